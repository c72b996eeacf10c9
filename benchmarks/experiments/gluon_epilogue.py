"""Experiment (issue 34): the Gluon FP8 kernel with its epilogue handed to a warpgroup of its own, and with the second
MMA partition skipping a tile's rows that are all padding.

    python benchmarks/experiments/gluon_epilogue.py OUT         # an sm_90 GPU: bits, then times; OUT/gluon_epilogue.md
    GE_MODELS=deepseek-v3,mixtral-8x7b GE_T=16384 python ...   # fewer presets and token counts
    TRITON_INTERPRET=0 python benchmarks/experiments/gluon_epilogue.py --regs   # any machine: sm_90a compile, ptxas -v

Why. Without block scales the kernel's skeleton stopped at 930 TFLOP/s (DeepSeek-V3) and 830 (Qwen3-30B-A3B) where
dense FP8 reached 1,085 to 1,233: their down GEMMs have 16 and 6 K blocks per tile, and at each tile's end both MMA
warpgroups store their sums at once while nothing is multiplied. And in a 128-row tile the second warpgroup's 64 rows
are often all padding (an expert's last M-block), yet it multiplies them.

Variants (constexprs of the copy of the kernel below; `moe_lab/_kernels/gluon_fp8.py`'s load partition and K loops
are called as they are):
- SKIP_PAD: the second MMA partition reads sorted_token_ids at its first row with the tile's expert; where that row is
  padding (so all its rows are: padding ends each expert's rows) it waits for each stage and releases it unread, and
  stores nothing. The rows it skips are left as they were (they are never read: the down GEMM of the same schedule
  skips the same rows). Both kernels (plain and SwiGLU).
- EPI (plain kernel, 128-row tiles): each MMA partition writes its float32 sums into shared memory (one [64, BLOCK_N]
  buffer each, mbarriers epi_full / epi_empty) and goes on to its next tile; an epilogue warpgroup (EPI_REGS
  registers) multiplies by the routed weight, converts and stores or scatters, 16 rows at a time. The MMA partitions
  then have 216 registers each (512 per thread of four warpgroups: 24 load, 56 epilogue); ptxas -v says whether they
  spill (`--regs`).
SKIP_PAD relies on padding ending each expert's rows, as `moe_align` lays them out (a routing built by hand is not
checked for it), and leaves the padding rows of a sorted output (the up GEMM's) unwritten: shipped, both would need
saying in `grouped_matmul_fp8_gluon`'s contract. A GEMM neither switch applies to runs the shipped kernel; "copy"
runs the copy with both off (its restructured tile loop spills 28 bytes more outside the K loop in the SwiGLU kernel).
Both keep the K order of every sum, so every written value is bitwise the one of the shipped kernel: the script checks
that first (outputs poisoned with NaN; the rows the shipped kernel writes that a variant may skip are padding).
Timing: per model preset (full size) at T = 4096 and 16384, the down GEMM (scattered, routed weights, bf16) and the
up GEMM (SwiGLU, float8 out with scales, rows permuted first) of each variant and of the shipped kernel; CUDA-graph
medians with L2 flushed, order rotated over 3 rounds, the least median kept; ratios = shipped time / variant time.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from moe_lab._kernels import gluon_fp8 as shipped
from moe_lab._kernels.gluon_fp8 import (
    _gated_activation,
    _k_loop,
    _k_loop_swiglu,
    _load_partition,
    _quantize_halves,
    _store_half,
    _tile,
    _tiles,
)

EPI_REGS = 56
EPI_CONSUMER_REGS = 216  # (4 * 128 - 24 - EPI_REGS) / 2
EPI_LAUNCH_REGS = 128  # 64K registers over 4 warpgroups (the load warp counted as one)


@gluon.jit
def _drain(step, num_k, ready, empty):
    """Release num_k stages unread: each waited for (so this partition stays within the ring's round), then
    arrived empty."""
    STAGES: gl.constexpr = ready.type.shape[0]
    for _ in range(num_k):
        stage = step % STAGES
        mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
        mbarrier.arrive(empty.index(stage), count=1)
        step += 1
    return step


@gluon.jit
def _mma_partition_x(
    a_bufs,
    w_bufs,
    ready,
    empty,
    epi_bufs,
    epi_full,
    epi_empty,
    out,
    scales,
    schedule,
    act,
    N,
    K,
    num_slots,
    GROUP_SIZE_M: gl.constexpr,
    GROUP_N: gl.constexpr,
    SCATTER: gl.constexpr,
    SWIGLU: gl.constexpr,
    CONSUMERS: gl.constexpr,
    CONSUMER: gl.constexpr,
    SKIP_PAD: gl.constexpr,
    EPI: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The shipped `_mma_partition`, with SKIP_PAD and EPI (the module's docstring)."""
    out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk = out
    a_scale_ptr, stride_asm, stride_ask, w_scale_ptr, stride_wse, stride_wsn, stride_wsk = scales
    topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr = schedule
    alpha, limit = act
    PARTITION_M: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_SIZE_N: gl.constexpr = w_bufs.type.shape[1]
    BLOCK_SIZE_K: gl.constexpr = a_bufs.type.shape[2]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_SIZE_N, 32]
    )
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    zero = gl.zeros((PARTITION_M, BLOCK_SIZE_N), gl.float32, layout=mma_layout)
    HALF: gl.constexpr = BLOCK_SIZE_N // 2
    half_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HALF, 32]
    )
    zero_half = gl.zeros((PARTITION_M, HALF), gl.float32, layout=half_layout)

    num_pid_m, num_pid_n = _tiles(num_tokens_post_padded_ptr, N, PARTITION_M * CONSUMERS, BLOCK_SIZE_N)
    num_k = gl.cdiv(K, BLOCK_SIZE_K)
    step = 0
    handed = 0  # tiles whose sums this partition gave the epilogue partition (EPI)
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n, expert = _tile(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_SIZE_M)
        row0 = (pid_m * CONSUMERS + CONSUMER) * PARTITION_M
        first_slot = gl.load(sorted_token_ids_ptr + row0)  # beside the expert's load: both in flight at once
        skip = expert < 0
        if SKIP_PAD:
            if CONSUMER == 1:
                skip = skip | (first_slot >= num_slots)
        if skip:
            if expert >= 0:  # this partition's rows are padding: release the tile's stages unread
                step = _drain(step, num_k, ready, empty)
        else:
            n0 = pid_n * BLOCK_SIZE_N
            w_scale_base = w_scale_ptr + expert.to(gl.int64) * stride_wse + (n0 // GROUP_N) * stride_wsn
            if SWIGLU != "none":
                w_up_scale = w_scale_ptr + expert.to(gl.int64) * stride_wse + ((N + n0) // GROUP_N) * stride_wsn
                offs_h = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, half_layout))
                a_scale_rows = a_scale_ptr + offs_h.to(gl.int64) * stride_asm
                g0, g1, u0, u1, step = _k_loop_swiglu(
                    step,
                    num_k,
                    a_bufs,
                    w_bufs,
                    ready,
                    empty,
                    zero_half,
                    a_scale_rows,
                    stride_ask,
                    w_scale_base,
                    w_up_scale,
                    stride_wsk,
                )
                act0 = _gated_activation(g0, u0, alpha, limit, SWIGLU)
                act1 = _gated_activation(g1, u1, alpha, limit, SWIGLU)
                if out_scale_ptr is not None:
                    act0, act1, row_scale = _quantize_halves(act0, act1)
                    scale_ptrs = out_scale_ptr + offs_h.to(gl.int64) * stride_osm + (n0 // BLOCK_SIZE_N) * stride_osk
                    gl.store(scale_ptrs, row_scale)
                _store_half(out_ptr, stride_om, act0, row0, n0, N, out_layout)
                _store_half(out_ptr, stride_om, act1, row0, n0 + HALF, N, out_layout)
            else:
                offs_m = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, mma_layout))
                a_scale_rows = a_scale_ptr + offs_m.to(gl.int64) * stride_asm
                acc, step = _k_loop(
                    step,
                    num_k,
                    a_bufs,
                    w_bufs,
                    ready,
                    empty,
                    zero,
                    a_scale_rows,
                    stride_ask,
                    w_scale_base,
                    stride_wsk,
                    CONSUMER,
                )
                if EPI:  # hand the sums over and go on: the epilogue partition stores them
                    mbarrier.wait(epi_empty.index(CONSUMER), (handed & 1) ^ 1)
                    epi_bufs.index(CONSUMER).store(acc)
                    mbarrier.arrive(epi_full.index(CONSUMER), count=1)
                    handed += 1
                else:
                    rows = row0 + gl.arange(0, PARTITION_M, layout=gl.SliceLayout(1, out_layout))
                    cols = n0 + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, out_layout))
                    slots = gl.load(sorted_token_ids_ptr + rows)
                    routed = slots < num_slots
                    result = gl.convert_layout(acc, out_layout)
                    if topk_weights_ptr is not None:
                        result = result * gl.load(topk_weights_ptr + slots, mask=routed, other=0.0)[:, None]
                    if SCATTER:
                        dst = slots.to(gl.int64)
                        keep = routed[:, None] & (cols[None, :] < N)
                    else:
                        dst = rows.to(gl.int64)
                        keep = cols[None, :] < N
                    gl.store(
                        out_ptr + dst[:, None] * stride_om + cols[None, :],
                        result.to(out_ptr.dtype.element_ty),
                        mask=keep,
                    )


@gluon.jit
def _store_rows(
    x,
    row0,
    n0,
    out_ptr,
    stride_om,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    N,
    num_slots,
    SCATTER: gl.constexpr,
    layout: gl.constexpr,
):
    """The shipped epilogue's store of sums x [rows, BLOCK_N] (in `layout`) of sorted rows row0.., columns n0.."""
    rows = row0 + gl.arange(0, x.type.shape[0], layout=gl.SliceLayout(1, layout))
    cols = n0 + gl.arange(0, x.type.shape[1], layout=gl.SliceLayout(0, layout))
    slots = gl.load(sorted_token_ids_ptr + rows)
    routed = slots < num_slots
    if topk_weights_ptr is not None:
        x = x * gl.load(topk_weights_ptr + slots, mask=routed, other=0.0)[:, None]
    if SCATTER:
        dst = slots.to(gl.int64)
        keep = routed[:, None] & (cols[None, :] < N)
    else:
        dst = rows.to(gl.int64)
        keep = cols[None, :] < N
    gl.store(out_ptr + dst[:, None] * stride_om + cols[None, :], x.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def _epilogue_partition(
    epi_bufs,
    epi_full,
    epi_empty,
    out,
    schedule,
    N,
    num_slots,
    GROUP_SIZE_M: gl.constexpr,
    SCATTER: gl.constexpr,
    CONSUMERS: gl.constexpr,
    SKIP_PAD: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Each tile's sums from the MMA partitions' buffers to out, 16 rows at a time (few registers)."""
    out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk = out
    topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr = schedule
    PARTITION_M: gl.constexpr = epi_bufs.type.shape[1]
    BLOCK_SIZE_N: gl.constexpr = epi_bufs.type.shape[2]
    CHUNK: gl.constexpr = 16
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    num_pid_m, num_pid_n = _tiles(num_tokens_post_padded_ptr, N, PARTITION_M * CONSUMERS, BLOCK_SIZE_N)
    taken0 = 0
    taken1 = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n, expert = _tile(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_SIZE_M)
        hi_row0 = (pid_m * CONSUMERS + 1) * PARTITION_M
        hi_slot = gl.load(sorted_token_ids_ptr + hi_row0)
        if expert >= 0:
            n0 = pid_n * BLOCK_SIZE_N
            row0 = pid_m * CONSUMERS * PARTITION_M
            mbarrier.wait(epi_full.index(0), taken0 & 1)
            for r in gl.static_range(PARTITION_M // CHUNK):
                x = epi_bufs.index(0).slice(r * CHUNK, CHUNK, dim=0).load(layout)
                _store_rows(
                    x,
                    row0 + r * CHUNK,
                    n0,
                    out_ptr,
                    stride_om,
                    topk_weights_ptr,
                    sorted_token_ids_ptr,
                    N,
                    num_slots,
                    SCATTER,
                    layout,
                )
            mbarrier.arrive(epi_empty.index(0), count=1)
            taken0 += 1
            if CONSUMERS == 2:
                hi = True
                if SKIP_PAD:
                    hi = hi_slot < num_slots
                if hi:
                    mbarrier.wait(epi_full.index(1), taken1 & 1)
                    for r in gl.static_range(PARTITION_M // CHUNK):
                        x = epi_bufs.index(1).slice(r * CHUNK, CHUNK, dim=0).load(layout)
                        _store_rows(
                            x,
                            hi_row0 + r * CHUNK,
                            n0,
                            out_ptr,
                            stride_om,
                            topk_weights_ptr,
                            sorted_token_ids_ptr,
                            N,
                            num_slots,
                            SCATTER,
                            layout,
                        )
                    mbarrier.arrive(epi_empty.index(1), count=1)
                    taken1 += 1


@gluon.jit(do_not_specialize=["num_slots"])
def fp8_ws_x_kernel(
    a_desc,
    w_desc,
    out_ptr,
    stride_om,
    out_scale_ptr,
    stride_osm,
    stride_osk,
    a_scale_ptr,
    stride_asm,
    stride_ask,
    w_scale_ptr,
    stride_wse,
    stride_wsn,
    stride_wsk,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    alpha,
    limit,
    N,
    K,
    num_slots,
    GROUP_SIZE_M: gl.constexpr,
    GROUP_N: gl.constexpr,
    STAGES: gl.constexpr,
    SCATTER: gl.constexpr,
    SWIGLU: gl.constexpr,
    CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    SKIP_PAD: gl.constexpr,
    EPI: gl.constexpr,
    EPI_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """`fp8_grouped_matmul_ws_kernel` with SKIP_PAD and EPI (EPI: the plain kernel with CONSUMERS = 2 only)."""
    PARTS: gl.constexpr = 2 if SWIGLU != "none" else 1
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    a_hi_bufs = a_bufs
    if CONSUMERS == 2:
        a_hi_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES * PARTS] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)
    epi_bufs = ready  # placeholders where EPI is off (never touched)
    epi_full = ready
    epi_empty = ready
    if EPI:
        # the wgmma layout of float32 [64, BLOCK_N] (128-byte swizzle): the MMA partitions' stores meet few bank
        # conflicts
        epi_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
        epi_bufs = gl.allocate_shared_memory(
            gl.float32, [CONSUMERS, a_desc.block_type.shape[0], w_desc.block_type.shape[0]], epi_layout
        )
        epi_full = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        epi_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(epi_full.index(i), count=1)
            mbarrier.init(epi_empty.index(i), count=1)

    out = (out_ptr, stride_om, out_scale_ptr, stride_osm, stride_osk)
    scales = (a_scale_ptr, stride_asm, stride_ask, w_scale_ptr, stride_wse, stride_wsn, stride_wsk)
    schedule = (topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr)
    act = (alpha, limit)
    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (
                    _mma_partition_x,
                    (
                        a_bufs,
                        w_bufs,
                        ready,
                        empty,
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        scales,
                        schedule,
                        act,
                        N,
                        K,
                        num_slots,
                        GROUP_SIZE_M,
                        GROUP_N,
                        SCATTER,
                        SWIGLU,
                        CONSUMERS,
                        0,
                        False,
                        False,
                        num_warps,
                    ),
                ),
                (
                    _load_partition,
                    (
                        a_desc,
                        w_desc,
                        a_bufs,
                        a_hi_bufs,
                        w_bufs,
                        ready,
                        empty,
                        expert_ids_ptr,
                        num_tokens_post_padded_ptr,
                        N,
                        K,
                        GROUP_SIZE_M,
                        SWIGLU,
                        CONSUMERS,
                    ),
                ),
            ],
            [1],
            [LOAD_REGS],
        )
    elif EPI:
        gl.warp_specialize(
            [
                (
                    _mma_partition_x,
                    (
                        a_bufs,
                        w_bufs,
                        ready,
                        empty,
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        scales,
                        schedule,
                        act,
                        N,
                        K,
                        num_slots,
                        GROUP_SIZE_M,
                        GROUP_N,
                        SCATTER,
                        SWIGLU,
                        CONSUMERS,
                        0,
                        SKIP_PAD,
                        EPI,
                        num_warps,
                    ),
                ),
                (
                    _mma_partition_x,
                    (
                        a_hi_bufs,
                        w_bufs,
                        ready,
                        empty,
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        scales,
                        schedule,
                        act,
                        N,
                        K,
                        num_slots,
                        GROUP_SIZE_M,
                        GROUP_N,
                        SCATTER,
                        SWIGLU,
                        CONSUMERS,
                        1,
                        SKIP_PAD,
                        EPI,
                        num_warps,
                    ),
                ),
                (
                    _epilogue_partition,
                    (
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        schedule,
                        N,
                        num_slots,
                        GROUP_SIZE_M,
                        SCATTER,
                        CONSUMERS,
                        SKIP_PAD,
                        num_warps,
                    ),
                ),
                (
                    _load_partition,
                    (
                        a_desc,
                        w_desc,
                        a_bufs,
                        a_hi_bufs,
                        w_bufs,
                        ready,
                        empty,
                        expert_ids_ptr,
                        num_tokens_post_padded_ptr,
                        N,
                        K,
                        GROUP_SIZE_M,
                        SWIGLU,
                        CONSUMERS,
                    ),
                ),
            ],
            [num_warps, num_warps, 1],
            [CONSUMER_REGS, EPI_REGS, LOAD_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _mma_partition_x,
                    (
                        a_bufs,
                        w_bufs,
                        ready,
                        empty,
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        scales,
                        schedule,
                        act,
                        N,
                        K,
                        num_slots,
                        GROUP_SIZE_M,
                        GROUP_N,
                        SCATTER,
                        SWIGLU,
                        CONSUMERS,
                        0,
                        SKIP_PAD,
                        False,
                        num_warps,
                    ),
                ),
                (
                    _mma_partition_x,
                    (
                        a_hi_bufs,
                        w_bufs,
                        ready,
                        empty,
                        epi_bufs,
                        epi_full,
                        epi_empty,
                        out,
                        scales,
                        schedule,
                        act,
                        N,
                        K,
                        num_slots,
                        GROUP_SIZE_M,
                        GROUP_N,
                        SCATTER,
                        SWIGLU,
                        CONSUMERS,
                        1,
                        SKIP_PAD,
                        False,
                        num_warps,
                    ),
                ),
                (
                    _load_partition,
                    (
                        a_desc,
                        w_desc,
                        a_bufs,
                        a_hi_bufs,
                        w_bufs,
                        ready,
                        empty,
                        expert_ids_ptr,
                        num_tokens_post_padded_ptr,
                        N,
                        K,
                        GROUP_SIZE_M,
                        SWIGLU,
                        CONSUMERS,
                    ),
                ),
            ],
            [num_warps, 1],
            [CONSUMER_REGS, LOAD_REGS],
        )


class _Launcher:
    """Stands in for the shipped kernel in `moe_lab.gluon_fp8.run_gluon_fp8`: launches the copy with the variant's
    constexprs (EPI only where it applies: the plain kernel with 128-row tiles)."""

    def __init__(self, skip_pad: bool, epi: bool, copy: bool = False, kept=None):
        self.skip_pad, self.epi, self.copy, self.kept = skip_pad, epi, copy, kept

    def __getitem__(self, grid):
        def launch(*args, **kw):
            two = kw["CONSUMERS"] == 2
            epi = self.epi and two and kw["SWIGLU"] == "none"
            skip = self.skip_pad and two
            if not (epi or skip or self.copy):  # nothing switched on for this GEMM: the shipped kernel itself
                return self.kept[grid](*args, **kw)
            kw.update(SKIP_PAD=skip, EPI=epi, EPI_REGS=EPI_REGS)
            if epi:
                kw.update(CONSUMER_REGS=EPI_CONSUMER_REGS, maxnreg=EPI_LAUNCH_REGS)
            return fp8_ws_x_kernel[grid](*args, **kw)

        return launch


@contextlib.contextmanager
def variant(skip_pad: bool = False, epi: bool = False, copy: bool = False):
    """Inside: `grouped_matmul_fp8_gluon` (and `fused_moe`'s Gluon GEMMs) run the copy with these switches, or the
    shipped kernel for a GEMM neither switch applies to (copy=True: the copy even then, both switches off)."""
    kept = shipped.fp8_grouped_matmul_ws_kernel
    shipped.fp8_grouped_matmul_ws_kernel = _Launcher(skip_pad, epi, copy, kept)
    try:
        yield
    finally:
        shipped.fp8_grouped_matmul_ws_kernel = kept


VARIANTS = {
    "shipped": None,
    "copy": dict(copy=True),  # the copy with both switches off: what its restructured tile loop costs alone
    "skip": dict(skip_pad=True),
    "epi": dict(epi=True),
    "skip+epi": dict(skip_pad=True, epi=True),
}


def run_as(name, fn):
    if VARIANTS[name] is None:
        return fn()
    with variant(**VARIANTS[name]):
        return fn()


# --- any machine: compile for sm_90a, ptxas -v --------------------------------------------------------------------


def regs() -> int:
    from moe_lab import Activation, AlignedRouting
    from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
    from moe_lab.tools import compile_only

    compile_only.patch_moe_lab()

    def meta(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device="meta")

    e, rows, bm, fp8, f32, h, i = 8, 1024, 128, torch.float8_e4m3fn, torch.float32, 1024, 512
    routing = AlignedRouting(meta(e), meta(rows), meta(rows // bm), meta(1), bm, 256, 2, e)
    failed = 0
    for name, flags in VARIANTS.items():
        session = compile_only.Session(compile_missing=True)
        try:
            with compile_only.fake_gpu(90, session), variant(**flags) if flags else contextlib.nullcontext():
                grouped_matmul_fp8_gluon(
                    meta(rows, i, dtype=fp8),
                    meta(e, h, i, dtype=fp8),
                    routing,
                    gather_a=False,
                    scatter=True,
                    topk_weights=meta(256, 2, dtype=f32),
                    a_scale=meta(rows, i // 128, dtype=f32),
                    w_scale=meta(e, h // 128, i // 128, dtype=f32),
                    out=meta(512, h, dtype=torch.bfloat16),
                )
                grouped_matmul_fp8_gluon(
                    meta(256, h, dtype=fp8),
                    meta(e, 2 * i, h, dtype=fp8),
                    routing,
                    gather_a=True,
                    a_scale=meta(256, h // 128, dtype=f32),
                    w_scale=meta(e, 2 * i // 128, h // 128, dtype=f32),
                    activation=Activation("silu"),
                    out=meta(rows, i, dtype=fp8),
                    out_scale=meta(rows, i // 128, dtype=f32),
                )
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: compile FAILED: {type(exc).__name__}: {str(exc)[:3000]}")
            failed += 1
            continue
        kernels = [k for k in session.kernels.values() if k.name in ("fp8_ws_x_kernel", "fp8_grouped_matmul_ws_kernel")]
        for label, k in zip(("down (plain)", "up (SwiGLU)"), kernels):
            with tempfile.TemporaryDirectory() as d:
                ptx = os.path.join(d, "k.ptx")
                with open(ptx, "w") as f:
                    f.write(k.asm["ptx"])
                done = subprocess.run(
                    ["ptxas", "-v", "-arch=sm_90a", ptx, "-o", os.path.join(d, "k.cubin")],
                    capture_output=True,
                    text=True,
                )
            info = [ln.split(":", 1)[-1].strip() for ln in done.stderr.splitlines() if "spill" in ln or "Used" in ln]
            setmaxnreg = sorted({ln.strip() for ln in k.asm["ptx"].splitlines() if "setmaxnreg" in ln})
            print(f"{name:9s} {label:13s} shared {k.metadata.shared:6d} B; {'; '.join(info)}; {setmaxnreg}")
    return 1 if failed else 0


# --- an sm_90 GPU: bits, then times ------------------------------------------------------------------------------


def gpu(out_dir: str) -> int:
    from moe_lab import Activation, fused_moe, get_preset, moe_align, quantize_activations_fp8, quantize_weights_fp8
    from moe_lab.configs import GemmConfig
    from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
    from moe_lab.routing import uniform_routing
    from moe_lab.tools.timing import graph_ms

    os.makedirs(out_dir, exist_ok=True)
    os.environ["MOE_LAB_GLUON"] = "1"  # the layer rows: its Gluon GEMMs at every T (here T * k / E >= 128 anyway)
    lines, results, failures = [], [], 0

    def say(line):
        print(line, flush=True)
        lines.append(line)

    cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=4)
    for model in os.environ.get("GE_MODELS", "mixtral-8x7b,deepseek-v3,qwen3-30b-a3b").split(","):
        p = get_preset(model)
        e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
        gen = torch.Generator(device="cuda").manual_seed(1)
        w1_q, w1_s = quantize_weights_fp8(
            ((torch.rand(e, 2 * i, h, device="cuda", generator=gen) - 0.5) * h**-0.5).to(torch.bfloat16), (128, 128)
        )
        w2_q, w2_s = quantize_weights_fp8(
            ((torch.rand(e, h, i, device="cuda", generator=gen) - 0.5) * i**-0.5).to(torch.bfloat16), (128, 128)
        )
        for t in [int(v) for v in os.environ.get("GE_T", "4096,16384").split(",")]:
            tw, ti = uniform_routing(t, e, k, seed=1)
            r = moe_align(ti, e, 128)
            x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda", dtype=torch.bfloat16), group_size=128)
            rows = r.max_num_tokens_padded
            a_q, a_s = quantize_activations_fp8(
                torch.randn(rows, i, device="cuda", dtype=torch.bfloat16), group_size=128
            )
            routed = r.sorted_token_ids[:rows] < r.num_slots

            def down():
                return grouped_matmul_fp8_gluon(
                    a_q,
                    w2_q,
                    r,
                    cfg,
                    gather_a=False,
                    scatter=True,
                    topk_weights=tw,
                    a_scale=a_s,
                    w_scale=w2_s,
                    out=down_out,
                )

            def up():
                return grouped_matmul_fp8_gluon(
                    x_q,
                    w1_q,
                    r,
                    cfg,
                    gather_a=True,
                    a_scale=x_s,
                    w_scale=w1_s,
                    activation=Activation("silu"),
                    out=up_out,
                    out_scale=up_scale,
                )

            down_out = torch.empty(t * k, h, device="cuda", dtype=torch.bfloat16)
            up_out = torch.empty(rows, i, device="cuda", dtype=torch.float8_e4m3fn)
            up_scale = torch.empty(rows, i // 128, device="cuda", dtype=torch.float32)
            want = {}
            for name in VARIANTS:
                down_out.fill_(float("nan"))
                up_out.view(torch.uint8).fill_(0x7F)  # e4m3 NaN
                up_scale.fill_(float("nan"))
                try:
                    run_as(name, down)
                    run_as(name, up)
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    say(f"FAIL {model} T={t} {name}: {type(exc).__name__}: {str(exc)[:500]}")
                    failures += 1
                    continue
                # bit patterns (NaN-safe): down all slots, up's routed rows and their scales
                got = (
                    down_out.view(torch.int16).clone(),
                    up_out[routed].view(torch.uint8).clone(),
                    up_scale[routed].view(torch.int32).clone(),
                )
                if name == "shipped":
                    want = got
                    ok = not down_out.isnan().any().item()
                    what = "down: every slot written"
                else:
                    ok = bool(want) and all(torch.equal(g, w) for g, w in zip(got, want))
                    what = "down and up (routed rows, scales) bitwise the shipped kernel's"
                say(f"{'ok  ' if ok else 'FAIL'} bits {model} T={t} {name}: {what}")
                failures += 0 if ok else 1
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)

            def layer():  # fused_moe with the Gluon GEMMs at every T (MOE_LAB_GLUON=1, set below)
                return fused_moe(x, w1_q, w2_q, tw, ti, w1_scale=w1_s, w2_scale=w2_s, block_shape=[128, 128])

            flops_down, flops_up = 2.0 * t * k * h * i, 2.0 * t * k * 2 * i * h
            for gemm, fn, flops in (("down", down, flops_down), ("up", up, flops_up), ("layer", layer, 1.5 * flops_up)):
                names = ["shipped", "copy", "skip"] if gemm == "up" else list(VARIANTS)  # EPI: the plain kernel's
                best = {}
                for rnd in range(3):
                    for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                        try:
                            ms = graph_ms(lambda name=name: run_as(name, fn), rep_ms=100)
                            best[name] = min(ms, best.get(name, float("inf")))
                        except Exception as exc:  # noqa: BLE001
                            say(f"FAIL timing {model} T={t} {gemm} {name}: {type(exc).__name__}: {str(exc)[:300]}")
                            failures += 1
                base = best.get("shipped")
                for name, ms in best.items():
                    row = dict(
                        model=model,
                        T=t,
                        gemm=gemm,
                        variant=name,
                        ms=ms,
                        tflops=flops / ms / 1e9,
                        shipped_over_this=base / ms if base else None,
                    )
                    results.append(row)
                    ratio = row["shipped_over_this"]
                    say(
                        f"| {model} | {t} | {gemm} | {name} | {ms:.3f} | {row['tflops']:.0f} | "
                        f"{'-' if ratio is None else f'{ratio:.3f}'} |"
                    )
        torch.cuda.empty_cache()
        save(out_dir, lines, results)  # after each model: a later failure keeps what was measured
    say(f"{failures} failures")
    save(out_dir, lines, results)
    return 1 if failures else 0


def save(out_dir, lines, results):
    with open(os.path.join(out_dir, "gluon_epilogue.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    with open(os.path.join(out_dir, "gluon_epilogue.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if "--regs" in sys.argv:
        sys.exit(regs())
    sys.exit(gpu(sys.argv[1] if len(sys.argv) > 1 else "gluon_epilogue_out"))
