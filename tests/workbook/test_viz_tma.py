"""moe_lab.workbook.viz.tma: every plot function returns a Figure; the widgets redraw when driven."""

import re

import matplotlib
import pytest

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from moe_lab.workbook.viz import tma  # noqa: E402


def test_box_overlap_counts_inside_and_outside():
    assert tma.box_overlap((12, 20), (8, 8), (0, 0)) == (64, 0)
    assert tma.box_overlap((12, 20), (8, 8), (8, 16)) == (16, 48)
    for args, error, message in (
        (((4, 4), (2,), (0, 0)), ValueError, "must have one rank, got 2, 1 and 2"),
        (((4, 4), (-2, 2), (0, 0)), ValueError, "block_shape[0] must be >= 1, got -2"),
        (((4, 4), (2, 2), (0.5, 0)), TypeError, "offsets[0] must be an int, got float 0.5"),
        ((4, (2, 2), (0, 0)), TypeError, "shape must be a sequence of sizes, got int"),
        (("44", (2, 2), (0, 0)), TypeError, "shape must be a sequence of sizes, got str"),
    ):
        with pytest.raises(error, match=re.escape(message)):
            tma.box_overlap(*args)
    assert tma.box_overlap((4, 4, 4), (1, 4, 4), (3, 2, 0)) == (8, 8)


def test_plot_descriptor_box_returns_figure_and_uses_given_axes():
    fig = tma.plot_descriptor_box((12, 20), (8, 8), [(8, 16)], values=torch.arange(64).reshape(8, 8))
    assert isinstance(fig, Figure)
    assert "48 element(s) out of bounds" in fig.axes[0].get_title()
    ax = Figure().add_subplot()
    assert tma.plot_descriptor_box((4, 8), (2, 4), [(0, 0), (2, 4)], ax=ax) is ax.figure


def test_plot_expert_weights_box():
    fig = tma.plot_expert_weights_box(4, 32, 16, (1, 16, 16), (2, 16, 0))
    assert isinstance(fig, Figure)
    assert "[2, 16, 0]" in fig.axes[0].get_title()


def test_sorted_rows_and_crossing_tiles():
    counts = [5, 0, 13, 3, 9]
    padded = tma.sorted_row_experts(counts, 4)
    assert len(padded) == 8 + 16 + 4 + 12 and (padded >= 0).sum() == 30
    assert tma.crossing_tiles(counts, 4) == []
    assert tma.crossing_tiles(counts, 4, packed=True) == [1, 4, 5]
    packed = tma.sorted_row_experts(counts, 4, packed=True)
    assert len(packed) == 32 and np.array_equal(packed[:6], [0, 0, 0, 0, 0, 2])


@pytest.mark.parametrize("packed", [False, True])
def test_plot_expert_tiles(packed):
    fig = tma.plot_expert_tiles([5, 0, 13, 3, 9], 4, packed=packed)
    assert isinstance(fig, Figure)
    assert ("3 tile(s) span" if packed else "0 tile(s) span") in fig.axes[0].get_title()


def test_box_widget_redraws_on_change():
    w = tma.box_widget((12, 20), (8, 8), itemsize=4)
    first_fig, first_text = w.figure, w.summary.value
    assert "0 zero-filled" in first_text
    row_slider, col_slider = w.children[0].children
    assert row_slider.continuous_update is False
    row_slider.value = 8
    col_slider.value = 16
    assert w.figure is not first_fig
    assert "48 zero-filled" in w.summary.value


def test_expert_tiles_widget_redraws_on_change():
    w = tma.expert_tiles_widget([5, 0, 13, 3, 9], 4)
    assert "0 tile(s) span" in w.summary.value
    before = w.figure
    w.children[0].children[1].value = "packed"
    assert w.figure is not before
    assert "3 tile(s) span" in w.summary.value


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: tma.sorted_row_experts([5, -3, 2], 4), ValueError, r"counts\[1\] must be >= 0, got -3"),
        (lambda: tma.sorted_row_experts([5, 3, 2], 0), ValueError, r"block_size_m must be >= 1, got 0"),
        (lambda: tma.sorted_row_experts([5, 2.5], 4), TypeError, r"counts\[1\] must be an int, got float"),
        (lambda: tma.plot_expert_tiles("5,3", 4), TypeError, r"counts must be a sequence of ints .*got str"),
        (lambda: tma.crossing_tiles(5, 4), TypeError, r"counts must be a sequence of ints .*got int"),
        (lambda: tma.crossing_tiles([5, 3], 4, packed="no"), TypeError, r"packed must be True or False, got str"),
        (lambda: tma.sorted_row_experts([5, 3], 4, packed=torch.tensor([True])), TypeError, r"packed must be True"),
        (lambda: tma.sorted_row_experts({0: 3, 1: 5}, 4), TypeError, r"counts must be a sequence .*got dict"),
        (lambda: tma.sorted_row_experts(torch.tensor(3), 4), TypeError, r"sequence .*got a 0-d int64 tensor"),
    ],
)
def test_bad_counts_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_counts_may_be_a_tensor():
    assert tma.sorted_row_experts(torch.tensor([5, 3]), 4).tolist() == tma.sorted_row_experts([5, 3], 4).tolist()


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: tma.plot_descriptor_box((-4, 20), (8, 8)), ValueError, r"shape\[0\] must be >= 0, got -4"),
        (lambda: tma.plot_descriptor_box((12, 20), (8, 0)), ValueError, r"block_shape\[1\] must be >= 1, got 0"),
        (lambda: tma.plot_descriptor_box((12, 20, 3), (8, 8)), ValueError, r"shape must be a sequence of 2 ints"),
        (lambda: tma.plot_descriptor_box("12", (8, 8)), TypeError, r"shape must be a sequence .*got str"),
        (lambda: tma.plot_descriptor_box((12.5, 20), (8, 8)), TypeError, r"shape\[0\] must be an int, got float"),
        (lambda: tma.plot_descriptor_box((12, 20), (8, 8), []), ValueError, r"offsets must hold at least one"),
        (lambda: tma.plot_descriptor_box((12, 20), (8, 8), [(1, 2, 3)]), ValueError, r"offsets\[0\] must be"),
        (
            lambda: tma.plot_descriptor_box((12, 20), (8, 8), "00"),
            TypeError,
            r"offsets must be a sequence of \(row, col\) box origins, got str",
        ),
        (
            lambda: tma.plot_descriptor_box((12, 20), (8, 8), values=np.zeros((4, 4))),
            ValueError,
            r"values must be \[BLOCK_M, BLOCK_N\] = \[8, 8\] .*got shape \(4, 4\)",
        ),
        (lambda: tma.plot_expert_weights_box(0, 32, 16, (1, 16, 16), (0, 0, 0)), ValueError, r"num_experts must be"),
        (lambda: tma.plot_expert_weights_box(4, -32, 16, (1, 16, 16), (0, 0, 0)), ValueError, r"n must be >= 1"),
        (
            lambda: tma.plot_expert_weights_box(4, 32, 16, (16, 16), (0, 0, 0)),
            ValueError,
            r"block_shape must be a sequence of 3 ints .*got 2 entries",
        ),
        (lambda: tma.plot_expert_weights_box(4, 32, 16, (1, 16, 16), (0, 0.5, 0)), TypeError, r"offsets\[1\]"),
        # the widgets: a value among no choices, a clamped one, refused before any widget is built
        (lambda: tma.box_widget((12, 20), (3, 8)), ValueError, r"BLOCK_M\) must be one of \[2, 4, 8, 16\], got int 3"),
        (
            lambda: tma.box_widget((12, 20), (8, 4), itemsize=2),
            ValueError,
            r"BLOCK_N, with itemsize 2\) must be one of",
        ),
        (lambda: tma.box_widget((12, 20), (8, 8), itemsize=0), ValueError, r"itemsize must be >= 1, got 0"),
        (lambda: tma.box_widget((-1, 20), (8, 8)), ValueError, r"shape\[0\] must be >= 0, got -1"),
        (lambda: tma.expert_tiles_widget([5, 3], 3), ValueError, r"block_size_m must be one of \[2, 4, 8, 16\], got"),
        (lambda: tma.expert_tiles_widget([5, 3], True), ValueError, r"block_size_m must be one of .*got bool True"),
        (lambda: tma.expert_tiles_widget([5, -3], 4), ValueError, r"counts\[1\] must be >= 0, got -3"),
    ],
)
def test_bad_sizes_and_choices_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: tma.plot_descriptor_box((10**6, 10**6), (8, 8)),
            r"shape is too large to draw: 1000000 .*at most 1024",
        ),
        (
            lambda: tma.plot_descriptor_box((12, 20), (4096, 4096)),
            r"block_shape is too large to draw: 16777216 .*at most",
        ),
        (lambda: tma.plot_descriptor_box((12, 20), (8, 8), [(0, 0)] * 20000), r"block_shape is too large to draw"),
        (lambda: tma.plot_descriptor_box((12, 20), (8, 8), [(2**62, 0)]), r"offsets is too large to draw: \d+ rows"),
        (
            lambda: tma.box_widget((10**5, 10**5), (2, 4)),
            r"shape is too large to draw: \d+ rows or columns of the view",
        ),
        (
            lambda: tma.plot_expert_weights_box(10**6, 8, 8, (1, 4, 4), (0, 0, 0)),
            r"num_experts is too large to draw: 1000000 experts .*at most 256",
        ),
        (lambda: tma.plot_expert_tiles([10**9], 4), r"counts is too large to draw: 1000000000 rows .*at most 1048576"),
        (lambda: tma.plot_expert_tiles([1] * 100000, 1), r"counts is too large to draw: 100000 experts .*at most 512"),
        (lambda: tma.plot_expert_tiles([4096], 1), r"counts is too large to draw: 4096 tiles .*at most 512"),
        (lambda: tma.expert_tiles_widget([2000], 16), r"counts is too large to draw: 1000 tiles at BLOCK_SIZE_M = 2"),
    ],
)
def test_too_large_to_draw_is_refused_at_once(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_far_expert_weight_offsets_are_refused():
    with pytest.raises(ValueError, match=r"offsets\[1\] \(n0\) must put the box within one panel size"):
        tma.plot_expert_weights_box(4, 8, 8, (1, 4, 4), (0, 2**62, 0))
    assert isinstance(tma.plot_expert_weights_box(4, 8, 8, (1, 4, 4), (0, -7, 15)), Figure)  # partly outside: drawn


@pytest.mark.parametrize(
    "values,error,match",
    [
        ([["a", "b"], ["c", "d"]], TypeError, r"values must hold numbers .*got dtype <U1"),
        ([[1, None], [2, 3]], TypeError, r"values must hold numbers .*got dtype object"),
        (torch.ones(2, 2, device="meta"), ValueError, r"values is on the meta device, which holds no data"),
        ([[1, 2], [3]], ValueError, r"values must be \[BLOCK_M, BLOCK_N\] = \[2, 2\]"),
    ],
)
def test_descriptor_box_refuses_values_it_cannot_write(values, error, match):
    with pytest.raises(error, match=match):
        tma.plot_descriptor_box((4, 4), (2, 2), values=values)


def test_descriptor_box_takes_bool_and_int_values_and_checks_ax():
    assert isinstance(tma.plot_descriptor_box((4, 4), (2, 2), values=np.array([[True, False], [1, 0]])), Figure)
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        tma.plot_descriptor_box((4, 4), (2, 2), ax="ax")
