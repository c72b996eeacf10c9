"""The repository's conftest.py: nbval starts a notebook's kernel again once when it dies before replying."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def restart_once():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.restart_once


def starter(errors):
    """A stand-in for nbval's start_new_kernel: raises the given errors in turn, then returns its arguments."""
    calls = []

    def start(**kwargs):
        calls.append(kwargs)
        kwargs["stderr"].write("zmq.error.ZMQError: Address already in use\n")
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "km", "kc"

    return start, calls


def test_a_kernel_that_dies_once_is_started_again_with_a_warning_that_quotes_its_stderr():
    start, calls = starter([RuntimeError("Kernel died before replying to kernel_info")])
    with pytest.warns(RuntimeWarning, match="died before replying.*starting it again.*Address already in use"):
        assert restart_once()(start)(kernel_name="python3", cwd="/tmp") == ("km", "kc")
    assert [c["kernel_name"] for c in calls] == ["python3", "python3"]


def test_a_kernel_that_dies_twice_is_an_error_with_its_stderr():
    died = RuntimeError("Kernel died before replying to kernel_info")
    start, calls = starter([died, died])
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match=r"\(twice\).*Address already in use"):
        restart_once()(start)(kernel_name="python3")
    assert len(calls) == 2


def test_other_errors_are_not_retried():
    start, calls = starter([RuntimeError("Kernel didn't respond in 60 seconds")])
    with pytest.raises(RuntimeError, match="didn't respond"):
        restart_once()(start)(kernel_name="python3")
    assert len(calls) == 1


def test_nbval_uses_it():
    import nbval.kernel

    assert nbval.kernel.start_new_kernel.__qualname__ == "restart_once.<locals>.start_new_kernel"
