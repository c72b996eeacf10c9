"""moe_lab.workbook.viz.schedule: the persistent tile schedule (data and picture), the SwiGLU rows picture, and the
committed persistent timings."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from moe_lab.workbook.viz import schedule


@pytest.mark.parametrize("blocks,n_tiles,programs,group", [(6, 2, 4, 1), (5, 3, 3, 2), (7, 4, 132, 8), (0, 2, 4, 1)])
def test_every_tile_once_and_program_p_takes_p_plus_multiples_of_the_grid(blocks, n_tiles, programs, group):
    tiles = schedule.tile_schedule(blocks, n_tiles, programs, group)
    assert [t.tile for t in tiles] == list(range(blocks * n_tiles))
    assert sorted((t.pid_m, t.pid_n) for t in tiles) == [(m, n) for m in range(blocks) for n in range(n_tiles)]
    assert all(t.program == t.tile % programs and t.step == t.tile // programs for t in tiles)


def test_bad_counts_raise():
    for args in ((-1, 2, 4), (3, 0, 4), (3, 2, 0), (3, 2, 4, 0)):
        with pytest.raises(ValueError, match="must be >= "):
            schedule.tile_schedule(*args)
    for args in ((3.0, 2, 4), (True, 2, 4), (3, np.float64(2.0), 4)):
        with pytest.raises(TypeError, match="must be an int"):
            schedule.tile_schedule(*args)
    with pytest.raises(ValueError, match="fewer than num_used_blocks"):
        schedule.plot_tile_schedule([0, 1], 3, 2, 4)
    with pytest.raises(ValueError, match="block_size_n of 32"):
        schedule.plot_swiglu_rows(48, 31, 0)
    with pytest.raises(TypeError, match="inter must be an int, got float 48.0"):
        schedule.plot_swiglu_rows(48.0, 32, 0)
    with pytest.raises(TypeError, match="pid_n must be an int, got bool"):
        schedule.plot_swiglu_rows(48, 32, False)
    with pytest.raises(ValueError, match=">= 0"):
        schedule.plot_tile_schedule([0, -1, 2], 3, 2, 4)
    with pytest.raises(ValueError, match="pid_n must be in"):
        schedule.plot_swiglu_rows(48, 32, 3)


def test_plots_return_figures():
    assert isinstance(schedule.plot_tile_schedule([0, 1, 2, 3, -1], 4, 2, 3), Figure)
    assert isinstance(schedule.plot_swiglu_rows(48, 32, 2), Figure)  # the last tile: half of it past I
    data = schedule.load_persistent_experiment()
    assert data["environment"]["device"] == "NVIDIA H200" and data["rows"]
    assert isinstance(schedule.plot_persistent_speedup(data), Figure)


def test_committed_prefill_anatomy_loads_and_plots():
    data = schedule.load_prefill_anatomy()
    assert {"tflops_uniform", "tflops_balanced", "tflops_bmm"} <= set(data["rows"][0])
    assert isinstance(schedule.plot_prefill_anatomy(data), Figure)
    with pytest.raises(ValueError, match="load_prefill_anatomy"):
        schedule.plot_prefill_anatomy([])
    # a row whose variant failed (an error text instead of a number) is left out, not plotted as text
    broken = dict(data, rows=[dict(data["rows"][0], tflops_bmm="RuntimeError: ...")] + data["rows"][1:])
    assert isinstance(schedule.plot_prefill_anatomy(broken), Figure)


@pytest.mark.parametrize(
    "expert_ids,error,match",
    [
        ("0123", TypeError, r"expert_ids must be a sequence of ints .*got str"),  # int("3") would read a character
        ([0, 1.5, 2], TypeError, r"expert_ids\[1\] must be an int, got float 1.5"),  # int() would truncate it
        ([0, 1, 2, -2], ValueError, r"expert_ids\[3\] must be >= -1, got -2"),
    ],
)
def test_expert_ids_must_be_ints(expert_ids, error, match):
    with pytest.raises(error, match=match):
        schedule.plot_tile_schedule(expert_ids, 3, 2, 4)


def test_expert_ids_may_be_a_tensor():
    import torch

    assert isinstance(schedule.plot_tile_schedule(torch.tensor([0, 1, 2, -1]), 3, 2, 4), Figure)


def test_counts_take_numpy_ints_and_0d_tensors():
    tiles = schedule.tile_schedule(np.int64(3), torch.tensor(2), np.int32(4), torch.tensor(1))
    assert tiles == schedule.tile_schedule(3, 2, 4, 1)
    assert isinstance(schedule.plot_tile_schedule([0, 1, 2], np.int64(3), torch.tensor(2), np.int32(4)), Figure)
    assert isinstance(schedule.plot_swiglu_rows(np.int64(48), torch.tensor(32), np.int32(2)), Figure)
    with pytest.raises(TypeError, match="num_programs must be an int, got float 4.0"):
        schedule.plot_tile_schedule([0, 1, 2], 3, 2, 4.0)


@pytest.mark.parametrize(
    "args,match",
    [
        (([0], 1, 1, 10**6), r"num_programs is too large to draw: 1000000 programs .*at most 256"),
        (([0] * 10**5, 10**5, 4, 4), r"num_used_blocks is too large to draw: 400000 tiles .*at most 256"),
    ],
)
def test_schedule_too_large_to_draw_is_refused_at_once(args, match):
    with pytest.raises(ValueError, match=match):
        schedule.plot_tile_schedule(*args)


def test_schedule_ax_must_be_an_axes():
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        schedule.plot_tile_schedule([0, 1], 2, 2, 4, ax="ax")
