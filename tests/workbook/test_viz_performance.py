"""moe_lab.workbook.viz.performance: results loading, cost model, plots, and the guarded block-size widget."""

import json
import os

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import performance as perf  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return perf.load_results()


def test_load_results_reads_newest_committed_file(results):
    assert os.path.dirname(results["path"]) == perf.results_dir()
    assert {"copy_tbps", "bf16_matmul_tflops"} <= set(results["ceilings"])
    assert results["rows"] and {"model", "T", "impl", "gemms_ms"} <= set(results["rows"][0])
    assert "committed data" in perf.describe_results(results)


def test_load_results_picks_newest_by_date(tmp_path, monkeypatch):
    row = dict(model="m", T=1, impl="moe-lab pointer", gemms_ms=1.0)
    for name, date in (("b-old.json", "2026-01-01"), ("a-new.json", "2026-12-31")):
        (tmp_path / name).write_text(json.dumps(dict(environment=dict(date=date), ceilings={}, rows=[row])))
    monkeypatch.setattr(perf, "results_dir", lambda: str(tmp_path))
    assert perf.load_results()["path"].endswith("a-new.json")
    monkeypatch.setattr(perf, "results_dir", lambda: str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="benchmarks/results is not beside this moe-lab .*is missing.*Clone it"):
        perf.load_results()
    # the committed studies the notebooks read, where a pip install has none: the same words, the file named
    from moe_lab.workbook.viz import schedule, warp_specialization

    with pytest.raises(FileNotFoundError, match="benchmarks/results/gluon_fp8/gluon_fp8.json is not beside"):
        warp_specialization.load_gluon_results()
    with pytest.raises(FileNotFoundError, match="benchmarks/results/studies/persistent-.*json is not beside"):
        schedule.load_persistent_experiment()


def test_layer_cost_matches_preset_flops():
    p = moe_lab.get_preset("mixtral-8x7b")
    c = perf.layer_cost(p, 64, experts_used=8)
    assert c["flops"] == p.flops(64)
    assert c["bytes"] > 2 * 8 * 3 * p.hidden_size * p.intermediate_size
    assert c["intensity"] == pytest.approx(c["flops"] / c["bytes"])
    assert perf.expected_experts_used(8, 2, 1) == pytest.approx(2.0)
    assert "MFLOP/token" in perf.cost_table(["mixtral-8x7b"], [1, 64])


def test_plots_return_figures(results):
    assert isinstance(perf.plot_roofline(results["ceilings"], results=results, presets=["qwen3-30b-a3b"]), Figure)
    assert isinstance(perf.plot_roofline(results["ceilings"]), Figure)
    fig = perf.plot_time_vs_tokens(results, "qwen3-30b-a3b", metric="layer_ms")
    assert "whole layer time (ms)" == fig.axes[0].get_ylabel()
    grid = perf.plot_time_grid(results)
    assert len(grid.axes) == len({r["model"] for r in results["rows"]})
    ax = Figure().add_subplot()
    assert perf.plot_bars([("a", 1.0), ("b (live)", 2.0)], title="t", ax=ax) is ax.figure


def test_compare_table_has_speedups(results):
    text = perf.compare_table(results, models=["qwen3-30b-a3b"])
    assert "speedup" in text and "qwen3-30b-a3b" in text and text.count("x") >= 3


@pytest.mark.skipif(not moe_lab.interpreter_active(), reason="checks the refusal under the interpreter")
def test_time_layer_refuses_under_interpreter():
    with pytest.raises(RuntimeError, match="interpreter"):
        perf.time_layer(moe_lab.get_preset("qwen3-30b-a3b"), 8, moe_lab.GemmConfig())


@pytest.mark.skipif(not moe_lab.interpreter_active(), reason="checks the refusal under the interpreter")
def test_block_size_widget_refuses_and_shows_committed(results):
    w = perf.block_size_widget("qwen3-30b-a3b", 512, results=results)
    assert "Not timing" in w.summary.value and "interpreter" in w.summary.value
    assert "committed" in w.summary.value
    assert w.timings == []
    before_fig, before_text = w.figure, w.summary.value
    model, tokens = w.children[0].children
    bm, bn, bk = w.children[1].children
    bm.value = 128
    assert "M128" in w.summary.value and w.summary.value != before_text
    tokens.value = 4096
    assert w.figure is not before_fig
    assert "T=4096" in w.summary.value
    assert w.timings == []


@pytest.mark.parametrize(
    "bad, error",
    [(12.5, TypeError), (True, TypeError), ("64", TypeError), (None, TypeError), (-3, ValueError), (0, ValueError)],
)
def test_token_count_must_be_a_whole_number(bad, error, results):
    p = moe_lab.get_preset("qwen3-30b-a3b")
    calls = [
        lambda: perf.layer_cost(p, bad),
        lambda: perf.cost_table(["qwen3-30b-a3b"], [1, bad]),
        lambda: perf.plot_roofline(results["ceilings"], presets=["qwen3-30b-a3b"], tokens=(1, bad)),
        lambda: perf.block_size_widget("qwen3-30b-a3b", bad, results=results),
    ]
    for call in calls:
        with pytest.raises(error, match=r"^T \(the token count\) must be"):
            call()


def test_token_count_accepts_integers():
    import numpy as np

    assert perf.check_token_count(64) == 64 and perf.check_token_count(np.int64(4)) == 4
    p = moe_lab.get_preset("qwen3-30b-a3b")
    assert perf.layer_cost(p, np.int32(64)) == perf.layer_cost(p, 64)


def test_stage_sweep_cost_model():
    rows = perf.stage_sweep([(128, 128, 64), (128, 256, 64)], [1, 4, 5], limit=perf.H200_SHARED_MEMORY_BYTES)
    by = {(r["block_n"], r["num_stages"]): r for r in rows}
    assert by[(128, 1)]["smem_bytes"] == (128 * 64 + 64 * 128) * 2 == 32 * 1024
    assert by[(256, 4)]["smem_bytes"] == 192 * 1024 and by[(256, 4)]["fits"]
    assert by[(256, 5)]["smem_bytes"] == 240 * 1024 and not by[(256, 5)]["fits"]  # past 227 KiB
    assert by[(128, 1)]["intensity"] == pytest.approx(64.0)  # 2*128*128 / (256 * 2)
    assert all("ms" not in r for r in rows)  # nothing timed
    text = perf.stage_sweep_table(rows)
    assert "fits 227 KiB" in text and "NO" in text and "TFLOP/s" not in text
    assert isinstance(perf.plot_stage_sweep(rows), Figure)


@pytest.mark.skipif(not moe_lab.interpreter_active(), reason="checks the refusal under the interpreter")
def test_stage_sweep_refuses_to_time_under_interpreter():
    from tests.notebook_source import notebook_kernel

    kernel = notebook_kernel("07_performance", "matmul_kernel_solution")
    with pytest.raises(RuntimeError, match="interpreter"):
        perf.stage_sweep([(64, 64, 32)], [2], kernel=kernel)


def test_stage_sweep_table_and_plot_with_times():
    """Rows as a GPU sweep returns them (one launch failed): the table and the figure show the times."""
    rows = perf.stage_sweep([(128, 256, 64)], [4, 5], limit=perf.H200_SHARED_MEMORY_BYTES)
    rows[0].update(ms=0.25, tflops=2 * 4096**3 / 0.25 / 1e9)
    rows[1].update(ms=None, tflops=None, error="OutOfResources: out of resource: shared memory")
    text = perf.stage_sweep_table(rows)
    assert "TFLOP/s" in text and "0.250" in text and "failed: OutOfResources" in text
    fig = perf.plot_stage_sweep(rows, title="t")
    assert len(fig.axes) == 2 and "TFLOP/s" in fig.axes[1].get_ylabel()


def test_layer_cost_takes_a_preset_name():
    assert perf.layer_cost("mixtral-8x7b", 4) == perf.layer_cost(moe_lab.get_preset("mixtral-8x7b"), 4)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: perf.layer_cost(8, 4), TypeError, r"preset must be a MoEPreset or a preset's name \(str\), got int"),
        (lambda: perf.layer_cost("no-such-model", 4), ValueError, r"unknown model preset 'no-such-model'"),
        (lambda: perf.tile_intensity(0, 0, 0), ValueError, r"block_m must be >= 1, got 0"),
        (lambda: perf.tile_intensity(64, 64, 32, itemsize=0), ValueError, r"itemsize must be >= 1, got 0"),
        (lambda: perf.pipeline_shared_memory(-16, 32, 32, 2), ValueError, r"block_m must be >= 1, got -16"),
        (lambda: perf.pipeline_shared_memory(16, 32, 32, 0), ValueError, r"num_stages must be >= 1, got 0"),
        (lambda: perf.pipeline_shared_memory(16, 32.0, 32, 2), TypeError, r"block_n must be an int, got float"),
        (lambda: perf.layer_cost("mixtral-8x7b", 64, experts_used=9), ValueError, r"must be in .*\(0, 8\]"),
        (lambda: perf.layer_cost("mixtral-8x7b", 1, experts_used=3), ValueError, r"= \(0, 2\], got 3.0"),
        (lambda: perf.layer_cost("mixtral-8x7b", 64, experts_used=0), ValueError, r"experts_used must be in"),
        (lambda: perf.layer_cost("mixtral-8x7b", 64, experts_used=float("nan")), ValueError, r"got nan"),
        (lambda: perf.layer_cost("mixtral-8x7b", 64, experts_used="8"), TypeError, r"experts_used must be a real"),
        (lambda: perf.load_results(3), TypeError, r"path must be a str or os.PathLike .*got int"),
    ],
)
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "text,match",
    [
        ("not json\n", r"is not valid JSON"),
        ("[1, 2]", r"must hold a JSON object"),
        ('{"rows": []}', r"is not a benchmark results file: it lacks environment \(dict\), ceilings \(dict\)$"),
        ('{"environment": "x", "ceilings": {}, "rows": "abc"}', r"it lacks environment \(dict\), rows \(list\)$"),
    ],
)
def test_load_results_names_a_file_that_is_not_results(tmp_path, text, match):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        perf.load_results(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: perf.expected_experts_used(8, 2, -1), ValueError, r"num_tokens must be >= 0, got -1"),
        (lambda: perf.expected_experts_used(0, 2, 4), ValueError, r"num_experts must be >= 1, got 0"),
        (lambda: perf.expected_experts_used(8, 9, 4), ValueError, r"top_k must be <= num_experts = 8, got 9"),
        (lambda: perf.expected_experts_used(8, 2.0, 4), TypeError, r"top_k must be an int, got float"),
        (lambda: perf.cost_table("mixtral-8x7b", [1]), TypeError, r"models must be a sequence of preset names"),
        (lambda: perf.cost_table(["mixtral-8x7b"], "64"), TypeError, r"tokens must be a sequence of token counts"),
        (lambda: perf.plot_roofline({}, presets="qwen3-30b-a3b"), TypeError, r"presets must be a sequence .*str"),
        (lambda: perf.plot_roofline({}, impls="moe-lab tma"), TypeError, r"impls must be a sequence .*got str"),
        (lambda: perf.plot_bars("ab", title="t"), TypeError, r"entries must be a sequence of \(label, value\)"),
        (lambda: perf.plot_bars([("a", "1")], title="t"), TypeError, r"entries\[0\] must be a \(label, value\) pair"),
        (lambda: perf.stage_sweep([(64, 64)], [2]), ValueError, r"blocks\[0\] must be a sequence of 3 ints"),
        (lambda: perf.stage_sweep([(64, 64, 32)], "23"), TypeError, r"stages must be a sequence of num_stages"),
        (lambda: perf.stage_sweep([(64, 64, 32)], [2], limit=-1), ValueError, r"limit must be >= 1, got -1"),
        (lambda: perf.stage_sweep([(64, 64, 32)], [2], size=0), ValueError, r"size must be >= 1, got 0"),
    ],
)
def test_sizes_and_sequences_are_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda r: perf.plot_time_vs_tokens(r, "qwen3-30b-a3b", metric="ms"), ValueError, r"metric must be one of"),
        (lambda r: perf.plot_time_vs_tokens(r, "qwen3-30b-a3b", impls=()), ValueError, r"impls must name at least"),
        (lambda r: perf.plot_time_vs_tokens(r, "qwen3-30b-a3b", impls="moe-lab tma"), TypeError, r"impls must be"),
        (lambda r: perf.plot_time_grid(r, metric="tflops"), ValueError, r"metric must be one of \['up_ms'"),
        (lambda r: perf.plot_time_grid(r, models="qwen3-30b-a3b"), TypeError, r"models must be a sequence .*str"),
        (lambda r: perf.compare_table(r, metrics="up_ms"), TypeError, r"metrics must be a sequence .*got str"),
        (lambda r: perf.compare_table(r, models="qwen3-30b-a3b"), TypeError, r"models must be a sequence .*str"),
        # the model dropdown would raise ipywidgets' TraitError, naming neither the argument nor the choices
        (lambda r: perf.block_size_widget("gpt-5", 512, results=r), ValueError, r"model must be one of \["),
    ],
)
def test_committed_plots_name_bad_arguments(results, call, error, match):
    with pytest.raises(error, match=match):
        call(results)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_bars_refuse_a_value_that_is_not_finite(bad):
    with pytest.raises(ValueError, match=r"entries\[1\] must have a finite value"):
        perf.plot_bars([("a", 1.0), ("b", bad)], title="t")


@pytest.mark.parametrize(
    "ceilings,error,match",
    [
        ({}, ValueError, r"ceilings must hold copy_tbps"),
        ({"copy_tbps": 4.0}, ValueError, r"ceilings must hold bf16_matmul_tflops"),
        (
            {"copy_tbps": float("nan"), "bf16_matmul_tflops": 900.0},
            ValueError,
            r"ceilings\['copy_tbps'\] must be a positive finite",
        ),
        (
            {"copy_tbps": 4.0, "bf16_matmul_tflops": 0},
            ValueError,
            r"ceilings\['bf16_matmul_tflops'\] must be a positive",
        ),
        (
            {"copy_tbps": "4", "bf16_matmul_tflops": 900.0},
            TypeError,
            r"ceilings\['copy_tbps'\] must be a number, got str",
        ),
        ([4.0, 900.0], TypeError, r"ceilings must be a dict with copy_tbps, bf16_matmul_tflops .*got list"),
    ],
)
def test_roofline_refuses_bad_ceilings(ceilings, error, match):
    with pytest.raises(error, match=match):
        perf.plot_roofline(ceilings)


def test_roofline_ax_must_be_an_axes():
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        perf.plot_roofline({"copy_tbps": 4.0, "bf16_matmul_tflops": 900.0}, ax="ax")
