"""Notebook 01's exercise: `renormalize_kernel` divides each token's top-k routing weights by their sum.

    renormalize_kernel(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
                       BLOCK_K: tl.constexpr)

One program per token t: out[t, j] = topk_weights[t, j] / sum_j' topk_weights[t, j'] for j < top_k.
"""

from __future__ import annotations

import torch

from ...reference import relative_error
from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

NUM_TOKENS, NUM_EXPERTS = 37, 64
TOP_K, BLOCK_K = 6, 8  # top_k is not a power of two: lanes 6 and 7 of each program must be masked
ROW_STRIDE = 8  # topk_weights is a [T, 8] buffer sliced to [:, :6]
# the second launch, once the first is right: other sizes (top_k = 3 in lanes of 4, rows 5 apart)
NUM_TOKENS2, TOP_K2, BLOCK_K2, ROW_STRIDE2 = 11, 3, 4, 5
OTHER_HINT = "other=0.0, so that the masked lanes add nothing to the sum"

MASK_HINT = (
    f"top_k = {TOP_K} is not a power of two, so each program has BLOCK_K = {BLOCK_K} lanes and the "
    f"last {BLOCK_K - TOP_K} are not slots of the token: mask them with `j < top_k` on the load "
    "(other=0.0, so they add nothing to the sum) and on the store"
)


def _stride_hint(run) -> str:
    """What a kernel that is right only on a contiguous topk_weights got wrong: the row stride it used."""
    where = {o.tensor for o in run.out_of_bounds}
    hints = []
    if "topk_weights_ptr" in where or not where:
        hints.append(
            f"Wrong stride: row t of topk_weights starts at t * weights_row_stride (= {ROW_STRIDE} "
            f"here: the weights are a [T, {ROW_STRIDE}] buffer sliced to [:, :{TOP_K}]), not at "
            "t * top_k; a kernel that assumes contiguous rows reads the wrong tokens' weights"
        )
    if "out_ptr" in where:
        hints.append(
            "Wrong stride: row t of out starts at t * out_row_stride (out is contiguous, "
            f"[T, {TOP_K}]), not at t * weights_row_stride"
        )
    return "; ".join(hints)


def _inputs(num_tokens: int, top_k: int, row_stride: int):
    """(topk_weights [T, top_k], a view of a [T, row_stride] buffer; the right out)."""
    device = default_device()
    logits = torch.randn(num_tokens, NUM_EXPERTS, device=device)
    weights = torch.softmax(logits, dim=-1).topk(top_k, dim=-1).values
    buffer = torch.full((num_tokens, row_stride), float("nan"), device=device)
    buffer[:, :top_k] = weights
    return buffer[:, :top_k], weights / weights.sum(dim=-1, keepdim=True)


def _launch(kernel, w: torch.Tensor, block_k: int):
    out = torch.full(w.shape, float("nan"), device=w.device)
    return run_guarded(
        kernel,
        (w.shape[0],),
        topk_weights_ptr=w,
        out_ptr=out,
        weights_row_stride=w.stride(0),
        out_row_stride=out.stride(0),
        top_k=w.shape[1],
        BLOCK_K=block_k,
    )


def _second_size(kernel):
    w, want = _inputs(NUM_TOKENS2, TOP_K2, ROW_STRIDE2)
    problem = diagnose(_launch(kernel, w, BLOCK_K2), "out_ptr", want, tol=1e-6, undefined_hint=OTHER_HINT)
    return at_other_sizes(
        problem,
        f"T = {NUM_TOKENS}, top_k = {TOP_K}, BLOCK_K = {BLOCK_K}",
        f"T = {NUM_TOKENS2}, top_k = {TOP_K2}, BLOCK_K = {BLOCK_K2}, weights_row_stride = {ROW_STRIDE2}",
        f"look for a size written into the kernel ({TOP_K}, {BLOCK_K}, {ROW_STRIDE}) where top_k, BLOCK_K and "
        "the strides belong",
    )


def check_renormalize(kernel, strict: bool = False) -> Verdict:
    """Grade `renormalize_kernel(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
    BLOCK_K: tl.constexpr)`, launched with one program per token (grid (T,)).

    Sizes: T = 37 tokens, top_k = 6 of E = 64 experts, BLOCK_K = 8. `topk_weights` [T, 6] float32 (the
    top-6 softmax probabilities of random logits, descending) is a view of a [T, 8] buffer
    (weights_row_stride = 8, column stride 1); `out` [T, 6] float32 contiguous (out_row_stride = 6),
    poisoned with NaN. Then, if right, a second launch at other sizes (T = 11, top_k = 3, BLOCK_K = 4,
    weights_row_stride = 5) for sizes written into the kernel. Names: a masked load without other=0.0 (its
    masked lanes are NaN here, as undefined as on a GPU), a missing mask (lanes 6 and 7: out of bounds),
    rows stepped by top_k instead of weights_row_stride (found by a second launch on a contiguous copy,
    where that kernel is right), out equal to the input (not normalised), division by the row's maximum
    instead of its sum, a softmax of the weights, every program working on token 0 (storing into every
    row, or into row 0 only), and float16 rounding.
    """
    topk_weights, want = _inputs(NUM_TOKENS, TOP_K, ROW_STRIDE)
    weights = topk_weights.contiguous()

    def launch(w):
        return _launch(kernel, w, BLOCK_K)

    run = launch(topk_weights)
    row_zero_only = torch.full_like(want, float("nan"))
    row_zero_only[0] = want[0]
    hint = MASK_HINT
    if run.error is None and (run.out_of_bounds or not _close_enough(run.tensors["out_ptr"], want)):
        contiguous = launch(weights.contiguous())  # weights_row_stride = top_k: a stride mistake is harmless
        if contiguous.clean and _close_enough(contiguous.tensors["out_ptr"], want):
            hint = _stride_hint(run)
            if not run.out_of_bounds:  # on a GPU a read in the gaps may go unseen: say it in the result
                return grade(
                    "renormalize_kernel",
                    run,
                    "out_ptr",
                    want,
                    tol=1e-6,
                    strict=strict,
                    mistakes=[(hint, run.tensors["out_ptr"])],
                    then=(f"and at a second size (T = {NUM_TOKENS2}, top_k = {TOP_K2})", lambda: _second_size(kernel)),
                )
    return grade(
        "renormalize_kernel",
        run,
        "out_ptr",
        want,
        tol=1e-6,
        strict=strict,
        out_of_bounds_hint=hint,
        undefined_hint=OTHER_HINT,
        then=(f"and at a second size (T = {NUM_TOKENS2}, top_k = {TOP_K2})", lambda: _second_size(kernel)),
        mistakes=[
            (
                "out equals topk_weights: not normalised; divide each weight by the sum of its row (tl.sum(w, axis=0))",
                weights,
            ),
            (
                "each row was divided by its largest weight: divide by the row's sum (tl.sum), not tl.max",
                weights / weights.amax(dim=-1, keepdim=True),
            ),
            (
                "you applied a softmax: the weights are probabilities already; divide them by their sum instead",
                torch.softmax(weights, dim=-1),
            ),
            (
                "every row is token 0's: each program must load and store its own token's row, t = tl.program_id(0)",
                want[:1].expand_as(want),
            ),
            (
                f"the masked lanes added {BLOCK_K - TOP_K} to each row's sum: the load's other= gave "
                "them 1.0 (or another non-zero value); use other=0.0, which adds nothing",
                weights / (weights.sum(dim=-1, keepdim=True) + (BLOCK_K - TOP_K)),
            ),
            (
                "only row 0 was written: every program worked on token 0 (t = tl.program_id(1), or "
                "no program id at all, is 0 for every program of this 1-D grid); t = "
                "tl.program_id(0)",
                row_zero_only,
            ),
            *_float16_rounding(run.tensors["out_ptr"], want, weights),
        ],
    )


def _float16_rounding(got: torch.Tensor, want: torch.Tensor, weights: torch.Tensor):
    """[(explanation, got)] when `got` is `want` up to float16 rounding, else []: recognised by its rounding
    (every value a float16 number, or far closer to the result from float16-rounded weights than to the
    truth, or an error at float16's level: a float32 kernel is near 1e-7 here, and a GPU's float16 sum
    rounds in its own order), not by one exact result."""
    if not torch.isfinite(got).all():
        return []
    error = relative_error(got, want)
    if not 1e-6 <= error < 2e-3:
        return []
    w16 = weights.half().float()
    sum32, sum16 = w16.sum(dim=-1, keepdim=True), w16.sum(dim=-1, keepdim=True).half().float()
    rounded = [w16 / sum32, w16 / sum16, (w16 / sum16).half().float()]  # where float16 came in, and left
    if not (
        torch.equal(got.half().float(), got)
        or min(relative_error(got, r) for r in rounded) < 0.3 * error
        or error >= 5e-5
    ):
        return []
    return [
        (
            f"float16 rounding (relative error {error:.1e}): the weights or their sum went through float16. Keep "
            "them float32, as loaded (no .to(tl.float16))",
            got,
        )
    ]


def _close_enough(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got, want, rtol=1e-5, atol=1e-7))
