# %% [markdown]
# # 07 · Performance: FLOPs, bytes, the roofline, and measured times
#
# How fast can a MoE layer be, and how close do the kernels come? This notebook counts the work, draws
# the roofline of an H200 with ceilings measured on it, and reads the committed benchmark results.
#
# **Goals**
# 1. Count FLOPs and bytes per token for each model preset, and see why small batches are memory-bound.
# 2. Draw the roofline (arithmetic intensity against attainable TFLOP/s) from measured H200 ceilings.
# 3. Compare moe-lab's pointer path, its TMA path and `torch._grouped_mm` against T, per model.
# 4. Try block sizes in a widget that times live on a GPU (and says why it does not on the CPU).
# 5. Write the K loop of a tiled matmul with `tl.range(..., num_stages=...)`, and see what each pipeline
#    stage costs in shared memory (and, on a GPU, what it buys in time).
#
# All times below come from `benchmarks/results/*.json` (**committed data** from `moe-lab bench` on an
# H200), unless a cell says it measured them live.

# %%
# Setup, the same first cell in every notebook. It finds moe-lab (a second) or installs it from the clone
# this notebook sits in, with the notebooks' extras, keeping the host's torch, Triton, numpy and ipywidgets
# (a hosted notebook: a minute or two, once per runtime). Where Triton 3.6 runs without a GPU it pins
# numpy < 2.4 too. How: moe_lab_bootstrap.py, beside this notebook; docs/hosted.md.
import importlib.util

if importlib.util.find_spec("moe_lab_bootstrap"):  # this notebook sits in a clone
    import moe_lab_bootstrap

    moe_lab_bootstrap.ensure_moe_lab()
elif importlib.util.find_spec("moe_lab") is None:
    raise RuntimeError("moe-lab is not installed here: clone it and run from its notebooks/ (in a cell: "
                       "!git clone -q <moe-lab repo> moe-lab, then %cd moe-lab/notebooks; docs/hosted.md)")
# %matplotlib inline

# %%
import moe_lab  # first: picks GPU or interpreter before any kernel is defined

import torch

from moe_lab import workbook
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import performance as perf

results = perf.load_results()
print(perf.describe_results(results))

# %% [markdown]
# ## 1. FLOPs and bytes per token
#
# One token routed to k experts costs, in the two GEMMs of a SwiGLU expert (up: `2I × H`, down: `H × I`):
#
# FLOPs per token = 2 · k · (2I·H + I·H) = 6·k·H·I
#
# The bytes are mostly **weights**: every expert that receives at least one token has its `3·H·I` weights
# read once per call, whatever the number of tokens. With few tokens the weights dominate, each weight
# byte serves few FLOPs, and the layer is memory-bound; with many tokens the weights are shared by many
# tokens and the arithmetic intensity (FLOP per byte) grows.

# %% [markdown]
# ### Build: count it yourself for Mixtral-8x7B at T = 1
#
# At T = 1 the token hits k = 2 experts, so the weights read are 2 · 3·H·I bf16 values (2 bytes each);
# tokens and outputs add a few KB.

# %%
# NBVAL_CHECK_OUTPUT
p = moe_lab.get_preset("mixtral-8x7b")
h, i, k = p.hidden_size, p.intermediate_size, p.top_k
my_flops = 6 * k * h * i                                   # FLOP
my_bytes = 2 * (k * 3 * h * i + h + k * 2 * i + k * i + k * h)  # B: weights + x + gate_up + act + out
print(f"my count: {my_flops / 1e6:.1f} MFLOP, {my_bytes / 1e6:.1f} MB, intensity {my_flops / my_bytes:.2f} FLOP/B")
cost = perf.layer_cost(p, 1, experts_used=k)
_ = workbook.check("my FLOPs and bytes vs perf.layer_cost", torch.tensor([float(my_flops), float(my_bytes)]),
                   torch.tensor([cost["flops"], cost["bytes"]]), tol=1e-9)

# %% [markdown]
# For every preset, with the experts hit at random (uniform routing): FLOPs per token stay fixed, bytes
# per token fall as T grows, the intensity rises.

# %%
# NBVAL_CHECK_OUTPUT
print(perf.cost_table(list(moe_lab.PRESETS), [1, 64, 4096]))

# %% [markdown]
# ## 2. The roofline
#
# A kernel cannot beat either ceiling: attainable TFLOP/s = min(matmul peak, intensity × memory bandwidth).
# Both ceilings were measured on the H200 in the benchmark run (copy bandwidth of a 1 GiB buffer, an
# 8192³ bf16 matmul). The ridge point is where the two meet: below it, memory bound; above it, compute
# bound. Points are the committed measurements of the two GEMMs (each model and T); purple marks are
# where Qwen3-30B-A3B sits at T = 1, 64 and 4096 by the count above.

# %%
perf.plot_roofline(results["ceilings"], results=results, presets=["qwen3-30b-a3b"])

# %% [markdown]
# The two ceilings the figure is drawn from (the same `results["ceilings"]`):

# %%
# NBVAL_CHECK_OUTPUT
ceilings = results["ceilings"]
print(f"memory: {ceilings['copy_tbps']:.2f} TB/s copy; compute: {ceilings['bf16_matmul_tflops']:.0f} TFLOP/s bf16 "
      f"matmul; ridge: {ceilings['bf16_matmul_tflops'] / ceilings['copy_tbps']:.0f} FLOP/B "
      f"(measured on an H200, {results['environment']['date']}, committed)")

# %% [markdown]
# ## 3. Pointer vs TMA vs `torch._grouped_mm` against T
#
# Time of the up + down GEMMs (ms, median with L2 flushed; lower is better), one panel per model. The
# dashed line is the roofline bound for the same work.

# %%
perf.plot_time_grid(results, metric="gemms_ms")

# %% [markdown]
# The whole layer (align, activation, reduce and the glue each implementation needs included):

# %%
perf.plot_time_grid(results, metric="layer_ms")

# %%
print(perf.compare_table(results, base="torch._grouped_mm", other="moe-lab tma", metrics=("gemms_ms", "layer_ms")))

# %% [markdown]
# ## 4. Block sizes
#
# BLOCK_SIZE_M trades padding against reuse: a large M-block reuses each weight tile for more rows, but
# with few rows per expert most of it is padding. BLOCK_SIZE_N and BLOCK_SIZE_K set the tile each program
# loads per step. The widget times the whole layer with the block sizes you choose — **on a GPU only**.
# Under the interpreter it says why it does not time, and shows the committed times instead.

# %%
# NBVAL_IGNORE_OUTPUT
perf.block_size_widget("qwen3-30b-a3b", 512, results=results)

# %%
committed = [(f"{r['impl']} (committed)", r["layer_ms"])
             for r in perf.select_rows(results, "qwen3-30b-a3b", num_tokens=512) if r.get("layer_ms")]
perf.plot_bars(committed, title="qwen3-30b-a3b, T=512: whole-layer time on an H200 (committed data)")

# %% [markdown]
# On a GPU, the same sweep without the widget: a few configs for one model and T.

# %%
# NBVAL_IGNORE_OUTPUT
if workbook.timing_allowed("the block-size sweep"):
    preset = moe_lab.get_preset("qwen3-30b-a3b")
    for bm, bn, bk in ((16, 64, 128), (32, 64, 128), (64, 128, 64), (128, 128, 64)):
        cfg = moe_lab.GemmConfig(bm, bn, bk, 8, 8 if bm * bn >= 128 * 128 else 4, 3)
        ms = perf.time_layer(preset, 512, cfg)
        print(f"BLOCK_SIZE_M={bm:<4} N={bn:<4} K={bk:<4}: {ms:.3f} ms per layer (median, L2 flushed, live)")

# %% [markdown]
# ### Exercise: where does the layer become compute-bound?
#
# Using `perf.layer_cost(preset, T)` and the measured ceilings (`results["ceilings"]`), find the smallest T
# (a power of two) at which Qwen3-30B-A3B's intensity reaches the ridge point (peak TFLOP/s ÷ TB/s).

# %%
def compute_bound_tokens(preset_name, ceilings):
    return None  # TODO: your code here


def check_compute_bound(fn, strict=False):
    got = fn("qwen3-30b-a3b", results["ceilings"])
    if got is None:
        return exercises.report("compute_bound_tokens", "it returns None (hint: ridge = bf16_matmul_tflops / "
                                "copy_tbps; try T = 1, 2, 4, ... until layer_cost(...)['intensity'] >= ridge)",
                                "", strict)
    c = results["ceilings"]
    ridge = c["bf16_matmul_tflops"] / c["copy_tbps"]
    t = 1
    while perf.layer_cost(moe_lab.get_preset("qwen3-30b-a3b"), t)["intensity"] < ridge:
        t *= 2
    problem = (None if got == t else
               f"T = {got} is one step too early: its intensity is still below the ridge ({ridge:.0f} FLOP/B)"
               if got == t // 2 else f"T = {got}; the answer lies where the intensity first reaches {ridge:.0f} FLOP/B")
    return exercises.report("compute_bound_tokens", problem, f"compute-bound from T = {t} (ridge {ridge:.0f} FLOP/B)",
                            strict)


check_compute_bound(compute_bound_tokens)

# %% jupyter={"source_hidden": true}
# Solution
def compute_bound_tokens_solution(preset_name, ceilings):
    ridge = ceilings["bf16_matmul_tflops"] / ceilings["copy_tbps"]
    preset, t = moe_lab.get_preset(preset_name), 1
    while perf.layer_cost(preset, t)["intensity"] < ridge:
        t *= 2
    return t


check_compute_bound(compute_bound_tokens_solution, strict=True)

# %% [markdown]
# ## 5. Build: a pipelined K loop
#
# Every GEMM of the layer is a loop over K: each program owns one `BLOCK_SIZE_M × BLOCK_SIZE_N` tile of C,
# and each step loads an A tile `[BLOCK_SIZE_M, BLOCK_SIZE_K]` and a B tile `[BLOCK_SIZE_K, BLOCK_SIZE_N]`
# and adds their product to a float32 accumulator. Written with
# `for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES)`, the loop is **software-pipelined**
# on a GPU: the compiler issues the loads of the next `NUM_STAGES - 1` K blocks while `tl.dot` works on
# the current one, so the tensor cores do not wait for memory. (The interpreter runs the loop plainly; the
# result is the same.)
#
# ### Exercise: write the K loop
#
# The stub sets up the pointers of the first K block:
# - `a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak`: the A tile
#   `[BLOCK_SIZE_M, BLOCK_SIZE_K]`, columns `offs_k` of the rows `offs_m`;
# - `b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn`: the B tile
#   `[BLOCK_SIZE_K, BLOCK_SIZE_N]`, rows `offs_k` of the columns `offs_n`.
#
# In step `k` they point at K block `k` (columns `k * BLOCK_SIZE_K + offs_k` of A, the same rows of B).
# Fill in the loop body: load both tiles, add `tl.dot(a, b)` to the accumulator, advance both pointers by
# one K block (`BLOCK_SIZE_K * stride_ak` and `BLOCK_SIZE_K * stride_bk`). The checker runs float16 A
# `[64, 200]`, stored column-major (strides (1, 64): a step along K is 64 elements, so the stride matters),
# and B `[200, 96]` (a transposed view of a weight `[96, 200]`, as the MoE GEMMs read `w1`/`w2`); a kernel
# that passes runs once more with B row-major, where `stride_bk` is not 1 either.
# with 32 × 32 × 32 blocks: K = 200 is **not** a multiple of BLOCK_SIZE_K, so mask the last block's 8
# columns (`offs_k < K - k * BLOCK_SIZE_K`, `other=0.0`). Keep the accumulator in float32.

# %%
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  NUM_STAGES: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES):
        # TODO: load the A tile and the B tile of K block k (mask: offs_k < K - k * BLOCK_SIZE_K, other=0.0)
        # TODO: accumulator += tl.dot(a, b)
        # TODO: advance a_ptrs and b_ptrs by one K block
        pass
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, accumulator, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# %%
matmul_verdict = exercises.check_pipelined_matmul(matmul_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def matmul_kernel_solution(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                           stride_cn, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                           BLOCK_SIZE_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=NUM_STAGES):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        accumulator += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, accumulator, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


exercises.check_pipelined_matmul(matmul_kernel_solution, strict=True)

# %% [markdown]
# ### What the stages cost, and what they buy
#
# Each stage holds one A tile and one B tile in shared memory, so a pipeline of `num_stages` stages needs
# (BM·BK + BK·BN) · 2 bytes · num_stages (float16), and an H200 gives one block at most 227 KiB: a config
# that does not fit fails to launch (`OutOfResources`). What the tiles buy is reuse: one K step does
# 2·BM·BN·BK FLOPs on (BM·BK + BK·BN)·2 loaded bytes, an intensity of 2·BM·BN / ((BM + BN)·2) FLOP/B,
# larger for larger tiles. The cost model needs no GPU:

# %%
# NBVAL_CHECK_OUTPUT
SWEEP_BLOCKS = [(64, 64, 32), (128, 128, 32), (128, 128, 64), (128, 256, 64), (256, 128, 128)]
SWEEP_STAGES = [1, 2, 3, 4, 5]
stage_costs = perf.stage_sweep(SWEEP_BLOCKS, SWEEP_STAGES)
print(perf.stage_sweep_table(stage_costs))

# %%
perf.plot_stage_sweep(stage_costs, title="num_stages against shared memory (cost model, float16 tiles)")

# %% [markdown]
# How good is the model? Compiled for an H200 (sm_90, Triton 3.6, no GPU needed: `moe_lab.tools.compile_only`),
# the solution's kernel uses exactly the table's shared memory from 3 stages on, and fails to launch
# (`OutOfResources`) exactly at the rows marked NO. With 1 or 2 stages it can use more than the table
# says: the float32 C tile (BM·BN·4 bytes) passes through shared memory once, after the loop.
#
# On a GPU the next cell times your kernel (the solution's while yours is NOT YET) at M = N = K = 4096 for
# each block shape and `num_stages`, live; under the interpreter it times nothing and says why. More
# stages help until the loads are hidden, and a config past the shared-memory limit fails to launch.

# %%
# NBVAL_IGNORE_OUTPUT
if workbook.timing_allowed("the num_stages sweep"):
    sweep_kernel, which = ((matmul_kernel, "your matmul_kernel") if matmul_verdict.passed
                           else (matmul_kernel_solution, "matmul_kernel_solution (yours is NOT YET)"))
    print(f"timing {which}, live on this GPU")
    stage_times = perf.stage_sweep(SWEEP_BLOCKS, SWEEP_STAGES, kernel=sweep_kernel, size=4096)
    print(perf.stage_sweep_table(stage_times))
    display(perf.plot_stage_sweep(stage_times, title="matmul 4096³, float16 in, float32 out: live on this GPU"))

# %% [markdown]
# ## Summary
#
# - FLOPs per token are fixed (6·k·H·I); bytes per token fall with T because the weights are shared, so
#   decode (small T) is memory-bound and prefill (large T) compute-bound.
# - The roofline of an H200 (the copy bandwidth and bf16 matmul peak measured in the committed run, printed
#   under the roofline figure) bounds every point; small-T points should be judged against bandwidth,
#   large-T points against the matmul peak.
# - In the committed run the TMA path beats the pointer path once tiles are full, and `torch._grouped_mm`
#   is the peer to beat at large T for the GEMMs alone.
# - Block sizes matter; time them on a GPU, never under the interpreter.
# - `num_stages` keeps that many A and B tiles in flight: more stages hide more load latency, but each
#   costs (BM·BK + BK·BN)·2 bytes of shared memory, and past 227 KiB per block (an H200) the kernel does not
#   launch.
