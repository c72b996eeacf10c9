"""workbook.capture_device_print: descriptor 1's text shown through sys.stdout (the cell), on a GPU around a
`tl.device_print` kernel; a pass-through under the interpreter."""

import os

import pytest
import torch
import triton
import triton.language as tl

from moe_lab import workbook
from moe_lab.runtime import interpreter_active


def test_captures_descriptor_1_and_prints_it_through_sys_stdout(capfd, monkeypatch):
    written = []
    monkeypatch.setattr("sys.stdout.write", written.append, raising=False)
    with workbook.capture_device_print(enabled=True):
        os.write(1, b"from fd 1\n")
    assert written == ["from fd 1\n"]  # through sys.stdout, once
    assert capfd.readouterr().out == ""  # nothing reached descriptor 1 itself


def test_restores_descriptor_1_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError, match="launch failed"):
        with workbook.capture_device_print(enabled=True):
            os.write(1, b"before the error\n")
            raise RuntimeError("launch failed")
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "before the error\nafter\n"


@pytest.mark.parametrize("enabled", [False, None])
def test_passes_through_when_disabled_and_by_default_under_the_interpreter(capfd, enabled):
    if enabled is None and not interpreter_active():
        pytest.skip("the interpreter is off")
    with workbook.capture_device_print(enabled=enabled):
        os.write(1, b"straight to fd 1\n")
    assert capfd.readouterr().out == "straight to fd 1\n"


@triton.jit
def _device_print_kernel(x_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.device_print("peek x", x)


@pytest.mark.gpu
def test_device_print_on_cuda_reaches_sys_stdout(capfd):
    x = torch.arange(4, dtype=torch.int32, device="cuda") + 40
    torch.cuda.synchronize()
    capfd.readouterr()
    with workbook.capture_device_print():
        _device_print_kernel[(1,)](x, BLOCK=4)
    out = capfd.readouterr().out
    assert out.count("peek x") >= 4, out  # a line per element (threads holding a copy print it too)
    assert all(str(v) in out for v in (40, 41, 42, 43)), out
