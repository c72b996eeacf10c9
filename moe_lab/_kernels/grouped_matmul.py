"""The grouped matmul: for every M-block of the aligned schedule, C[rows] = A[rows] @ W[expert].T.

Two entry kernels, one per schedule: `grouped_matmul_kernel` (one program per tile) and
`grouped_matmul_persistent_kernel` (one program per SM walking the tiles). Both run `_tile`, built from
small helpers: the rows (`_a_rows`, `_weight_rows`), one K loop per numeric mode (`_k_loop`: float, and
float8 with outer scales; `_k_loop_block_scaled`: float8 with block scales), one dot helper that hides the
interpreter's emulation (`_dot`, `_product`), one epilogue (`_epilogue`).

Operands travel as tuples, their tensor descriptors beside them (Triton 3.6 takes no descriptor inside a
tuple); a feature is on where its pointer or descriptor is given (not None):
  A = (a_ptr, stride_am, stride_ak), a_desc: a 2-D tensor descriptor over sorted rows (block
      [BLOCK_SIZE_M, K of a dot]) or None for pointer loads. ROWS == "gather" reads token rows
      sorted_token_id // top_k (the up projection), by pointer: Hopper's TMA copies boxes, not gathers.
      Every M-block belongs to one expert, so a box never spans two experts.
  W = (w_ptr, stride_we, stride_wn, stride_wk), w_desc: a 3-D descriptor over [E, N, K] with block
      [1, BLOCK_SIZE_N, K of a dot] (4-D over [E, 2, I, K] with SWIGLU in halves), or None.
  C = (c_ptr, c_scale_ptr, stride_cm, stride_cn, stride_csm, stride_csk): with c_scale_ptr the output is
      float8, quantized per row per SCALE_GROUP_K columns as the down GEMM reads it.
  S = (a_scale_ptr, w_scale_ptr, stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, scale_group_n):
      float8 scales (DeepSeek-V3's w8a8 format, arXiv:2412.19437 §3.3), None pointers for float operands.
      SCALES "outer": one per row (per token, or per tensor with stride 0) and one per weight row (per
      channel, or per expert with stride 0): the float32 sum is scaled once. "block" / "block_tile": one per
      SCALE_GROUP_K channels of a row and one per scale_group_n x SCALE_GROUP_K block of W: each dot's
      product is scaled before it is added.
  EPI = (bias_ptr, stride_be, stride_bn, alpha, limit): the epilogue's operands. bias_ptr: a bias per
      weight row ([E, N], or [E, 2N] in w1's row order with SWIGLU), added to the float32 sums before the
      activation and before the routed weight, or None. alpha, limit: swigluoai's (unused otherwise).
  topk_weights_ptr: the routed weights, multiplied in the epilogue where given (ROWS == "scatter").

SwiGLU epilogue (SWIGLU, the up projection of a gated expert; "none" otherwise): "silu" / "swigluoai" (the
function, `common.gated_activation`), with "_interleaved" where W's rows hold gate and up interleaved (row 2j
gate j, 2j + 1 up j; gpt-oss) rather than as halves (gate rows [0, N), up rows [N, 2N): w1 = [gate; up]).
With halves a program's BLOCK_SIZE_N weight rows are gate rows n0 .. n0 + BLOCK_SIZE_N/2 and the matching up
rows; interleaved, the BLOCK_SIZE_N rows from 2 n0 on, as stored. Either way the K loop runs one dot as wide
as the unfused GEMM's; the epilogue splits the float32 accumulator into gate and up (its halves, or its even
and odd columns) and writes the activation: [rows, N], with no [rows, 2N] round trip through memory and no
float16 overflow of a large pre-activation whose product is small (Shazeer, "GLU Variants Improve
Transformer", arXiv:2002.05202).

Tails (per-tile kernel): an expert's last M-block is mostly padding when its row count is not a multiple of
BLOCK_SIZE_M, and padding rows cost as much tensor-core work as real ones. TAIL_SPLITS runs such a block as
a half or quarter tile (`_tail_rows`); FOLD_M has the block before compute its few valid rows in a second
dot on the same weight tile (`_fold`). Each row's K reduction runs in the same order either way.

DOT: "mma" (tensor cores), "ieee" (float32 at full precision) or "interpreter" (Triton's interpreter on a
CPU: exact products through float64, and GPU-like rounding to bfloat16 and float8).
"""
import triton
import triton.language as tl

from .common import (
    cast_e4m3,
    e4m3_to_float32,
    gate_up_halves,
    gated_activation,
    quantize_groups_e4m3,
    round_to_bf16_grid,
)


# Arguments that change with the token count are not specialized, so a new T never recompiles; nor are the
# pointers read a word at a time or gathered, which may point into a caller's tensor at any offset (a chunk's
# routed weights; slot order's block map, the caller's topk_ids): no variant per alignment.
@triton.jit(do_not_specialize=["num_slots", "num_m_blocks", "expert_ids_ptr", "topk_weights_ptr"])
def grouped_matmul_kernel(
    A, a_desc, W, w_desc, C, S, EPI, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, num_slots, num_m_blocks, num_experts, top_k,
    ROWS: tl.constexpr, SWIGLU: tl.constexpr, SCALES: tl.constexpr, SCALE_GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr, DOT: tl.constexpr, TAIL_SPLITS: tl.constexpr, FOLD_M: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    """One program per tile: the tile of M-block pid_m, N-tile pid_n, in GROUP_SIZE_M order. A block past
    the schedule's end, or of an expert outside [0, E) (slot order), returns at once. An expert's last
    block runs as the smallest tile holding its valid rows (TAIL_SPLITS), or is folded into the block
    before (FOLD_M)."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_m_blocks, _num_pid_n(N, SWIGLU, BLOCK_SIZE_N), GROUP_SIZE_M)
    row0 = pid_m * BLOCK_SIZE_M
    # Every schedule word this program needs is loaded before the first branch (all in bounds: the
    # buffers are sized by the bound), so they cost one round trip to memory, not one each.
    rows_in_use = tl.load(num_tokens_post_padded_ptr)
    block_expert = tl.load(expert_ids_ptr + pid_m)  # its own dtype: slot order's ids may lie outside [0, E)
    tile_rows = _tail_rows(sorted_token_ids_ptr, row0, num_slots, TAIL_SPLITS, BLOCK_SIZE_M)
    fold_next, folded = _fold(sorted_token_ids_ptr, expert_ids_ptr, pid_m, row0, block_expert, num_m_blocks,
                              num_slots, FOLD_M, BLOCK_SIZE_M)
    if (row0 >= rows_in_use) | (block_expert < 0) | (block_expert >= num_experts) | folded:
        return
    expert = block_expert.to(tl.int32)
    R = (topk_weights_ptr, sorted_token_ids_ptr, num_slots, top_k, N, K)
    if fold_next:
        _tile(A, a_desc, W, w_desc, C, S, EPI, R, row0, expert, pid_n, ROWS, SWIGLU, SCALES, SCALE_GROUP_K, EVEN_K, DOT,
              BLOCK_SIZE_M, FOLD_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    elif tile_rows == BLOCK_SIZE_M // 4:
        _tile(A, a_desc, W, w_desc, C, S, EPI, R, row0, expert, pid_n, ROWS, SWIGLU, SCALES, SCALE_GROUP_K, EVEN_K, DOT,
              BLOCK_SIZE_M // 4, 0, BLOCK_SIZE_N, BLOCK_SIZE_K)
    elif tile_rows == BLOCK_SIZE_M // 2:
        _tile(A, a_desc, W, w_desc, C, S, EPI, R, row0, expert, pid_n, ROWS, SWIGLU, SCALES, SCALE_GROUP_K, EVEN_K, DOT,
              BLOCK_SIZE_M // 2, 0, BLOCK_SIZE_N, BLOCK_SIZE_K)
    else:
        _tile(A, a_desc, W, w_desc, C, S, EPI, R, row0, expert, pid_n, ROWS, SWIGLU, SCALES, SCALE_GROUP_K, EVEN_K, DOT,
              BLOCK_SIZE_M, 0, BLOCK_SIZE_N, BLOCK_SIZE_K)


# As for grouped_matmul_kernel.
@triton.jit(do_not_specialize=["num_slots", "expert_ids_ptr", "topk_weights_ptr"])
def grouped_matmul_persistent_kernel(
    A, a_desc, W, w_desc, C, S, EPI, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, num_slots, top_k,
    ROWS: tl.constexpr, SWIGLU: tl.constexpr, SCALES: tl.constexpr, SCALE_GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr, DOT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    """The same tiles as `grouped_matmul_kernel`, walked by a grid of P programs (one per SM): program p
    takes tiles p, p + P, ... of the M-blocks in use, whose count it reads from num_tokens_post_padded on
    the device (no host sync; the grid does not depend on T). The tile loop and the K loop are flattened
    into one loop that Triton software-pipelines across tile boundaries, so the next tile's loads are in
    flight during this tile's epilogue (Triton's tutorial python/tutorials/09-persistent-matmul.py). Every
    tile runs whole (a flattened loop nest cannot branch on tile sizes), each row's K reduction in the same
    order as in `grouped_matmul_kernel`: bitwise the same results. Expert-sorted schedules only (the plan
    sees to it): every block in use has an expert in [0, E), so no tile is skipped."""
    num_pid_n = _num_pid_n(N, SWIGLU, BLOCK_SIZE_N)
    num_used_blocks = tl.load(num_tokens_post_padded_ptr) // BLOCK_SIZE_M
    R = (topk_weights_ptr, sorted_token_ids_ptr, num_slots, top_k, N, K)
    for tile in tl.range(tl.program_id(0), num_used_blocks * num_pid_n, tl.num_programs(0), flatten=True):
        pid_m, pid_n = _tile_coords(tile, num_used_blocks, num_pid_n, GROUP_SIZE_M)
        _tile(A, a_desc, W, w_desc, C, S, EPI, R, pid_m * BLOCK_SIZE_M, tl.load(expert_ids_ptr + pid_m), pid_n,
              ROWS, SWIGLU, SCALES, SCALE_GROUP_K, EVEN_K, DOT, BLOCK_SIZE_M, 0, BLOCK_SIZE_N, BLOCK_SIZE_K)


@triton.jit
def _num_pid_n(N, SWIGLU: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """N-tiles per M-block: a program writes BLOCK_SIZE_N columns, BLOCK_SIZE_N/2 with SWIGLU."""
    if SWIGLU != "none":
        n_tiles = tl.cdiv(N, BLOCK_SIZE_N // 2)
    else:
        n_tiles = tl.cdiv(N, BLOCK_SIZE_N)
    return n_tiles


@triton.jit
def _tile_coords(tile, num_m_blocks, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """(M-block, N-tile) of tile number `tile`, in GROUP_SIZE_M ordering: neighbouring tiles share W tiles
    (same N-tile) while they sit in L2 (Triton's matmul tutorial, python/tutorials/03-matrix-multiplication.py)."""
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (tile // tiles_per_group) * GROUP_SIZE_M
    group_rows = min(num_m_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (tile % tiles_per_group) % group_rows
    pid_n = (tile % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _tail_rows(sorted_token_ids_ptr, row0, num_slots, TAIL_SPLITS: tl.constexpr, BLOCK_SIZE_M: tl.constexpr):
    """Rows of the smallest tile that holds this block's valid rows: BLOCK_SIZE_M, or with tail tiles half or
    a quarter of it. Valid rows come first in a block, so one look at the row halfway (a quarter of the way)
    in tells whether a half (quarter) tile holds them all; the rows it skips are padding, never written."""
    rows = BLOCK_SIZE_M
    if TAIL_SPLITS >= 1:
        rows = tl.where(tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M // 2) >= num_slots, BLOCK_SIZE_M // 2, rows)
    if TAIL_SPLITS >= 2:
        rows = tl.where(tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M // 4) >= num_slots, BLOCK_SIZE_M // 4, rows)
    return rows


@triton.jit
def _fold(sorted_token_ids_ptr, expert_ids_ptr, pid_m, row0, block_expert, num_m_blocks, num_slots,
          FOLD_M: tl.constexpr, BLOCK_SIZE_M: tl.constexpr):
    """Folded tails: (fold_next, folded). Where an expert's last M-block holds at most FOLD_M valid rows,
    the block before it (the same expert's) computes them too, in a second FOLD_M-row dot on the same weight
    tile (fold_next), and the last block's own program ends at once (folded). Blocks past the end have
    expert -1, so no block in use folds one that is not."""
    fold_next = False
    folded = False
    if FOLD_M > 0:
        has_next = pid_m + 1 < num_m_blocks
        next_expert = tl.load(expert_ids_ptr + pid_m + 1, mask=has_next, other=-1)
        next_small = tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M + FOLD_M, mask=has_next, other=0) >= num_slots
        prev_expert = tl.load(expert_ids_ptr + pid_m - 1, mask=pid_m > 0, other=-1)
        own_small = tl.load(sorted_token_ids_ptr + row0 + FOLD_M) >= num_slots
        fold_next = (next_expert == block_expert) & next_small
        folded = (prev_expert == block_expert) & own_small
    return fold_next, folded


@triton.jit
def _tile(A, a_desc, W, w_desc, C, S, EPI, R, row0, expert, pid_n,
          ROWS: tl.constexpr, SWIGLU: tl.constexpr, SCALES: tl.constexpr, SCALE_GROUP_K: tl.constexpr,
          EVEN_K: tl.constexpr, DOT: tl.constexpr, TILE_M: tl.constexpr, FOLD_M: tl.constexpr,
          BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """One TILE_M x BLOCK_SIZE_N tile of expert `expert`, schedule rows row0 .. row0 + TILE_M: the K loop of
    its numeric mode, then the epilogue. With FOLD_M > 0 (float operands) also the next FOLD_M rows, the
    next block's valid ones (a folded tail), in a second dot on the same weight tile."""
    topk_weights_ptr, sorted_token_ids_ptr, num_slots, top_k, N, K = R
    offs_m = row0 + tl.arange(0, TILE_M)
    token_ids = tl.load(sorted_token_ids_ptr + offs_m)
    a_rows, row_ok = _a_rows(offs_m, token_ids, num_slots, top_k, ROWS)
    # The K loops read gate and up rows as halves (a 4-D descriptor box, a scale per half) or as rows in a row.
    HALVES: tl.constexpr = gate_up_halves(SWIGLU)
    n0, w_row0, w_rows = _weight_rows(pid_n, N, SWIGLU, BLOCK_SIZE_N)
    if FOLD_M > 0:  # the folded tail's rows, read by pointer (a descriptor's box is BLOCK_SIZE_M rows)
        offs_f = row0 + TILE_M + tl.arange(0, FOLD_M)
        f_token_ids = tl.load(sorted_token_ids_ptr + offs_f)
        f_rows, f_ok = _a_rows(offs_f, f_token_ids, num_slots, top_k, ROWS)
    else:
        offs_f, f_token_ids, f_rows, f_ok = offs_m, token_ids, a_rows, row_ok  # unused
    if SCALES == "none" or SCALES == "outer":
        acc, acc_f = _k_loop(A, a_desc, W, w_desc, a_rows, row_ok, f_rows, f_ok, row0, expert, w_row0, w_rows, K,
                             HALVES, EVEN_K, DOT, TILE_M, FOLD_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        if SCALES == "outer":  # one scale per row and per weight row for all of K: the sum is scaled once
            acc = acc * _outer_scales(S, a_rows, row_ok, expert, w_rows)
    else:
        acc = _k_loop_block_scaled(A, a_desc, W, w_desc, S, a_rows, row_ok, row0, expert, w_row0, w_rows, N, K,
                                   HALVES, SCALES, SCALE_GROUP_K, EVEN_K, DOT, TILE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    _epilogue(acc, C, EPI, topk_weights_ptr, offs_m, token_ids, token_ids < num_slots, expert, n0, w_rows, N, ROWS,
              SWIGLU, SCALE_GROUP_K, DOT, TILE_M, BLOCK_SIZE_N)
    if FOLD_M > 0:  # stored by pointer too
        _epilogue(acc_f, C, EPI, topk_weights_ptr, offs_f, f_token_ids, f_token_ids < num_slots, expert, n0, w_rows,
                  N, ROWS, SWIGLU, SCALE_GROUP_K, DOT, FOLD_M, BLOCK_SIZE_N)


@triton.jit
def _a_rows(offs_m, token_ids, num_slots, top_k, ROWS: tl.constexpr):
    """The rows of A that schedule rows offs_m read (int64: T*k*H can pass 2^31), and which rows to load:
    gathered token rows sorted_token_id // top_k, padding rows masked; else the schedule rows themselves."""
    if ROWS == "gather":
        a_rows = (token_ids // top_k).to(tl.int64)
        row_ok = token_ids < num_slots
    else:
        a_rows = offs_m.to(tl.int64)
        row_ok = tl.full(offs_m.shape, 1, tl.int1)  # constant-true: the mask folds away
    return a_rows, row_ok


@triton.jit
def _weight_rows(pid_n, N, SWIGLU: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """(n0, w_row0, w_rows): the first output column of N-tile pid_n, the first weight row its program reads
    (of a descriptor box; the gate half's with halves) and its BLOCK_SIZE_N weight rows. N is wrapped instead
    of masked: columns past N are computed, then dropped by the store mask. With SWIGLU in halves the gate rows
    n0 + j in the first half and the up rows N + n0 + j in the second; interleaved, rows 2 n0 + j."""
    lane_n = tl.arange(0, BLOCK_SIZE_N)
    if gate_up_halves(SWIGLU):
        n0 = pid_n * (BLOCK_SIZE_N // 2)
        w_row0 = n0
        half_n = BLOCK_SIZE_N // 2
        # A select, not arithmetic on (lane >= half): that form made Triton 3.6 overestimate the rows'
        # alignment and copy 16 bytes from unaligned rows (tests/tools/test_compile_check.py, swiglu).
        w_rows = tl.where(lane_n < half_n, (n0 + lane_n) % N, N + (n0 + lane_n - half_n) % N)
    elif SWIGLU != "none":  # interleaved
        n0 = pid_n * (BLOCK_SIZE_N // 2)
        w_row0 = 2 * n0
        w_rows = (w_row0 + lane_n) % (2 * N)
    else:
        n0 = pid_n * BLOCK_SIZE_N
        w_row0 = n0
        w_rows = (n0 + lane_n) % N
    return n0, w_row0, w_rows


@triton.jit
def _k_mask(offs_k, k_left, EVEN_K: tl.constexpr):
    """Which of a step's channels lie inside K (constant-true where K is a multiple of the step)."""
    if EVEN_K:
        k_ok = tl.full(offs_k.shape, 1, tl.int1)
    else:
        k_ok = offs_k < k_left
    return k_ok


@triton.jit
def _load_a(a_desc, a_ptrs, row0, k0, row_ok, k_ok, A_BOX: tl.constexpr):
    """A's rows at channel k0: one box of its tensor descriptor (A_BOX: its box is the tile's rows), else
    pointer loads."""
    if A_BOX:
        a = a_desc.load([row0, k0])
    else:
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    return a


@triton.jit
def _load_w(w_desc, w_ptrs, expert, w_row0, k0, k_ok, HALVES: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
            DOT_K: tl.constexpr):
    """The weight tile [DOT_K, BLOCK_SIZE_N] at channel k0: through W's tensor descriptor where there is one
    (with gate and up in HALVES a 4-D one over w viewed as [E, 2, N, K]: gate and up boxes land in one tile;
    else the BLOCK_SIZE_N rows from w_row0), else by pointer."""
    if w_desc is not None:
        if HALVES:
            w = w_desc.load([expert, 0, w_row0, k0])
        else:
            w = w_desc.load([expert, w_row0, k0])
        w = w.reshape(BLOCK_SIZE_N, DOT_K).T
    else:
        w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
    return w


@triton.jit
def _k_loop(A, a_desc, W, w_desc, a_rows, row_ok, f_rows, f_ok, row0, expert, w_row0, w_rows, K, HALVES: tl.constexpr,
            EVEN_K: tl.constexpr, DOT: tl.constexpr, TILE_M: tl.constexpr, FOLD_M: tl.constexpr,
            BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """The float32 sums of a tile (and of its folded tail's FOLD_M rows f_rows, on the same weight tile) over
    all of K, for float operands and for float8 ones with outer scales (`_dot` knows the difference)."""
    a_ptr, stride_am, stride_ak = A
    w_ptr, stride_we, stride_wn, stride_wk = W
    # A tile reads A through its descriptor where the descriptor's box is the tile's rows: a smaller tail
    # tile, or a folded tail, reads by pointer.
    A_BOX: tl.constexpr = a_desc is not None and a_desc.block_shape[0] == TILE_M
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    f_ptrs = a_ptr + f_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + w_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((TILE_M, BLOCK_SIZE_N), dtype=tl.float32)
    acc_f = tl.zeros((FOLD_M if FOLD_M > 0 else 1, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k0 = kb * BLOCK_SIZE_K
        k_ok = _k_mask(offs_k, K - k0, EVEN_K)
        a = _load_a(a_desc, a_ptrs, row0, k0, row_ok, k_ok, A_BOX)
        w = _load_w(w_desc, w_ptrs, expert, w_row0, k0, k_ok, HALVES, BLOCK_SIZE_N, BLOCK_SIZE_K)
        if not A_BOX:
            a_ptrs += BLOCK_SIZE_K * stride_ak
        if w_desc is None:
            w_ptrs += BLOCK_SIZE_K * stride_wk
        acc = _dot(acc, a, w, DOT)
        if FOLD_M > 0:
            a_f = tl.load(f_ptrs, mask=f_ok[:, None] & k_ok[None, :], other=0.0)
            f_ptrs += BLOCK_SIZE_K * stride_ak
            acc_f = _dot(acc_f, a_f, w, DOT)
    return acc, acc_f


@triton.jit
def _outer_scales(S, a_rows, row_ok, expert, w_rows):
    """[rows, columns] products of the rows' scales (per token, or one per tensor with stride 0) and the
    weight rows' (per channel, or one per expert with stride 0)."""
    a_scale_ptr, w_scale_ptr, stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, scale_group_n = S
    a_s = tl.load(a_scale_ptr + a_rows * stride_asm, mask=row_ok, other=0.0)
    w_s = tl.load(w_scale_ptr + expert.to(tl.int64) * stride_wse + (w_rows // scale_group_n) * stride_wsn)
    return a_s[:, None] * w_s[None, :]


@triton.jit
def _k_loop_block_scaled(A, a_desc, W, w_desc, S, a_rows, row_ok, row0, expert, w_row0, w_rows, N, K,
                         HALVES: tl.constexpr, SCALES: tl.constexpr, SCALE_GROUP_K: tl.constexpr, EVEN_K: tl.constexpr,
                         DOT: tl.constexpr, TILE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                         BLOCK_SIZE_K: tl.constexpr):
    """The float32 sums of a float8 tile whose scales change along K (block_shape): each dot's product is
    scaled before it is added. A K step is one dot where BLOCK_SIZE_K divides SCALE_GROUP_K, else one dot per
    scale block it spans (larger loads per step at decode, the sums in the same order). With SCALES ==
    "block_tile" the tile's weight rows lie in one scale block (each half's, with HALVES): one weight scale
    per dot, folded into the rows' scales, each step's scales loaded a step ahead so their latency hides
    behind the MMAs."""
    a_ptr, stride_am, stride_ak = A
    w_ptr, stride_we, stride_wn, stride_wk = W
    a_scale_ptr, w_scale_ptr, stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, scale_group_n = S
    DOTS_PER_STEP: tl.constexpr = BLOCK_SIZE_K // SCALE_GROUP_K if BLOCK_SIZE_K > SCALE_GROUP_K else 1
    DOT_K: tl.constexpr = BLOCK_SIZE_K // DOTS_PER_STEP
    A_BOX: tl.constexpr = a_desc is not None and a_desc.block_shape[0] == TILE_M  # as in `_k_loop`
    offs_k = tl.arange(0, DOT_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + w_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk
    a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
    w_scale_expert = w_scale_ptr + expert.to(tl.int64) * stride_wse
    lane_n = tl.arange(0, BLOCK_SIZE_N)
    num_k_steps = tl.cdiv(K, BLOCK_SIZE_K)
    num_dots = tl.cdiv(K, DOT_K)  # dots past K (a ragged last step) multiply zeros by the last group's scales
    if SCALES == "block_tile":
        w_tile_scale_ptr = w_scale_expert + (w_row0 // scale_group_n) * stride_wsn  # the gate rows' with HALVES
        w_up_scale_ptr = w_scale_expert + ((N + w_row0) // scale_group_n) * stride_wsn  # unused without HALVES
        next_a_s, next_w_s, next_w_up_s = _step_scales(a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, 0,
                                                       num_dots, stride_ask, stride_wsk, HALVES, DOTS_PER_STEP,
                                                       DOT_K, SCALE_GROUP_K)
    else:
        w_scale_ptrs = w_scale_expert + (w_rows // scale_group_n) * stride_wsn
    acc = tl.zeros((TILE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(0, num_k_steps):
        for d in tl.static_range(DOTS_PER_STEP):
            k0 = kb * BLOCK_SIZE_K + d * DOT_K
            k_ok = _k_mask(offs_k, K - k0, EVEN_K)
            a = _load_a(a_desc, a_ptrs, row0, k0, row_ok, k_ok, A_BOX)
            w = _load_w(w_desc, w_ptrs, expert, w_row0, k0, k_ok, HALVES, BLOCK_SIZE_N, DOT_K)
            if not A_BOX:
                a_ptrs += DOT_K * stride_ak
            if w_desc is None:
                w_ptrs += DOT_K * stride_wk
            if SCALES == "block_tile":
                if d == 0:  # this step's scales; the last step loads its own again (no load past the K groups)
                    step_a_s, step_w_s, step_w_up_s = next_a_s, next_w_s, next_w_up_s
                    next_a_s, next_w_s, next_w_up_s = _step_scales(
                        a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, tl.minimum(kb + 1, num_k_steps - 1),
                        num_dots, stride_ask, stride_wsk, HALVES, DOTS_PER_STEP, DOT_K, SCALE_GROUP_K)
                a_s = _dot_scale(step_a_s, d, DOTS_PER_STEP)
                w_s = _dot_scale(step_w_s, d, DOTS_PER_STEP)
                if HALVES:  # gate columns first, then up columns, as w_rows holds them
                    w_up_s = _dot_scale(step_w_up_s, d, DOTS_PER_STEP)
                    scale = tl.where(lane_n[None, :] < BLOCK_SIZE_N // 2, (a_s * w_s)[:, None], (a_s * w_up_s)[:, None])
                else:
                    scale = (a_s * w_s)[:, None]
            else:  # one weight scale per column (DOT_K divides the group)
                if DOTS_PER_STEP > 1:  # a ragged last step's dots past K read the last group's scales
                    group = (tl.minimum(k0 // DOT_K, num_dots - 1) * DOT_K) // SCALE_GROUP_K
                else:
                    group = k0 // SCALE_GROUP_K
                a_s = tl.load(a_scale_ptrs + group * stride_ask, mask=row_ok, other=0.0)
                w_s = tl.load(w_scale_ptrs + group * stride_wsk)
                scale = a_s[:, None] * w_s[None, :]
            acc += _product(a, w, DOT) * scale
    return acc


@triton.jit
def _dot(acc, a, w, DOT: tl.constexpr):
    """acc + a @ w in float32. Float8 products are added to the float32 sum one K step at a time (Hopper's
    float8 MMA keeps fewer accumulator bits, DeepSeek-V3 §3.3.2, arXiv:2412.19437); other dtypes accumulate
    in the MMA, float32 ones at full precision with DOT == "ieee" (PyTorch's "highest" matmul precision).
    Under the interpreter (DOT == "interpreter") each product is added (`_product`)."""
    if DOT == "interpreter":
        acc += _product(a, w, DOT)
    elif a.dtype == tl.float8e4nv:
        acc += tl.dot(a, w)
    elif DOT == "ieee":
        acc = tl.dot(a, w, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, w, acc)
    return acc


@triton.jit
def _product(a, w, DOT: tl.constexpr):
    """One K step's product a @ w in float32. Under the interpreter exactly, through float64, then rounded:
    numpy's BLAS orders a row's sum by the shape of the whole tile, so a row's float32 result would change
    with the rows beside it (a token's output with its batch), which a GPU's MMA never does; and its
    bfloat16 and float8 dots would multiply raw bit patterns (float8 NaN kept NaN)."""
    if DOT == "interpreter":
        product = tl.dot(_exact_float(a).to(tl.float64), _exact_float(w).to(tl.float64),
                         input_precision="ieee").to(tl.float32)
    else:
        product = tl.dot(a, w)
    return product


@triton.jit
def _exact_float(x):
    """x as float32, exactly (the interpreter reads float8 NaN as +-480: `e4m3_to_float32` keeps it NaN)."""
    if x.dtype == tl.float8e4nv:
        y = e4m3_to_float32(x)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def _step_scales(a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, step, num_dots, stride_ask, stride_wsk,
                 HALVES: tl.constexpr, DOTS_PER_STEP: tl.constexpr, DOT_K: tl.constexpr, SCALE_GROUP_K: tl.constexpr):
    """The scales of K step `step`'s dots, for tiles with one weight scale (per half with HALVES): the rows'
    ([TILE_M]) and the weight's (a scalar), or with several dots per step one column / element per dot
    ([TILE_M, DOTS_PER_STEP], [DOTS_PER_STEP]); dots past K read the last group's. No up scale without HALVES."""
    if DOTS_PER_STEP == 1:
        group = (step * DOT_K) // SCALE_GROUP_K
        a_s = tl.load(a_scale_ptrs + group * stride_ask, mask=row_ok, other=0.0)
    else:
        group = (tl.minimum(step * DOTS_PER_STEP + tl.arange(0, DOTS_PER_STEP), num_dots - 1) * DOT_K) // SCALE_GROUP_K
        a_s = tl.load(a_scale_ptrs[:, None] + group[None, :] * stride_ask, mask=row_ok[:, None], other=0.0)
    w_s = tl.load(w_tile_scale_ptr + group * stride_wsk)
    w_up_s = tl.load(w_up_scale_ptr + group * stride_wsk) if HALVES else w_s
    return a_s, w_s, w_up_s


@triton.jit
def _dot_scale(step_scales, d: tl.constexpr, DOTS_PER_STEP: tl.constexpr):
    """Dot d's scales out of `_step_scales`' (the last axis picked where a step has several dots)."""
    if DOTS_PER_STEP == 1:
        picked = step_scales
    elif len(step_scales.shape) == 2:
        picked = tl.sum(tl.where((tl.arange(0, DOTS_PER_STEP) == d)[None, :], step_scales, 0.0), axis=1)
    else:
        picked = tl.sum(tl.where(tl.arange(0, DOTS_PER_STEP) == d, step_scales, 0.0), axis=0)
    return picked


@triton.jit
def _epilogue(acc, C, EPI, topk_weights_ptr, offs_m, token_ids, token_valid, expert, n0, w_rows, N,
              ROWS: tl.constexpr, SWIGLU: tl.constexpr, SCALE_GROUP_K: tl.constexpr, DOT: tl.constexpr,
              TILE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """The float32 sums acc [TILE_M, BLOCK_SIZE_N] of schedule rows offs_m (slots token_ids) to the output:
    plus the bias of each weight row w_rows (where bias_ptr is given), the gated activation (SWIGLU), times
    the routed weight (where topk_weights_ptr is given), rounded to C's dtype, or
    with an output scale pointer quantized to float8 with one scale per row per SCALE_GROUP_K columns (the
    down GEMM's input); stored in sorted order, or scattered to the rows' slots (ROWS == "scatter")."""
    c_ptr, c_scale_ptr, stride_cm, stride_cn, stride_csm, stride_csk = C
    bias_ptr, stride_be, stride_bn, alpha, limit = EPI
    if bias_ptr is not None:  # one per weight row (wrapped rows, in bounds): before the activation and weight
        bias = tl.load(bias_ptr + expert.to(tl.int64) * stride_be + w_rows * stride_bn)
        acc = acc + bias.to(tl.float32)[None, :]
    if SWIGLU != "none":  # the activation in float32, before anything is rounded to the output dtype
        if gate_up_halves(SWIGLU):  # gate columns, then up columns
            gate, up = tl.split(acc.reshape(TILE_M, 2, BLOCK_SIZE_N // 2).permute(0, 2, 1))
        else:  # interleaved: even columns gate, odd columns up
            gate, up = tl.split(acc.reshape(TILE_M, BLOCK_SIZE_N // 2, 2))
        acc = gated_activation(gate, up, SWIGLU, alpha, limit)
        offs_n = n0 + tl.arange(0, BLOCK_SIZE_N // 2)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_SIZE_N)
    if topk_weights_ptr is not None:
        routed = tl.load(topk_weights_ptr + token_ids, mask=token_valid, other=0.0)
        acc = acc * routed.to(tl.float32)[:, None]
    if ROWS == "scatter":
        c_rows = token_ids.to(tl.int64)
        row_mask = token_valid
    else:
        c_rows = offs_m.to(tl.int64)
        row_mask = tl.full([TILE_M], 1, tl.int1)
    emulate = DOT == "interpreter"
    if c_scale_ptr is not None:  # float8 output (a tile holds whole groups)
        TILE_N: tl.constexpr = BLOCK_SIZE_N // 2 if SWIGLU != "none" else BLOCK_SIZE_N
        acc = tl.where(offs_n[None, :] < N, acc, 0.0)  # columns past N (wrapped weight rows) are no group's
        acc, c_scale = quantize_groups_e4m3(acc.reshape(TILE_M, TILE_N // SCALE_GROUP_K, SCALE_GROUP_K), emulate)
        acc = acc.reshape(TILE_M, TILE_N)
        groups = n0 // SCALE_GROUP_K + tl.arange(0, TILE_N // SCALE_GROUP_K)
        tl.store(c_scale_ptr + c_rows[:, None] * stride_csm + groups[None, :] * stride_csk, c_scale,
                 mask=row_mask[:, None] & (groups[None, :] * SCALE_GROUP_K < N))
        c = cast_e4m3(acc, emulate)
    else:
        if emulate and c_ptr.dtype.element_ty == tl.bfloat16:  # the interpreter truncates; GPUs round to even
            acc = round_to_bf16_grid(acc)
        c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=row_mask[:, None] & (offs_n[None, :] < N))
