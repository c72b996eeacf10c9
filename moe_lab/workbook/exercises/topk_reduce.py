"""Notebook 06's exercise: the top-k reduce, each token's k expert rows weighted and summed.

    topk_reduce_kernel(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                       TOP_K: tl.constexpr, BLOCK_H: tl.constexpr)

stores out[t, :] = sum over j < TOP_K of topk_weights[t, j] * y[t * TOP_K + j, :], with one program per
(token t = program_id(0), block of BLOCK_H columns = program_id(1)). y [num_slots, H] holds the down GEMM's
rows, one per (token, k) slot: slot j of token t is row t * TOP_K + j.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import triton

from ...reference import relative_error
from ...runtime import default_device
from ..guarded import GuardedRun, run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

# T * TOP_K = 30 slots; TOP_K = 6 is not a power of two; H = 200 is not a multiple of BLOCK_H = 64 (the last
# H block has 8 columns). y and topk_weights are views of wider buffers: their row strides (224 and 8)
# are not H and TOP_K, so a kernel must use the strides it is given.
T, TOP_K, H, BLOCK_H = 5, 6, 200, 64
Y_ROW_STRIDE, W_ROW_STRIDE = 224, 8
# the second launch, once the first is right: other sizes, H again not a multiple of BLOCK_H
T2, TOP_K2, H2, BLOCK_H2, Y_ROW_STRIDE2, W_ROW_STRIDE2 = 3, 2, 100, 32, 112, 3


def _inputs(device):
    y = torch.randn(T * TOP_K, Y_ROW_STRIDE, device=device)[:, :H]
    values = torch.rand(T, TOP_K, device=device) + 0.1
    weights = torch.zeros(T, W_ROW_STRIDE, device=device)[:, :TOP_K]
    weights.copy_(values / values.sum(dim=1, keepdim=True))  # routed weights: positive, each row sums to 1
    return y, weights


def _weighted(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_j weights[t, j] * y[t * TOP_K + j] in float64: [T, TOP_K] weights, [T * TOP_K, H] y -> [T, H]."""
    return (y.double().reshape(T, TOP_K, H) * weights.double()[:, :, None]).sum(dim=1).float()


def _applied_weights(got: torch.Tensor, y: torch.Tensor):
    """The coefficients c[t, j] with got[t] = sum_j c[t, j] * y[t * TOP_K + j] (least squares per token), or
    None when `got` is not such a combination of each token's own rows."""
    if not torch.isfinite(got).all():
        return None
    rows = y.double().cpu().reshape(T, TOP_K, H).transpose(1, 2)  # [T, H, TOP_K]
    target = got.double().cpu()[:, :, None]  # [T, H, 1]
    coeffs = torch.linalg.lstsq(rows, target).solution  # [T, TOP_K, 1]
    if relative_error(rows @ coeffs, target) > 1e-4:
        return None
    return coeffs[:, :, 0]


def _permuted_weights(got, y, weights):
    """What the kernel computes if it paired each token's weights with its slots in another order (the
    order it used, read back from its result), or None."""
    coeffs = _applied_weights(got, y)
    w = weights.double().cpu()
    if coeffs is None or torch.allclose(coeffs, w, rtol=1e-3, atol=1e-5):
        return None
    order_c, order_w = coeffs.argsort(dim=1), w.argsort(dim=1)
    if not torch.allclose(coeffs.gather(1, order_c), w.gather(1, order_w), rtol=1e-3, atol=1e-5):
        return None
    paired = torch.empty_like(w).scatter_(1, order_c, w.gather(1, order_w))  # each slot's weight, as used
    return _weighted(y.cpu(), paired).to(y.device)


def _launch(kernel, y, weights) -> GuardedRun:
    out = torch.full((T, H), float("nan"), device=y.device)
    return run_guarded(
        kernel,
        (T, triton.cdiv(H, BLOCK_H)),
        y_ptr=y,
        topk_weights_ptr=weights,
        out_ptr=out,
        H=H,
        stride_y_row=y.stride(0),
        stride_w_token=weights.stride(0),
        stride_out_row=out.stride(0),
        TOP_K=TOP_K,
        BLOCK_H=BLOCK_H,
    )


def _column(offsets: np.ndarray) -> np.ndarray:
    """The column of y each element offset lies in, counted from the start of its row (past y's end: from
    the start of its last row)."""
    rows = np.minimum(offsets // Y_ROW_STRIDE, T * TOP_K - 1)
    return offsets - rows * Y_ROW_STRIDE


def _out_of_bounds_hint(kernel, run: GuardedRun, y, weights) -> str:
    """What usually causes the out-of-bounds accesses of `run`. A kernel that reads the gaps between rows
    is launched once more on contiguous copies (row strides H and TOP_K): right there, it ignores a stride."""
    where = {o.tensor for o in run.out_of_bounds}
    if where & {"y_ptr", "topk_weights_ptr"}:
        again = _launch(kernel, y.contiguous(), weights.contiguous())
        if again.clean and relative_error(again.tensors["out_ptr"], _weighted(y, weights)) < 1e-5:
            strides = []
            if "y_ptr" in where:
                strides.append(
                    f"row r of y starts at y_ptr + r * stride_y_row (here {Y_ROW_STRIDE}, not H = {H}: "
                    "y is a view of a wider buffer)"
                )
            if "topk_weights_ptr" in where:
                strides.append(
                    f"topk_weights[t, j] is at topk_weights_ptr + t * stride_w_token + j (here "
                    f"stride_w_token = {W_ROW_STRIDE}, not TOP_K = {TOP_K})"
                )
            return (
                "wrong stride: the kernel is right on contiguous tensors but ignores a row stride it is "
                "given: " + "; ".join(strides)
            )
    hints = []
    stores = run.offsets("out_ptr", "store")
    reach = (T - 1) * H + triton.cdiv(H, BLOCK_H) * BLOCK_H  # how far a store with the right stride but no mask goes
    if stores.size and stores.max() >= reach:
        stored = np.unique(run.offsets("out_ptr", "store", outside_only=False)) if run.accesses else np.unique(stores)
        rows = np.arange(T)[:, None] * Y_ROW_STRIDE
        by_y = any(
            np.array_equal(stored, np.unique(rows + np.arange(width)[None, :]))
            for width in (H, triton.cdiv(H, BLOCK_H) * BLOCK_H)
        )
        used = f"not t * stride_y_row (= {Y_ROW_STRIDE}, y's row stride)" if by_y else "not t times another stride"
        hints.append(
            f"wrong stride for out: row t of out starts at out_ptr + t * stride_out_row (out is a "
            f"contiguous [T, H] tensor: stride_out_row = {H}), {used}; the stores reach element "
            f"{int(stores.max())}, past the last row plus a whole BLOCK_H, which no missing mask explains"
        )
        where = where - {"out_ptr"}
    if where & {"y_ptr", "out_ptr"}:
        mask = (
            f"H = {H} is not a multiple of BLOCK_H = {BLOCK_H}: mask the last H block's loads and its store with "
            "`offs_h < H`"
        )
        loads, stores = run.offsets("y_ptr", "load"), run.offsets("out_ptr", "store")
        # a missing mask reaches only columns H .. of a row of y, and past out's end by less than a block
        spill_only = not any(o.far for o in run.out_of_bounds) and (
            bool(((loads >= 0) & (_column(loads) >= H) & (_column(loads) < triton.cdiv(H, BLOCK_H) * BLOCK_H)).all())
            and bool(((stores >= T * H) & (stores < reach)).all())
        )
        hints.append(
            mask
            if spill_only
            else f"{mask}. Row r of y starts at y_ptr + r * stride_y_row (here {Y_ROW_STRIDE}, not H: y is a view "
            "of a wider buffer), and slot j of token t is row t * TOP_K + j"
        )
    if "topk_weights_ptr" in where:
        hints.append(
            "wrong stride for the weights? topk_weights[t, j] is at topk_weights_ptr + t * stride_w_token "
            f"+ j; its rows are stride_w_token = {W_ROW_STRIDE} elements apart here (a view of a wider "
            f"buffer), not TOP_K = {TOP_K}"
        )
    return ". ".join(hints)


def _second_size(kernel) -> Optional[str]:
    device = default_device()
    y = torch.randn(T2 * TOP_K2, Y_ROW_STRIDE2, device=device)[:, :H2]
    weights = torch.zeros(T2, W_ROW_STRIDE2, device=device)[:, :TOP_K2]
    weights.copy_(torch.rand(T2, TOP_K2, device=device) + 0.1)
    out = torch.full((T2, H2), float("nan"), device=device)
    run = run_guarded(
        kernel,
        (T2, triton.cdiv(H2, BLOCK_H2)),
        y_ptr=y,
        topk_weights_ptr=weights,
        out_ptr=out,
        H=H2,
        stride_y_row=y.stride(0),
        stride_w_token=weights.stride(0),
        stride_out_row=out.stride(0),
        TOP_K=TOP_K2,
        BLOCK_H=BLOCK_H2,
    )
    want = (y.double().reshape(T2, TOP_K2, H2) * weights.double()[:, :, None]).sum(dim=1).float()
    return at_other_sizes(
        diagnose(run, "out_ptr", want, tol=1e-5),
        f"T = {T}, TOP_K = {TOP_K}, H = {H}, BLOCK_H = {BLOCK_H}",
        f"T = {T2}, TOP_K = {TOP_K2}, H = {H2}, BLOCK_H = {BLOCK_H2} (rows of y {Y_ROW_STRIDE2} apart)",
        f"look for a size written into the kernel ({TOP_K}, {H}, {BLOCK_H}, {Y_ROW_STRIDE}, {W_ROW_STRIDE}) where "
        "TOP_K, H, BLOCK_H or a stride belongs",
    )


PROBE_STRIDE = 2**28  # the int64 probe's stride_y_row: slot 16's row at 16 * 2^28 = 2^32 wraps to 0 in int32


def _int32_rows(kernel) -> Optional[str]:
    """The int64 probe (as notebook 03's checker has it): stride_y_row = 2^28 stands for slot rows past 2^31
    elements. With int64 offsets every slot row but 0's lies far outside the small y and reads 0 (dropped); in
    int32 slot 16 (token 2, j = 4) at 16 * 2^28 = 2^32 wraps to 0 and token 2 reads row 0 of y."""
    y, weights = _inputs(default_device())
    y = y + 3.0  # no zeros in row 0
    out = torch.full((T, H), float("nan"), device=y.device)
    args = dict(y_ptr=y, topk_weights_ptr=weights, out_ptr=out, H=H, stride_y_row=PROBE_STRIDE)
    args.update(stride_w_token=weights.stride(0), stride_out_row=out.stride(0), TOP_K=TOP_K, BLOCK_H=BLOCK_H)
    run = run_guarded(kernel, (T, triton.cdiv(H, BLOCK_H)), **args)
    if run.error is not None:
        return f"with stride_y_row = 2^28 (standing for slot rows past 2^31 elements), {run.problem()}"
    if bool(torch.nan_to_num(run.tensors["out_ptr"][2].float(), nan=0.0).abs().max() > 0):
        return (
            "the row offset `(t * TOP_K + j) * stride_y_row` is computed in int32. With stride_y_row = 2^28 (a "
            "probe standing for slot rows past 2^31 elements: 37,000 tokens of k = 8 and H = 7168), slot 16's "
            "offset 16 * 2^28 = 2^32 wrapped around to 0 and token 2 read row 0 of y. Make the token index an "
            "int64 before multiplying: `t = tl.program_id(0).to(tl.int64)`"
        )
    return None


def check_topk_reduce(kernel, strict: bool = False) -> Verdict:
    """Grade `topk_reduce_kernel(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token,
    stride_out_row, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr)` on T = 5 tokens, TOP_K = 6, H = 200,
    BLOCK_H = 64 (grid (T, cdiv(H, BLOCK_H)) = (5, 4)): float32 y [30, 200] with row stride 224, float32
    topk_weights [5, 6] with row stride 8 (rows summing to 1), out [5, 200] poisoned with NaN.

    Names: the weights not applied (a plain sum over the k rows); the weights paired with the wrong slots
    (reversed, or any other order); slot j of token t read at row j * T + t instead of t * TOP_K + j; no
    mask on the last H block (out-of-bounds loads or stores); the weights or y read with the wrong row
    stride (out-of-bounds reads of the gaps between rows); out's rows stepped by y's stride (stores past
    the last row plus BLOCK_H); the accumulator overwritten (only the last slot counts). Then, if right, a
    second launch (T = 3, TOP_K = 2, H = 100, BLOCK_H = 32, row strides 112 and 3) for sizes written in, and
    the int64 probe (stride_y_row = 2^28: an int32 row offset wraps around)."""
    y, weights = _inputs(default_device())
    run = _launch(kernel, y, weights)
    last_only = torch.zeros_like(weights)
    last_only[:, -1] = weights[:, -1]
    slot_major = y.view(TOP_K, T, H).transpose(0, 1).reshape(T * TOP_K, H)  # row j * T + t taken as slot (t, j)
    mistakes = [
        (
            "the weights are not applied: out is the plain sum of each token's k rows. Multiply row "
            "t * TOP_K + j by topk_weights[t, j] before adding it",
            _weighted(y, torch.ones_like(weights)),
        ),
        (
            "the k weights are reversed: slot j took topk_weights[t, TOP_K - 1 - j]. Slot j of token t (row "
            "t * TOP_K + j of y) takes topk_weights[t, j]",
            _weighted(y, weights.flip(1)),
        ),
        (
            "slot j of token t was read at row j * T + t of y: the slots of a token are consecutive rows, "
            "read row t * TOP_K + j",
            _weighted(slot_major, weights),
        ),
        (
            "slot j of token t was read at row j * T + t of y and not weighted: read row t * TOP_K + j and "
            "multiply it by topk_weights[t, j]",
            _weighted(slot_major, torch.ones_like(weights)),
        ),
        (
            "only the last slot counts: out is topk_weights[t, TOP_K - 1] * y[t * TOP_K + TOP_K - 1], so the "
            "accumulator was overwritten in each step (acc = w * row). Add to it: acc += w * row",
            _weighted(y, last_only),
        ),
    ]
    if run.problem() is None:
        permuted = _permuted_weights(run.tensors["out_ptr"], y, weights)
        if permuted is not None:
            mistakes.append(
                (
                    "the k weights are paired with the wrong slots (each token's weights are all "
                    "used, in another order): slot j of token t (row t * TOP_K + j of y) takes "
                    "topk_weights[t, j]",
                    permuted,
                )
            )
    return grade(
        "topk_reduce_kernel",
        run,
        "out_ptr",
        _weighted(y, weights),
        tol=1e-5,
        strict=strict,
        out_of_bounds_hint=_out_of_bounds_hint(kernel, run, y, weights),
        mistakes=mistakes,
        then=(
            f"and with T = {T2}, TOP_K = {TOP_K2}, H = {H2}, BLOCK_H = {BLOCK_H2}, and int64 row offsets",
            lambda: _second_size(kernel) or _int32_rows(kernel),
        ),
    )
