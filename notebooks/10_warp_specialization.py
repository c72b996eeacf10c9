# %% [markdown]
# # 10 · Warp specialization on Hopper
#
# Notebook 09 ended on a gap: an FP8 GEMM with block scales must scale each 128-deep product before it adds it
# to the accumulator, and in one warpgroup that issues the wgmma, waits for it and then scales, the tensor cores
# stand idle while the warpgroup scales. Hopper's answer is to give different jobs to different warps of one
# program: a **producer** warp that only issues TMA loads, and **consumer** warpgroups that only multiply and
# scale, meeting on **mbarriers** in shared memory. moe-lab has such a kernel, written in Gluon (Triton's
# lower-level language, where the programmer places the warps, the layouts and the barriers):
# `moe_lab.gluon_fp8.grouped_matmul_fp8_gluon`, which `fused_moe` runs for block-scaled FP8 layers where the
# experts get 256 rows each or more (128 for large experts) and no config is given (section 7 says why only
# there). This notebook takes it apart.
#
# **Goals**
# 1. See why one warpgroup waits: a schematic of one program's timeline (loads, MMAs, scaling, epilogue).
# 2. Learn how a producer and a consumer meet on mbarriers: arrivals, expected bytes, phases and their parity.
# 3. See how two MMA warpgroups share a tile without waiting for each other, and why ping-pong was not kept.
# 4. Read the kernel piece by piece, and see its warp specialization in the PTX compiled for sm_90 here.
# 5. Write the producer's load loop of a warp-specialized TMA copy (exercise), checked by a model of the
#    protocol and by compiling for sm_90, and run on a GPU where there is one.
# 6. Read the measured table of every step on an H200, each with the reason it moved.

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
import moe_lab  # first: picks GPU or interpreter before any kernel below is defined

import inspect

import torch

from moe_lab import GemmConfig, capability, workbook
from moe_lab.tools import look_inside
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import warp_specialization as ws_viz

device = moe_lab.runtime.default_device()
print("kernels run on:", "a GPU" if workbook.on_gpu() else "the CPU, under Triton's interpreter")
print("Gluon in this Triton:", capability._gluon_problem() or "yes, with warp_specialize")
print("the Gluon FP8 kernel can run here:", moe_lab.capability.gluon_fp8_support(device) or "yes")

# %% [markdown]
# Gluon kernels compile for a GPU and have no interpreter, so on a CPU this notebook compiles them for sm_90
# (an H100 or H200) and reads what the compiler made; on an H200 it also runs them.
#
# ## 1. Why one warpgroup waits
#
# The function, first: per M-block of the routing, `out = sum over 128-deep K blocks of (A @ W[e].T) x a_scale
# x w_scale`, float8 e4m3 operands, float32 sums (DeepSeek-V3's recipe, notebook 09). moe-lab's Triton kernel
# computes it everywhere, here under the interpreter on a small case:

# %%
gen = torch.Generator().manual_seed(0)
T, E, TOP_K, N, K = 8, 4, 2, 256, 384
a = torch.randn(T, K, generator=gen).to(device)
w = (torch.randn(E, N, K, generator=gen) / K**0.5).to(device)
ids = torch.rand(T, E, generator=gen).topk(TOP_K, dim=1).indices.to(torch.int32).to(device)
routing = moe_lab.moe_align(ids, E, 16)
a_q, a_scale = moe_lab.quantize_activations_fp8(a, group_size=128)
w_q, w_scale = moe_lab.quantize_weights_fp8(w, block_shape=(128, 128))
out = moe_lab.grouped_matmul(a_q, w_q, routing, GemmConfig(16, 64, 128, 1, 4, 1), gather_a=True, a_scale=a_scale,
                             w_scale=w_scale, block_shape=(128, 128), out_dtype=torch.float32)
used = routing.num_tokens_post_padded.item()
slots = routing.sorted_token_ids[:used]
valid = slots < routing.num_slots
experts = routing.expert_ids[torch.arange(used, device=device) // 16][valid]
a_deq = moe_lab.dequantize_fp8(a_q, a_scale, block_shape=(1, 128))
w_deq = moe_lab.dequantize_fp8(w_q, w_scale, block_shape=(128, 128))
want = workbook.expert_rows_matmul(a_deq[(slots[valid] // TOP_K).long()], w_deq, experts)
_ = workbook.check("Triton FP8 grouped GEMM vs float32 math on the dequantized operands", out[:used][valid], want,
                   tol=1e-5)

# %% [markdown]
# Its K loop, per K block: wait for the block's tiles in shared memory, `tl.dot` them (a wgmma on Hopper), then
# multiply the float32 product by `a_scale[row] * w_scale` and add it to the accumulator. The product is needed
# at once, to be scaled, so the warpgroup waits for each wgmma to finish, and while it scales (a multiply-add on
# every one of the tile's float32 elements, on the CUDA cores) no wgmma runs. Triton's pipeliner overlaps the
# loads (the ring of `num_stages`), not the scaling. Two or three programs per SM hide part of it: one program's
# MMA runs while another scales.
#
# The picture below is a **schematic**, drawn from the kernels' code with made-up durations
# (`ws_viz.DURATIONS`: a wgmma 1 unit, scaling 0.6, a tile's epilogue 2), not a measurement: a measured one
# needs a GPU profiler or clock reads inside the kernel (section 7 cites one), and the proportions differ per
# shape. It shows three schedules of the same work, two
# tiles of four K blocks each:
#
# - **one warpgroup** (Triton's FP8 kernel): wgmma, wait, scale, wgmma, ...: the tensor cores idle during every
#   scaling and during the epilogue.
# - **warp-specialized** (moe-lab's Gluon kernel): a producer warp keeps the ring of stages full; the MMA
#   warpgroup issues the wgmmas of K blocks k and k + 1, scales k while k + 1 runs, then scales k + 1. One gap
#   per pair instead of one per block. (Why pairs and not a running chain: a product in flight across the
#   loop's back edge makes ptxas serialize every wgmma, its warning C7514.)
# - **ping-pong**: two MMA warpgroups on two different tiles take turns: while one scales, the other's wgmma
#   runs, and the tensor cores never wait (section 3). The schematic leaves out what loads cost; on an H200
#   that cost decided against ping-pong (section 3).

# %%
ws_viz.plot_timeline()

# %% [markdown]
# ## 2. A producer and a consumer meet on mbarriers
#
# The producer and the consumer share a **ring** of `STAGES` shared-memory stages (each holds one box of A and
# one of W) and two barriers per stage, both in shared memory:
#
# - `ready[s]`: "stage s holds a full box". The producer announces the bytes it is about to load,
#   `mbarrier.expect(ready[s], nbytes)` (one arrival plus nbytes expected), and issues the TMA load, which
#   signals `ready[s]` as its bytes land. The phase completes when the arrival has come *and* every expected
#   byte has landed. The consumer waits on it.
# - `empty[s]`: "the consumer is done with stage s". The consumer arrives on it once it has read the stage
#   (here: once the wgmma that reads it has finished). The producer waits on it before it loads into s again.
#
# An mbarrier counts **phases**. `mbarrier.init(bar, count=1)` starts phase 0; when `count` arrivals (and all
# expected bytes) have come, the phase completes and the next begins. `mbarrier.wait(bar, parity)` returns once
# the phase of that parity has completed: the barrier keeps only the parity of its current phase, which is why
# a stage's waits alternate 0, 1, 0, ... with each round of the ring. The one rule to remember: **a fresh
# barrier counts as having completed the phase before phase 0**, so a wait for parity 1 passes at once.
#
# So with `step` counting a partition's K blocks (across tiles: the persistent kernel's counter runs on), stage
# `s = step % STAGES`, round `r = step // STAGES`:
#
# - consumer: `wait(ready[s], r & 1)`: round 0 waits for the first fill (phase 0);
# - producer: `wait(empty[s], (r & 1) ^ 1)`: round 0 passes at once (every stage starts empty), round 1 waits
#   for the consumer's first release of s, and so on.
#
# The model the exercise's checker uses (`exercises.ws_copy.MBarrier`) plays these rules in Python:

# %%
# NBVAL_CHECK_OUTPUT
from moe_lab.workbook.exercises.ws_copy import MBarrier

bar = MBarrier()  # init(count=1)
print(f"fresh:                 phase {bar.phase}, wait(parity 0) passes: {bar.passes(0)}, wait(parity 1): {bar.passes(1)}")
bar.bytes(2048)  # expect: 2048 bytes ...
bar.arrive()  # ... and its one arrival
print(f"after expect(2048):    phase {bar.phase}, pending bytes {bar.tx}, wait(0) passes: {bar.passes(0)}")
bar.bytes(-2048)  # the TMA box lands
print(f"after the box landed:  phase {bar.phase}, wait(0) passes: {bar.passes(0)}, wait(1): {bar.passes(1)}")

STAGES = 2
print(f"\nSTAGES = {STAGES}: {'step':>4} {'stage':>5} {'round':>5} {'producer waits empty':>21} {'consumer waits ready':>21}")
for step in range(6):
    s, r = step % STAGES, step // STAGES
    print(f"{'':>12}{step:>4} {s:>5} {r:>5} {'parity ' + str((r & 1) ^ 1):>21} {'parity ' + str(r & 1):>21}")

# %% [markdown]
# Every slip in this protocol is silent at compile time and fatal at run time: a wait for the wrong parity
# either passes too early (the producer overwrites a box the consumer has not read: wrong results, sometimes)
# or never passes (a deadlock: the GPU kernel hangs, and with it the Python process that waits for it). That is
# why the exercise below is checked by a model first.
#
# ## 3. Two warpgroups, and ping-pong
#
# In moe-lab's kernel with 128-row tiles there are two MMA warpgroups, each 64 rows of the *same* tile, and each
# is a partition of its own. Both wait for the same stage; each arrives on the stage's `empty` barrier once its
# wgmma has read it, and the barrier is made with `count=2`, so the producer refills the stage when both have.
# Between those meetings they run apart, up to the depth of the ring: one scales or stores while the other's
# wgmmas run. (The kernel's first form ran both warpgroups as one partition, which Gluon synchronizes before
# every arrival: they scaled at the same time and multiplied at the same time, up to 6 % slower at prefill.)
#
# **Ping-pong** (DeepSeek-V3's report, §3.3.2; CUTLASS's "ping-pong" kernel schedule) gives the two warpgroups
# *different* tiles and makes them take turns at the tensor cores (the third panel). moe-lab measured it (64-row
# tiles, a ring of stages per warpgroup, two load orders) and did not keep it: each warpgroup's tile is half as
# tall, so every W box is loaded for half the work, which cost more than the turns gained (0.84 to 1.02x the
# Triton kernel's speed where the two warpgroups of one tile reach 1.0 to 1.2x, at T = 4096 and 16384). A
# 128-row tile per warpgroup would need its 128 rows of sums and a product in flight in one warpgroup's
# registers: more than a thread has beside a second warpgroup (64 for the sums and 64 per product in flight
# with 64 rows; twice as many with 128). Measurements: docs/experiments.md, "Two MMA partitions, and ping-pong".
#
# ## 4. The kernel, piece by piece
#
# `moe_lab/_kernels/gluon_fp8.py`. The entry kernel allocates the ring and its barriers and forks the program
# into partitions: the default one (the kernel's `num_warps` = 4 warps, one warpgroup) runs `_mma_partition` on
# the tile's first 64 rows, with 128-row tiles a worker of 4 more warps runs it on the next 64 (`CONSUMER_REGS`
# registers per thread), and one extra warp runs `_load_partition` with `LOAD_REGS` registers (the load warp
# needs few: 24, the least `setmaxnreg` allows, so each MMA warpgroup gets 240; at 232 the compiler spilled a few
# of the SwiGLU K loop's addresses to local memory, and the layer ran 6 to 20 % slower). The load warp is padded
# to a whole warpgroup, so the compiled kernel counts 8 or 12 warps. `moe_lab.plan.plan_gluon_fp8` decides the stages (as many as
# shared memory holds, up to the config's), the grid (one program per SM, persistent; one per tile for a SwiGLU up
# GEMM whose experts' weights outgrow L2, below) and the launch's
# register limit; `GLUON_CONSUMER_REGS` and `GLUON_LOAD_REGS` in `moe_lab/plan.py` are the split.

# %%
from moe_lab._kernels import gluon_fp8 as gluon_kernels

entry = inspect.getsource(gluon_kernels.fp8_grouped_matmul_ws_kernel.fn)
print(entry[entry.index("    a_bufs ="):])

# %% [markdown]
# **The producer.** One warp walks the same persistent tile sequence as the MMA partition (skipping M-blocks of no
# expert, -1), and for each K block: the stage and its round from `step`, the wait on `empty` with the flipped
# parity, the expect of all the stage's bytes on `ready`, and the TMA loads that signal `ready`: the A rows and the
# expert's W rows (with SwiGLU, the up projection of `fused_moe`, two W boxes: the gate's rows and the up's).
# Nothing else: no address arithmetic per element, no registers for tiles.

# %%
print(inspect.getsource(gluon_kernels._load_partition.fn))

# %% [markdown]
# **The consumer.** `_issue` waits for a stage and issues its wgmma asynchronously, returning at once; the K loop
# (`_k_loop`, run by `_mma_partition` for each tile) takes K blocks in pairs: both wgmmas issued, then
# `warpgroup_mma_wait(num_outstanding=1)` waits for the first only, its stage is released (`arrive` on `empty`),
# and the first product is scaled while the second runs. Between two pairs a warpgroup has nothing in flight
# (it scales the second product and waits for the next stage), so the second warpgroup takes its first K block
# alone: its pairs start a block later, and its gaps fall while the first warpgroup's wgmmas run (1.01 to 1.04x
# at T = 16384). (`_k_loop_swiglu`, for SwiGLU, takes one K block at a time: its gate and up products in two
# half-width pieces each, each piece added while the next one runs.)

# %%
print(inspect.getsource(gluon_kernels._issue.fn))
print(inspect.getsource(gluon_kernels._k_loop.fn))

# %% [markdown]
# Then the epilogue, in the same warps: the routed weight (with `topk_weights_ptr`), the conversion to bf16, and a
# sorted or scattered store; with SwiGLU, the activation instead, written as float8 with one scale per row per 128
# columns (the down GEMM's input, as `fused_moe`'s Triton up GEMM writes it). While the MMA warpgroups run it, the
# load warp is already filling the ring with the next tile's first stages: the one overlap of epilogue and loads
# that warp specialization gives for free.
#
# **Compiled for sm_90, here.** `look_inside.compile_gluon_fp8` compiles the kernel in a child process for an
# H200 that is not there (moe_lab.tools.compile_only) and returns its PTX. What shows warp specialization:

# %%
for block_m in (64, 128):
    compiled = look_inside.compile_gluon_fp8(block_m)
    print(f"BLOCK_SIZE_M = {block_m}: {compiled.num_warps} warps in all, {compiled.shared_bytes} bytes of shared memory")
    for instruction in look_inside.WARP_SPECIALIZATION_INSTRUCTIONS:
        print(f"  {compiled.count(instruction):3d} x {instruction}")
print()
for instruction, meaning in look_inside.WARP_SPECIALIZATION_INSTRUCTIONS.items():
    print(f"{instruction}: {meaning}")
print("\nthe register hand-over (BLOCK_SIZE_M = 128), each line once:")
print(*dict.fromkeys(compiled.lines("setmaxnreg", limit=None)), sep="\n")

# %% [markdown]
# The hand-over comes in two phases. Inside the partitions: 240 registers per thread for each MMA warpgroup (the
# default partition's `dec 240`, the worker's `inc 240`) and 24 for the load warp (`dec 24`): 240 + 240 + 24 = 504
# = 3 x 168, the launch's limit per thread (`.maxnreg 168`) for each of the three warpgroups. Around them, Triton's
# lowering of `gl.warp_specialize` shares the same registers out for setting up and ending: the default warpgroup
# holds 256 while the waiting workers hold 120 each (256 + 120 + 120 = 496, within the 504).

# %% [markdown]
# ## 5. Exercise: the producer of a warp-specialized TMA copy
#
# A copy is the smallest kernel with the whole protocol. `ws_copy_kernel`
# (`moe_lab/workbook/exercises/ws_copy_kernels.py`) copies `src [M, N]` into `dst` box by box: program p of P
# walks the tiles p, p + P, ...; its consumer partition (given, below) waits on `ready`, reads the box into
# registers, arrives on `empty` and stores the box. Write its producer:
#
# - for each of the program's tiles (the loop and the box's `[row, col]` are given), with `step` counting the
#   program's loads from 0: `stage = step % STAGES`;
# - wait until the stage is empty: `mbarrier.wait(empty.index(stage), parity)`, parity from the round
#   (section 2);
# - make `ready.index(stage)` expect one box's bytes, `src_desc.block_type.nbytes`;
# - issue the load: `tma_load(src_desc, [row, col], ready.index(stage), bufs.index(stage))`;
# - count the step.
#
# The checker first plays your producer's Python body against the consumer in a model of the mbarriers (no GPU,
# a second; 2 programs with 3 stages, two rounds of the ring, then the GPU run's sizes: 5 programs with 2 stages,
# 7 with 4, up to 19 rounds): it names the slip it sees (a wait on the wrong
# barrier or parity, a missing expect, a wrong stage, ...) and what it does (deadlock or race). Then it compiles
# the kernel for sm_90 in a child process. On an H100/H200 it also runs it, in a child process with a time limit
# (a hung GPU kernel is stopped there, not in this notebook), and compares the copy bit for bit. The consumer:

# %%
from moe_lab.workbook.exercises import ws_copy_kernels

print(inspect.getsource(ws_copy_kernels._copy_consumer.fn))

# %%
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # Triton 3.8 renamed the load


@gluon.jit
def copy_load_partition(src_desc, bufs, ready, empty, M, N):
    BLOCK_M: gl.constexpr = src_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = src_desc.block_type.shape[1]
    STAGES: gl.constexpr = bufs.type.shape[0]
    num_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for t in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * num_n, gl.num_programs(0)):
        row = (t // num_n) * BLOCK_M
        col = (t % num_n) * BLOCK_N
        # TODO: wait for the stage to be empty, expect the box's bytes on its ready barrier, load, count the step


# %%
exercises.check_ws_copy(copy_load_partition)


# %% jupyter={"source_hidden": true}
# Solution
@gluon.jit
def copy_load_partition_solution(src_desc, bufs, ready, empty, M, N):
    BLOCK_M: gl.constexpr = src_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = src_desc.block_type.shape[1]
    STAGES: gl.constexpr = bufs.type.shape[0]
    num_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for t in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * num_n, gl.num_programs(0)):
        row = (t // num_n) * BLOCK_M
        col = (t % num_n) * BLOCK_N
        stage = step % STAGES
        mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1)  # round 0 passes: every stage starts empty
        mbarrier.expect(ready.index(stage), src_desc.block_type.nbytes)
        tma_load(src_desc, [row, col], ready.index(stage), bufs.index(stage))
        step += 1


exercises.check_ws_copy(copy_load_partition_solution, strict=True)

# %% [markdown]
# ## 6. On a GPU: the Gluon kernel against the Triton kernel
#
# On an H100/H200 the next cell runs DeepSeek-V3's up GEMM (full size, T = 4096, FP8 with [128, 128] block
# scales) with the Triton FP8 kernel and with the Gluon kernel (128-row tiles), compares them, and times both.
# Elsewhere it says why it does not.

# %%
# NBVAL_IGNORE_OUTPUT
reason = moe_lab.capability.gluon_fp8_support(device)
if reason:
    print("Not run here:", reason)
elif workbook.timing_allowed("the Gluon vs Triton FP8 timing"):
    from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
    from moe_lab.routing import uniform_routing
    from moe_lab.tools.timing import graph_ms

    ds = moe_lab.get_preset("deepseek-v3")
    T_GPU, E_GPU, H, I = 4096, ds.num_experts, ds.hidden_size, ds.intermediate_size
    w1 = (torch.rand(E_GPU, 2 * I, H, device="cuda", dtype=torch.bfloat16) - 0.5) * H**-0.5
    w1_q, w1_s = moe_lab.quantize_weights_fp8(w1, block_shape=(128, 128))
    del w1
    x_q, x_s = moe_lab.quantize_activations_fp8(torch.randn(T_GPU, H, device="cuda"), group_size=128)
    _, topk_ids = uniform_routing(T_GPU, E_GPU, ds.top_k, seed=1)
    layer_cfg = moe_lab.default_config(T_GPU, E_GPU, ds.top_k, H, I, torch.float8_e4m3fn)  # its tuned FP8 tiles
    cfg = layer_cfg.up
    r_triton = moe_lab.moe_align(topk_ids, E_GPU, layer_cfg.block_size_m)
    r_gluon = moe_lab.moe_align(topk_ids, E_GPU, 128)  # 128-row tiles: two MMA warpgroups
    fp8 = dict(a_scale=x_s, w_scale=w1_s, block_shape=(128, 128))

    def triton_up():
        return moe_lab.grouped_matmul(x_q, w1_q, r_triton, cfg, gather_a=True, **fp8)

    def gluon_up():
        return grouped_matmul_fp8_gluon(x_q, w1_q, r_gluon, gather_a=True, **fp8)  # plan_gluon_fp8's config

    def by_slot(out, r):  # sorted rows -> [T * k, 2I] rows by slot
        ids = r.sorted_token_ids[: r.max_num_tokens_padded].long()
        keep = ids < r.num_slots
        rows = torch.empty(r.num_slots, out.shape[1], dtype=out.dtype, device="cuda")
        rows[ids[keep]] = out[keep]
        return rows

    print(f"Gluon vs Triton FP8, same inputs: relative error "
          f"{moe_lab.relative_error(by_slot(gluon_up(), r_gluon).float(), by_slot(triton_up(), r_triton).float()):.1e}")
    t_triton, t_gluon = graph_ms(triton_up), graph_ms(gluon_up)
    flops = 2 * T_GPU * ds.top_k * 2 * I * H
    print(f"{torch.cuda.get_device_name()}, DeepSeek-V3 up GEMM, T = {T_GPU} (CUDA-graph medians, L2 flushed):")
    for name, ms in (("Triton FP8", t_triton), ("Gluon FP8, 128x128, warp-specialized", t_gluon)):
        print(f"  {name:<38} {ms:.3f} ms  {flops / ms / 1e9:.0f} TFLOP/s")

# %% [markdown]
# ## 7. Every step, measured on an H200
#
# `benchmarks/gluon_fp8.py` timed the GEMM pair of each model (up and down, full size) for each step from bf16 to
# the warp-specialized kernel, beside the ceiling of a dense FP8 GEMM of the same FLOPs (**committed data, not
# measured here**: benchmarks/results/gluon_fp8/gluon_fp8.json). Per step: TFLOP/s per model at T = 16384, the
# Triton FP8 pair's time over this step's in brackets (above 1: faster than Triton FP8), and why it moved.

# %%
results = ws_viz.load_gluon_results()
print(f"{results['device']}, torch {results['torch']}, triton {results['triton']}\n")
print(ws_viz.steps_table(results, tokens=16384))
print()
print(ws_viz.steps_table(results, tokens=512))

# %% [markdown]
# How to read it:
#
# - bf16 to Triton FP8: half the bytes, and FP8's tensor-core rate, but well short of the dense FP8 ceiling:
#   the scaling gap of section 1.
# - Warp-specialized with one MMA warpgroup (64-row tiles): one program per SM, so nothing hides the gaps that
#   remain; about the Triton kernel's speed, slower at some models.
# - Two MMA warpgroups (128-row tiles): the step that moves it past the Triton kernel at prefill (T = 16384) for
#   every model: twice the work per wait, per W box loaded and per pair's gap. At T = 512 it loses where the
#   experts get few rows each (Qwen3-30B-A3B: 4096 slots over 128 experts, DeepSeek-V3: over 256), so 128-row
#   tiles are mostly padding; Mixtral's 8 experts get about 128 rows each, and there it does not lose.
# - Still short of the dense FP8 ceiling, and measured why (docs/experiments.md, "What stops the Gluon FP8
#   kernel"): the same kernel without block scales (its wgmmas accumulating, as with one scale per tensor)
#   comes within 5 % of the dense FP8 ceiling at Mixtral-8x7B (about 1,150 TFLOP/s at T = 16384) but reaches
#   about 930 at DeepSeek-V3 and 830 at Qwen3-30B-A3B, whose short K (16 and 6 K blocks in the down GEMM) leave
#   the epilogue a larger share. So at Mixtral the scaling of each product costs about a fifth; at DeepSeek-V3
#   and Qwen3 the epilogue costs about as much as the scaling (each about 10 to 20 %). The fairer ceiling, a
#   dense GEMM with the same block scales (cuBLAS's, through `torch._scaled_mm`), reaches about 1,110 TFLOP/s
#   at Mixtral-8x7B and 1,100 at DeepSeek-V3 (T = 16384): the kernel is at 86 % and 76 % of it. Handing the
#   epilogue to a warpgroup of its own, through shared memory, measured slower (0.79 to 0.99x: the hand-over
#   costs more than the stores it moves; docs/experiments.md, "The Gluon epilogue in a warpgroup"). A clock read
#   at each tile's start, K-loop end and store end (on an H100) showed where it goes: a warpgroup of the down GEMM
#   spends 34 % of its own cycles in epilogues at Qwen3-30B-A3B, 15 % at DeepSeek-V3 and 2.5 % at Mixtral (the
#   other warpgroup's wgmmas run through part of that), and both are in an epilogue at once for a quarter of a
#   program's time at Qwen3, when nothing multiplies; starting the second one late does not spread them apart
#   (the ring of stages bounds the lag; docs/experiments.md, "Full-width wgmmas"). A step
#   tried before this kernel, Gluon without warp
#   specialization (wgmmas issued asynchronously in one warpgroup), was no faster than the Triton kernel
#   (docs/experiments.md, "FP8 in Gluon"), because the Triton kernel's several programs per SM already overlapped
#   one program's scaling with another's MMAs.
# - In the whole layer (`fused_moe` with SwiGLU and the activation's quantization in the Gluon up GEMM's
#   epilogue) it is faster than the Triton layer on an H200 where the experts get 256 rows each or more (1.07 to
#   1.26x: Mixtral T >= 1024, Qwen3 T >= 4096, DeepSeek-V3 T >= 8192), mixed at 128 and 192 (faster for Mixtral
#   and DeepSeek-V3, slower for Qwen3), slower below (benchmarks/results/gluon_fp8/fp8_layer.md; 192 rows and an
#   H100's numbers in docs/experiments.md, "The Gluon GEMMs' tile order"), so `fused_moe`
#   runs the Gluon GEMMs where the experts get 256 rows each or more and no config is given (`MOE_LAB_GLUON=1`: at
#   every T); for large experts (w1 of 16 MiB or more each: Mixtral, DeepSeek-V3) from 128 rows, a full tile
#   each, where both measured faster on an H200 and on an H100 (1.01 to 1.11x; docs/experiments.md, "auto for
#   large experts"). Its up GEMM walks the tiles one M-block at a time (GROUP_SIZE_M = 1) where two M-blocks' N tiles
#   fit one wave of programs (DeepSeek-V3 and Qwen3: that GEMM 1.02 to 1.21x on an H100, the layer 0.99 to 1.06x
#   on an H200; docs/experiments.md, "The Gluon GEMMs' tile order"). Where one expert's w1 takes 16 MiB or more
#   (DeepSeek-V3, Mixtral) the up GEMM launches one program per tile instead of one per SM: the GPU starts tiles
#   in order, so the M-blocks that share a weight box run at once and find it in L2, where programs walking tiles
#   drift apart and each read it from DRAM (DeepSeek-V3's layer 1.11 to 1.20x on an H100; docs/experiments.md,
#   "One program per tile"). Where the Triton up GEMM quantizes in its
#   epilogue with 64-row tiles, the two layers agree bit for bit; elsewhere by a few float8 steps, as FP8's tuned
#   tiles already do from one T to another (docs/experiments.md, "Where the Gluon and Triton layers part").
# - The same skeleton with bf16 operands (no scales: each wgmma accumulates in place) is slower than the Triton
#   bf16 layer, 0.57 to 0.95x on an H100 at Qwen3-30B-A3B T = 4096 and at T = 16384 for all three, whatever its
#   tiles: with no scaling to hide, warp specialization has little to overlap that Triton's own pipelining of
#   `tl.dot` does not (docs/experiments.md, "bf16 on the Gluon skeleton"). This kernel is for FP8's scaling.
#
# ## Summary
#
# - A block-scaled FP8 GEMM must scale every 128-deep product before adding it: in one warpgroup, the tensor
#   cores wait while it scales.
# - Warp specialization splits a program into a producer warp (TMA loads) and consumer warpgroups (wgmma,
#   scaling, epilogue), meeting on a ring of stages with two mbarriers each: `ready` (expect bytes, the TMA
#   load completes it) and `empty` (the consumer arrives). Waits alternate parity with each round of the ring;
#   a fresh barrier passes parity 1.
# - moe-lab's Gluon kernel issues K blocks in pairs and scales one while the next multiplies; with two MMA
#   warpgroups its GEMMs beat the Triton FP8 kernel's at prefill on an H200, short of the dense FP8 ceiling;
#   `fused_moe` runs them where the experts get 256 rows each or more (128 where one expert's w1 takes 16 MiB or
#   more; no config given), where the layer is faster.
# - What is left between it and the dense ceiling is the scaling itself (about a fifth at Mixtral, measured by
#   leaving it out) and, where K is short, the epilogue; ping-pong on 64-row tiles did not win it back.
