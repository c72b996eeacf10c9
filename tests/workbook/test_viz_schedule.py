"""moe_lab.workbook.viz.schedule: the persistent tile schedule (data and picture), the SwiGLU rows picture, and the
committed persistent timings."""

import pytest
from matplotlib.figure import Figure

from moe_lab.workbook.viz import schedule


@pytest.mark.parametrize("blocks,n_tiles,programs,group", [(6, 2, 4, 1), (5, 3, 3, 2), (7, 4, 132, 8), (0, 2, 4, 1)])
def test_every_tile_once_and_program_p_takes_p_plus_multiples_of_the_grid(blocks, n_tiles, programs, group):
    tiles = schedule.tile_schedule(blocks, n_tiles, programs, group)
    assert [t.tile for t in tiles] == list(range(blocks * n_tiles))
    assert sorted((t.pid_m, t.pid_n) for t in tiles) == [(m, n) for m in range(blocks) for n in range(n_tiles)]
    assert all(t.program == t.tile % programs and t.step == t.tile // programs for t in tiles)


def test_bad_counts_raise():
    for args in ((-1, 2, 4), (3, 0, 4), (3, 2, 0), (3, 2, 4, 0), (3.0, 2, 4), (True, 2, 4)):
        with pytest.raises(ValueError, match="must be an int"):
            schedule.tile_schedule(*args)
    with pytest.raises(ValueError, match="fewer than num_used_blocks"):
        schedule.plot_tile_schedule([0, 1], 3, 2, 4)
    with pytest.raises(ValueError, match="block_size_n of 32"):
        schedule.plot_swiglu_rows(48, 31, 0)
    with pytest.raises(ValueError, match="must be an int"):
        schedule.plot_swiglu_rows(48.0, 32, 0)
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
