"""Notebook 03's exercise: `gather_rows_kernel`, the gathered A tile of the grouped GEMM.

    gather_rows_kernel(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                       TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr)

Program m takes M-block m of `sorted_token_ids` (BLOCK_SIZE_M slot ids t*TOP_K + j, grouped by expert;
padding rows hold the sentinel num_slots = T*TOP_K, as `moe_align` writes them) and copies, one
BLOCK_SIZE_M x BLOCK_SIZE_K tile at a time along K, row `slot // TOP_K` of A [T, K] into row
m*BLOCK_SIZE_M + i of out [num_tokens_post_padded, K]; padding rows get zeros. These are the A tiles the
grouped GEMM feeds to `tl.dot`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch
import triton

from ...align import moe_align
from ...runtime import default_device
from ..guarded import GuardedRun, run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade, undefined_lanes_problem

EXERCISE = "gather_rows_kernel"
NUM_TOKENS, TOP_K, NUM_EXPERTS = 6, 6, 7  # top_k = 6 is not a power of two; 36 slots over 7 experts
K, BLOCK_SIZE_K = 24, 16  # K is not a multiple of BLOCK_SIZE_K: the last K block is half empty
BLOCK_SIZE_M = 16
K_PADDED = triton.cdiv(K, BLOCK_SIZE_K) * BLOCK_SIZE_K  # 32: the columns the K blocks reach
ROW_STRIDE = K + 8  # A is a [T, K + 8] buffer sliced to [:, :K]: stride_am = 32, not K
# the second launch, once the first is right: other sizes, K again not a multiple of BLOCK_SIZE_K
NUM_TOKENS2, TOP_K2, NUM_EXPERTS2, K2, ROW_STRIDE2 = 5, 2, 3, 40, 48
PROBE_STRIDE = 2**30  # the int64 probe's stride_am: 4 * 2^30 wraps to 0 in int32
OTHER_HINT = "other=0.0, so that padding rows hold zeros for the GEMM"
# Small on purpose: a kernel that forgets `// TOP_K` reads up to row T*TOP_K of A, and that stays inside
# the guard bytes around A (4 KiB), so on a GPU too the read is seen and nothing far away is touched.

GENERAL_HINT = (
    f"usual causes: the row of A is `slots // TOP_K` (slot t*TOP_K + j belongs to token t); padding "
    f"rows hold the sentinel num_slots = {NUM_TOKENS * TOP_K}: mask rows with `slots < num_slots`; "
    f"rows of A are stride_am = {ROW_STRIDE} elements apart (not K = {K}); the last K block is "
    f"partial: mask columns with `(k0 + offs_k) < K`"
)
K_MASK_HINT = (
    f"no K mask: K = {K} is not a multiple of BLOCK_SIZE_K = {BLOCK_SIZE_K}, so the last K block "
    f"reaches columns {K}..{triton.cdiv(K, BLOCK_SIZE_K) * BLOCK_SIZE_K - 1}, which A and out do not "
    "have: mask the load (with the row mask) and the store with `k_ok = (k0 + offs_k) < K`"
)


def _read_memory(a: torch.Tensor, offsets: torch.Tensor, loaded: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """What a masked load of A's memory at element `offsets` ([P, K], from A's first element) gives where
    `loaded`, and 0 elsewhere. Returns (values, outside): `outside` marks the loads that fall outside A's
    elements (its row gaps, or past its end), whose values are not known (the guarded runner drops them
    under the interpreter; a GPU reads junk)."""
    stride = a.stride(0)
    span = (a.shape[0] - 1) * stride + a.shape[1]
    inside = (offsets >= 0) & (offsets < span) & (offsets % stride < a.shape[1])
    take = loaded & inside
    values = torch.zeros(offsets.shape, dtype=a.dtype, device=a.device)
    values[take] = a[(offsets // stride)[take], (offsets % stride)[take]]
    return values, loaded & ~inside


def _read_a(
    a: torch.Tensor, rows: torch.Tensor, row_stride: int, loaded: torch.Tensor, column: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """What out holds when out row r loads A's memory at `rows[r] * row_stride + column` (column c of out
    reads `column[c]`, default c) where `loaded[r]`, and 0 elsewhere: (values [P, K], outside [P, K]) as
    `_read_memory` gives them."""
    column = torch.arange(a.shape[1], device=a.device) if column is None else column
    offsets = rows.long()[:, None] * row_stride + column[None, :]
    return _read_memory(a, offsets, loaded[:, None].expand(offsets.shape))


def _read_transposed(a: torch.Tensor, tokens: torch.Tensor, real: torch.Tensor, row_stride: int):
    """What out holds when the A tile's pointers are transposed, `tokens[None, :] * stride_am + (k0 +
    offs_k)[:, None]` (BLOCK_SIZE_M = BLOCK_SIZE_K, so the tile still fits the store), the mask as given:
    out[b + i, k0 + j] loads A's memory at tokens[b + j] * stride_am + k0 + i where row b + i is real."""
    r = torch.arange(tokens.numel(), device=a.device)[:, None]
    c = torch.arange(a.shape[1], device=a.device)[None, :]
    i, j, k0 = r % BLOCK_SIZE_M, c % BLOCK_SIZE_K, c - c % BLOCK_SIZE_K
    offsets = tokens.long()[r - i + j] * row_stride + k0 + i
    return _read_memory(a, offsets, real[:, None].expand(offsets.shape))


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(((got == want) | (torch.isnan(got) & torch.isnan(want))).all())


def _matches(run: GuardedRun, got: torch.Tensor, values: torch.Tensor, outside: torch.Tensor) -> bool:
    """Did the kernel do what this signature does: the same values wherever they are known, and out-of-bounds
    loads of A exactly where the signature loads outside A (under the interpreter: as many lanes)?"""
    a_loads = [o for o in run.out_of_bounds if o.tensor == "a_ptr" and o.kind == "load"]
    if run.error is not None or len(a_loads) != len(run.out_of_bounds) or bool(a_loads) != bool(outside.any()):
        return False
    if run.checked_by == "interpreter" and sum(o.count for o in a_loads) != int(outside.sum()):
        return False
    return _same(got[~outside], values[~outside])


def _k_mask_missing(run: GuardedRun, a: torch.Tensor, out: torch.Tensor) -> bool:
    """Out-of-bounds accesses that only a missing K mask makes: loads in the gap columns K..stride_am-1
    of A's rows, or stores just past the end of out (its last row's columns K and on), all of them. A read
    seen on a GPU has no offsets: it neither shows nor rules out the shape."""
    spill = K_PADDED - K
    for o in run.out_of_bounds:
        if o.far:
            return False
        if not o.offsets:
            continue
        x = run.offsets(o.tensor, o.kind)
        if o.tensor == "a_ptr" and o.kind == "load":
            ok = (x >= 0) & (x < a.shape[0] * a.stride(0)) & (x % a.stride(0) >= K)
        elif o.tensor == "out_ptr" and o.kind == "store":
            ok = (x >= out.numel()) & (x < out.numel() + spill)
        else:
            return False
        if not bool(ok.all()):
            return False
    return any(o.offsets for o in run.out_of_bounds)


def _out_stride_hint(run: GuardedRun, out: torch.Tensor) -> Optional[str]:
    """The hint for stores past out's end farther than a missing K mask reaches: its rows stepped by
    another stride than stride_om (A's stride_am, if every column stored fits rows stride_am apart)."""
    beyond = run.offsets("out_ptr", "store")
    if not beyond.size or beyond.max() < out.numel() + K_PADDED - K:
        return None
    stored = np.unique(run.offsets("out_ptr", "store", outside_only=False))
    rows = np.arange(out.shape[0])[:, None] * ROW_STRIDE
    like_a = any(np.array_equal(stored, np.unique(rows + np.arange(width)[None, :])) for width in (K, K_PADDED))
    used = f"stride_am = {ROW_STRIDE} (A's row stride)" if like_a else "another stride"
    return (
        f"wrong out stride: out's rows are stride_om = {out.stride(0)} elements apart (out is a contiguous "
        f"[num_tokens_post_padded, {K}] tensor), and the kernel stepped them by {used}, so the last rows land "
        "past its end: store at `out_ptr + offs_m[:, None] * stride_om + (k0 + offs_k)[None, :]`"
    )


def _routing(num_tokens: int, top_k: int, num_experts: int, block_m: int):
    topk_ids = torch.rand(num_tokens, num_experts, device=default_device()).argsort(dim=1)[:, :top_k]
    return moe_align(topk_ids.to(torch.int32), num_experts, block_m)


def _launch(kernel, a, routing, top_k: int, block_m: int, block_k: int, stride_am: Optional[int] = None):
    """(run, out as given): one guarded launch, one program per M-block in use; `stride_am` overrides A's."""
    padded = int(routing.num_tokens_post_padded.item())
    out = torch.full((padded, a.shape[1]), float("nan"), device=a.device)
    run = run_guarded(
        kernel,
        (padded // block_m,),
        a_ptr=a,
        out_ptr=out,
        sorted_token_ids_ptr=routing.sorted_token_ids,
        num_slots=routing.num_slots,
        K=a.shape[1],
        stride_am=a.stride(0) if stride_am is None else stride_am,
        stride_ak=a.stride(1),
        stride_om=out.stride(0),
        TOP_K=top_k,
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_K=block_k,
    )
    return run, out


def _bounds_hint(run: GuardedRun, a: torch.Tensor, out: torch.Tensor) -> str:
    """The causes that fit where the out-of-bounds accesses went (and only those)."""
    stride, k = a.stride(0), a.shape[1]
    causes = []
    loads = run.offsets("a_ptr", "load")
    if any(o.far for o in run.out_of_bounds):
        causes.append("accesses far from every tensor: check the strides and the row index `slots // TOP_K`")
    if loads.size and (loads < 0).any():
        causes.append("loads before A's first element: a negative row or column offset")
    if loads.size and (loads >= a.shape[0] * stride).any():
        causes.append(
            f"loads past A's last row (T = {a.shape[0]}): the row of A is `slots // TOP_K`, and padding rows hold the "
            "sentinel num_slots: mask rows with `slots < num_slots`"
        )
    if loads.size and ((loads >= 0) & (loads < a.shape[0] * stride) & (loads % stride >= k)).any():
        causes.append(
            f"loads in the gap after a row's K = {k} columns: mask the columns with `(k0 + offs_k) < K`, and step "
            f"the rows by stride_am = {stride} (not K)"
        )
    if run.offsets("out_ptr", "store").size:
        causes.append(
            "stores past the end of out: mask the store's columns with `(k0 + offs_k) < K`; out's rows are "
            "stride_om apart"
        )
    if not causes:
        return GENERAL_HINT
    return "; ".join(causes)


def _second_size(kernel) -> Optional[str]:
    """The kernel at other sizes (T = 5, top_k = 2 of E = 3, K = 40, rows 48 apart), then the int64 probe."""
    routing = _routing(NUM_TOKENS2, TOP_K2, NUM_EXPERTS2, BLOCK_SIZE_M)
    a = torch.randn(NUM_TOKENS2, ROW_STRIDE2, device=default_device())[:, :K2]
    run, out = _launch(kernel, a, routing, TOP_K2, BLOCK_SIZE_M, BLOCK_SIZE_K)
    slots = routing.sorted_token_ids[: out.shape[0]].long()
    real = slots < routing.num_slots
    want, _ = _read_a(a, slots // TOP_K2, ROW_STRIDE2, real)
    problem = diagnose(
        run, "out_ptr", want, tol=1e-6, out_of_bounds_hint=_bounds_hint(run, a, out), undefined_hint=OTHER_HINT
    )
    return at_other_sizes(
        problem,
        f"T = {NUM_TOKENS}, TOP_K = {TOP_K}, K = {K}",
        f"T = {NUM_TOKENS2}, TOP_K = {TOP_K2}, K = {K2}, stride_am = {ROW_STRIDE2}",
        f"look for a size written into the kernel ({NUM_TOKENS}, {TOP_K}, {K}, {ROW_STRIDE}, {NUM_TOKENS * TOP_K}) "
        "where T, TOP_K, K, the strides or num_slots belong",
    ) or _int32_rows(kernel)


def _int32_rows(kernel) -> Optional[str]:
    """The int64 probe: stride_am = 2^30 stands for an A past 2^31 elements. With the row offset in int64,
    every row but token 0's lies far outside the small A and is dropped (0); computed in int32, token 4's
    offset 4 * 2^30 = 2^32 wraps around to 0 and reads row 0 of A."""
    routing = _routing(NUM_TOKENS, TOP_K, NUM_EXPERTS, BLOCK_SIZE_M)
    a = torch.randn(NUM_TOKENS, ROW_STRIDE, device=default_device())[:, :K] + 3.0  # no zeros in row 0
    run, out = _launch(kernel, a, routing, TOP_K, BLOCK_SIZE_M, BLOCK_SIZE_K, stride_am=PROBE_STRIDE)
    if run.error is not None:
        return f"with stride_am = 2^30 (standing for an A past 2^31 elements), {run.problem()}"
    slots = routing.sorted_token_ids[: out.shape[0]].long()
    rows = (slots // TOP_K == 4) & (slots < routing.num_slots)
    if torch.equal(run.tensors["out_ptr"][rows], a[0].expand(int(rows.sum()), K)):
        return (
            "the row offset `tokens * stride_am` is computed in int32. With stride_am = 2^30 (a probe standing for "
            "an A past 2^31 elements: 262144 tokens of H = 8192), token 4's offset 4 * 2^30 = 2^32 wrapped around "
            "to 0 and read row 0 of A. Cast the row index before multiplying: "
            "`tokens = (slots // TOP_K).to(tl.int64)`"
        )
    return None


def check_gather_rows(kernel, strict: bool = False) -> Verdict:
    """Grade `gather_rows_kernel(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak,
    stride_om, TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr)`, launched with
    one program per M-block in use: grid (num_tokens_post_padded // BLOCK_SIZE_M,).

    Sizes: T = 6 tokens, top_k = 6 of E = 7 experts (random distinct experts per token), so num_slots = 36;
    `moe_align(topk_ids, 7, BLOCK_SIZE_M=16)` gives `sorted_token_ids` (int32, sentinel 36 on padding
    rows). A [6, 24] float32 is a view of a [6, 32] buffer (stride_am = 32, stride_ak = 1); K = 24 with
    BLOCK_SIZE_K = 16; out [num_tokens_post_padded, 24] float32 contiguous (stride_om = 24), poisoned with
    NaN. The right out: row r = A[sorted_token_ids[r] // 6] for real slots, zeros on padding rows.

    Names: `// TOP_K` forgotten (rows of the wrong token, and rows past T), no row mask (the sentinel's row
    T read out of bounds), both, the row stride taken as K instead of stride_am, no K mask on the last K
    block (load or store), padding rows left unwritten, the row mask compared with T instead of num_slots,
    `k0` left out of the A pointers, `slots % TOP_K` for the token, the A tile transposed, a load without
    other= (padding rows undefined). Then, if right: a second launch at other sizes (T = 5, top_k = 2 of
    E = 3, K = 40, stride_am = 48), and the int64 probe: stride_am = 2^30 (standing for an A past 2^31
    elements, on the same small A: every row but token 0's is far outside A, dropped and reads 0), where
    a row offset computed in int32 wraps around (4 * 2^30 = 2^32 becomes 0) and token 4 reads row 0.
    """
    device = default_device()
    routing = _routing(NUM_TOKENS, TOP_K, NUM_EXPERTS, BLOCK_SIZE_M)
    num_slots = routing.num_slots
    a = torch.randn(NUM_TOKENS, ROW_STRIDE, device=device)[:, :K]
    run, out = _launch(kernel, a, routing, TOP_K, BLOCK_SIZE_M, BLOCK_SIZE_K)
    padded = out.shape[0]
    got = run.tensors["out_ptr"]

    slots = routing.sorted_token_ids[:padded].long()
    real = slots < num_slots
    tokens = slots // TOP_K
    everywhere = torch.ones_like(real)
    want, _ = _read_a(a, tokens, ROW_STRIDE, real)

    wrong_token = (
        f"`// TOP_K` forgotten: slot t*TOP_K + j holds token t, so the row of A is `slots // TOP_K`; "
        f"reading row `slot` gives the wrong token's row, and slots >= T = {NUM_TOKENS} lie past "
        "the end of A"
    )
    signatures: List[Tuple[str, Tuple[torch.Tensor, torch.Tensor]]] = [
        (wrong_token, _read_a(a, slots, ROW_STRIDE, real)),
        (
            f"no row mask: padding rows hold the sentinel num_slots = {num_slots}, whose row num_slots // TOP_K = "
            f"{NUM_TOKENS} is past the last row of A; load with `mask=row_ok[:, None] & k_ok[None, :]`, "
            "`row_ok = slots < num_slots`, and other=0.0",
            _read_a(a, tokens, ROW_STRIDE, everywhere),
        ),
        (
            f"{wrong_token}; and no row mask: the sentinel num_slots = {num_slots} must be masked with "
            "`slots < num_slots`",
            _read_a(a, slots, ROW_STRIDE, everywhere),
        ),
        (
            "`slots % TOP_K` is the slot's place j among its token's TOP_K choices, not its token: slot "
            "t*TOP_K + j belongs to token t, so the row of A is `slots // TOP_K`",
            _read_a(a, slots % TOP_K, ROW_STRIDE, real),
        ),
        (
            "the A tile is transposed: its rows must run down axis 0 and its columns along axis 1, "
            "`a_ptr + tokens[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak` (here [:, None] and "
            "[None, :] are the other way round; the tile still fits the store only because BLOCK_SIZE_M = "
            "BLOCK_SIZE_K)",
            _read_transposed(a, tokens, real, ROW_STRIDE),
        ),
        (
            f"wrong stride: rows of A are stride_am = {ROW_STRIDE} elements apart (A is a [T, {ROW_STRIDE}] buffer "
            f"sliced to [:, :{K}]), not K = {K}: point at `a_ptr + tokens[:, None] * stride_am + "
            "(k0 + offs_k)[None, :] * stride_ak`",
            _read_a(a, tokens, K, real),
        ),
        (
            "every K step read A's first BLOCK_SIZE_K columns: add k0 to the column offsets of the A pointers, "
            "`(k0 + offs_k)[None, :] * stride_ak`",
            _read_a(a, tokens, ROW_STRIDE, real, torch.arange(K, device=device) % BLOCK_SIZE_K),
        ),
        (
            f"the row mask compares the slot with T = {NUM_TOKENS}: slots run up to T*TOP_K - 1 = {num_slots - 1} "
            f"and the padding sentinel is num_slots = {num_slots}; use `slots < num_slots`",
            _read_a(a, tokens, ROW_STRIDE, slots < NUM_TOKENS),
        ),
    ]
    unwritten = want.clone()
    unwritten[~real] = float("nan")
    signatures.append(
        (
            "padding rows left unwritten (still NaN): they must hold zeros for the GEMM; load with "
            "other=0.0 and store every row of the block (mask the store with the K mask only)",
            (unwritten, torch.zeros_like(unwritten, dtype=torch.bool)),
        )
    )

    why = None if run.out_of_bounds else undefined_lanes_problem(run, "out_ptr", want, OTHER_HINT)
    why = why or next((text for text, (values, outside) in signatures if _matches(run, got, values, outside)), None)
    if why is None and run.error is None and run.out_of_bounds:
        why = _out_stride_hint(run, out) or (K_MASK_HINT if _k_mask_missing(run, a, out) else None)
    return grade(
        EXERCISE,
        run,
        "out_ptr",
        want,
        tol=1e-6,
        strict=strict,
        out_of_bounds_hint=why or _bounds_hint(run, a, out),
        undefined_hint=OTHER_HINT,
        mistakes=[(why, got)] if why else [],
        then=(
            f"with T = {NUM_TOKENS2}, TOP_K = {TOP_K2}, K = {K2} too, and int64 row offsets",
            lambda: _second_size(kernel),
        ),
        nothing_written="out is untouched: every row or column is masked off (the stub's placeholders); "
        "fill in tokens, row_ok, k_ok and a_ptrs",
    )
