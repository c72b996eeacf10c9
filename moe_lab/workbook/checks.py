"""Helpers for the notebooks: checks with a clear pass/fail line, the size to run at, and timing guards.

Kept free of Jupyter, ipywidgets and matplotlib so that tests can call them too.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..reference import relative_error
from ..runtime import default_device, interpreter_active


def on_gpu() -> bool:
    """True when kernels run on a CUDA GPU (real sizes), False under the interpreter (scaled sizes)."""
    return default_device().type == "cuda"


def check(label: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-2) -> float:
    """Print 'PASS label: ...' when ||got - want|| / ||want|| < tol; raise AssertionError 'FAIL ...' (with
    the shapes, the error and a hint) otherwise. NaN never passes. Returns the relative error."""
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"FAIL {label}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    err = relative_error(got, want)
    if not err < tol:
        nan = int(torch.isnan(got.float()).sum())
        hint = f"; {nan} NaN value(s): some outputs were never written" if nan else ""
        raise AssertionError(f"FAIL {label}: relative error {err:.2e} is not below {tol:.0e}{hint}")
    print(f"PASS {label}: relative error {err:.1e} < {tol:.0e}")
    return err


def check_equal(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Exact comparison for integer results (ids, counts); on failure show the first differing index."""
    got_c, want_c = got.cpu(), want.cpu()
    if tuple(got_c.shape) != tuple(want_c.shape):
        raise AssertionError(f"FAIL {label}: shape {tuple(got_c.shape)}, expected {tuple(want_c.shape)}")
    diff = (got_c != want_c).nonzero()
    if len(diff):
        i = tuple(diff[0].tolist())
        raise AssertionError(
            f"FAIL {label}: {len(diff)} element(s) differ; first at {i}: got "
            f"{got_c[i].item()}, expected {want_c[i].item()}"
        )
    print(f"PASS {label}: all {want_c.numel()} values equal")


def timing_allowed(what: str = "this timing cell") -> bool:
    """False (and say why) under the interpreter or without a GPU: timings there mean nothing."""
    if interpreter_active() or not torch.cuda.is_available():
        print(
            f"Skipping {what}: kernels run under Triton's interpreter on the CPU here, one program at a "
            "time, so a time would say nothing about a GPU. The committed H200 results are shown instead "
            "where a notebook has them."
        )
        return False
    return True


def pick(gpu_value, cpu_value, override: Optional[object] = None):
    """`override` if given, else the GPU or CPU value for this machine."""
    if override is not None:
        return override
    return gpu_value if on_gpu() else cpu_value


def fp32_dot_tol() -> float:
    """Tolerance for a float32 Triton `tl.dot` in a notebook kernel against a float32 PyTorch result. A
    notebook's own `tl.dot` on a GPU uses Triton's default, TF32 on the tensor cores (10-bit mantissa:
    relative error near 1e-3); moe_lab's kernels instead follow `torch.get_float32_matmul_precision()`
    (full float32 by default). The interpreter multiplies in float32 with numpy (near 1e-6)."""
    return 5e-3 if on_gpu() else 1e-5


def expert_rows_matmul(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Row r of the result is x[r] @ w[experts[r]].T, in float32, computed one expert at a time (a
    batched einsum over [R, N, K] would not fit in memory at real sizes). x [R, K], w [E, N, K],
    experts [R] int -> [R, N] float32."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    for e in experts.unique().tolist():
        rows = experts == e
        out[rows] = x[rows].float() @ w[e].float().T
    return out
