"""The grouped matmul: for every M-block of the aligned schedule, C[rows] = A[rows] @ W[expert].T.

One program computes one BLOCK_SIZE_M x BLOCK_SIZE_N tile of one expert. The two operands each have a
load path chosen at launch (constexpr):
  A: pointer loads of gathered rows (GATHER_A: row = sorted_token_id // TOP_K, the up projection), or
     rows in expert-sorted padded order, by pointer or through a 2-D tensor descriptor (A_TMA; the down
     projection). Every M-block belongs to one expert, so a descriptor box never spans two experts.
  W: pointer loads, or a 3-D tensor descriptor over [E, N, K] with block [1, BLOCK_SIZE_N, BLOCK_SIZE_K]
     (W_TMA).
FP8 (SCALES, float8_e4m3fn A and W with float32 scales, DeepSeek-V3's w8a8 format, arXiv:2412.19437 §3.3):
"block" scales change along K, one per SCALE_GROUP_K channels of a row (activations, per token) and one per
SCALE_GROUP_N x SCALE_GROUP_K block of W; each dot's product is scaled before it is added: a K step is one
dot where BLOCK_SIZE_K divides SCALE_GROUP_K, or DOTS_PER_STEP dots, one per scale block, where it spans
several (larger loads per step at decode, the sums in the same order); where a tile's weight rows lie in
one scale block (W_SCALE_PER_TILE), its weight scale is one number per dot (one per half with SWIGLU),
folded into the rows' scales, and each step's scales are loaded a step ahead. "outer" scales
are one per row (per token, or a per-tensor one with stride 0) and one per weight row (per channel, or per
expert with stride 0): the sum is scaled once. With FAST_ACCUM (outer scales on a GPU) the MMA itself
accumulates over all of K, as vLLM's per-tensor FP8 MoE kernel and cuBLAS's use_fast_accum do: Hopper's
FP8 MMA keeps fewer accumulator bits than float32 (DeepSeek-V3 §3.3.2), but no K step waits for its
product, so the tiles of bf16 fit; without it each K step's product is added to a float32 sum.
With QUANT_GROUP (float8 operands and the SwiGLU epilogue), the tile's float32 output is quantized as the
down GEMM reads it: one scale per row per QUANT_GROUP columns (a tile holds whole groups), float8 values.
The epilogue optionally multiplies by the routed weight and writes rows in sorted order or scatters them
to their flat (token, k) slot (SCATTER_C).

SwiGLU epilogue (SWIGLU, the up projection of a SwiGLU expert): W holds the gate rows [0, N) and the up
rows [N, 2N) (w1 = [gate; up]). A program's BLOCK_SIZE_N weight rows are gate rows n0 .. n0 + BLOCK_SIZE_N/2
and the up rows N + n0 .. (through TMA, one box of a 4-D descriptor over W viewed as [E, 2, N, K]), so the
K loop runs one dot as wide as the unfused GEMM's; the epilogue splits the float32 accumulator into its
gate and up halves and writes silu(gate) * up: [rows, N] activations, with no [rows, 2N] round trip
through memory and no float16 overflow of a large pre-activation whose product is small (Shazeer, "GLU
Variants Improve Transformer", arXiv:2002.05202).

Tail tiles (TAIL_SPLITS): an expert's last M-block is mostly padding when its row count is not a multiple
of BLOCK_SIZE_M, and padding rows cost as much tensor-core work as real ones. Valid rows come first in a
block, so one look at the row halfway (a quarter of the way) in tells whether a half (quarter) tile
holds them all; such blocks run a smaller tile. Rows the smaller tile skips are padding: never written.

Folded tails (FOLD_M): where an expert's last M-block holds at most FOLD_M valid rows, the block before it
(the same expert's, full) computes them too, in a second FOLD_M-row dot on the same weight tile, and the
last block's own program ends at once. A small tail then costs a fraction of a tile's MMAs and no second
pass over the expert's weights (a tail tile reads its weight tile again). Each row's K reduction runs in
the same order either way.
"""
import triton
import triton.language as tl

from .common import cast_e4m3, e4m3_to_float32, quantize_groups_e4m3, round_to_bf16_grid, wait_for_previous_kernel


# Arguments that change with the token count are not specialized, so a new T never recompiles; nor are the
# pointers read a word at a time or gathered, which may point into a caller's tensor at any offset (a chunk's
# routed weights; slot order's block map, the caller's topk_ids): no variant per alignment.
@triton.jit(do_not_specialize=["num_slots", "num_m_blocks", "expert_ids_ptr", "topk_weights_ptr"])
def grouped_matmul_kernel(
    a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr,
    topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, num_slots, num_m_blocks, num_experts,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
    TOP_K: tl.constexpr, GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr, SWIGLU: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr,
    SCALES: tl.constexpr, SCALE_GROUP_N: tl.constexpr, SCALE_GROUP_K: tl.constexpr, W_SCALE_PER_TILE: tl.constexpr,
    QUANT_GROUP: tl.constexpr, INTERPRETER: tl.constexpr, EVEN_K: tl.constexpr, EMULATE_BF16: tl.constexpr, FP32_IEEE: tl.constexpr, TAIL_SPLITS: tl.constexpr,
    FOLD_M: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, DOTS_PER_STEP: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, PDL: tl.constexpr, FAST_ACCUM: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    # The combinations the layer uses: gather without scatter (up), sorted rows with or without scatter,
    # routed weights only where rows are scattered to their slots (down).
    tl.static_assert(not (GATHER_A and SCATTER_C), "GATHER_A with SCATTER_C is not supported")
    tl.static_assert(SCATTER_C or not MUL_ROUTED_WEIGHT, "MUL_ROUTED_WEIGHT needs SCATTER_C")
    tl.static_assert(not (SWIGLU and SCATTER_C), "SWIGLU writes sorted rows (the up projection)")
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_m_blocks, _num_pid_n(N, SWIGLU, BLOCK_SIZE_N), GROUP_SIZE_M)

    # The grid is sized by the bound on padded rows; blocks past the real end have nothing to do. The
    # schedule's words this program needs are all loaded before the first branch (every address is in
    # bounds: the buffers are sized by the bound), so they cost one round trip to memory, not one each.
    row0 = pid_m * BLOCK_SIZE_M
    rows_in_use = tl.load(num_tokens_post_padded_ptr)
    # In its own dtype: a slot-order schedule's block map is topk_ids itself, whose ids may lie outside [0, E).
    block_expert = tl.load(expert_ids_ptr + pid_m)
    # Tail tiles (see above). Smaller tiles read A by pointer: the descriptor's box is BLOCK_SIZE_M rows.
    half_pad = False
    quarter_pad = False
    if TAIL_SPLITS >= 1:
        half_pad = tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M // 2) >= num_slots
    if TAIL_SPLITS >= 2:
        quarter_pad = tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M // 4) >= num_slots
    # Folded tails (see above): a block and the next of the same expert, whose row FOLD_M is padding. Blocks
    # past the end have expert -1, so no block in use folds one that is not.
    fold_next = False
    if FOLD_M > 0:
        tl.static_assert(SCALES == "none", "folded tails are for float operands")
        has_next = pid_m + 1 < num_m_blocks
        next_expert = tl.load(expert_ids_ptr + pid_m + 1, mask=has_next, other=-1)
        next_small = tl.load(sorted_token_ids_ptr + row0 + BLOCK_SIZE_M + FOLD_M, mask=has_next, other=0) >= num_slots
        prev_expert = tl.load(expert_ids_ptr + pid_m - 1, mask=pid_m > 0, other=-1)
        own_small = tl.load(sorted_token_ids_ptr + row0 + FOLD_M) >= num_slots
        fold_next = (next_expert == block_expert) & next_small
    if (row0 >= rows_in_use) | (block_expert < 0) | (block_expert >= num_experts):
        return
    if FOLD_M > 0:
        if (prev_expert == block_expert) & own_small:  # folded into the block before
            return
    expert = block_expert.to(tl.int32)
    if fold_next:
        _tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
              row0, expert, pid_n, N, K, num_slots,
              stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
              stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
              SCALES, SCALE_GROUP_N, SCALE_GROUP_K, W_SCALE_PER_TILE, QUANT_GROUP, INTERPRETER,
              TOP_K, GATHER_A, SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, A_TMA, W_TMA, False, EVEN_K, EMULATE_BF16, FP32_IEEE,
              BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, DOTS_PER_STEP, FAST_ACCUM, FOLD_M)
    elif quarter_pad:
        _tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
              row0, expert, pid_n, N, K, num_slots,
              stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
              stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
              SCALES, SCALE_GROUP_N, SCALE_GROUP_K, W_SCALE_PER_TILE, QUANT_GROUP, INTERPRETER,
              TOP_K, GATHER_A, SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, False, W_TMA, False, EVEN_K, EMULATE_BF16, FP32_IEEE,
              BLOCK_SIZE_M // 4, BLOCK_SIZE_N, BLOCK_SIZE_K, DOTS_PER_STEP, FAST_ACCUM, 0)
    elif half_pad:
        _tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
              row0, expert, pid_n, N, K, num_slots,
              stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
              stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
              SCALES, SCALE_GROUP_N, SCALE_GROUP_K, W_SCALE_PER_TILE, QUANT_GROUP, INTERPRETER,
              TOP_K, GATHER_A, SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, False, W_TMA, False, EVEN_K, EMULATE_BF16, FP32_IEEE,
              BLOCK_SIZE_M // 2, BLOCK_SIZE_N, BLOCK_SIZE_K, DOTS_PER_STEP, FAST_ACCUM, 0)
    else:
        _tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
              row0, expert, pid_n, N, K, num_slots,
              stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
              stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
              SCALES, SCALE_GROUP_N, SCALE_GROUP_K, W_SCALE_PER_TILE, QUANT_GROUP, INTERPRETER,
              TOP_K, GATHER_A, SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, A_TMA, W_TMA, False, EVEN_K, EMULATE_BF16, FP32_IEEE,
              BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, DOTS_PER_STEP, FAST_ACCUM, 0)


# As for grouped_matmul_kernel.
@triton.jit(do_not_specialize=["num_slots", "num_m_blocks", "expert_ids_ptr", "topk_weights_ptr"])
def grouped_matmul_persistent_kernel(
    a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr,
    topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, num_slots, num_m_blocks, num_experts,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
    TOP_K: tl.constexpr, GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr, SWIGLU: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr,
    C_TMA: tl.constexpr, SCALES: tl.constexpr, SCALE_GROUP_N: tl.constexpr, SCALE_GROUP_K: tl.constexpr, W_SCALE_PER_TILE: tl.constexpr,
    QUANT_GROUP: tl.constexpr, INTERPRETER: tl.constexpr, EVEN_K: tl.constexpr, EMULATE_BF16: tl.constexpr, FP32_IEEE: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, DOTS_PER_STEP: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, PDL: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """The same tiles as `grouped_matmul_kernel`, walked by a grid of P programs (one per SM): program p
    takes tiles p, p + P, ... of the M-blocks in use, whose count it reads from
    num_tokens_post_padded on the device (no host sync; the grid does not depend on T). With FLATTEN the
    tile loop and the K loop become one loop that Triton software-pipelines across tile boundaries, so the
    next tile's loads are in flight during this tile's epilogue (Triton's persistent-matmul tutorial,
    python/tutorials/09-persistent-matmul.py). Every tile runs whole (no tail tiles): a loop nest with
    branches of different tile sizes cannot be flattened. Each row's K reduction runs in the same order as
    in `grouped_matmul_kernel`, so results are bitwise the same. Expert-sorted schedules only (the launcher's
    plan sees to it): every block in use has an expert in [0, E), so no tile is skipped, and num_experts
    (passed to both kernels alike) goes unused. With C_TMA (sorted rows of a float dtype) each tile leaves
    through c_desc, a tensor descriptor over the output with block [BLOCK_SIZE_M, columns of a tile]: a bulk
    copy that runs on while the next tile starts (the launcher's switch TMA_STORE, off: no faster on an
    H200). The per-tile kernel takes c_desc too and stores by pointer."""
    wait_for_previous_kernel(PDL)
    tl.static_assert(not (GATHER_A and SCATTER_C), "GATHER_A with SCATTER_C is not supported")
    tl.static_assert(SCATTER_C or not MUL_ROUTED_WEIGHT, "MUL_ROUTED_WEIGHT needs SCATTER_C")
    tl.static_assert(not (SWIGLU and SCATTER_C), "SWIGLU writes sorted rows (the up projection)")
    num_pid_n = _num_pid_n(N, SWIGLU, BLOCK_SIZE_N)
    # Blocks in use all belong to an expert (expert_ids is -1 only past them).
    num_used_blocks = tl.load(num_tokens_post_padded_ptr) // BLOCK_SIZE_M
    for tile in tl.range(tl.program_id(0), num_used_blocks * num_pid_n, tl.num_programs(0), flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile, num_used_blocks, num_pid_n, GROUP_SIZE_M)
        _tile(a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
              pid_m * BLOCK_SIZE_M, tl.load(expert_ids_ptr + pid_m), pid_n, N, K, num_slots,
              stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
              stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
              SCALES, SCALE_GROUP_N, SCALE_GROUP_K, W_SCALE_PER_TILE, QUANT_GROUP, INTERPRETER,
              TOP_K, GATHER_A, SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, A_TMA, W_TMA, C_TMA, EVEN_K, EMULATE_BF16, FP32_IEEE,
              BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, DOTS_PER_STEP, FAST_ACCUM, 0)


@triton.jit
def _step_product(a, w, INTERPRETER: tl.constexpr):
    """One K step's product a @ w in float32. Under the interpreter through float64, then rounded: numpy's
    BLAS orders a row's sum by the shape of the whole tile, so a row's float32 result would change with the
    rows beside it (a token's output with its batch), which a GPU's MMA never does."""
    if INTERPRETER:
        product = tl.dot(a.to(tl.float64), w.to(tl.float64), input_precision="ieee").to(tl.float32)
    else:
        product = tl.dot(a, w)
    return product


@triton.jit
def _step_scales(a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, step, num_dots, stride_ask, stride_wsk,
                 SWIGLU: tl.constexpr, DOTS_PER_STEP: tl.constexpr, DOT_K: tl.constexpr, SCALE_GROUP_K: tl.constexpr):
    """The scales of K step `step`'s dots, for tiles with one weight scale (per half with SWIGLU): the rows'
    ([TILE_M]) and the weight's (a scalar), or with several dots per step one column / element per dot
    ([TILE_M, DOTS_PER_STEP], [DOTS_PER_STEP]); dots past K read the last group's. No up scale without SWIGLU."""
    if DOTS_PER_STEP == 1:
        group = (step * DOT_K) // SCALE_GROUP_K
        a_s = tl.load(a_scale_ptrs + group * stride_ask, mask=row_ok, other=0.0)
    else:
        group = (tl.minimum(step * DOTS_PER_STEP + tl.arange(0, DOTS_PER_STEP), num_dots - 1) * DOT_K) // SCALE_GROUP_K
        a_s = tl.load(a_scale_ptrs[:, None] + group[None, :] * stride_ask, mask=row_ok[:, None], other=0.0)
    w_s = tl.load(w_tile_scale_ptr + group * stride_wsk)
    w_up_s = tl.load(w_up_scale_ptr + group * stride_wsk) if SWIGLU else w_s
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
def _num_pid_n(N, SWIGLU: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """N-tiles per M-block: a program writes BLOCK_SIZE_N columns, BLOCK_SIZE_N/2 with SWIGLU."""
    if SWIGLU:
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
def _tile(
    a_ptr, a_desc, w_ptr, w_desc, c_ptr, c_desc, a_scale_ptr, w_scale_ptr, c_scale_ptr, topk_weights_ptr,
    sorted_token_ids_ptr, row0, expert, pid_n, N, K, num_slots,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk, stride_csm, stride_csk,
    SCALES: tl.constexpr, SCALE_GROUP_N: tl.constexpr, SCALE_GROUP_K: tl.constexpr, W_SCALE_PER_TILE: tl.constexpr,
    QUANT_GROUP: tl.constexpr, INTERPRETER: tl.constexpr,
    TOP_K: tl.constexpr, GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    SWIGLU: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr, C_TMA: tl.constexpr, EVEN_K: tl.constexpr,
    EMULATE_BF16: tl.constexpr, FP32_IEEE: tl.constexpr, TILE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    DOTS_PER_STEP: tl.constexpr, FAST_ACCUM: tl.constexpr, FOLD_M: tl.constexpr,
):
    """One TILE_M x BLOCK_SIZE_N tile of expert `expert`, rows row0 .. row0 + TILE_M of the schedule.
    With SWIGLU the BLOCK_SIZE_N weight rows are BLOCK_SIZE_N/2 gate rows and the matching up rows, one
    dot as wide as without it, and the tile writes BLOCK_SIZE_N/2 columns of the N = I outputs. With
    FOLD_M > 0 (float operands) also the next FOLD_M rows, the next block's valid ones (a folded tail),
    in a second dot on the same weight tile."""
    offs_m = row0 + tl.arange(0, TILE_M)
    token_ids = tl.load(sorted_token_ids_ptr + offs_m)
    token_valid = token_ids < num_slots
    # int64 only where it matters: token rows (T*k*H can pass 2^31) and the expert's weight offset.
    if GATHER_A:
        a_rows = (token_ids // TOP_K).to(tl.int64)
    else:
        a_rows = offs_m.to(tl.int64)
    # DOTS_PER_STEP > 1 (block scales only): a K step of BLOCK_SIZE_K spans that many scale blocks, loaded
    # and multiplied one block (DOT_K channels) at a time, so a step's loads are larger than one scale block.
    tl.static_assert(DOTS_PER_STEP == 1 or SCALES == "block", "several dots per K step need block scales")
    DOT_K: tl.constexpr = BLOCK_SIZE_K // DOTS_PER_STEP
    offs_k = tl.arange(0, DOT_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    if FOLD_M > 0:  # the folded tail's rows, by pointer (a descriptor's box is BLOCK_SIZE_M rows)
        offs_f = row0 + TILE_M + tl.arange(0, FOLD_M)
        f_token_ids = tl.load(sorted_token_ids_ptr + offs_f)
        f_valid = f_token_ids < num_slots
        if GATHER_A:
            f_rows = (f_token_ids // TOP_K).to(tl.int64)
            f_row_ok = f_valid
        else:
            f_rows = offs_f.to(tl.int64)
            f_row_ok = tl.full([FOLD_M], 1, tl.int1)
        f_ptrs = a_ptr + f_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
        acc_f = tl.zeros((FOLD_M, BLOCK_SIZE_N), dtype=tl.float32)
    # Weight rows of the tile. Wrap N instead of masking loads: columns past N are computed and then
    # dropped by the store mask.
    lane_n = tl.arange(0, BLOCK_SIZE_N)
    if SWIGLU:  # gate rows n0 + j in the first half, up rows N + n0 + j in the second
        n0 = pid_n * (BLOCK_SIZE_N // 2)
        half_n = BLOCK_SIZE_N // 2
        # A select, not arithmetic on (lane >= half): that form made Triton 3.6 overestimate the rows'
        # alignment and copy 16 bytes from unaligned rows (tests/test_compile_check.py, swiglu).
        w_rows = tl.where(lane_n < half_n, (n0 + lane_n) % N, N + (n0 + lane_n - half_n) % N)
    else:
        n0 = pid_n * BLOCK_SIZE_N
        w_rows = (n0 + lane_n) % N
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + w_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk

    # Masks that are constant-true fold away: gathered rows need a row mask, a ragged K a column mask.
    if GATHER_A:
        row_ok = token_valid
    else:
        row_ok = tl.full([TILE_M], 1, tl.int1)
    if SCALES != "none":  # FP8: a scale per row (of a K group) and per weight row (of a K group)
        a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
        w_scale_expert = w_scale_ptr + expert.to(tl.int64) * stride_wse
    if SCALES == "outer" or (SCALES == "block" and not W_SCALE_PER_TILE):  # one per column of the tile
        w_scale_ptrs = w_scale_expert + (w_rows // SCALE_GROUP_N) * stride_wsn
    num_k_steps = tl.cdiv(K, BLOCK_SIZE_K)
    num_dots = tl.cdiv(K, DOT_K)  # dots past K (a ragged last step) multiply zeros by the last group's scales
    if SCALES == "block" and W_SCALE_PER_TILE:
        # The tile's weight rows lie in one scale block (with SWIGLU: its gate rows in one, its up rows in
        # one): one weight scale per dot (two with SWIGLU) instead of a vector over the tile's columns,
        # and each step's scales are loaded a step ahead, so their latency hides behind the MMAs.
        w_tile_scale_ptr = w_scale_expert + (n0 // SCALE_GROUP_N) * stride_wsn  # the gate rows' with SWIGLU
        w_up_scale_ptr = w_scale_expert + ((N + n0) // SCALE_GROUP_N) * stride_wsn  # unused without SWIGLU
        next_a_s, next_w_s, next_w_up_s = _step_scales(a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, 0,
                                                       num_dots, stride_ask, stride_wsk, SWIGLU, DOTS_PER_STEP,
                                                       DOT_K, SCALE_GROUP_K)
    acc = tl.zeros((TILE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(0, num_k_steps):
        for d in tl.static_range(DOTS_PER_STEP):
            k0 = kb * BLOCK_SIZE_K + d * DOT_K
            if EVEN_K:
                k_ok = tl.full([DOT_K], 1, tl.int1)
            else:
                k_ok = offs_k < K - k0
            if A_TMA:
                a = a_desc.load([row0, k0])
            else:
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                a_ptrs += DOT_K * stride_ak
            if FOLD_M > 0:
                a_f = tl.load(f_ptrs, mask=f_row_ok[:, None] & k_ok[None, :], other=0.0)
                f_ptrs += DOT_K * stride_ak
            if W_TMA:
                if SWIGLU:  # a 4-D descriptor over w viewed as [E, 2, N, K]: gate and up boxes land in one tile
                    w = w_desc.load([expert, 0, n0, k0])
                else:
                    w = w_desc.load([expert, n0, k0])
                w = w.reshape(BLOCK_SIZE_N, DOT_K).T
            else:
                w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
                w_ptrs += DOT_K * stride_wk
            if INTERPRETER and SCALES != "none":  # under the interpreter: float32 operands (exact), NaN kept NaN
                a = e4m3_to_float32(a)
                w = e4m3_to_float32(w)
            if EMULATE_BF16:  # the interpreter's bf16 dot multiplies raw bit patterns
                a = a.to(tl.float32)
                w = w.to(tl.float32)
                if FOLD_M > 0:
                    a_f = a_f.to(tl.float32)
            if SCALES == "block" and W_SCALE_PER_TILE:  # as below, with the scales loaded a step ahead
                if d == 0:  # this step's scales; the last step loads its own again (no load past the K groups)
                    step_a_s, step_w_s, step_w_up_s = next_a_s, next_w_s, next_w_up_s
                    next_a_s, next_w_s, next_w_up_s = _step_scales(
                        a_scale_ptrs, row_ok, w_tile_scale_ptr, w_up_scale_ptr, tl.minimum(kb + 1, num_k_steps - 1),
                        num_dots, stride_ask, stride_wsk, SWIGLU, DOTS_PER_STEP, DOT_K, SCALE_GROUP_K)
                a_s = _dot_scale(step_a_s, d, DOTS_PER_STEP)
                w_s = _dot_scale(step_w_s, d, DOTS_PER_STEP)
                if SWIGLU:  # gate columns first, then up columns, as w_rows holds them
                    w_up_s = _dot_scale(step_w_up_s, d, DOTS_PER_STEP)
                    step_scale = tl.where(lane_n[None, :] < half_n, (a_s * w_s)[:, None], (a_s * w_up_s)[:, None])
                else:
                    step_scale = (a_s * w_s)[:, None]
                acc += _step_product(a, w, INTERPRETER) * step_scale
            elif SCALES == "block":  # scales change along K: scale each dot's product (DOT_K divides the group)
                if DOTS_PER_STEP > 1:  # a ragged last step's dots past K read the last group's scales
                    group = (tl.minimum(k0 // DOT_K, num_dots - 1) * DOT_K) // SCALE_GROUP_K
                else:
                    group = k0 // SCALE_GROUP_K
                a_s = tl.load(a_scale_ptrs + group * stride_ask, mask=row_ok, other=0.0)
                w_s = tl.load(w_scale_ptrs + group * stride_wsk)
                acc += _step_product(a, w, INTERPRETER) * (a_s[:, None] * w_s[None, :])
            elif SCALES == "outer" and FAST_ACCUM and not INTERPRETER:  # the sum kept in the MMA (see above)
                acc = tl.dot(a, w, acc)
            elif SCALES == "outer":  # float8: each step's product added in float32 (Hopper's float8
                acc += _step_product(a, w, INTERPRETER)  # MMA keeps fewer accumulator bits, DeepSeek-V3 §3.3.2)
            else:
                acc = _mma(acc, a, w, INTERPRETER, FP32_IEEE)
            if FOLD_M > 0:  # the folded tail's rows, on the same weight tile
                acc_f = _mma(acc_f, a_f, w, INTERPRETER, FP32_IEEE)
    if SCALES == "outer":  # one scale per row and per weight row for all of K: scale the sum once
        a_s = tl.load(a_scale_ptrs, mask=row_ok, other=0.0)
        acc = acc * (a_s[:, None] * tl.load(w_scale_ptrs)[None, :])

    _write_rows(acc, row0, offs_m, token_ids, token_valid, n0, N, c_ptr, c_desc, c_scale_ptr, topk_weights_ptr,
                stride_cm, stride_cn, stride_csm, stride_csk, QUANT_GROUP, INTERPRETER, SCATTER_C,
                MUL_ROUTED_WEIGHT, SWIGLU, C_TMA, EMULATE_BF16, TILE_M, BLOCK_SIZE_N)
    if FOLD_M > 0:  # by pointer: the output descriptor's box is BLOCK_SIZE_M rows
        _write_rows(acc_f, row0 + TILE_M, offs_f, f_token_ids, f_valid, n0, N, c_ptr, c_desc, c_scale_ptr,
                    topk_weights_ptr, stride_cm, stride_cn, stride_csm, stride_csk, QUANT_GROUP, INTERPRETER,
                    SCATTER_C, MUL_ROUTED_WEIGHT, SWIGLU, False, EMULATE_BF16, FOLD_M, BLOCK_SIZE_N)


@triton.jit
def _mma(acc, a, w, INTERPRETER: tl.constexpr, FP32_IEEE: tl.constexpr):
    """acc + a @ w for float operands; under the interpreter each step's product added (`_step_product`)."""
    if INTERPRETER:  # every dtype: numpy's summation order must never depend on the tile
        acc += _step_product(a, w, INTERPRETER)
    elif FP32_IEEE:  # float32 operands, full precision (PyTorch's "highest" float32 matmul precision)
        acc = tl.dot(a, w, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, w, acc)
    return acc


@triton.jit
def _write_rows(acc, row0, offs_m, token_ids, token_valid, n0, N, c_ptr, c_desc, c_scale_ptr, topk_weights_ptr,
                stride_cm, stride_cn, stride_csm, stride_csk, QUANT_GROUP: tl.constexpr, INTERPRETER: tl.constexpr,
                SCATTER_C: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, SWIGLU: tl.constexpr, C_TMA: tl.constexpr,
                EMULATE_BF16: tl.constexpr, TILE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """The epilogue of TILE_M rows (schedule rows offs_m = row0 + 0 .. TILE_M, their slots token_ids): the
    float32 sums acc [TILE_M, BLOCK_SIZE_N] to SiLU-and-mul (SWIGLU), times the routed weight, rounded (or
    quantized, QUANT_GROUP) and stored, in sorted order or scattered to their slots. With C_TMA (sorted rows,
    a whole block) the tile goes out as one box of the output's tensor descriptor: an asynchronous bulk copy
    from shared memory, which clips columns past N itself."""
    if SWIGLU:  # silu(gate) * up in float32, before anything is rounded to the output dtype
        gate, up = tl.split(acc.reshape(TILE_M, 2, BLOCK_SIZE_N // 2).permute(0, 2, 1))
        acc = gate * tl.sigmoid(gate) * up
        offs_n = n0 + tl.arange(0, BLOCK_SIZE_N // 2)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_SIZE_N)

    if MUL_ROUTED_WEIGHT:
        routed = tl.load(topk_weights_ptr + token_ids, mask=token_valid, other=0.0)
        acc = acc * routed.to(tl.float32)[:, None]

    if SCATTER_C:
        c_rows = token_ids.to(tl.int64)
        row_mask = token_valid
    else:
        c_rows = offs_m.to(tl.int64)
        row_mask = tl.full([TILE_M], 1, tl.int1)
    if QUANT_GROUP > 0:  # float8 output, one scale per row per QUANT_GROUP columns (the down GEMM's input)
        TILE_N: tl.constexpr = BLOCK_SIZE_N // 2 if SWIGLU else BLOCK_SIZE_N
        acc = tl.where(offs_n[None, :] < N, acc, 0.0)  # columns past N (wrapped weight rows) are no group's
        acc, c_scale = quantize_groups_e4m3(acc.reshape(TILE_M, TILE_N // QUANT_GROUP, QUANT_GROUP), INTERPRETER)
        acc = acc.reshape(TILE_M, TILE_N)
        groups = n0 // QUANT_GROUP + tl.arange(0, TILE_N // QUANT_GROUP)
        tl.store(c_scale_ptr + c_rows[:, None] * stride_csm + groups[None, :] * stride_csk, c_scale,
                 mask=row_mask[:, None] & (groups[None, :] * QUANT_GROUP < N))
    if EMULATE_BF16:
        acc = round_to_bf16_grid(acc)
    if QUANT_GROUP > 0:
        c = cast_e4m3(acc, INTERPRETER)
    else:
        c = acc.to(c_ptr.dtype.element_ty)
    if C_TMA:
        tl.static_assert(not SCATTER_C and QUANT_GROUP == 0, "a TMA store writes sorted rows of the output dtype")
        c_desc.store([row0, n0], c)
    else:
        c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, c, mask=row_mask[:, None] & (offs_n[None, :] < N))
