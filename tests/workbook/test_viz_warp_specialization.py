"""Notebook 10's schematic timeline and its table of the committed Gluon FP8 measurements."""

import pytest

from moe_lab.tools import look_inside
from moe_lab.workbook.viz import warp_specialization as ws


def test_the_schedules_keep_the_tensor_cores_busier_in_order():
    busy = [ws.tensor_core_busy(ws.timeline(s)) for s in ("one warpgroup", "warp-specialized", "ping-pong")]
    assert busy[0] < busy[1] < busy[2] == pytest.approx(1.0)


@pytest.mark.parametrize("schedule", list(ws.SCHEDULES))
def test_each_wgmma_has_its_box_loaded_before_it_starts(schedule):
    segments = ws.timeline(schedule)
    loads = sorted((s for s in segments if s.kind == "load"), key=lambda s: s.start)
    mmas = sorted((s for s in segments if s.kind == "mma"), key=lambda s: s.start)
    assert len(loads) == len(mmas) == ws.K_BLOCKS * ws.TILES
    assert all(load.start + load.length <= mma.start + 1e-9 for load, mma in zip(loads, mmas))
    assert min(s.start for s in segments) == 0
    assert {s.lane for s in segments} <= set(ws.LANES[schedule])


def test_an_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="schedule must be one of"):
        ws.timeline("round robin")


def test_the_steps_table_reads_every_step_from_the_committed_results():
    results = ws.load_gluon_results()
    table = ws.steps_table(results, tokens=16384)
    for variant in ws.STEPS:
        row = next(r for r in results["rows"] if r["variant"] == variant and r["T"] == 16384)
        assert variant in table and f"{row['tflops']:.0f} ({row['vs_triton_fp8']:.2f})" in table


def test_look_inside_names_a_block_size_the_gluon_kernel_lacks():
    with pytest.raises(ValueError, match="block_m must be 64 or 128"):
        look_inside.compile_gluon_fp8(block_m=32)


@pytest.mark.parametrize(
    "schedules,error,match",
    [
        ("ping-pong", TypeError, r"schedules must be a sequence of schedule names .*got str"),
        ((), ValueError, r"schedules must name at least one of \['one warpgroup'"),
        (["ping-pong", "round robin"], ValueError, r"schedule must be one of .*got 'round robin'"),
    ],
)
def test_plot_timeline_names_bad_schedules(schedules, error, match):
    with pytest.raises(error, match=match):
        ws.plot_timeline(schedules)


def test_plot_timeline_draws_a_chosen_schedule():
    assert len(ws.plot_timeline(["ping-pong"]).axes) == 1


def test_steps_table_and_busy_fraction_refuse_what_they_cannot_show():
    results = ws.load_gluon_results()
    with pytest.raises(ValueError, match=r"tokens must be one of the measured T \[.*16384.*\], got 3"):
        ws.steps_table(results, tokens=3)
    with pytest.raises(TypeError, match=r"tokens \(the token count\) must be an int"):
        ws.steps_table(results, tokens="512")
    with pytest.raises(ValueError, match=r"segments must hold at least one wgmma"):
        ws.tensor_core_busy([])
