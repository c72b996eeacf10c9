"""Block-scaled float8 grouped GEMM for Hopper (sm_90) in Gluon, warp-specialized.

out[rows of M-block b] = sum over K blocks kb of
    (A[rows, kb] @ W[e, n, kb].T) * a_scale[rows, kb] * w_scale[e, n // GROUP_N, kb]

with e = expert_ids[b], A in padded expert-sorted rows (the up GEMM's token rows are permuted into that order
first: Hopper's TMA copies boxes and cannot gather), float8 e4m3 operands, float32 sums.

The partitions share a ring of STAGES shared-memory stages, each holding the tile's A rows (one [64,
BLOCK_SIZE_K] box per 64 rows) and one [BLOCK_SIZE_N, BLOCK_SIZE_K] W box (two with SWIGLU: the gate box and
the up box):
- the load partition (one warp) issues the TMA copies of a stage once the stage is empty and makes its `ready`
  barrier expect their bytes;
- an MMA partition per 64 rows of the tile (CONSUMERS of them, one warpgroup each: the default partition and,
  for 128-row tiles, a worker with CONSUMER_REGS registers per thread) waits for a stage, issues its wgmma
  asynchronously, and scales each K block's float32 product by its A and W scales into a float32 accumulator in
  registers (the promotion of DeepSeek-V3's recipe), then signals the stage `empty`. K blocks go in pairs: both
  wgmmas issued, the first scaled while the second runs; the second partition's pairs start a K block later than the
  first's, so one has a wgmma in flight while the other is between pairs. No product is in flight across the loop's
  back edge (ptxas would then serialize every wgmma, C7514/C7515). The epilogue multiplies by the routed weight
  (where `topk_weights_ptr` is given), converts to the output's dtype and stores sorted rows or scatters them to
  their (token, k) slots. Each MMA partition arrives on a stage's `empty` barrier on its own (count CONSUMERS), so
  one can scale or store while the other's wgmmas run; one partition of two warpgroups would synchronize both before
  each arrival.
All partitions walk the same persistent tile sequence (one program per SM, `_tiles` and `_tile`) from the
schedule in memory (`num_tokens_post_padded`, `expert_ids`): no host synchronization, and unused M-blocks
(expert -1) are skipped. Stage index and phase come from a step count that runs on across tiles.

SwiGLU (SWIGLU "silu" or "swigluoai", the up projection of a gated expert; "none" otherwise): a tile covers
output columns [n, n + BLOCK_SIZE_N) of the activation [rows, N], N = I, reading w1 [E, 2I, K] as halves (gate
rows n.., up rows I + n..; both boxes in each stage). Gate and up sums are kept as two halves of
BLOCK_SIZE_N / 2 columns each (four accumulators; wgmmas of half width), each K block's gate and up products
scaled by their own w1_scale block, the next half product issued before the last is added: two full-width
accumulators and two full-width products in flight would pass the registers a thread has (ptxas spills).
The epilogue applies the activation to the float32 sums (`_gated_activation`) and, where
`out_scale_ptr` is given, writes it as float8 with one float32 scale per row per BLOCK_SIZE_N (= 128)
columns, the rule of the Triton kernel's epilogue (`moe_lab/_kernels/common.py` quantize_groups_e4m3):
scale = max(amax, 1e-10) / 448, q = clamp(x / scale, -448, 448) rounded to nearest even, IEEE divisions.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

# The TMA load is `async_load` from Triton 3.8 on (3.9 removed the old name).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _tiles(num_tokens_post_padded_ptr, N, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr):
    """(M-blocks in use, N-tiles per M-block): the tile count both partitions walk, read from the schedule."""
    return gl.cdiv(gl.load(num_tokens_post_padded_ptr), BLOCK_SIZE_M), gl.cdiv(N, BLOCK_SIZE_N)


@gluon.jit
def _tile(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_SIZE_M: gl.constexpr):
    """Tile t -> (pid_m, pid_n, expert), GROUP_SIZE_M M-blocks at a time so neighbouring tiles share W boxes
    in L2; expert -1 marks an M-block not in use (skipped by both partitions)."""
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (t // tiles_per_group) * GROUP_SIZE_M
    group_rows = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (t % tiles_per_group) % group_rows
    pid_n = (t % tiles_per_group) // group_rows
    return pid_m, pid_n, gl.load(expert_ids_ptr + pid_m)


@gluon.jit
def _load_partition(a_desc, w_desc, a_bufs, a_hi_bufs, w_bufs, ready, empty, expert_ids_ptr, num_tokens_post_padded_ptr,
                    N, K, GROUP_SIZE_M: gl.constexpr, SWIGLU: gl.constexpr, CONSUMERS: gl.constexpr):
    """Each tile's K blocks into the ring: its A rows (the second 64 into a_hi_bufs with two consumers) and W."""
    BOX_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_SIZE_M: gl.constexpr = BOX_M * CONSUMERS
    BLOCK_SIZE_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_SIZE_N: gl.constexpr = w_desc.block_type.shape[0]
    PARTS: gl.constexpr = 2 if SWIGLU != "none" else 1  # W boxes per stage: gate and up, or one
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_pid_m, num_pid_n = _tiles(num_tokens_post_padded_ptr, N, BLOCK_SIZE_M, BLOCK_SIZE_N)
    num_k = gl.cdiv(K, BLOCK_SIZE_K)
    step = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n, expert = _tile(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_SIZE_M)
        if expert >= 0:
            w_row = expert * (PARTS * N) + pid_n * BLOCK_SIZE_N  # W viewed as [E * PARTS * N, K]; up rows N on
            for k in range(num_k):
                stage = step % STAGES
                # A fresh barrier counts as having completed the phase before phase 0: the first round passes.
                mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1)
                bar = ready.index(stage)
                mbarrier.expect(bar, CONSUMERS * a_desc.block_type.nbytes + PARTS * w_desc.block_type.nbytes)
                _tma_load(a_desc, [pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K], bar, a_bufs.index(stage))
                if CONSUMERS == 2:
                    _tma_load(a_desc, [pid_m * BLOCK_SIZE_M + BOX_M, k * BLOCK_SIZE_K], bar, a_hi_bufs.index(stage))
                for part in gl.static_range(PARTS):
                    _tma_load(w_desc, [w_row + part * N, k * BLOCK_SIZE_K], bar, w_bufs.index(stage * PARTS + part))
                step += 1


@gluon.jit
def _issue(step, part, a_bufs, w_bufs, ready, zero, PARTS: gl.constexpr):
    """Wait for the stage of `step` and issue the wgmma of its W box `part` asynchronously into fresh sums
    (use_acc=False)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    stage = step % STAGES
    mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(stage), w_bufs.index(stage * PARTS + part).permute((1, 0)), zero,
                         use_acc=False, is_async=True)


@gluon.jit
def _scale(k, a_scale_rows, stride_ask, w_scale_base, stride_wsk):
    """The scale of K block k for each row: a_scale[row, k] * w_scale[expert, n block, k]."""
    return gl.load(a_scale_rows + k * stride_ask) * gl.load(w_scale_base + k * stride_wsk)


@gluon.jit
def _k_block(step, k, acc, a_bufs, w_bufs, ready, empty, zero, a_scale_rows, stride_ask, w_scale_base, stride_wsk):
    """acc plus K block k's scaled product, alone (nothing else in flight); returns (sums, the next step)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    p = _issue(step, 0, a_bufs, w_bufs, ready, zero, 1)
    s = _scale(k, a_scale_rows, stride_ask, w_scale_base, stride_wsk)
    v = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
    mbarrier.arrive(empty.index(step % STAGES), count=1)
    return acc + v * s[:, None], step + 1


@gluon.jit
def _k_loop(step, num_k, a_bufs, w_bufs, ready, empty, zero, a_scale_rows, stride_ask, w_scale_base, stride_wsk,
            CONSUMER: gl.constexpr):
    """The float32 sums of one tile over all K blocks, two wgmmas in flight; returns (sums, the next step).
    The second MMA partition takes its first K block alone, so its pairs start a block after the first's:
    the two are not between pairs (scaling the second product, waiting for the next stage) at the same time."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    acc = zero
    k_first = 0
    if CONSUMER == 1:
        acc, step = _k_block(step, 0, acc, a_bufs, w_bufs, ready, empty, zero, a_scale_rows, stride_ask,
                             w_scale_base, stride_wsk)
        k_first = 1
    for k in range(k_first, num_k - 1, 2):  # K blocks k and k + 1
        p0 = _issue(step, 0, a_bufs, w_bufs, ready, zero, 1)
        p1 = _issue(step + 1, 0, a_bufs, w_bufs, ready, zero, 1)
        s0 = _scale(k, a_scale_rows, stride_ask, w_scale_base, stride_wsk)
        s1 = _scale(k + 1, a_scale_rows, stride_ask, w_scale_base, stride_wsk)
        v0 = warpgroup_mma_wait(num_outstanding=1, deps=(p0, ))
        mbarrier.arrive(empty.index(step % STAGES), count=1)
        acc += v0 * s0[:, None]
        v1 = warpgroup_mma_wait(num_outstanding=0, deps=(p1, ))
        mbarrier.arrive(empty.index((step + 1) % STAGES), count=1)
        acc += v1 * s1[:, None]
        step += 2
    if (num_k - k_first) % 2 == 1:  # the last K block alone
        acc, step = _k_block(step, num_k - 1, acc, a_bufs, w_bufs, ready, empty, zero, a_scale_rows, stride_ask,
                             w_scale_base, stride_wsk)
    return acc, step


@gluon.jit
def _half_product(stage, part: gl.constexpr, half: gl.constexpr, a_bufs, w_bufs, zero_half):
    """Issue the wgmma of columns [half * HALF, (half + 1) * HALF) of W box `part` (0 gate, 1 up) of `stage`."""
    HALF: gl.constexpr = zero_half.type.shape[1]
    w = w_bufs.index(stage * 2 + part).slice(half * HALF, HALF, dim=0)
    return warpgroup_mma(a_bufs.index(stage), w.permute((1, 0)), zero_half, use_acc=False, is_async=True)


@gluon.jit
def _k_loop_swiglu(step, num_k, a_bufs, w_bufs, ready, empty, zero_half, a_scale_rows, stride_ask, w_gate_scale,
                   w_up_scale, stride_wsk):
    """The gate and up float32 sums of one tile over all K blocks, each as two halves of HALF columns (four
    accumulators of a quarter of the registers of two products in flight), each product scaled by its own
    weight scale block, the next product issued before the last is added; returns (gate halves, up halves,
    the next step)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    g0 = zero_half
    g1 = zero_half
    u0 = zero_half
    u1 = zero_half
    for k in range(num_k):
        stage = step % STAGES
        mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
        pg0 = _half_product(stage, 0, 0, a_bufs, w_bufs, zero_half)
        pg1 = _half_product(stage, 0, 1, a_bufs, w_bufs, zero_half)
        a_s = gl.load(a_scale_rows + k * stride_ask)
        s_gate = (a_s * gl.load(w_gate_scale + k * stride_wsk))[:, None]
        s_up = (a_s * gl.load(w_up_scale + k * stride_wsk))[:, None]
        v = warpgroup_mma_wait(num_outstanding=1, deps=(pg0, ))
        g0 += v * s_gate
        pu0 = _half_product(stage, 1, 0, a_bufs, w_bufs, zero_half)
        v = warpgroup_mma_wait(num_outstanding=1, deps=(pg1, ))
        g1 += v * s_gate
        pu1 = _half_product(stage, 1, 1, a_bufs, w_bufs, zero_half)
        v = warpgroup_mma_wait(num_outstanding=1, deps=(pu0, ))
        u0 += v * s_up
        v = warpgroup_mma_wait(num_outstanding=0, deps=(pu1, ))
        mbarrier.arrive(empty.index(stage), count=1)
        u1 += v * s_up
        step += 1
    return g0, g1, u0, u1, step


@gluon.jit
def _gated_activation(gate, up, alpha, limit, SWIGLU: gl.constexpr):
    """As `moe_lab/_kernels/common.py` gated_activation (the same expressions, so the same float32 results):
    silu(gate) * up, or gpt-oss's clamped (up + 1) * gate * sigmoid(alpha * gate). NaN stays NaN."""
    if SWIGLU == "silu":
        out = gate * (1 / (1 + gl.exp(-gate))) * up
    else:
        gate = gl.where(gate != gate, gate, gl.minimum(gate, limit))
        up = gl.where(up != up, up, gl.minimum(gl.maximum(up, -limit), limit))
        x = alpha * gate
        out = (up + 1.0) * gate * (1 / (1 + gl.exp(-x)))
    return out


@gluon.jit
def _quantize_halves(x0, x1):
    """float32 halves x0, x1 [rows, HALF] of one group of 2 HALF columns -> (q0, q1 float32 on the e4m3 range,
    scale [rows]): scale = max(amax, 1e-10) / 448 (NaN where the row holds one), q = clamp(x / scale, -448,
    448), NaN kept; IEEE divisions."""
    amax = gl.maximum(gl.max(gl.abs(x0), axis=1), gl.max(gl.abs(x1), axis=1))
    scale = gl.div_rn(gl.maximum(amax, 1e-10), gl.zeros_like(amax) + 448.0)
    has_nan = (gl.max((x0 != x0).to(gl.int32), axis=1) + gl.max((x1 != x1).to(gl.int32), axis=1)) > 0
    scale = gl.where(has_nan, float("nan"), scale)
    q0 = gl.div_rn(x0, gl.zeros_like(x0) + scale[:, None])
    q1 = gl.div_rn(x1, gl.zeros_like(x1) + scale[:, None])
    q0 = gl.where(q0 != q0, q0, gl.minimum(gl.maximum(q0, -448.0), 448.0))
    q1 = gl.where(q1 != q1, q1, gl.minimum(gl.maximum(q1, -448.0), 448.0))
    return q0, q1, scale


@gluon.jit
def _store_half(out_ptr, stride_om, x, row0, col0, N, out_layout: gl.constexpr):
    """x [rows, HALF] to sorted rows row0.., columns col0.. (< N) of out, in out's dtype."""
    rows = row0 + gl.arange(0, x.type.shape[0], layout=gl.SliceLayout(1, out_layout))
    cols = col0 + gl.arange(0, x.type.shape[1], layout=gl.SliceLayout(0, out_layout))
    result = gl.convert_layout(x.to(out_ptr.dtype.element_ty), out_layout)
    gl.store(out_ptr + rows.to(gl.int64)[:, None] * stride_om + cols[None, :], result, mask=cols[None, :] < N)


@gluon.jit
def _mma_partition(a_bufs, w_bufs, ready, empty, out, scales, schedule, act, N, K, num_slots,
                   GROUP_SIZE_M: gl.constexpr, GROUP_N: gl.constexpr, SCATTER: gl.constexpr, SWIGLU: gl.constexpr,
                   CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr, num_warps: gl.constexpr):
    """Rows [CONSUMER * 64, +64) of every tile of the program's walk (tiles of CONSUMERS * 64 rows), read from
    the ring (a_bufs: this consumer's A boxes), scaled, stored."""
    out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk = out
    a_scale_ptr, stride_asm, stride_ask, w_scale_ptr, stride_wse, stride_wsn, stride_wsk = scales
    topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr = schedule
    alpha, limit = act
    PARTITION_M: gl.constexpr = a_bufs.type.shape[1]  # this partition's rows of a tile of PARTITION_M * CONSUMERS
    BLOCK_SIZE_N: gl.constexpr = w_bufs.type.shape[1]
    BLOCK_SIZE_K: gl.constexpr = a_bufs.type.shape[2]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_SIZE_N, 32])
    # Stores of 8 elements per thread along a row (16 bytes of bfloat16).
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    zero = gl.zeros((PARTITION_M, BLOCK_SIZE_N), gl.float32, layout=mma_layout)
    # SWIGLU: gate and up each as two halves of HALF columns (`_k_loop_swiglu`).
    HALF: gl.constexpr = BLOCK_SIZE_N // 2
    half_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                          instr_shape=[16, HALF, 32])
    zero_half = gl.zeros((PARTITION_M, HALF), gl.float32, layout=half_layout)

    num_pid_m, num_pid_n = _tiles(num_tokens_post_padded_ptr, N, PARTITION_M * CONSUMERS, BLOCK_SIZE_N)
    num_k = gl.cdiv(K, BLOCK_SIZE_K)
    step = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n, expert = _tile(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_SIZE_M)
        if expert >= 0:
            row0 = (pid_m * CONSUMERS + CONSUMER) * PARTITION_M
            n0 = pid_n * BLOCK_SIZE_N
            w_scale_base = w_scale_ptr + expert.to(gl.int64) * stride_wse + (n0 // GROUP_N) * stride_wsn
            if SWIGLU != "none":  # sorted rows, no routed weight (the up projection)
                # the up rows' scale block: rows N + n0 of w1 (N = I)
                w_up_scale = w_scale_ptr + expert.to(gl.int64) * stride_wse + ((N + n0) // GROUP_N) * stride_wsn
                offs_h = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, half_layout))
                a_scale_rows = a_scale_ptr + offs_h.to(gl.int64) * stride_asm
                g0, g1, u0, u1, step = _k_loop_swiglu(step, num_k, a_bufs, w_bufs, ready, empty, zero_half,
                                                      a_scale_rows, stride_ask, w_scale_base, w_up_scale, stride_wsk)
                act0 = _gated_activation(g0, u0, alpha, limit, SWIGLU)
                act1 = _gated_activation(g1, u1, alpha, limit, SWIGLU)
                if out_scale_ptr is not None:  # float8 out, one scale per row of the tile (its BLOCK_SIZE_N columns)
                    act0, act1, row_scale = _quantize_halves(act0, act1)
                    scale_ptrs = out_scale_ptr + offs_h.to(gl.int64) * stride_osm + (n0 // BLOCK_SIZE_N) * stride_osk
                    gl.store(scale_ptrs, row_scale)
                _store_half(out_ptr, stride_om, act0, row0, n0, N, out_layout)
                _store_half(out_ptr, stride_om, act1, row0, n0 + HALF, N, out_layout)
            else:
                offs_m = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, mma_layout))
                a_scale_rows = a_scale_ptr + offs_m.to(gl.int64) * stride_asm
                acc, step = _k_loop(step, num_k, a_bufs, w_bufs, ready, empty, zero, a_scale_rows, stride_ask,
                                    w_scale_base, stride_wsk, CONSUMER)
                rows = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, out_layout))
                cols = n0 + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, out_layout))
                slots = gl.load(sorted_token_ids_ptr + rows)
                routed = slots < num_slots  # padding rows hold the sentinel num_slots
                result = gl.convert_layout(acc, out_layout)
                if topk_weights_ptr is not None:
                    result = result * gl.load(topk_weights_ptr + slots, mask=routed, other=0.0)[:, None]
                if SCATTER:
                    dst = slots.to(gl.int64)
                    keep = routed[:, None] & (cols[None, :] < N)
                else:
                    dst = rows.to(gl.int64)
                    keep = cols[None, :] < N
                gl.store(out_ptr + dst[:, None] * stride_om + cols[None, :], result.to(out_ptr.dtype.element_ty),
                         mask=keep)


@gluon.jit(do_not_specialize=["num_slots"])
def fp8_grouped_matmul_ws_kernel(a_desc, w_desc, out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk,
                                 a_scale_ptr, stride_asm, stride_ask, w_scale_ptr, stride_wse, stride_wsn, stride_wsk,
                                 topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
                                 alpha, limit, N, K, num_slots,
                                 GROUP_SIZE_M: gl.constexpr, GROUP_N: gl.constexpr, STAGES: gl.constexpr,
                                 SCATTER: gl.constexpr, SWIGLU: gl.constexpr, CONSUMERS: gl.constexpr,
                                 CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, num_warps: gl.constexpr):
    """N: the output's columns (I with SWIGLU, whose W has 2N rows per expert). out_scale_ptr: float8 output
    with one float32 scale per row per BLOCK_SIZE_N columns, or None. alpha, limit: swigluoai's. Tiles of
    CONSUMERS * 64 rows (a_desc's box: 64), num_warps = 4 (one warpgroup per MMA partition)."""
    PARTS: gl.constexpr = 2 if SWIGLU != "none" else 1
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    a_hi_bufs = a_bufs  # the second consumer's rows, with two
    if CONSUMERS == 2:
        a_hi_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES * PARTS] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)

    out = (out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk)
    scales = (a_scale_ptr, stride_asm, stride_ask, w_scale_ptr, stride_wse, stride_wsn, stride_wsk)
    schedule = (topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr)
    act = (alpha, limit)
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_mma_partition, (a_bufs, w_bufs, ready, empty, out, scales, schedule, act, N, K, num_slots, GROUP_SIZE_M,
                              GROUP_N, SCATTER, SWIGLU, CONSUMERS, 0, num_warps)),
            (_load_partition, (a_desc, w_desc, a_bufs, a_hi_bufs, w_bufs, ready, empty, expert_ids_ptr,
                               num_tokens_post_padded_ptr, N, K, GROUP_SIZE_M, SWIGLU, CONSUMERS)),
        ], [1], [LOAD_REGS])
    else:
        gl.warp_specialize([
            (_mma_partition, (a_bufs, w_bufs, ready, empty, out, scales, schedule, act, N, K, num_slots, GROUP_SIZE_M,
                              GROUP_N, SCATTER, SWIGLU, CONSUMERS, 0, num_warps)),
            (_mma_partition, (a_hi_bufs, w_bufs, ready, empty, out, scales, schedule, act, N, K, num_slots,
                              GROUP_SIZE_M, GROUP_N, SCATTER, SWIGLU, CONSUMERS, 1, num_warps)),
            (_load_partition, (a_desc, w_desc, a_bufs, a_hi_bufs, w_bufs, ready, empty, expert_ids_ptr,
                               num_tokens_post_padded_ptr, N, K, GROUP_SIZE_M, SWIGLU, CONSUMERS)),
        ], [num_warps, 1], [CONSUMER_REGS, LOAD_REGS])
