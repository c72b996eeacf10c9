"""Helpers for the notebooks: checks with a clear pass/fail line, the size to run at, and timing guards.

Kept free of Jupyter, ipywidgets and matplotlib so that tests can call them too.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._validate import FLOAT_DTYPES, INDEX_DTYPES, check_tensor
from ..reference import relative_error
from ..runtime import default_device, interpreter_active


def on_gpu() -> bool:
    """True when kernels run on a CUDA GPU (real sizes), False under the interpreter (scaled sizes)."""
    return default_device().type == "cuda"


def _tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__} (torch.as_tensor makes one)")
    return value


def _first(mask: torch.Tensor) -> tuple:
    return tuple(mask.nonzero()[0].tolist())


def check(label: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-2) -> float:
    """Print 'PASS label: ...' when ||got - want|| / ||want|| < tol; raise AssertionError 'FAIL ...' (with
    the shapes, the error and a hint) otherwise. NaN never passes. An infinity passes where want has the
    same infinity (same place, same sign), and the error is then that of the finite values; an infinity
    in one and not the other fails, naming the first place. Returns the relative error.
    Raises TypeError unless got and want are tensors and tol a number, ValueError unless tol > 0."""
    _tensor("got", got)
    _tensor("want", want)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)):
        raise TypeError(f"tol must be a number > 0 (a relative error, such as 1e-2), got {type(tol).__name__} {tol!r}")
    if not tol > 0:  # (NaN too)
        raise ValueError(f"tol must be a number > 0 (a relative error, such as 1e-2), got {tol!r}")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"FAIL {label}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got_c, want_c = got.detach().cpu(), want.detach().cpu()
    if got_c.is_floating_point() or want_c.is_floating_point():
        infinite = torch.isinf(got_c) | torch.isinf(want_c)
        if infinite.any():
            apart = infinite & (got_c != want_c)
            if apart.any():
                i = _first(apart)
                raise AssertionError(
                    f"FAIL {label}: {int(apart.sum())} infinite value(s) where the other has another value; "
                    f"first at {i}: got {got_c[i].item()}, expected {want_c[i].item()}"
                )
            got_c, want_c = got_c[~infinite], want_c[~infinite]  # the same infinities: compare the rest
    err = relative_error(got_c, want_c)
    if not err < tol:
        nan, nan_want = (int(torch.isnan(t.float()).sum()) for t in (got_c, want_c))
        hint = f"; {nan} NaN value(s): some outputs were never written" if nan else ""
        hint += f"; the reference (want) holds {nan_want} NaN value(s)" if nan_want else ""
        raise AssertionError(f"FAIL {label}: relative error {err:.2e} is not below {tol:.0e}{hint}")
    print(f"PASS {label}: relative error {err:.1e} < {tol:.0e}")
    return err


def check_equal(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Exact comparison for integer results (ids, counts); on failure show the first differing index.
    Compares values, not dtypes (an int32 result equals its int64 reference). For float tensors, NaN
    equals NaN at the same place (and inf equals inf of the same sign): the same values were stored.
    Raises TypeError unless got and want are tensors."""
    got_c, want_c = _tensor("got", got).detach().cpu(), _tensor("want", want).detach().cpu()
    if tuple(got_c.shape) != tuple(want_c.shape):
        raise AssertionError(f"FAIL {label}: shape {tuple(got_c.shape)}, expected {tuple(want_c.shape)}")
    differ = got_c != want_c
    if got_c.is_floating_point() and want_c.is_floating_point():
        differ &= ~(torch.isnan(got_c) & torch.isnan(want_c))
    if differ.any():
        i = _first(differ)
        raise AssertionError(
            f"FAIL {label}: {int(differ.sum())} element(s) differ; first at {i}: got "
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
    experts [R] int in [0, E) -> [R, N] float32. Raises TypeError for arguments that are not tensors or
    integer experts, ValueError for shapes that do not fit and for experts outside [0, E): the package's
    -1 (an id past the end, expert_map's "not on this rank") is not an expert (select those rows first;
    Python's negative index would compute them with the last expert)."""
    floats = FLOAT_DTYPES + (torch.float64,)
    check_tensor("x", x, ndim=2, dtypes=floats, layout="[R, K]")
    check_tensor("w", w, ndim=3, dtypes=floats, shape=(None, None, x.shape[1]), layout="[E, N, K] (K of x)")
    check_tensor("experts", experts, ndim=1, dtypes=INDEX_DTYPES, shape=(x.shape[0],), layout="[R] (R of x)")
    num_experts = w.shape[0]
    outside = (experts < 0) | (experts >= num_experts)
    if outside.any():
        r = int(outside.nonzero()[0])
        raise ValueError(
            f"experts must hold ids in [0, E={num_experts}) (w's experts), got {int(outside.sum())} outside; "
            f"first at row {r}: {int(experts[r])}. Rows of padding or of another rank's experts (id -1 or "
            "E) have no expert here: select the other rows first"
        )
    out = torch.empty(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    for e in experts.unique().tolist():
        rows = experts == e
        out[rows] = x[rows].float() @ w[e].float().T
    return out
