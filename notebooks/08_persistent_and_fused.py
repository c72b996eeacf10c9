# %% [markdown]
# # 08 · Persistent and fused: one program per SM, and the activation in the epilogue
#
# Notebooks 03 to 07 launched one program per output tile. This notebook changes two things about the
# grouped GEMM: the first keeps its results bit for bit, the second changes one rounding, for the better.
#
# **Goals**
# 1. See what a grid of one program per tile costs: waves of programs, each with its own start and end.
# 2. Draw the tile schedule of a persistent grid, where each program walks many tiles.
# 3. Read the tile count on the device (`num_tokens_post_padded`), so the grid never depends on the routing
#    and the layer stays CUDA-graph safe.
# 4. Write a persistent kernel yourself (exercise), then run moe-lab's and compare it with the per-tile one.
# 5. Move SiLU-and-mul into the up GEMM's epilogue: one tile holds gate and up rows.
# 6. Timings: live on a GPU, committed H200 data otherwise.
# 7. See where the remaining prefill time goes: padding rows, measured against cuBLAS.
# 8. Fold an expert's small last block into the block before it: fewer padding rows, same weight tile.

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

import dataclasses

import torch
import triton
import triton.language as tl

from moe_lab import GemmConfig, workbook
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import schedule as schedule_viz

device = moe_lab.runtime.default_device()

# %% [markdown]
# ## 1. One program per tile: waves
#
# The grouped GEMM's grid has one program per (M-block, N-tile). An H200 has 132 SMs; with one
# 128 x 256 program per SM at a time, the programs run in waves. Each program loads its first K tiles
# before the tensor cores can start (the prologue), and converts and stores its tile at the end (the
# epilogue), while the SM's memory pipes sit idle. When K is short, as in Qwen3-30B-A3B's down GEMM
# (K = I = 768: 12 steps of 64), start and end are a large part of each program's time.
#
# The table counts tiles and waves at T = 4096 with the bound on padded rows (`max_num_tokens_padded`).

# %%
# NBVAL_CHECK_OUTPUT
from moe_lab.align import max_num_tokens_padded

SMS, BM, BN, BK = 132, 128, 256, 64
print(f"{'model':<16} {'GEMM':<5} {'M-blocks':>8} {'N-tiles':>7} {'tiles':>6} {'waves':>6} {'K steps':>7}")
for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
    p = moe_lab.get_preset(name)
    blocks = max_num_tokens_padded(4096 * p.top_k, p.num_experts, BM) // BM
    for gemm, n, k in (("up", 2 * p.intermediate_size, p.hidden_size), ("down", p.hidden_size, p.intermediate_size)):
        tiles = blocks * triton.cdiv(n, BN)
        print(f"{name:<16} {gemm:<5} {blocks:>8} {triton.cdiv(n, BN):>7} {tiles:>6} {tiles / SMS:>6.1f} "
              f"{triton.cdiv(k, BK):>7}")

# %% [markdown]
# ## 2. A persistent grid
#
# A persistent kernel launches one program per SM, and each program walks tiles: program p takes tiles
# p, p + P, p + 2P, ... (P programs). Triton's `tl.range(..., flatten=True)` then turns the tile loop and
# the K loop into one loop, and software-pipelines it across tile boundaries: the loads of the next tile
# are in flight while this tile's epilogue runs (Triton's persistent-matmul tutorial,
# `python/tutorials/09-persistent-matmul.py`).
#
# A small routing, drawn: each box is one tile, in the column of the program that computes it, coloured
# by its expert (GROUP_SIZE_M = 1 here and in the exercise: tiles in row-major order).

# %%
# NBVAL_CHECK_OUTPUT
T, E, TOP_K, H, I = 20, 6, 2, 64, 48
BLOCK_SIZE_M = 16
gen = torch.Generator().manual_seed(0)
topk_ids = torch.rand(T, E, generator=gen).topk(TOP_K, dim=1).indices.to(torch.int32).to(device)
routing = moe_lab.moe_align(topk_ids, E, BLOCK_SIZE_M)
used_blocks = routing.num_tokens_post_padded.item() // BLOCK_SIZE_M
print("tokens per expert:", routing.counts.tolist())
print("M-blocks in use:  ", used_blocks, "of a bound of", routing.max_num_m_blocks)
print("expert_ids:       ", routing.expert_ids.tolist())

# %%
schedule_viz.plot_tile_schedule(routing.expert_ids.tolist(), used_blocks, num_pid_n=2, num_programs=4)

# %% [markdown]
# ## 3. The tile count lives on the device
#
# How many M-blocks are in use depends on the routing, which only the GPU knows: `num_tokens_post_padded`
# is a one-element tensor that `moe_align` writes. Reading it on the host would stop the CPU until the GPU
# got there (and CUDA-graph capture forbids it). So the persistent kernel reads it itself:
#
# ```python
# num_used_blocks = tl.load(num_tokens_post_padded_ptr) // BLOCK_SIZE_M
# for tile in tl.range(tl.program_id(0), num_used_blocks * num_pid_n, tl.num_programs(0), flatten=True):
#     pid_m, pid_n = _tile_coords(tile, num_used_blocks, num_pid_n, GROUP_SIZE_M)
#     ...  # the same tile as the per-tile kernel: K loop, then epilogue
# ```
#
# The grid is `min(SMs, bound on tiles)`, known on the host from shapes alone. The per-tile kernel's grid
# is the bound on tiles: its programs past the rows in use return at once.

# %% [markdown]
# ### Exercise: walk the tiles
#
# Write `persistent_copy_kernel`: it copies the rows in use of `x [MAX_ROWS, N]` into `out`, tile by tile,
# with fewer programs than tiles.
#
# - `num_rows = tl.load(num_rows_ptr)`: the rows in use (a multiple of `BLOCK_M`), on the device.
# - Tiles are `BLOCK_M x BLOCK_N`; there are `(num_rows // BLOCK_M) * tl.cdiv(N, BLOCK_N)` of them. Tile t is
#   M-block `t // tl.cdiv(N, BLOCK_N)` and N-block `t % tl.cdiv(N, BLOCK_N)`.
# - Program p takes tiles p, p + P, ...: `for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0))`.
# - `x` and `out` are contiguous: element (r, c) is at `r * N + c`. `N` is not a multiple of `BLOCK_N`: mask.
# - Rows past `num_rows` must stay as they are.
# - Loop with `tl.range`: `tl.static_range` needs constant bounds (the interpreter runs it anyway, a GPU
#   will not compile it).
#
# The checker runs 3 programs over 15 tiles (80 of 128 rows in use, N = 40, blocks of 16), then 4 programs
# over 15 tiles of other sizes, with `out` poisoned (NaN). From the record of every store it tells which
# tiles went missing or were stored twice, and which store covers no whole tile.

# %%
@triton.jit
def persistent_copy_kernel(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # TODO: read num_rows from num_rows_ptr, and loop over this program's tiles
    tile = tl.program_id(0)
    rows = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    # TODO: load the x tile at rows[:, None] * N + cols[None, :] (masked: cols < N) and store it into out


# %%
exercises.check_persistent_copy(persistent_copy_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def persistent_copy_kernel_solution(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = (tl.load(num_rows_ptr) // BLOCK_M) * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        rows = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs = rows[:, None] * N + cols[None, :]
        mask = cols[None, :] < N
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


exercises.check_persistent_copy(persistent_copy_kernel_solution, strict=True)

# %% [markdown]
# ## 4. moe-lab's persistent grouped GEMM
#
# `GemmConfig(persistent=True)` launches `grouped_matmul_persistent_kernel`. Each tile runs the same code
# as in the per-tile kernel, so each row's K reduction runs in the same order: the outputs are equal bit
# for bit, and a token's output still does not depend on its batch. (Tiles run whole in it: the tail
# tiles of notebook 05 would put branches of different tile sizes in the loop, which Triton cannot
# flatten.) Its grid is one program per SM (132 on an H200) or one per tile where there are fewer tiles;
# under the interpreter, 3 programs.

# %%
# NBVAL_CHECK_OUTPUT
dtype = torch.float16  # as in notebook 05 (the interpreter's bfloat16 dot is emulated)
hidden_states = (torch.randn(T, H, generator=gen)).to(dtype).to(device)
w1 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).to(dtype).to(device)
w2 = (torch.randn(E, H, I, generator=gen) / I ** 0.5).to(dtype).to(device)
topk_weights = torch.rand(T, TOP_K, generator=gen).to(device)
per_tile = GemmConfig(BLOCK_SIZE_M, 32, 32, 1, 4, 2, tail_tiles=False)
persistent = dataclasses.replace(per_tile, persistent=True)
out_tile, plan_tile = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, config=per_tile,
                                        return_info=True)
out_pers, plan_pers = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, config=persistent,
                                        return_info=True)
workbook.check_equal("persistent layer vs per-tile layer", out_pers, out_tile)
_ = workbook.check("persistent layer vs fused_moe_reference", out_pers,
                   moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids))

# %%
print(f"per tile:   up grid {plan_tile.up_plan.grid:>3}, down grid {plan_tile.down_plan.grid:>3}")
print(f"persistent: up grid {plan_pers.up_plan.grid:>3}, down grid {plan_pers.down_plan.grid:>3}")

# %% [markdown]
# Could the epilogue's stores overlap too? A tile of sorted rows (the up GEMM's output) could leave through
# a tensor descriptor, as notebook 05's kernel stores it: one bulk copy from shared memory that runs on
# while the next tile's loads start. moe-lab's persistent kernel once did that, bitwise the same output, and
# it was no faster: on an H200 the persistent up GEMM took 0.99 to 1.04x its time with pointer stores, and a
# program of the per-tile kernel, which must wait for its copy before it ends, up to 1.26x, so the code was
# removed (docs/experiments.md, "TMA store of the output tile"). Measure before you believe an overlap.

# %% [markdown]
# ## 5. SiLU-and-mul in the epilogue
#
# Notebook 06 checked the fused up GEMM in passing; here is how it works. The up GEMM computes `gate_up = x @ w1[e].T` with `w1 = [gate; up]` (2I rows), and SiLU-and-mul makes
# `act = silu(gate) * up` from it. As two kernels, the `[rows, 2I]` intermediate goes to memory and back,
# rounded to bf16 on the way. Fused, each program reads BLOCK_SIZE_N/2 gate rows and the matching
# BLOCK_SIZE_N/2 up rows, I rows apart, as **one** tile: a descriptor over `w1` viewed as `[E, 2, I, H]`
# with block shape `[1, 2, BLOCK_SIZE_N/2, BLOCK_SIZE_K]`. The K loop is the unfused GEMM's, one dot as wide;
# the epilogue splits the float32 accumulator into its two halves and writes `silu(gate) * up`:
#
# ```python
# gate, up = tl.split(acc.reshape(TILE_M, 2, BLOCK_SIZE_N // 2).permute(0, 2, 1))
# acc = gate * tl.sigmoid(gate) * up
# ```
#
# The red rows are what program `pid_n = 1` reads (I = 48, BLOCK_SIZE_N = 32):

# %%
schedule_viz.plot_swiglu_rows(inter=I, block_size_n=32, pid_n=1)

# %% [markdown]
# The float32 accumulator also saves float16 from itself: a gate of 1e5 times an up of 1e-3 is 100, but
# 1e5 is past float16's largest value (65504). Unfused, the intermediate holds inf (and a gate of -1e5
# gives -inf * 0 = NaN); fused, the right answer comes out. Here with I = 16 and w2 = 0.01, so the layer
# gives about 16 for the first token (16.02 in float16) and 0 for the second:

# %%
# NBVAL_CHECK_OUTPUT
import warnings

x = torch.zeros(2, 32)
x[:, 0], x[:, 1] = 316.25, 1e-3          # 316.25^2 = 100014: the gate pre-activation
x[1, 0] = -316.25
w1_big = torch.zeros(2, 32, 32)
w1_big[:, :16, 0] = 316.25               # gate rows read x[:, 0]
w1_big[:, 16:, 1] = 1.0                  # up rows read x[:, 1]
w2_small = torch.full((2, 32, 16), 0.01)
args = [t.to(device) for t in (x.half(), w1_big.half(), w2_small.half(), torch.ones(2, 1),
                               torch.tensor([[0], [1]], dtype=torch.int32))]
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's float16 overflow, unfused
    for fuse in (True, False):
        out = moe_lab.fused_moe(*args, config=GemmConfig(16, 32, 32, 1, 4, 1, fuse_swiglu=fuse))
        print(f"fuse_swiglu={fuse!s:<5}: token 0 -> {out[0, 0].item():g}, token 1 -> {out[1, 0].item():g}")

# %% [markdown]
# ## 6. What it buys, measured
#
# On a GPU the next cell times both GEMMs of Qwen3-30B-A3B at T = 4096, per tile and persistent, with the
# shipped config for that size. Under the interpreter it refuses: a CPU time says nothing about a GPU.

# %%
# NBVAL_IGNORE_OUTPUT
if workbook.timing_allowed("the persistent vs per-tile timing"):
    from moe_lab.tools.timing import graph_ms

    preset = moe_lab.get_preset("qwen3-30b-a3b")
    hs, g1, g2, (tw, ti) = preset.build(4096, dtype=torch.bfloat16, device="cuda")
    cfg = moe_lab.default_config(4096, preset.num_experts, preset.top_k, preset.hidden_size,
                                 preset.intermediate_size)
    r = moe_lab.moe_align(ti, preset.num_experts, cfg.block_size_m)
    act = moe_lab.grouped_matmul(hs, g1, r, cfg.up, gather_a=True, swiglu=True)
    out_k = torch.empty(4096 * preset.top_k, preset.hidden_size, dtype=torch.bfloat16, device="cuda")
    for persistent in (False, True):
        up = dataclasses.replace(cfg.up, persistent=persistent)
        down = dataclasses.replace(cfg.down, persistent=persistent)
        up_ms = graph_ms(lambda: moe_lab.grouped_matmul(hs, g1, r, up, gather_a=True, swiglu=True, out=act))
        down_ms = graph_ms(lambda: moe_lab.grouped_matmul(act, g2, r, down, gather_a=False, scatter=True,
                                                          topk_weights=tw, out=out_k))
        print(f"persistent={persistent!s:<5}: up (with SwiGLU) {up_ms:.3f} ms, down {down_ms:.3f} ms "
              f"(CUDA-graph median, L2 flushed, {torch.cuda.get_device_name()})")

# %% [markdown]
# The committed H200 measurement (docs/experiments.md, "Persistent grouped GEMM"; **committed
# data, not measured here**): per-tile time over persistent time for each GEMM, same config. Above 1 the
# persistent kernel is faster.

# %%
experiment = schedule_viz.load_persistent_experiment()
schedule_viz.plot_persistent_speedup(experiment)

# %% [markdown]
# How to read it: at T = 512 the per-tile kernel wins everywhere, by 4 to 23 %: there are few tiles per SM
# to overlap, and the per-tile kernel can run tail tiles that skip padding rows. From T = 4096 on, Qwen3
# gains 5 to 8 % on both GEMMs (short K, many tiles) and DeepSeek 4 to 7 % on all but its T = 4096 down GEMM
# (3 % slower); Mixtral's long K leaves little to overlap (within 3 % either way). So it is a switch
# (`GemmConfig.persistent`) that `moe-lab tune` sets per shape and token count.

# %% [markdown]
# ## 7. Where the rest of the time goes: padding
#
# With the persistent kernel, Qwen3-30B-A3B's GEMM pair runs at about 550 to 580 TFLOP/s at T = 16384, of
# an H200's 700 or so for one large bf16 matmul. Is the kernel slow, or the schedule (how rows are grouped
# into blocks)? `moe_align` pads each expert's rows up to a whole number of M-blocks (BLOCK_SIZE_M = 128
# rows each, the shipped value at prefill): an expert with 300 rows gets 3 blocks, 384 rows, 84 of them
# padding. A padding row costs the tensor cores as much as a real one. Count them for the benchmark's
# routing (each of T tokens picks k distinct experts of E, uniformly at random) at T = 4096. This cell draws
# that routing with the CPU's random generator; the GPU experiment below draws it on the GPU, so its
# counts differ a little (there: 313, 376 and 67 M-blocks, against 256, 256 and 64 without padding):

# %%
# NBVAL_CHECK_OUTPUT
from moe_lab.routing import uniform_routing

for name in ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"):
    p = moe_lab.get_preset(name)
    _, ids = uniform_routing(4096, p.num_experts, p.top_k, device="cpu", seed=1)
    counts = torch.bincount(ids.flatten().long(), minlength=p.num_experts)
    blocks = int(((counts + 127) // 128).sum())
    exact = 4096 * p.top_k // 128
    print(f"{name:<15} {4096 * p.top_k / p.num_experts:5.0f} rows per expert (std {counts.float().std():4.1f}): "
          f"{blocks} M-blocks of 128 rows, {exact} without padding ({blocks / exact - 1:+.0%} tensor-core work)")

# %% [markdown]
# An experiment timed the same GEMMs three ways on an H200 (docs/experiments.md; **committed data,
# not measured here**): on that routing; on a routing that gives every expert exactly T*k/E rows, a
# multiple of 128, so no M-block holds padding; and cuBLAS's batched matmul (`torch.bmm`, one
# [T*k/E, K] x [K, N] product per expert) on the padding-free problem: what a vendor library does with the
# same per-expert shapes. moe-lab runs its shipped config: the persistent kernel at 8 of the 12 points, the
# per-tile kernel at the other 4.

# %%
schedule_viz.plot_prefill_anatomy(schedule_viz.load_prefill_anatomy())

# %% [markdown]
# How to read it: without padding (green) moe-lab's GEMMs run at 0.95 to 1.06x cuBLAS's speed (grey),
# except Qwen3's down GEMM, whose K = 768 leaves each tile's prologue and epilogue a large share (0.88 to
# 0.94x). The gap to the routed case (blue) is padding: up to 22 % more time (Qwen3's up GEMM at T = 4096,
# DeepSeek-V3 16 to 18 % at both T), where the GPU's routing adds 2 to 47 % more M-blocks. Time grows less
# than the block count (DeepSeek-V3 at T = 4096: 47 % more blocks, 17 % more time), and Qwen3's down GEMM
# at T = 16384 is even 4 % faster routed than padding-free. Tail tiles (a mostly empty last block run as a
# smaller tile, `GemmConfig.tail_tiles`) win back a little in the per-tile kernel's down GEMM (3 to 8 % at
# T = 512, docs/experiments.md); moving those blocks to a launch of
# their own ran at 0.81 to 1.00x the speed (up to 24 % more time), because their expert's weights then come
# from HBM (the GPU's main memory) a second time instead of from the L2 cache
# (docs/experiments.md, "Tail blocks in a launch of their own"). So the next gains at prefill are in the
# schedule: fewer padding rows, while each expert's last block stays in the same launch as its other blocks.

# %% [markdown]
# ## 8. Folded tails: the block before computes them
#
# An expert with 150 rows takes two M-blocks of 128: one full, one with 22 rows and 106 of padding. A tail
# tile (a quarter tile of 32 rows) skips most of the padding but still streams the expert's whole weight
# tile through shared memory a second time. `GemmConfig.fold_tail_rows = 64` does better for such
# blocks: the program of the full block sees that the next block is the same expert's and holds at most 64
# valid rows (its row 64 is padding), and computes those rows too, in a second dot of 64 rows on the same
# weight tile it already loaded; the program of the tail block sees the same two facts from its side and
# ends at once. Each row's K reduction runs in the same order as before, so the output is bitwise the
# same (a `wgmma` of 64 rows sums a row as one of 128 does). How many blocks fold at T = 4096, on the same
# CPU routing as above:

# %%
# NBVAL_CHECK_OUTPUT
from moe_lab.workbook.viz.align import folded_tails

for name in ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"):
    p = moe_lab.get_preset(name)
    _, ids = uniform_routing(4096, p.num_experts, p.top_k, device="cpu", seed=1)
    blocks, folded = folded_tails(torch.bincount(ids.flatten().long(), minlength=p.num_experts), 128, 64)
    print(f"{name:<15} {blocks} M-blocks of 128 rows; {folded} are small tails that fold into the block before")

# %% [markdown]
# The same schedule, folded and not, on a small problem here: the outputs match bit for bit, and the
# launch plan says how many rows folded (`fold_m`; the persistent kernel and slot order never fold).

# %%
# NBVAL_CHECK_OUTPUT
sizes = [32 + 10, 64 + 16, 32 + 17, 5]  # last blocks of 10, 16, 17 and 5 valid rows (BLOCK_SIZE_M = 32)
fold_ids = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate(sizes)])
fold_ids = fold_ids[torch.randperm(fold_ids.numel(), generator=torch.Generator().manual_seed(0))]
fold_routing = moe_lab.moe_align(fold_ids.reshape(-1, 1).to(device), len(sizes), 32)
a_fold = torch.randn(fold_ids.numel(), 64, device=device)
w_fold = torch.randn(len(sizes), 32, 64, device=device)
outs = {}
for rows in (0, 16):
    cfg = GemmConfig(32, 32, 32, 1, 4, 2, fold_tail_rows=rows)
    outs[rows], plan = moe_lab.grouped_matmul(a_fold, w_fold, fold_routing, cfg, gather_a=True, return_plan=True)
    print(f"fold_tail_rows={rows:2d}: plan.fold_m = {plan.fold_m}")
valid = fold_routing.sorted_token_ids < fold_routing.num_slots
print("folded blocks:", folded_tails(fold_routing.counts.cpu(), 32, 16)[1], "of",
      folded_tails(fold_routing.counts.cpu(), 32, 16)[0], "| bitwise the same:",
      torch.equal(outs[0][valid], outs[16][valid]))

# %% [markdown]
# On an H200 (**committed data**, docs/experiments.md, "Folded tails"), each GEMM as
# the layer runs it, against the shipped config of the day (the persistent kernel at most of these points):

# %%
schedule_viz.plot_fold_tails(schedule_viz.load_fold_tails())

# %% [markdown]
# How to read it: at DeepSeek-V3 T = 4096 (128 rows per expert, so a third of the blocks are small tails)
# 64 folded rows make the up GEMM 0.93x and the down GEMM 0.89x the shipped time, and at Mixtral T = 512
# the up GEMM 0.92x (its down GEMM's bar, 1.38, is a 4-warp 128 x 128 tile, whose registers cannot hold
# 64 more rows of float32 sums; the tuner's 8-warp tiles with folds are faster there). Where tails are few (T = 16384) or K is short (Qwen3), the persistent kernel stays
# ahead: folding runs in the per-tile kernel, and a loop whose tiles differ in size cannot be flattened
# into the persistent kernel's pipeline. `moe-lab tune` weighs both per shape; the shipped table folds
# where it won (DeepSeek-V3 at T = 4096: 7.47 -> 6.56 ms for the pair in the benchmark).
#
# ## Summary
#
# - A persistent grid launches one program per SM; each walks tiles p, p + P, ..., and Triton pipelines
#   the flattened loop, so a tile's epilogue overlaps the next tile's loads.
# - The number of tiles in use is read on the device, from `num_tokens_post_padded`: no host sync, and the
#   grid depends on shapes only.
# - The SwiGLU epilogue reads gate and up rows as one tile and writes `silu(gate) * up` from the float32
#   accumulator: no `[rows, 2I]` round trip, and no float16 overflow in between.
# - The persistent kernel keeps every row's K reduction in the same order: its results are bitwise the
#   per-tile kernel's, and a token's output still does not depend on its batch. The fused epilogue is not
#   bitwise the two-kernel path (it skips a rounding), so the layer uses it at every T, never by turns.
# - At prefill the kernels run at 0.95 to 1.06x cuBLAS's speed on padding-free shapes (Qwen3's short-K down
#   GEMM 0.88 to 0.94x); what is left is mostly padding, the rows that fill each expert's last M-block.
# - Folded tails (`GemmConfig.fold_tail_rows`) compute an expert's small last block in the program of the
#   block before, on the weight tile it already holds: bitwise the same, and 7 to 11 % faster at
#   DeepSeek-V3 T = 4096, where a third of the blocks are such tails (with 8-warp tiles; 4-warp ones spill).
