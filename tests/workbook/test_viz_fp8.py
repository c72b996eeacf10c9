"""moe_lab.workbook.viz.fp8: the e4m3 grid (data and picture), scales drawn over their matrix, and the committed FP8
timings."""

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import fp8  # noqa: E402

from ..conftest import DEVICE  # noqa: E402


def test_e4m3_values_and_binades():
    values = fp8.e4m3_values()
    assert len(values) == 127 and values[0] == 0 and values[1] == 2.0**-9 and values[-1] == 448
    assert values == sorted(values)
    binades = fp8.e4m3_binades()
    assert binades[0].subnormal and len(binades[0].values) == 7 and binades[0].spacing == 2.0**-9
    normal = binades[1:]
    assert [b.low for b in normal] == [2.0**e for e in range(-6, 9)]
    for b in normal:  # eight values, evenly spaced, the spacing doubling from one binade to the next
        assert np.allclose(np.diff(b.values), b.spacing) and b.spacing == b.low / 8
        assert len(b.values) == (7 if b.low == 256 else 8)
    assert sum(len(b.values) for b in binades) == 126
    # the values are e4m3's: a cast leaves each one as it is
    t = torch.tensor(values)
    assert torch.equal(t.to(torch.float8_e4m3fn).float(), t)


def test_plots_return_figures():
    assert isinstance(fp8.plot_e4m3_grid(), Figure)
    fig = Figure()
    assert fp8.plot_e4m3_grid(ax=fig.add_subplot()) is fig
    _, w_scale = moe_lab.quantize_weights_fp8(torch.randn(1, 300, 600), block_shape=(128, 128))
    fig = fp8.plot_scale_blocks(w_scale[0], (300, 600), (128, 128), marks=[(10, 500)])
    assert isinstance(fig, Figure)
    shown = fig.axes[0].collections[0].get_array().reshape(3, 5)
    assert np.allclose(shown, w_scale[0].numpy())
    assert len(fig.axes[0].texts) == 15  # few blocks: each scale written in its block
    _, x_scale = moe_lab.quantize_activations_fp8(torch.randn(4, 300, device=DEVICE), group_size=128)
    fig = fp8.plot_scale_blocks(x_scale, (4, 300), (1, 128))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "1", "2", "3"]


def test_scale_blocks_bad_inputs_raise():
    scale = torch.ones(3, 5)
    for shape, block in (((300, 600), (128, 64)), ((390, 600), (128, 128)), ((0, 600), (128, 128))):
        with pytest.raises(ValueError):
            fp8.plot_scale_blocks(scale, shape, block)
    with pytest.raises(ValueError, match=r"\[3, 5\]"):
        fp8.plot_scale_blocks(torch.ones(1, 3, 5), (300, 600))
    with pytest.raises(ValueError, match="positive finite"):
        fp8.plot_scale_blocks(torch.zeros(3, 5), (300, 600))


def test_committed_experiment_and_speedup_plot(tmp_path):
    rows = [
        dict(model=m, T=t, bf16_pair_ms=1.0, fp8_pair_ms=1 / s, speedup=s)
        for m in ("a", "b")
        for t, s in ((1, 1.5), (64, 1.9), (4096, 1.0))
    ]
    rows.append(dict(model="a", T=8, bf16_pair_ms="failed", fp8_pair_ms=1.0))  # skipped, not drawn
    fig = fp8.plot_fp8_speedup(dict(environment=dict(device="NVIDIA H200", triton="3.6.0"), rows=rows))
    assert isinstance(fig, Figure)
    lines = [line for line in fig.axes[0].lines if line.get_label() in ("a", "b")]
    assert [list(line.get_xdata()) for line in lines] == [[1, 64, 4096]] * 2
    assert np.allclose(lines[0].get_ydata(), [1.5, 1.9, 1.0])
    with pytest.raises(ValueError, match="list of rows"):
        fp8.plot_fp8_speedup({"rows": None})
    with pytest.raises(FileNotFoundError):
        fp8.load_fp8_experiment(str(tmp_path / "missing.json"))
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps(dict(environment={}, rows=rows[:3])))
    assert fp8.load_fp8_experiment(str(path))["rows"][0]["model"] == "a"
    try:
        committed = fp8.load_fp8_experiment()
    except FileNotFoundError:
        pytest.skip("benchmarks/results/studies/fp8-H200-2026-12-01.json is not in this checkout")
    assert committed["rows"] and all(
        {"model", "T", "bf16_pair_ms", "fp8_pair_ms", "speedup"} <= set(r) for r in committed["rows"]
    )
    assert isinstance(fp8.plot_fp8_speedup(committed), Figure)


@pytest.mark.parametrize(
    "shape,block,marks,error,match",
    [
        ((300.7, 600), (128, 128), (), TypeError, r"shape\[0\] must be an int, got float 300.7"),  # not truncated
        ((300, 600, 1), (128, 128), (), ValueError, r"shape must be a sequence of 2 ints \(rows, cols\), got 3"),
        ("300", (128, 128), (), TypeError, r"shape must be a sequence of 2 ints .*got str"),
        ((300, 600), (-128, 128), (), ValueError, r"block_shape\[0\] must be >= 1, got -128"),
        ((300, 600), (128, 128), "ab", TypeError, r"marks must be a sequence of \(row, col\) pairs, got str"),
        ((300, 600), (128, 128), [(1, 2, 3)], ValueError, r"marks\[0\] must be a sequence of 2 ints"),
    ],
)
def test_scale_blocks_names_bad_sizes(shape, block, marks, error, match):
    with pytest.raises(error, match=match):
        fp8.plot_scale_blocks(torch.ones(3, 5), shape, block, marks=marks)


def test_scale_blocks_refuses_marks_outside_the_matrix():
    with pytest.raises(ValueError, match=r"marks\[0\] must lie in the matrix: row in \[0, 256\), col in \[0, 256\)"):
        fp8.plot_scale_blocks(torch.ones(2, 2), (256, 256), (128, 128), marks=[(1000, -5)])
    with pytest.raises(ValueError, match=r"marks\[1\] must lie in the matrix.*got \(0, 256\)"):
        fp8.plot_scale_blocks(torch.ones(2, 2), (256, 256), (128, 128), marks=[(255, 255), (0, 256)])


@pytest.mark.parametrize(
    "scale,error,match",
    [
        (np.ones((2, 2)), TypeError, r"scale must be a torch.Tensor .*got numpy.ndarray"),
        (torch.ones(2, 2, device="meta"), ValueError, r"scale is on the meta device, which holds no data"),
    ],
)
def test_scale_blocks_refuses_what_holds_no_scales(scale, error, match):
    with pytest.raises(error, match=match):
        fp8.plot_scale_blocks(scale, (256, 256), (128, 128))


def test_scale_blocks_too_large_to_draw_is_refused_at_once():
    with pytest.raises(ValueError, match=r"scale is too large to draw: 1000000 scale blocks .*at most 65536"):
        fp8.plot_scale_blocks(torch.ones(1, 10**6), (1, 10**6), (1, 1))
    with pytest.raises(ValueError, match=r"annotate is too large to draw: 4096 scale labels .*at most 1024"):
        fp8.plot_scale_blocks(torch.ones(64, 64), (64, 64), (1, 1), annotate=True)
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        fp8.plot_scale_blocks(torch.ones(2, 2), (256, 256), (128, 128), ax="ax")
