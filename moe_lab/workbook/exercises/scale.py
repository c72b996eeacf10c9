"""Notebook 00's exercise: `scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK)` stores out[i] = alpha * x[i]."""

from __future__ import annotations

import torch
import triton

from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, grade

N, BLOCK, ALPHA = 1000, 256, 2.5  # n is not a multiple of BLOCK: the last program must mask

MASK_HINT = f"n = {N} is not a multiple of BLOCK = {BLOCK}: mask the last block's load and store with `offs < n`"
OFFSETS_HINT = (
    f"the offsets are wrong, not just unmasked: a missing mask reaches only elements n .. n + BLOCK - 1 "
    f"= {N} .. {N + BLOCK - 1}, and these accesses land elsewhere. Program p's elements are offs = "
    "p * BLOCK + tl.arange(0, BLOCK) (element offsets: no stride, no byte size), kept in int32: a cast to "
    "int8 or int16 wraps them around (negative offsets)"
)


def _bounds_hint(run) -> str:
    """The mask hint when every access outside x or out falls in the last block's spill, [n, n + BLOCK);
    else the offsets themselves are wrong (a stride, a cast that wraps, a wild pointer)."""
    if any(o.far for o in run.out_of_bounds):
        return OFFSETS_HINT
    offsets = run.offsets()
    if offsets.size and not ((offsets >= N) & (offsets < N + BLOCK)).all():
        return OFFSETS_HINT
    return MASK_HINT


def check_scale(kernel, strict: bool = False) -> Verdict:
    """Grade `scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr)` on n = 1000, BLOCK = 256
    (4 programs): float32 `x`, `out` poisoned with NaN. Names: a missing mask (out-of-bounds load or
    store within the last block's spill, n .. n + BLOCK - 1), wrong offsets (out of bounds anywhere else:
    a stride, a wrapping int8 cast), alpha left out, only the first block written (offsets without
    `program_id * BLOCK`)."""
    x = torch.randn(N, device=default_device())
    run = run_guarded(
        kernel,
        (triton.cdiv(N, BLOCK),),
        x_ptr=x,
        out_ptr=torch.full_like(x, float("nan")),
        alpha=ALPHA,
        n=N,
        BLOCK=BLOCK,
    )
    first_block = torch.full_like(x, float("nan"))
    first_block[:BLOCK] = ALPHA * x[:BLOCK]
    return grade(
        "scale_kernel",
        run,
        "out_ptr",
        ALPHA * x,
        tol=1e-6,
        strict=strict,
        out_of_bounds_hint=_bounds_hint(run),
        mistakes=[
            ("out equals x: multiply by alpha before storing", x),
            (
                "only the first block is right: every program works on block 0; start at program_id(0) * BLOCK",
                first_block,
            ),
        ],
    )
