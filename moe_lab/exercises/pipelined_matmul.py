"""Notebook 07's exercise: the K loop of a tiled matmul, software-pipelined with `tl.range(..., num_stages=)`.

    matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  NUM_STAGES: tl.constexpr)

stores C = A @ B: A [M, K] and B [K, N] float16, C [M, N] float32, accumulated in float32; one program
per (BLOCK_SIZE_M, BLOCK_SIZE_N) tile of C (grid (cdiv(M, BLOCK_SIZE_M), cdiv(N, BLOCK_SIZE_N))), looping
`for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES)` over the K blocks.
"""
from __future__ import annotations

import torch
import triton

from ..guarded import GuardedRun, run_guarded
from ..reference import relative_error
from ..runtime import default_device
from ._grade import Verdict, grade

# K = 200 is not a multiple of BLOCK_SIZE_K = 32: 7 K blocks, the last one 8 columns wide. M and N are
# multiples of their blocks, so only K needs a mask. B is the transposed view of a weight W [N, K] (as the
# MoE GEMMs read w1 and w2): stride_bk = 1, stride_bn = K. Every tl.dot tile is at least 16 x 16.
M, N, K = 64, 96, 200
BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, NUM_STAGES = 32, 32, 32, 3
TOL = 2e-5   # float32 accumulation of float16 products: ~1e-7; float16 rounding anywhere: ~1e-4


def _blocks(width=None):
    """(start, valid columns) of each K block; `width(i)` overrides the valid columns of block i."""
    count = triton.cdiv(K, BLOCK_SIZE_K)
    return [(i * BLOCK_SIZE_K, min(BLOCK_SIZE_K, K - i * BLOCK_SIZE_K) if width is None else width(i))
            for i in range(count)]


def _product(a, b, pieces) -> torch.Tensor:
    """sum over (a_start, b_start, n) of A[:, a_start:a_start+n] @ B[b_start:b_start+n, :], in float64."""
    a64, b64 = a.double(), b.double()
    out = torch.zeros(M, N, dtype=torch.float64, device=a.device)
    for a_start, b_start, n in pieces:
        n = max(0, min(n, K - a_start, K - b_start))
        if n:
            out += a64[:, a_start:a_start + n] @ b64[b_start:b_start + n, :]
    return out.float()


def _float16_fingerprint(got: torch.Tensor, a, b, want: torch.Tensor) -> bool:
    """True when the result carries float16 rounding: every value is a float16 number (a float16
    accumulator), or it is far closer to the sum of float16-rounded block products than to the truth."""
    if not torch.isfinite(got).all() or relative_error(got, want) > 1e-2:
        return False
    if torch.equal(got.half().float(), got):
        return True
    rounded = sum(_product(a, b, [(s, s, n)]).half().float() for s, n in _blocks())
    return relative_error(got, rounded) < 0.2 * relative_error(rounded, want)


def _launch(kernel, a, b) -> GuardedRun:
    c = torch.full((M, N), float("nan"), device=a.device)
    return run_guarded(kernel, (triton.cdiv(M, BLOCK_SIZE_M), triton.cdiv(N, BLOCK_SIZE_N)),
                       a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K,
                       stride_am=a.stride(0), stride_ak=a.stride(1), stride_bk=b.stride(0), stride_bn=b.stride(1),
                       stride_cm=c.stride(0), stride_cn=c.stride(1), BLOCK_SIZE_M=BLOCK_SIZE_M,
                       BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K, NUM_STAGES=NUM_STAGES)


def _out_of_bounds_hint(kernel, run: GuardedRun, a, b) -> str:
    """What usually causes the out-of-bounds loads of `run`: launched once more with K cut to a multiple of
    BLOCK_SIZE_K, a kernel that is right there only lacks the mask of the last, partial block."""
    if not {o.tensor for o in run.out_of_bounds} & {"a_ptr", "b_ptr"}:
        return ""
    whole = K // BLOCK_SIZE_K * BLOCK_SIZE_K
    a_cut, b_cut = a[:, :whole].contiguous(), b[:whole, :].T.contiguous().T   # same layouts, K = 192
    c = torch.full((M, N), float("nan"), device=a.device)
    again = run_guarded(kernel, (triton.cdiv(M, BLOCK_SIZE_M), triton.cdiv(N, BLOCK_SIZE_N)),
                        a_ptr=a_cut, b_ptr=b_cut, c_ptr=c, M=M, N=N, K=whole,
                        stride_am=a_cut.stride(0), stride_ak=a_cut.stride(1), stride_bk=b_cut.stride(0),
                        stride_bn=b_cut.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1),
                        BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K,
                        NUM_STAGES=NUM_STAGES)
    mask = ("mask both loads, A with `offs_k[None, :] < K - k * BLOCK_SIZE_K` and B with "
            "`offs_k[:, None] < K - k * BLOCK_SIZE_K`, other=0.0")
    if again.clean and relative_error(again.tensors["c_ptr"], _product(a_cut, b_cut, [(0, 0, whole)])) < TOL:
        return (f"no K mask on the last block: the loop is right when K is a multiple of BLOCK_SIZE_K (K = {whole}), "
                f"but K = {K} is not: its last K block has {K - whole} valid columns. {mask[0].upper() + mask[1:]}")
    return (f"the loads leave A or B even when K is a multiple of BLOCK_SIZE_K (K = {whole}): an off-by-one block "
            "offset (the mask and the pointers describe different K blocks: load block k with the mask "
            "offs_k < K - k * BLOCK_SIZE_K, then advance), or pointers advanced by the wrong stride (a_ptrs by "
            "BLOCK_SIZE_K * stride_ak, b_ptrs by BLOCK_SIZE_K * stride_bk; B is a transposed view here: "
            f"stride_bk = 1). And with K = {K}, {mask}")


def check_pipelined_matmul(kernel, strict: bool = False) -> Verdict:
    """Grade `matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, NUM_STAGES)` (the last four
    tl.constexpr) on M = 64, N = 96, K = 200 with 32 x 32 x 32 blocks and NUM_STAGES = 3 (grid (2, 3), 7 K
    blocks, the last 8 columns wide): float16 A [64, 200] (contiguous) and B [200, 96] (a transposed view,
    strides (1, 200)), float32 C poisoned with NaN; compared with the float64 product within 2e-5.

    Names: no K mask on the last block (out-of-bounds loads); pointers not advanced (every step read the
    first K block); the accumulator overwritten instead of added to (only the last block counts); float16
    accumulation (or a float16 round of each block's product); an off-by-one block offset (the mask of
    the next block, the first block skipped, the last partial block left out); nothing accumulated."""
    device = default_device()
    a = torch.randn(M, K, device=device).half()
    b = torch.randn(N, K, device=device).half().T
    run = _launch(kernel, a, b)
    full = _blocks()
    last_start, last_width = full[-1]
    mistakes = [
        ("C is all zeros: the K loop adds nothing to the accumulator. In each step load the A tile and the B "
         "tile and add tl.dot(a, b) to it", torch.zeros(M, N, device=device)),
        ("every step read the first K block: the pointers are not advanced. At the end of each step move "
         "a_ptrs by BLOCK_SIZE_K * stride_ak and b_ptrs by BLOCK_SIZE_K * stride_bk",
         _product(a, b, [(0, 0, n) for _, n in full])),
        ("only the last K block counts: the accumulator is overwritten in each step (accumulator = "
         "tl.dot(a, b)). Add to it: accumulator += tl.dot(a, b) (or accumulator = tl.dot(a, b, accumulator))",
         _product(a, b, [(last_start, last_start, last_width)])),
        ("off-by-one block offset: each block was masked as if it were the next one (K - (k + 1) * "
         "BLOCK_SIZE_K), so the last valid columns are dropped. Block k covers columns k * BLOCK_SIZE_K + "
         "offs_k; mask it with offs_k < K - k * BLOCK_SIZE_K",
         _product(a, b, [(s, s, n) for s, n in _blocks(lambda i: min(BLOCK_SIZE_K, K - (i + 1) * BLOCK_SIZE_K))])),
        ("off-by-one block offset: the first K block is missing (the pointers moved before the first load, "
         "or the loop started at 1). Load block k, then advance; the loop runs k = 0 .. cdiv(K, BLOCK_SIZE_K) - 1",
         _product(a, b, [(s, s, n) for s, n in full[1:]])),
        (f"the last, partial K block is missing (its {last_width} columns): loop over tl.cdiv(K, BLOCK_SIZE_K) "
         "blocks, not K // BLOCK_SIZE_K, and mask the last one",
         _product(a, b, [(s, s, n) for s, n in full[:-1]])),
    ]
    want = _product(a, b, [(s, s, n) for s, n in full])
    got = run.tensors["c_ptr"]
    if run.problem() is None and relative_error(got, want) >= TOL and _float16_fingerprint(got, a, b, want):
        mistakes.insert(0, (f"float16 rounding (relative error {relative_error(got, want):.1e}): the accumulator "
                            "or tl.dot's result went through float16. Keep the accumulator float32 "
                            "(tl.zeros(..., dtype=tl.float32)) and add tl.dot(a, b), which is float32 for "
                            "float16 inputs, without converting it", got))  # recognised by its rounding
    return grade("matmul_kernel", run, "c_ptr", want, tol=TOL, strict=strict,
                 out_of_bounds_hint=_out_of_bounds_hint(kernel, run, a, b), mistakes=mistakes)
