"""moe_lab.workbook.viz.dataflow: stage shapes, the diagram, and its widget."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import dataflow  # noqa: E402


def test_layer_stages_shapes():
    p = moe_lab.get_preset("mixtral-8x7b")
    stages = dataflow.layer_stages(p, 64, 16)
    by_name = {s.name: s for s in stages}
    # T*k = 128 slots over 8 experts: bound (8 + 120 // 16) * 16 = 240 padded rows
    assert "sorted_token_ids [240]" in by_name["align"].out
    assert "gate_up [240, 28672]" in by_name["up GEMM (gather rows)"].out
    assert "out [64, 4096]" in stages[-1].out


def test_layer_stages_with_info_names_load_paths():
    p = moe_lab.get_preset("mixtral-8x7b").scaled(64)
    hs, w1, w2, (tw, ti) = p.build(4, dtype=torch.float32)
    _, info = moe_lab.fused_moe(hs, w1, w2, tw, ti, return_info=True)
    stages = dataflow.layer_stages(p, 4, info.config.block_size_m, info)
    assert info.up_plan.swiglu and "SwiGLU epilogue" in stages[3].name  # the layer fused the activation
    assert stages[3].note == f"load path {info.up_path.name}"
    assert stages[4].note == f"load path {info.down_path.name}"
    assert len(stages) == len(dataflow.layer_stages(p, 4, info.config.block_size_m)) - 1


def test_plot_dataflow_returns_figure():
    p = moe_lab.get_preset("qwen3-30b-a3b")
    fig = dataflow.plot_dataflow(p, 8, 16)
    assert isinstance(fig, Figure)
    assert "qwen3-30b-a3b" in fig.axes[0].get_title()
    ax = Figure().add_subplot()
    assert dataflow.plot_dataflow(p, 8, ax=ax) is ax.figure


def test_dataflow_widget_redraws_on_change():
    w = dataflow.dataflow_widget("mixtral-8x7b", 64, 16)
    name, tokens, bsm = w.children[0].children
    assert tokens.continuous_update is False
    before_fig, before_text = w.figure, w.summary.value
    assert "128 routed slots" in before_text
    name.value = "qwen3-30b-a3b"
    assert w.figure is not before_fig
    assert "512 routed slots" in w.summary.value
    text = w.summary.value
    bsm.value = 64
    assert w.summary.value != text


def test_bad_arguments_are_named():
    import pytest

    p = moe_lab.get_preset("mixtral-8x7b")
    for call, error, match in (
        (lambda: dataflow.layer_stages(p, -4, 16), ValueError, r"num_tokens must be >= 1, got -4"),
        (lambda: dataflow.layer_stages(p, 4, 24), ValueError, r"block_size_m must be a power of two >= 1, got 24"),
        (lambda: dataflow.plot_dataflow(p, 4.0, 16), TypeError, r"num_tokens must be an int, got float"),
        (lambda: dataflow.plot_dataflow("mixtral-8x7b", 4), TypeError, r"preset must be a MoEPreset .*got str"),
        # the widget: a dropdown's TraitError, the slider's silent clamp, a scale read as 1
        (lambda: dataflow.dataflow_widget("gpt-5"), ValueError, r"preset_name must be one of \['mixtral-8x7b'"),
        (lambda: dataflow.dataflow_widget(block_size_m=48), ValueError, r"block_size_m must be one of \[16, 32, 64"),
        (lambda: dataflow.dataflow_widget(num_tokens=5000), ValueError, r"num_tokens must be in \[1, 4096\] .*5000"),
        (lambda: dataflow.dataflow_widget(num_tokens=0), ValueError, r"num_tokens must be in \[1, 4096\] .*got 0"),
        (lambda: dataflow.dataflow_widget(scale=0), ValueError, r"scale must be >= 1, got 0"),
    ):
        with pytest.raises(error, match=match):
            call()


def test_dataflow_refuses_an_info_or_ax_of_another_type():
    preset = moe_lab.get_preset("mixtral-8x7b")
    with pytest.raises(TypeError, match=r"info must be a FusedMoEInfo .*or None, got str"):
        dataflow.plot_dataflow(preset, 16, info="x")
    with pytest.raises(TypeError, match=r"ax must be a matplotlib Axes .*got str"):
        dataflow.plot_dataflow(preset, 16, ax="ax")
