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
#
# All times below come from `benchmarks/results/*.json` (**committed data** from `moe-lab bench` on an
# H200), unless a cell says it measured them live.

# %%
# %matplotlib inline
import moe_lab  # first: picks GPU or interpreter before any kernel is defined

import torch

from moe_lab import workbook
from moe_lab.viz import performance as perf

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


def check_compute_bound(fn):
    got = fn("qwen3-30b-a3b", results["ceilings"])
    if got is None:
        print("not done yet (hint: ridge = bf16_matmul_tflops / copy_tbps; try T = 1, 2, 4, ... until "
              "layer_cost(...)['intensity'] >= ridge)")
        return
    c = results["ceilings"]
    ridge = c["bf16_matmul_tflops"] / c["copy_tbps"]
    t = 1
    while perf.layer_cost(moe_lab.get_preset("qwen3-30b-a3b"), t)["intensity"] < ridge:
        t *= 2
    if got == t:
        print(f"PASS compute-bound from T = {t} (ridge {ridge:.0f} FLOP/B)")
    elif got == t // 2:
        print(f"FAIL T = {got} is one step too early: its intensity is still below the ridge ({ridge:.0f} FLOP/B)")
    else:
        print(f"FAIL T = {got}; the answer lies where the intensity first reaches {ridge:.0f} FLOP/B")


check_compute_bound(compute_bound_tokens)

# %% jupyter={"source_hidden": true}
# Solution
def compute_bound_tokens_solution(preset_name, ceilings):
    ridge = ceilings["bf16_matmul_tflops"] / ceilings["copy_tbps"]
    preset, t = moe_lab.get_preset(preset_name), 1
    while perf.layer_cost(preset, t)["intensity"] < ridge:
        t *= 2
    return t


check_compute_bound(compute_bound_tokens_solution)

# %% [markdown]
# ## Summary
#
# - FLOPs per token are fixed (6·k·H·I); bytes per token fall with T because the weights are shared, so
#   decode (small T) is memory-bound and prefill (large T) compute-bound.
# - The roofline of an H200 (measured: about 4.2 TB/s copy, about 690 TFLOP/s bf16 matmul) bounds every
#   point; small-T points should be judged against bandwidth, large-T points against the matmul peak.
# - In the committed run the TMA path beats the pointer path once tiles are full, and `torch._grouped_mm`
#   is the peer to beat at large T for the GEMMs alone.
# - Block sizes matter; time them on a GPU, never under the interpreter.
