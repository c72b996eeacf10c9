"""Notebook 00's exercise: `scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK)` stores out[i] = alpha * x[i]."""

from __future__ import annotations

import torch
import triton

from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

N, BLOCK, ALPHA = 1000, 256, 2.5  # n is not a multiple of BLOCK: the last program must mask
N2, BLOCK2, ALPHA2 = 777, 128, -1.5  # the second launch: other sizes (n again not a multiple of BLOCK), alpha
SIZES_HINT = (
    f"look for a size written into the kernel (1000, 256, {triton.cdiv(N, BLOCK)} programs, alpha {ALPHA}) where "
    "the arguments n, BLOCK and alpha belong: the mask is `offs < n`"
)

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


def _launch(kernel, n: int, block: int, alpha: float = ALPHA):
    x = torch.randn(n, device=default_device())
    out = torch.full_like(x, float("nan"))
    return x, run_guarded(kernel, (triton.cdiv(n, block),), x_ptr=x, out_ptr=out, alpha=alpha, n=n, BLOCK=block)


def _second_size(kernel):
    x, run = _launch(kernel, N2, BLOCK2, ALPHA2)
    problem = diagnose(run, "out_ptr", ALPHA2 * x, tol=1e-6)
    offsets = run.offsets()
    hint = SIZES_HINT
    if run.out_of_bounds and offsets.size and ((offsets >= N2) & (offsets < N)).all():
        hint = f"the mask compares with {N}, the first launch's n: use the argument, `offs < n`"
    return at_other_sizes(
        problem, f"n = {N}, BLOCK = {BLOCK}, alpha = {ALPHA}", f"n = {N2}, BLOCK = {BLOCK2}, alpha = {ALPHA2}", hint
    )


def _offsets_without_block(x: torch.Tensor) -> torch.Tensor:
    """out after programs that store offs = program_id(0) + tl.arange(0, BLOCK): the first BLOCK + P - 1
    values (P programs), each written by one or more programs, and nothing after them."""
    out = torch.full_like(x, float("nan"))
    reach = BLOCK + triton.cdiv(N, BLOCK) - 1
    out[:reach] = ALPHA * x[:reach]
    return out


def check_scale(kernel, strict: bool = False) -> Verdict:
    """Grade `scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr)` on n = 1000, BLOCK = 256
    (4 programs), alpha = 2.5, then (if right there) on n = 777, BLOCK = 128 (7 programs), alpha = -1.5:
    float32 `x`, `out` poisoned with NaN. Names: sizes written into the kernel (right at the first sizes only:
    `offs < 1000` named), a missing mask (out-of-bounds load or store within the last block's spill, n .. n +
    BLOCK - 1), wrong offsets (out of bounds anywhere else: a stride, a wrapping int8 cast), alpha left out,
    only the first block written (offsets without `program_id * BLOCK`), overlapping blocks (`program_id +
    arange`), blocks stored by two programs (a race)."""
    x, run = _launch(kernel, N, BLOCK)
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
        then=(f"and with n = {N2}, BLOCK = {BLOCK2}, alpha = {ALPHA2}", lambda: _second_size(kernel)),
        mistakes=[
            ("out equals x: multiply by alpha before storing", x),
            (
                "only the first block is right: every program works on block 0; start at program_id(0) * BLOCK",
                first_block,
            ),
            (
                "only the first values are right: the offsets are program_id(0) + tl.arange(0, BLOCK), so "
                "the programs' blocks overlap, each one element further on. Program p's block starts at "
                "p * BLOCK: offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                _offsets_without_block(x),
            ),
        ],
    )
