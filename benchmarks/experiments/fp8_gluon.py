"""Experiment: a block-scaled FP8 grouped GEMM in Gluon whose MMAs overlap the scaling (Hopper, Triton 3.6).

moe-lab's Triton kernel scales each K step's float8 product as soon as it is made: `tl.dot` waits for its
wgmma before anything reads the result, so within a program the tensor cores idle while the step is scaled
and added (other programs on the SM can fill the gap). Gluon (`triton.experimental.gluon`) lets a kernel
issue wgmmas asynchronously and wait for them itself (`warpgroup_mma_wait(num_outstanding=...)`). Here each
loop iteration takes two K steps: it issues both MMAs, waits for the first (one still in flight), scales and
adds it while the second runs, then waits for the second; TMA loads run STAGES steps ahead on mbarriers.

What compiling for sm_90 showed first (ptxas -v on the PTX): the natural schedule, with step k's MMA in
flight across the loop's back edge while step k-1's product is scaled, makes LLVM copy the in-flight product
registers at the back edge, and ptxas then serializes every wgmma ("C7514 ... wgmma.mma_async instructions
are serialized due to non wgmma instructions reading accumulator registers"). Taking steps in pairs, with
nothing in flight across the back edge, compiles without it (226 registers at 64 x 128, 4 warps).

The kernel computes C[rows] = A[rows] @ W[expert].T for rows in expert-sorted padded order (the down GEMM's
layout, or the up GEMM's with its token rows copied into that order), A and W float8_e4m3fn with DeepSeek-V3's
scales (per row per 128 channels, per [128, 128] weight block), C bfloat16 in sorted order. It is timed
against moe-lab's Triton kernel on the same inputs and tiles (its tuned FP8 config), and against moe-lab's
bf16 GEMM on the bf16 weights (tuned config), each a CUDA-graph median with L2 flushed; outputs compared.
Result on the H200 (`fp8_gluon-H200-2026-12-01.txt`): bitwise the Triton kernel's output, but 0.69 to 1.01x
its speed: two or three Triton programs per SM already overlap one program's scaling with another's MMAs,
and this kernel adds none of the Triton kernel's own work-saving (scales loaded a step ahead). Not kept.
Usage (on a Hopper GPU): [MODELS="qwen3-30b-a3b ..."] python benchmarks/experiments/fp8_gluon.py [T ...]
"""
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _load_step(step, num_k, a_desc, w_desc, a_bufs, w_bufs, bars, row0, w_row0,
               BLOCK_SIZE_K: gl.constexpr, STAGES: gl.constexpr):
    """TMA loads of K step `step` (if there is one) into its stage, arriving on the stage's mbarrier."""
    stage = step % STAGES
    pred = step < num_k
    mbarrier.expect(bars.index(stage), a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [row0, step * BLOCK_SIZE_K], bars.index(stage), a_bufs.index(stage),
                                    pred=pred)
    tma.async_copy_global_to_shared(w_desc, [w_row0, step * BLOCK_SIZE_K], bars.index(stage), w_bufs.index(stage),
                                    pred=pred)


@gluon.jit
def _mma_step(step, into, a_bufs, w_bufs, bars, STAGES: gl.constexpr):
    """Wait for step `step`'s tiles and issue its MMA asynchronously, into the registers of `into` (whose
    values are not read: use_acc=False)."""
    stage = step % STAGES
    mbarrier.wait(bars.index(stage), phase=(step // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(stage), w_bufs.index(stage).permute((1, 0)), into, use_acc=False,
                         is_async=True)


@gluon.jit
def _step_scale(step, a_scale_ptrs, w_scale_base, BLOCK_SIZE_K: gl.constexpr, SCALE_GROUP: gl.constexpr):
    group = (step * BLOCK_SIZE_K) // SCALE_GROUP
    return gl.load(a_scale_ptrs + group) * gl.load(w_scale_base + group)


@gluon.jit
def fp8_block_gemm_kernel(a_desc, w_desc, c_ptr, a_scale_ptr, w_scale_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
                          N, K, stride_cm, stride_asm, stride_wse, stride_wsn,
                          BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
                          GROUP_SIZE_M: gl.constexpr, STAGES: gl.constexpr, SCALE_GROUP: gl.constexpr,
                          num_warps: gl.constexpr):
    num_pid_n = gl.cdiv(N, BLOCK_SIZE_N)
    num_pid_m = gl.num_programs(0) // num_pid_n
    pid = gl.program_id(0)
    tiles_per_group = GROUP_SIZE_M * num_pid_n  # neighbouring programs share W tiles while they sit in L2
    first_pid_m = (pid // tiles_per_group) * GROUP_SIZE_M
    group_rows = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    row0 = pid_m * BLOCK_SIZE_M
    if row0 >= gl.load(num_tokens_post_padded_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m)
    if expert < 0:
        return
    n0 = pid_n * BLOCK_SIZE_N
    w_row0 = expert * N + n0  # W viewed as [E * N, K]

    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_SIZE_N, 32])
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_SIZE_M, BLOCK_SIZE_K], a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_SIZE_N, BLOCK_SIZE_K], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    num_k = gl.cdiv(K, BLOCK_SIZE_K)
    for i in gl.static_range(STAGES):  # the first STAGES steps' loads (a stage is refilled once its MMA is done)
        _load_step(i, num_k, a_desc, w_desc, a_bufs, w_bufs, bars, row0, w_row0, BLOCK_SIZE_K, STAGES)

    offs_m = row0 + gl.arange(0, BLOCK_SIZE_M, layout=gl.SliceLayout(1, mma_layout))
    a_scale_ptrs = a_scale_ptr + offs_m.to(gl.int64) * stride_asm
    w_scale_base = w_scale_ptr + expert.to(gl.int64) * stride_wse + (n0 // SCALE_GROUP) * stride_wsn
    zero = gl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), gl.float32, layout=mma_layout)
    acc = gl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), gl.float32, layout=mma_layout)

    # Steps in pairs: both MMAs issued, then the first product is scaled and added while the second's MMA
    # runs. No product is in flight across the loop's back edge: LLVM copies such registers there, and
    # ptxas then serializes every wgmma (C7514).
    for k in range(0, num_k - 1, 2):  # steps k and k + 1
        p0 = _mma_step(k, zero, a_bufs, w_bufs, bars, STAGES)
        p1 = _mma_step(k + 1, zero, a_bufs, w_bufs, bars, STAGES)
        s0 = _step_scale(k, a_scale_ptrs, w_scale_base, BLOCK_SIZE_K, SCALE_GROUP)
        s1 = _step_scale(k + 1, a_scale_ptrs, w_scale_base, BLOCK_SIZE_K, SCALE_GROUP)
        v0 = warpgroup_mma_wait(num_outstanding=1, deps=(p0, ))
        acc += v0 * s0[:, None]
        _load_step(k + STAGES, num_k, a_desc, w_desc, a_bufs, w_bufs, bars, row0, w_row0, BLOCK_SIZE_K, STAGES)
        v1 = warpgroup_mma_wait(num_outstanding=0, deps=(p1, ))
        acc += v1 * s1[:, None]
        _load_step(k + 1 + STAGES, num_k, a_desc, w_desc, a_bufs, w_bufs, bars, row0, w_row0, BLOCK_SIZE_K, STAGES)
    if num_k % 2 == 1:  # the last step alone
        p0 = _mma_step(num_k - 1, zero, a_bufs, w_bufs, bars, STAGES)
        s0 = _step_scale(num_k - 1, a_scale_ptrs, w_scale_base, BLOCK_SIZE_K, SCALE_GROUP)
        v0 = warpgroup_mma_wait(num_outstanding=0, deps=(p0, ))
        acc += v0 * s0[:, None]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    offs_n = n0 + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, mma_layout))
    c_ptrs = c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + offs_n[None, :]
    gl.store(c_ptrs, acc.to(gl.bfloat16), mask=offs_n[None, :] < N)


def fp8_block_gemm(a, a_scale, w, w_scale, routing, block_m=64, block_n=128, block_k=128, group_m=8, stages=4,
                   num_warps=4):
    """C [rows, N] bfloat16 = a [rows, K] (sorted padded rows) @ w[expert].T, block scales [128, 128]."""
    e, n, k = w.shape
    rows = a.shape[0]
    c = torch.empty(rows, n, dtype=torch.bfloat16, device=a.device)
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.float8e4nv)
    a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k], a_layout)
    w_desc = TensorDescriptor.from_tensor(w.view(e * n, k), [block_n, block_k], w_layout)
    grid = (routing.max_num_m_blocks * triton.cdiv(n, block_n), )
    fp8_block_gemm_kernel[grid](a_desc, w_desc, c, a_scale, w_scale, routing.expert_ids,
                                routing.num_tokens_post_padded, n, k, c.stride(0), a_scale.stride(0),
                                w_scale.stride(0), w_scale.stride(1), block_m, block_n, block_k, group_m, stages,
                                128, num_warps=num_warps)
    return c


def main():
    from dataclasses import replace

    from moe_lab import (get_preset, grouped_matmul, moe_align, quantize_activations_fp8, quantize_weights_fp8,
                         relative_error)
    from moe_lab.routing import uniform_routing
    from moe_lab.tools.timing import graph_ms
    from moe_lab.tuned import default_config

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    print("model          T      GEMM   bf16 ms  triton fp8 ms  gluon fp8 ms  (tiles)        gluon/triton  fp8 vs bf16 "
          "triton gluon  max rel diff", flush=True)
    tokens = [int(t) for t in sys.argv[1:]] or [4096, 16384]
    models = os.environ.get("MODELS", "qwen3-30b-a3b deepseek-v3 mixtral-8x7b").split()
    for model in models:
        preset = get_preset(model)
        e, top_k, h, i = preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size
        for t in tokens:
            tw, ti = uniform_routing(t, e, top_k, seed=1)
            fp8_cfg = default_config(t, e, top_k, h, i, torch.float8_e4m3fn)
            bf16_cfg = default_config(t, e, top_k, h, i, torch.bfloat16)
            for gemm, n, k in (("up", 2 * i, h), ("down", h, i)):
                w = ((torch.rand(e, n, k, device="cuda") - 0.5) * k ** -0.5).bfloat16()
                cfg = replace(getattr(fp8_cfg, gemm), tail_tiles=False, persistent=False, prepermute=False)
                routing = moe_align(ti, e, cfg.BLOCK_SIZE_M)
                a = torch.randn(routing.max_num_tokens_padded, k, device="cuda").bfloat16()
                w_q, w_s = quantize_weights_fp8(w, (128, 128))
                a_q, a_s = quantize_activations_fp8(a, group_size=128)
                triton_fn = lambda: grouped_matmul(a_q, w_q, routing, cfg, gather_a=False, a_scale=a_s, w_scale=w_s,
                                                   block_shape=(128, 128))
                ms_triton = graph_ms(triton_fn, rounds=3)
                bcfg = replace(getattr(bf16_cfg, gemm), tail_tiles=False, persistent=False, prepermute=False)
                b_routing = moe_align(ti, e, bcfg.BLOCK_SIZE_M)
                b_a = a[:b_routing.max_num_tokens_padded] if b_routing.max_num_tokens_padded <= a.shape[0] else \
                    torch.randn(b_routing.max_num_tokens_padded, k, device="cuda").bfloat16()
                ms_bf16 = graph_ms(lambda: grouped_matmul(b_a, w, b_routing, bcfg, gather_a=False), rounds=3)
                want = triton_fn()
                used = routing.num_tokens_post_padded.item()
                for bm, warps, stages in ((64, 4, 4), (64, 4, 3), (128, 8, 3)):
                    r = moe_align(ti, e, bm)
                    if r.max_num_tokens_padded > a_q.shape[0]:
                        continue
                    fn = lambda: fp8_block_gemm(a_q[:r.max_num_tokens_padded], a_s, w_q, w_s, r, block_m=bm,
                                                num_warps=warps, stages=stages, group_m=cfg.GROUP_SIZE_M)
                    try:
                        got = fn()
                        ms = graph_ms(fn, rounds=3)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"{model:<14} {t:>5} {gemm:<5} gluon {bm}/{warps}/{stages}: {type(exc).__name__}: "
                              f"{str(exc)[:300]}", flush=True)
                        continue
                    diff = "-"
                    if bm == cfg.BLOCK_SIZE_M:
                        valid = torch.isfinite(want[:used]).all(1)
                        diff = f"{relative_error(got[:used][valid], want[:used][valid]):.1e}"
                    print(f"{model:<14} {t:>5} {gemm:<5} {ms_bf16:8.4f} {ms_triton:10.4f} {ms:12.4f}  "
                          f"({bm}x128, {warps}w, {stages}st) {ms_triton / ms:8.3f}x   {ms_bf16 / ms_triton:6.3f} "
                          f"{ms_bf16 / ms:6.3f}   {diff}", flush=True)
                del w, w_q, a, a_q
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
