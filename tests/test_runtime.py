"""Where kernels run, and what the interpreter needs from its environment."""
import pytest

from moe_lab import runtime
from moe_lab.runtime import interpreter_numpy_problem


@pytest.mark.parametrize("triton_version, numpy_version, broken", [
    ("3.6.0", "2.4.6", True), ("3.5.1", "2.4.0rc1", True), ("3.6.0+git1a2b3c", "2.5.0", True),
    ("3.6.0", "2.3.5", False), ("3.7.1", "2.4.6", False), ("3.9.0", "2.5.1", False), ("3.6.0", "1.26.4", False),
])
def test_interpreter_numpy_problem(triton_version, numpy_version, broken):
    problem = interpreter_numpy_problem(triton_version, numpy_version)
    assert bool(problem) == broken
    if broken:  # says what is wrong and what to install
        assert triton_version in problem and numpy_version in problem and "numpy < 2.4" in problem


def test_select_backend_refuses_interpreter_with_broken_numpy(monkeypatch):
    import numpy
    import triton
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    with pytest.raises(RuntimeError, match=r"numpy < 2\.4"):
        runtime.select_backend()
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled kernels do not use numpy
    runtime.select_backend()


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
