"""Notebook 01's exercise: `renormalize_kernel` divides each token's top-k routing weights by their sum.

    renormalize_kernel(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
                       BLOCK_K: tl.constexpr)

One program per token t: out[t, j] = topk_weights[t, j] / sum_j' topk_weights[t, j'] for j < top_k.
"""
from __future__ import annotations

import torch

from ..guarded import run_guarded
from ..runtime import default_device
from ._grade import Verdict, grade

NUM_TOKENS, NUM_EXPERTS = 37, 64
TOP_K, BLOCK_K = 6, 8            # top_k is not a power of two: lanes 6 and 7 of each program must be masked
ROW_STRIDE = 8                   # topk_weights is a [T, 8] buffer sliced to [:, :6]

MASK_HINT = (f"top_k = {TOP_K} is not a power of two, so each program has BLOCK_K = {BLOCK_K} lanes and the "
             f"last {BLOCK_K - TOP_K} are not slots of the token: mask them with `j < top_k` on the load "
             "(other=0.0, so they add nothing to the sum) and on the store")


def _stride_hint(run) -> str:
    """What a kernel that is right only on a contiguous topk_weights got wrong: the row stride it used."""
    where = {o.tensor for o in run.out_of_bounds}
    hints = []
    if "topk_weights_ptr" in where or not where:
        hints.append(f"Wrong stride: row t of topk_weights starts at t * weights_row_stride (= {ROW_STRIDE} "
                     f"here: the weights are a [T, {ROW_STRIDE}] buffer sliced to [:, :{TOP_K}]), not at "
                     "t * top_k; a kernel that assumes contiguous rows reads the wrong tokens' weights")
    if "out_ptr" in where:
        hints.append("Wrong stride: row t of out starts at t * out_row_stride (out is contiguous, "
                     f"[T, {TOP_K}]), not at t * weights_row_stride")
    return "; ".join(hints)


def check_renormalize(kernel, strict: bool = False) -> Verdict:
    """Grade `renormalize_kernel(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
    BLOCK_K: tl.constexpr)`, launched with one program per token (grid (T,)).

    Sizes: T = 37 tokens, top_k = 6 of E = 64 experts, BLOCK_K = 8. `topk_weights` [T, 6] float32 (the
    top-6 softmax probabilities of random logits, descending) is a view of a [T, 8] buffer
    (weights_row_stride = 8, column stride 1); `out` [T, 6] float32 contiguous (out_row_stride = 6),
    poisoned with NaN. Names: a missing mask (lanes 6 and 7: out of bounds), rows stepped by top_k instead
    of weights_row_stride (found by a second launch on a contiguous copy, where that kernel is right),
    out equal to the input (not normalised), division by the row's maximum instead of its sum, a softmax
    of the weights, and every program working on token 0.
    """
    device = default_device()
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS, device=device)
    weights = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1).values
    buffer = torch.full((NUM_TOKENS, ROW_STRIDE), float("nan"), device=device)
    buffer[:, :TOP_K] = weights
    topk_weights = buffer[:, :TOP_K]
    want = weights / weights.sum(dim=-1, keepdim=True)

    def launch(w):
        out = torch.full((NUM_TOKENS, TOP_K), float("nan"), device=device)
        return run_guarded(kernel, (NUM_TOKENS,), topk_weights_ptr=w, out_ptr=out,
                           weights_row_stride=w.stride(0), out_row_stride=out.stride(0), top_k=TOP_K,
                           BLOCK_K=BLOCK_K)

    run = launch(topk_weights)
    hint = MASK_HINT
    if run.error is None and (run.out_of_bounds or not _close_enough(run.tensors["out_ptr"], want)):
        contiguous = launch(weights.contiguous())   # weights_row_stride = top_k: a stride mistake is harmless
        if contiguous.clean and _close_enough(contiguous.tensors["out_ptr"], want):
            hint = _stride_hint(run)
            if not run.out_of_bounds:   # on a GPU a read in the gaps may go unseen: say it in the result
                return grade("renormalize_kernel", run, "out_ptr", want, tol=1e-6, strict=strict,
                             mistakes=[(hint, run.tensors["out_ptr"])])
    return grade("renormalize_kernel", run, "out_ptr", want, tol=1e-6, strict=strict,
                 out_of_bounds_hint=hint,
                 mistakes=[("out equals topk_weights: not normalised; divide each weight by the sum of its "
                            "row (tl.sum(w, axis=0))", weights),
                           ("each row was divided by its largest weight: divide by the row's sum "
                            "(tl.sum), not tl.max", weights / weights.amax(dim=-1, keepdim=True)),
                           ("you applied a softmax: the weights are probabilities already; divide them by "
                            "their sum instead", torch.softmax(weights, dim=-1)),
                           ("every row is token 0's: each program must load and store its own token's row, "
                            "t = tl.program_id(0)", want[:1].expand_as(want))])


def _close_enough(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got, want, rtol=1e-5, atol=1e-7))
