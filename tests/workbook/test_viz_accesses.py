"""plot_accesses: one row per program, the out-of-bounds cells red."""

import pytest
import torch

from moe_lab.runtime import default_device
from moe_lab.workbook.guarded import run_guarded
from tests.workbook.test_exercise_scale import unmasked

pytest.importorskip("matplotlib")
from moe_lab.workbook.viz.accesses import plot_accesses  # noqa: E402


def _run():
    x = torch.randn(1000, device=default_device())
    return run_guarded(unmasked, (4,), x_ptr=x, out_ptr=torch.zeros_like(x), alpha=2.0, n=1000, BLOCK=256)


def test_the_unmasked_tail_is_drawn_out_of_bounds():
    fig = plot_accesses(_run(), "out_ptr")
    ax = fig.axes[0]
    assert "24 out of bounds" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3"]
    assert ax.get_xlim()[1] == pytest.approx(1023.5)


def test_bad_arguments_are_named():
    run = _run()
    with pytest.raises(ValueError, match="tensor must be one of"):
        plot_accesses(run, "y_ptr")
    with pytest.raises(ValueError, match="kind must be"):
        plot_accesses(run, "out_ptr", kind="write")
    with pytest.raises(TypeError, match=r"run must be a GuardedRun .*got dict"):
        plot_accesses({"out_ptr": torch.zeros(4)}, "out_ptr")
    with pytest.raises(TypeError, match=r"tensor must be a parameter name \(str\) of \['out_ptr', 'x_ptr'\], got list"):
        plot_accesses(run, ["out_ptr"])
