"""Notebook 07's exercise: the K loop of a tiled matmul, software-pipelined with `tl.range(..., num_stages=)`.

    matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  NUM_STAGES: tl.constexpr)

stores C = A @ B: A [M, K] and B [K, N] float16, C [M, N] float32, accumulated in float32; one program
per (BLOCK_SIZE_M, BLOCK_SIZE_N) tile of C (grid (cdiv(M, BLOCK_SIZE_M), cdiv(N, BLOCK_SIZE_N))), looping
`for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES)` over the K blocks.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton

from ...reference import relative_error
from ...runtime import default_device
from ..guarded import GuardedRun, run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

# K = 200 is not a multiple of BLOCK_SIZE_K = 32: 7 K blocks, the last one 8 columns wide. M and N are
# multiples of their blocks, so only K needs a mask. B is the transposed view of a weight W [N, K] (as the
# MoE GEMMs read w1 and w2): stride_bk = 1, stride_bn = K. A is column-major (the transposed view of a
# [K, M] tensor): stride_am = 1, stride_ak = M, so a K loop that advances a_ptrs by BLOCK_SIZE_K elements
# instead of BLOCK_SIZE_K * stride_ak reads the wrong columns. A kernel right on these layouts is launched
# once more with B row-major (stride_bk = N, stride_bn = 1): there b_ptrs advanced by BLOCK_SIZE_K shows too.
# Every tl.dot tile is at least 16 x 16.
M, N, K = 64, 96, 200
BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, NUM_STAGES = 32, 32, 32, 3
# the last launch, once the others are right: other sizes and blocks, A and B row-major
M2, N2, K2 = 32, 48, 72
BLOCK_SIZE_M2, BLOCK_SIZE_N2, BLOCK_SIZE_K2, NUM_STAGES2 = 32, 16, 16, 2
TOL = 2e-5  # float32 accumulation of float16 products: ~1e-7; float16 rounding anywhere: ~1e-4


def _blocks(width=None):
    """(start, valid columns) of each K block; `width(i)` overrides the valid columns of block i."""
    count = triton.cdiv(K, BLOCK_SIZE_K)
    return [
        (i * BLOCK_SIZE_K, min(BLOCK_SIZE_K, K - i * BLOCK_SIZE_K) if width is None else width(i)) for i in range(count)
    ]


def _product(a, b, pieces) -> torch.Tensor:
    """sum over (a_start, b_start, n) of A[:, a_start:a_start+n] @ B[b_start:b_start+n, :], in float64."""
    a64, b64 = a.double(), b.double()
    out = torch.zeros(M, N, dtype=torch.float64, device=a.device)
    for a_start, b_start, n in pieces:
        n = max(0, min(n, K - a_start, K - b_start))
        if n:
            out += a64[:, a_start : a_start + n] @ b64[b_start : b_start + n, :]
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


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The dense storage under `t` (contiguous or a transposed view) as 1-D, element 0 first."""
    return t.as_strided((t.numel(),), (1,))


def _walk(a, b, a_step: int, b_step: int, dot_ba: bool = False) -> torch.Tensor:
    """What C holds after a K loop that loads, in step s, the tiles at the first K block's pointers moved by
    s * a_step and s * b_step elements, masked with offs_k < K - s * BLOCK_SIZE_K (loads outside A or B give
    0), and adds tl.dot(a, b) or, with `dot_ba`, tl.dot(b, a) (one tile of C at a time; the shapes fit
    because every block is 32). In float64."""
    fa, fb = _flat(a).double(), _flat(b).double()
    kk = torch.arange(BLOCK_SIZE_K, device=a.device)
    rows, cols = torch.arange(M, device=a.device), torch.arange(N, device=a.device)
    out = torch.zeros(M, N, dtype=torch.float64, device=a.device)

    def tile(flat, offsets, valid):
        inside = valid & (offsets >= 0) & (offsets < flat.numel())
        return torch.where(
            inside, flat[offsets.clamp(0, flat.numel() - 1)], torch.zeros((), dtype=flat.dtype, device=flat.device)
        )

    for s in range(triton.cdiv(K, BLOCK_SIZE_K)):
        valid = kk < K - s * BLOCK_SIZE_K
        at = tile(fa, rows[:, None] * a.stride(0) + kk[None, :] * a.stride(1) + s * a_step, valid[None, :])
        bt = tile(fb, kk[:, None] * b.stride(0) + cols[None, :] * b.stride(1) + s * b_step, valid[:, None])
        if not dot_ba:
            out += at @ bt
            continue
        for i in range(0, M, BLOCK_SIZE_M):
            for j in range(0, N, BLOCK_SIZE_N):
                out[i : i + BLOCK_SIZE_M, j : j + BLOCK_SIZE_N] += (
                    bt[:, j : j + BLOCK_SIZE_N] @ at[i : i + BLOCK_SIZE_M, :]
                )
    return out.float()


def _launch(kernel, a, b) -> GuardedRun:
    c = torch.full((M, N), float("nan"), device=a.device)
    return run_guarded(
        kernel,
        (triton.cdiv(M, BLOCK_SIZE_M), triton.cdiv(N, BLOCK_SIZE_N)),
        a_ptr=a,
        b_ptr=b,
        c_ptr=c,
        M=M,
        N=N,
        K=K,
        stride_am=a.stride(0),
        stride_ak=a.stride(1),
        stride_bk=b.stride(0),
        stride_bn=b.stride(1),
        stride_cm=c.stride(0),
        stride_cn=c.stride(1),
        BLOCK_SIZE_M=BLOCK_SIZE_M,
        BLOCK_SIZE_N=BLOCK_SIZE_N,
        BLOCK_SIZE_K=BLOCK_SIZE_K,
        NUM_STAGES=NUM_STAGES,
    )


def _right(run: GuardedRun, want: torch.Tensor) -> bool:
    got = run.tensors["c_ptr"]
    return run.clean and bool(torch.isfinite(got).all()) and relative_error(got, want) < TOL


def _row_major_b_problem(kernel, a, b) -> Optional[str]:
    """For a kernel right on the checker's layouts: launched once more with B row-major (stride_bk = N,
    stride_bn = 1), what goes wrong there (a B step without its stride), or None."""
    b_rows = b.contiguous()
    again = _launch(kernel, a, b_rows)
    want = _product(a, b_rows, [(s, s, n) for s, n in _blocks()])
    if _right(again, want):
        return None
    layouts = (
        f"right with B a transposed view (stride_bk = 1, stride_bn = {K}), but not with B row-major "
        f"(stride_bk = {N}, stride_bn = 1)"
    )
    if (
        again.clean
        and relative_error(again.tensors["c_ptr"], _walk(a, b_rows, BLOCK_SIZE_K * a.stride(1), BLOCK_SIZE_K)) < TOL
    ):
        return (
            f"{layouts}: b_ptrs moved by BLOCK_SIZE_K elements per step, which is one K block only while "
            "stride_bk = 1. Advance b_ptrs by BLOCK_SIZE_K * stride_bk (and a_ptrs by BLOCK_SIZE_K * stride_ak)"
        )
    detail = again.problem() or f"relative error {relative_error(again.tensors['c_ptr'], want):.1e}"
    return (
        f"{layouts} ({detail}): use stride_bk and stride_bn in every B offset and step, b_ptrs += "
        "BLOCK_SIZE_K * stride_bk"
    )


def _out_of_bounds_hint(kernel, run: GuardedRun, a, b) -> str:
    """What usually causes the out-of-bounds loads of `run`: launched once more with K cut to a multiple of
    BLOCK_SIZE_K, a kernel that is right there only lacks the mask of the last, partial block."""
    if not {o.tensor for o in run.out_of_bounds} & {"a_ptr", "b_ptr"}:
        return ""
    whole = K // BLOCK_SIZE_K * BLOCK_SIZE_K
    a_cut, b_cut = a[:, :whole].T.contiguous().T, b[:whole, :].T.contiguous().T  # same layouts, K = 192
    c = torch.full((M, N), float("nan"), device=a.device)
    again = run_guarded(
        kernel,
        (triton.cdiv(M, BLOCK_SIZE_M), triton.cdiv(N, BLOCK_SIZE_N)),
        a_ptr=a_cut,
        b_ptr=b_cut,
        c_ptr=c,
        M=M,
        N=N,
        K=whole,
        stride_am=a_cut.stride(0),
        stride_ak=a_cut.stride(1),
        stride_bk=b_cut.stride(0),
        stride_bn=b_cut.stride(1),
        stride_cm=c.stride(0),
        stride_cn=c.stride(1),
        BLOCK_SIZE_M=BLOCK_SIZE_M,
        BLOCK_SIZE_N=BLOCK_SIZE_N,
        BLOCK_SIZE_K=BLOCK_SIZE_K,
        NUM_STAGES=NUM_STAGES,
    )
    mask = (
        "mask both loads, A with `offs_k[None, :] < K - k * BLOCK_SIZE_K` and B with "
        "`offs_k[:, None] < K - k * BLOCK_SIZE_K`, other=0.0"
    )
    if again.clean and relative_error(again.tensors["c_ptr"], _product(a_cut, b_cut, [(0, 0, whole)])) < TOL:
        return (
            f"no K mask on the last block: the loop is right when K is a multiple of BLOCK_SIZE_K (K = {whole}), "
            f"but K = {K} is not: its last K block has {K - whole} valid columns. {mask[0].upper() + mask[1:]}"
        )
    return (
        f"the loads leave A or B even when K is a multiple of BLOCK_SIZE_K (K = {whole}): an off-by-one block "
        "offset (the mask and the pointers describe different K blocks: load block k with the mask "
        "offs_k < K - k * BLOCK_SIZE_K, then advance), or pointers advanced by the wrong stride (a_ptrs by "
        f"BLOCK_SIZE_K * stride_ak, b_ptrs by BLOCK_SIZE_K * stride_bk; A is column-major here: stride_am = 1, "
        f"stride_ak = {M}; B is a transposed view: stride_bk = 1, stride_bn = {K}). And with K = {K}, {mask}"
    )


def check_pipelined_matmul(kernel, strict: bool = False) -> Verdict:
    """Grade `matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, NUM_STAGES)` (the last four
    tl.constexpr) on M = 64, N = 96, K = 200 with 32 x 32 x 32 blocks and NUM_STAGES = 3 (grid (2, 3), 7 K
    blocks, the last 8 columns wide): float16 A [64, 200] (column-major, strides (1, 64)) and B [200, 96]
    (a transposed view, strides (1, 200)), float32 C poisoned with NaN; compared with the float64 product
    within 2e-5. A kernel right there runs once more with B row-major (strides (96, 1)), then at M = 32,
    N = 48, K = 72 with 32 x 16 x 16 blocks and NUM_STAGES = 2 (A and B row-major).

    Names: no K mask on the last block (out-of-bounds loads); pointers not advanced (every step read the
    first K block); pointers advanced by BLOCK_SIZE_K elements without the stride (on A, or on B in the
    second launch); the accumulator overwritten instead of added to (only the last block counts); only
    the first K block counting (a loop over columns, `tl.range(0, K, BLOCK_SIZE_K)`, whose k is used as a
    block index); tl.dot(b, a); float16 accumulation (or a float16 round of each block's product); an
    off-by-one block offset (the mask of the next block, the first block skipped, the last partial block
    left out); nothing accumulated; a masked load without other= (its lanes are NaN here, undefined on a
    GPU); sizes written into the kernel (the last launch)."""
    device = default_device()
    a = torch.randn(K, M, device=device).half().T  # column-major: stride_am = 1, stride_ak = M
    b = torch.randn(N, K, device=device).half().T  # W.T: stride_bk = 1, stride_bn = K
    run = _launch(kernel, a, b)
    full = _blocks()
    last_start, last_width = full[-1]
    step_a, step_b = BLOCK_SIZE_K * a.stride(1), BLOCK_SIZE_K * b.stride(0)
    mistakes = [
        (
            "C is all zeros: the K loop adds nothing to the accumulator. In each step load the A tile and the B "
            "tile and add tl.dot(a, b) to it",
            torch.zeros(M, N, device=device),
        ),
        (
            "every step read the first K block: the pointers are not advanced. At the end of each step move "
            "a_ptrs by BLOCK_SIZE_K * stride_ak and b_ptrs by BLOCK_SIZE_K * stride_bk",
            _product(a, b, [(0, 0, n) for _, n in full]),
        ),
        (
            f"a_ptrs moved by BLOCK_SIZE_K elements per step, not by one K block: A is column-major here "
            f"(stride_am = 1, stride_ak = {a.stride(1)}), so the next K block is BLOCK_SIZE_K * stride_ak elements "
            "further. Advance a_ptrs by BLOCK_SIZE_K * stride_ak and b_ptrs by BLOCK_SIZE_K * stride_bk",
            _walk(a, b, BLOCK_SIZE_K, step_b),
        ),
        (
            "only the last K block counts: the accumulator is overwritten in each step (accumulator = "
            "tl.dot(a, b)). Add to it: accumulator += tl.dot(a, b) (or accumulator = tl.dot(a, b, accumulator))",
            _product(a, b, [(last_start, last_start, last_width)]),
        ),
        (
            "only the first K block counts: every later block was masked off. A loop written as "
            "`tl.range(0, K, BLOCK_SIZE_K)` gives k = 0, 32, 64, ... (column offsets), and used as a block index "
            "in the mask `offs_k < K - k * BLOCK_SIZE_K` it leaves nothing after the first step: loop over the "
            "blocks, `tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES)`",
            _product(a, b, [(0, 0, BLOCK_SIZE_K)]),
        ),
        (
            "tl.dot(b, a): the operands are swapped (the 32 x 32 tiles let it run). C's tile is A's "
            "[BLOCK_SIZE_M, BLOCK_SIZE_K] tile times B's [BLOCK_SIZE_K, BLOCK_SIZE_N] tile: tl.dot(a, b)",
            _walk(a, b, step_a, step_b, dot_ba=True),
        ),
        (
            "off-by-one block offset: each block was masked as if it were the next one (K - (k + 1) * "
            "BLOCK_SIZE_K), so the last valid columns are dropped. Block k covers columns k * BLOCK_SIZE_K + "
            "offs_k; mask it with offs_k < K - k * BLOCK_SIZE_K",
            _product(a, b, [(s, s, n) for s, n in _blocks(lambda i: min(BLOCK_SIZE_K, K - (i + 1) * BLOCK_SIZE_K))]),
        ),
        (
            "off-by-one block offset: the first K block is missing (the pointers moved before the first load, "
            "or the loop started at 1). Load block k, then advance; the loop runs k = 0 .. cdiv(K, BLOCK_SIZE_K) - 1",
            _product(a, b, [(s, s, n) for s, n in full[1:]]),
        ),
        (
            f"the last, partial K block is missing (its {last_width} columns): loop over tl.cdiv(K, BLOCK_SIZE_K) "
            "blocks, not K // BLOCK_SIZE_K, and mask the last one",
            _product(a, b, [(s, s, n) for s, n in full[:-1]]),
        ),
    ]
    want = _product(a, b, [(s, s, n) for s, n in full])
    got = run.tensors["c_ptr"]
    if run.problem() is None and relative_error(got, want) >= TOL and _float16_fingerprint(got, a, b, want):
        mistakes.insert(
            0,
            (
                f"float16 rounding (relative error {relative_error(got, want):.1e}): the accumulator "
                "or tl.dot's result went through float16. Keep the accumulator float32 "
                "(tl.zeros(..., dtype=tl.float32)) and add tl.dot(a, b), which is float32 for "
                "float16 inputs, without converting it",
                got,
            ),
        )  # recognised by its rounding
    return grade(
        "matmul_kernel",
        run,
        "c_ptr",
        want,
        tol=TOL,
        strict=strict,
        out_of_bounds_hint=_out_of_bounds_hint(kernel, run, a, b),
        mistakes=mistakes,
        undefined_hint="other=0.0, so that the columns past K add nothing to the dot",
        then=(
            f"also with B row-major, and at M = {M2}, N = {N2}, K = {K2} with {BLOCK_SIZE_M2} x {BLOCK_SIZE_N2} x "
            f"{BLOCK_SIZE_K2} blocks",
            lambda: _row_major_b_problem(kernel, a, b) or _second_size(kernel),
        ),
    )


def _second_size(kernel) -> Optional[str]:
    """The kernel at other sizes and blocks (row-major A and B): sizes written into the kernel."""
    a = torch.randn(M2, K2, device=default_device()).half()
    b = torch.randn(K2, N2, device=a.device).half()
    c = torch.full((M2, N2), float("nan"), device=a.device)
    run = run_guarded(
        kernel,
        (triton.cdiv(M2, BLOCK_SIZE_M2), triton.cdiv(N2, BLOCK_SIZE_N2)),
        a_ptr=a,
        b_ptr=b,
        c_ptr=c,
        M=M2,
        N=N2,
        K=K2,
        stride_am=a.stride(0),
        stride_ak=a.stride(1),
        stride_bk=b.stride(0),
        stride_bn=b.stride(1),
        stride_cm=c.stride(0),
        stride_cn=c.stride(1),
        BLOCK_SIZE_M=BLOCK_SIZE_M2,
        BLOCK_SIZE_N=BLOCK_SIZE_N2,
        BLOCK_SIZE_K=BLOCK_SIZE_K2,
        NUM_STAGES=NUM_STAGES2,
    )
    want = (a.double() @ b.double()).float()
    return at_other_sizes(
        diagnose(run, "c_ptr", want, tol=TOL, undefined_hint="other=0.0"),
        f"M = {M}, N = {N}, K = {K} and blocks of {BLOCK_SIZE_K}",
        f"M = {M2}, N = {N2}, K = {K2}, blocks {BLOCK_SIZE_M2} x {BLOCK_SIZE_N2} x {BLOCK_SIZE_K2}",
        f"look for a size written into the kernel ({K}, {BLOCK_SIZE_K}, {triton.cdiv(K, BLOCK_SIZE_K)} K blocks) "
        "where K, the BLOCK_SIZE constants or the strides belong",
    )
