"""Where kernels run, and what the interpreter needs from its environment."""

import os

import pytest

from moe_lab import runtime
from moe_lab.runtime import interpreter_numpy_problem

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@pytest.mark.parametrize(
    "triton_version, numpy_version, broken",
    [
        ("3.6.0", "2.4.6", True),
        ("3.5.1", "2.4.0rc1", True),
        ("3.6.0+git1a2b3c", "2.5.0", True),
        ("3.6.0", "2.3.5", False),
        ("3.7.1", "2.4.6", False),
        ("3.9.0", "2.5.1", False),
        ("3.6.0", "1.26.4", False),
    ],
)
def test_interpreter_numpy_problem(triton_version, numpy_version, broken):
    problem = interpreter_numpy_problem(triton_version, numpy_version)
    assert bool(problem) == broken
    if broken:  # says what is wrong and what to install
        assert triton_version in problem and numpy_version in problem and "numpy < 2.4" in problem


def test_environment_problem_names_broken_numpy_under_the_interpreter_only(monkeypatch):
    import numpy
    import triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    assert "numpy < 2.4" in runtime.environment_problem()
    runtime.select_backend()  # raises nothing: `import moe_lab` succeeds so that `moe-lab doctor` can run
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled kernels do not use numpy
    assert runtime.environment_problem() is None


def test_launches_from_several_threads_give_right_answers():
    """The interpreter is not thread-safe; launchers serialize themselves under it (4 threads raised
    interpreter errors in 19 of 28 calls before)."""
    import threading

    import torch

    import moe_lab

    from .conftest import random_layer

    hs, w1, w2, tw, ti = random_layer(9, 4, 2, 32, 48, torch.float32)
    ref = moe_lab.fused_moe_reference(hs, w1, w2, tw, ti)
    results = []

    def work():
        for _ in range(3):
            try:
                results.append(moe_lab.relative_error(moe_lab.fused_moe(hs, w1, w2, tw, ti), ref))
            except Exception as exc:  # noqa: BLE001 (collected, asserted below)
                results.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 12 and all(isinstance(r, float) and r < 1e-4 for r in results), results


def test_unreadable_versions_do_not_block_import():
    assert interpreter_numpy_problem("dev", "2.4.0") is None and interpreter_numpy_problem("3.6.0", "") is None


def test_triton_imported_first_still_runs_the_package_under_the_interpreter(tmp_path):
    """A learner on a laptop who imports triton and writes a kernel and a helper before moe_lab: they and
    Triton's own jit helpers were made for a GPU; moe_lab remakes them for the interpreter and says so."""
    import subprocess
    import sys

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU the interpreter is not switched on")
    script = """
import triton, triton.language as tl, torch
@triton.jit
def twice(x):
    return x * 2
@triton.jit
def before(x_ptr):
    tl.store(x_ptr, twice(tl.max(tl.arange(0, 4).to(tl.float32), axis=0)))
import moe_lab
@triton.jit
def after(x_ptr):
    tl.store(x_ptr, twice(tl.sum(tl.arange(0, 4).to(tl.float32), axis=0)))
x, y = torch.zeros(1), torch.zeros(1)
before[(1,)](x)
after[(1,)](y)
ids = torch.tensor([[0, 1]] * 3, dtype=torch.int32)
out = moe_lab.fused_moe(torch.randn(3, 16), torch.randn(2, 32, 16), torch.randn(2, 16, 16), torch.rand(3, 2), ids)
print(x.item(), y.item(), tuple(out.shape))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = tmp_path / "learner.py"  # a file: @triton.jit reads its kernels' source
    path.write_text(script)
    run = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["6.0", "12.0", "(3,", "16)"]
    assert "__main__ (twice, before) were remade" in run.stderr and "import moe_lab first" in run.stderr
