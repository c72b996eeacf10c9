"""Where Triton kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

The interpreter must be switched on before any `@triton.jit` function is defined, so `import moe_lab`
calls `select_backend()` before it imports its kernels: with no CUDA device and `TRITON_INTERPRET` unset,
it sets `TRITON_INTERPRET=1`. Set `TRITON_INTERPRET` yourself to decide either way.
"""
from __future__ import annotations

import os

import torch


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def select_backend() -> None:
    """Switch the interpreter on when no CUDA device exists and the user has not chosen."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def default_device() -> torch.device:
    """The device tensors should live on: CUDA if it runs kernels, else the CPU (interpreter)."""
    if torch.cuda.is_available() and not interpreter_active():
        return torch.device("cuda")
    return torch.device("cpu")


def require_gpu_timing(what: str = "timing") -> None:
    """Raise `RuntimeError` where timings would mean nothing: under the interpreter or with no GPU."""
    if interpreter_active():
        raise RuntimeError(
            f"{what} refused: Triton's interpreter is on (TRITON_INTERPRET=1), which runs kernels on the CPU "
            "one program at a time; its timings say nothing about a GPU. Run on a CUDA GPU without "
            "TRITON_INTERPRET, or look at the committed H200 results in benchmarks/results/.")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} refused: no CUDA GPU is visible to PyTorch.")
