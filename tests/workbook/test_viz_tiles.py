"""moe_lab.workbook.viz.tiles: GROUP_SIZE_M ordering, the tile map and its widget."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import tiles as vt  # noqa: E402


@pytest.mark.parametrize("num_m,num_n,group", [(1, 1, 1), (5, 3, 1), (7, 4, 4), (11, 4, 8), (3, 5, 8)])
def test_tile_order_is_a_permutation(num_m, num_n, group):
    order = vt.tile_order(num_m, num_n, group)
    assert sorted(order.ravel().tolist()) == list(range(num_m * num_n))


def test_group_size_one_is_row_major_by_column():
    assert vt.tile_order(2, 3, 1).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert vt.tile_order(4, 2, 2).tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]


def routing(bm=16):
    ids = torch.randint(0, 4, (16, 2), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    return moe_lab.moe_align_reference(ids, 4, bm)


def test_tile_map_plot():
    r = routing()
    fig = vt.plot_tile_map(r, n=96, block_size_n=32, group_size_m=2)
    assert isinstance(fig, Figure)
    shown = np.ma.filled(fig.axes[0].images[0].get_array(), np.nan)
    assert shown.shape == (r.max_num_m_blocks, 3)
    idle = (r.expert_ids < 0).numpy()
    assert np.isnan(shown[idle]).all() and not np.isnan(shown[~idle]).any()
    fig2 = Figure()
    assert vt.plot_tile_map(r, 96, 32, 2, ax=fig2.add_subplot()) is fig2


def test_tile_report_counts_programs():
    r = routing()
    text = vt.tile_report(r, n=96, k=64, block_size_n=32, block_size_k=16)
    used = int((r.expert_ids >= 0).sum())
    assert f"= {r.max_num_m_blocks * 3} programs" in text and f"{used * 3} compute a tile" in text
    assert "4 K step(s)" in text


def test_widget_redraws_on_each_slider():
    ids = torch.randint(0, 4, (16, 2), dtype=torch.int32)
    box = vt.tiles_explorer(ids, 4, n=128, k=64, align=moe_lab.moe_align_reference)
    assert all(c.continuous_update is False for c in box.controls.values())
    for name, value in [("BLOCK_SIZE_M", 32), ("BLOCK_SIZE_N", 64), ("BLOCK_SIZE_K", 16), ("GROUP_SIZE_M", 1)]:
        fig, text = box.figure, box.summary.value
        box.controls[name].value = value
        assert box.figure is not fig
        if name != "GROUP_SIZE_M":
            assert box.summary.value != text, name
    assert box.routing.block_size_m == 32
    assert "4 K step(s) of BLOCK_SIZE_K=16" in box.summary.value


def _routing():
    return moe_lab.moe_align(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), 4, 16)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: vt.tile_order(4, 3, 0), ValueError, r"group_size_m must be >= 1, got 0"),
        (lambda: vt.tile_order(-4, 3, 1), ValueError, r"num_m_blocks must be >= 0, got -4"),
        (lambda: vt.tile_order(4, 3.0, 1), TypeError, r"num_n_blocks must be an int, got float"),
        (lambda: vt.program_tile(100, 4, 3, 1), ValueError, r"pid must be in \[0, 12\) .* got 100"),
        (lambda: vt.program_tile(-1, 4, 3, 1), ValueError, r"pid must be >= 0, got -1"),
        (
            lambda: vt.tile_report(_routing(), n=32, k=32, block_size_n=0, block_size_k=32),
            ValueError,
            r"block_size_n must be >= 1, got 0",
        ),
        (lambda: vt.tile_report(_routing(), 32, -1, 32, 32), ValueError, r"k must be >= 0, got -1"),
        (lambda: vt.plot_tile_map([1, 2], 32, 32, 1), TypeError, r"routing must be an AlignedRouting .*got list"),
        (lambda: vt.plot_tile_map(_routing(), 32, 32, 0), ValueError, r"group_size_m must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        # the sliders would raise ipywidgets' TraitError, naming neither the argument nor the choices
        (dict(block_size_n=48), ValueError, r"block_size_n must be one of \[16, 32, 64, 128\], got int 48"),
        (dict(group_size_m=3), ValueError, r"group_size_m must be one of \[1, 2, 4, 8\], got int 3"),
        (dict(block_size_m=64, block_sizes=(16, 32)), ValueError, r"block_size_m must be one of \[16, 32\]"),
        (dict(block_sizes="16"), TypeError, r"block_sizes must be a sequence of ints, got str"),
        (dict(group_sizes=[1, 0]), ValueError, r"group_sizes\[1\] must be >= 1, got 0"),
    ],
)
def test_widget_refuses_a_first_state_among_no_choices(kwargs, error, match):
    with pytest.raises(error, match=match):
        vt.tiles_explorer(torch.tensor([[0, 1]], dtype=torch.int32), 4, n=64, k=64, **kwargs)


def test_tile_map_refuses_negative_max_labels():
    with pytest.raises(ValueError, match=r"max_labels must be >= 0, got -1"):
        vt.plot_tile_map(_routing(), 32, 32, 1, max_labels=-1)


def test_tile_map_too_large_to_draw_is_refused_at_once():
    r = routing()
    with pytest.raises(ValueError, match=r"n is too large to draw: 10000000 N-blocks .*at most 2048"):
        vt.plot_tile_map(r, n=10**7, block_size_n=1, group_size_m=1)
    with pytest.raises(ValueError, match=r"max_labels is too large to draw: 10240 tile labels, at most 4096"):
        vt.plot_tile_map(r, n=2048, block_size_n=1, group_size_m=1, max_labels=10**9)
    ids = torch.zeros(10**5, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_ids is too large to draw: 12507 M-blocks, at most 2048"):
        vt.tiles_explorer(ids, 8, n=64, k=64)
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        vt.plot_tile_map(r, n=64, block_size_n=32, group_size_m=1, ax="ax")
