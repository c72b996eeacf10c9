# %% [markdown]
# # 03 · The grouped matmul, with pointer loads
#
# With the schedule from 02, one launch can compute every expert's matmul: each program takes one
# (M-block, N-block) tile, reads its expert from `expert_ids`, gathers its token rows through
# `sorted_token_ids`, and multiplies by that expert's weights.
#
# **Goals**
# 1. Write a tiled matmul for one expert and check it against torch.
# 2. Extend it to all experts in one launch (the block schedule and gathered rows; the gather of the
#    A tile is yours to write, graded by a checker), and check it against `moe_lab.grouped_matmul` and torch.
# 3. See which program computes which tile, and how GROUP_SIZE_M orders them.

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
import moe_lab  # first: picks GPU or Triton's interpreter before any kernel is defined

import torch
import triton
import triton.language as tl

from moe_lab import workbook
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import tiles as viz_tiles
from moe_lab.workbook.viz.routing import skewed_router_logits

# Settings. None = decided by the machine: real shapes on a GPU, scaled down (H and I / 64) on the CPU.
MODEL = "mixtral-8x7b"
FULL_SIZE = None
NUM_TOKENS = None    # T; default 1024 on a GPU, 16 on the CPU

device = moe_lab.runtime.default_device()
full = workbook.pick(True, False, FULL_SIZE)
preset = moe_lab.get_preset(MODEL) if full else moe_lab.get_preset(MODEL).scaled(64)
T = workbook.pick(1024, 16, NUM_TOKENS)
E, k, H, I = preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size
print(f"{preset.name}: E={E}, top_k={k}, H={H}, I={I}, T={T}; the up projection is N = 2I = {2 * I}, K = H = {H}")


# %% [markdown]
# ## 1. A tiled matmul for one expert
#
# `C = A @ W.T` with A [M, K] (token rows) and W [N, K] (one expert's `w1[e]`, rows = output features).
# Program (pid_m, pid_n) owns the BLOCK_SIZE_M × BLOCK_SIZE_N tile of C; it walks K in steps of
# BLOCK_SIZE_K, loading an A tile and a W tile each step and accumulating `tl.dot` in float32. Masks
# handle edges that are not multiples of the block sizes. We use float32 data: under the interpreter
# `tl.dot` on bfloat16 tiles is wrong.

# %%
@triton.jit
def matmul_kernel(a_ptr, w_ptr, c_ptr, M, N, K, stride_am, stride_wn, stride_cm,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :],
                    mask=(offs_m[:, None] < M) & ((k0 + offs_k)[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None],   # W.T tile [K, N]
                    mask=(offs_n[None, :] < N) & ((k0 + offs_k)[:, None] < K), other=0.0)
        acc = tl.dot(a, w, acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def my_matmul(a, w, block_m=16, block_n=64, block_k=32):
    """a [M, K], w [N, K] float32, contiguous -> a @ w.T [M, N]."""
    M, K = a.shape
    N = w.shape[0]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    matmul_kernel[grid](a, w, c, M, N, K, a.stride(0), w.stride(0), c.stride(0),
                        BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k)
    return c


# %%
gen = torch.Generator().manual_seed(0)
hidden_states = torch.randn(T, H, generator=gen).to(device)
w1 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).to(device)
a_rows = hidden_states[:10]     # 10 rows: not a multiple of BLOCK_SIZE_M, so the masks matter
err = workbook.check("my_matmul (expert 3) vs torch", my_matmul(a_rows, w1[3]), a_rows @ w1[3].T,
                      tol=workbook.fp32_dot_tol())

# %% [markdown]
# ## 2. All experts in one launch
#
# Routing and alignment from 01 and 02. Each M-block of the schedule holds rows of one expert,
# so a program needs three loads before the matmul loop:
# - `expert = expert_ids[pid_m]` (and returns at once if it is -1: a block past the end);
# - the block's slot ids `sorted_token_ids[pid_m*BLOCK_SIZE_M : ...]`, and from them the token rows
#   `slot // top_k` to **gather** from `hidden_states` (padding slots, `>= T*k`, are masked to zero);
# - the weight pointer moved to `w1[expert]`.
#
# The output stays in the padded, expert-sorted order [max_num_tokens_padded, N]: row r of the output
# belongs to slot `sorted_token_ids[r]`. That is the layout the next GEMM (the down projection) reads.

# %%
BLOCK_SIZE_M = 16
topk_weights, topk_ids = moe_lab.topk_routing(skewed_router_logits(T, E, seed=1).to(device), k)
routing = moe_lab.moe_align(topk_ids, E, BLOCK_SIZE_M)
print(f"T*k = {T * k} slots -> {routing.max_num_m_blocks} M-blocks allocated, "
      f"{int((routing.expert_ids >= 0).sum())} in use; expert_ids = {routing.expert_ids.tolist()}")


# %% [markdown]
# ## Exercise: the gathered A tile
#
# Before the whole kernel, its new part alone: the loads that gather an M-block's token rows. Write
# `gather_rows_kernel`, where program `m` copies the A tiles that the grouped GEMM's program `(m, n)`
# feeds to `tl.dot`, into `out` instead of multiplying them:
#
# - `sorted_token_ids` (int32, from `moe_align`): the rows of M-block `m` are
#   `slots = sorted_token_ids[m*BLOCK_SIZE_M : (m+1)*BLOCK_SIZE_M]`, [BLOCK_SIZE_M]. A real row holds a
#   slot `t*TOP_K + j` (token t's j-th expert); a padding row holds the sentinel `num_slots = T*TOP_K`.
# - `A` [T, K]: one row per token (`hidden_states` in the up projection). Element (t, c) lives at
#   `a_ptr + t*stride_am + c*stride_ak`. Do not assume `stride_am == K`: the checker's A is a [T, K + 8]
#   buffer sliced to [:, :K] (stride_am = K + 8), as a view of a bigger tensor often is.
# - `out` [num_tokens_post_padded, K], contiguous: row `m*BLOCK_SIZE_M + i` gets row
#   `slots[i] // TOP_K` of A, or zeros on a padding row (the GEMM then multiplies zeros).
#
# The stub walks K in steps of BLOCK_SIZE_K and loads and stores one [BLOCK_SIZE_M, BLOCK_SIZE_K] tile
# per step; fill in the four blanks (their placeholders mask every load and store off, so the stub runs
# and stores nothing):
# 1. `tokens`: the row of A each slot reads, [BLOCK_SIZE_M];
# 2. `row_ok`: True on real slots, False on padding rows;
# 3. `k_ok`: True on the columns `k0 + offs_k` that exist (the checker's K = 24 is not a multiple of
#    BLOCK_SIZE_K = 16, so the last step is half empty);
# 4. `a_ptrs`: the [BLOCK_SIZE_M, BLOCK_SIZE_K] tile of pointers, row `tokens` and column `k0 + offs_k`
#    (a column vector of row offsets plus a row vector of column offsets: `[:, None]` and `[None, :]`).
#
# **Where int64 matters.** `sorted_token_ids` is int32, and Triton passes an integer argument below
# 2^31 as int32, so `tokens * stride_am` is computed in int32. It wraps around once `T * stride_am`
# passes 2^31 - 1, for example 262144 tokens of H = 8192 (a long prefill): the offset turns negative
# and the load reads far outside A (an illegal memory access on a GPU, or rows of the wrong tokens).
# Cast the row index, `.to(tl.int64)`, and the product is int64; the scaffold does the same for
# out's rows. Only these token offsets need it (and, in the GEMM, the expert offset of the weights):
# making every offset int64 costs registers and time. The checker tries it without a big tensor: once
# your kernel is right, it passes `stride_am = 2^30` over the same small A and sees whether an offset wraps.

# %%
@triton.jit
def gather_rows_kernel(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                       TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)   # this block's rows of out
    slots = tl.load(sorted_token_ids_ptr + offs_m)                          # their slots (or num_slots)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    tokens = slots * 0       # TODO 1: the row of A each slot reads (as int64)   [placeholder: row 0]
    row_ok = slots < 0       # TODO 2: real slots, not padding                   [placeholder: all False]
    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = offs_k < 0    # TODO 3: the columns k0 + offs_k that exist        [placeholder: all False]
        a_ptrs = a_ptr + tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_K), dtype=tl.int64)  # TODO 4: the A tile's pointers
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + (k0 + offs_k)[None, :], a,
                 mask=k_ok[None, :])


# %% [markdown]
# The checker launches your kernel with one program per M-block in use on a small routing (T = 6
# tokens, top_k = 6 of 7 experts, BLOCK_SIZE_M = 16) on guarded buffers, compares `out` with the rows
# gathered in PyTorch, and names what went wrong.

# %%
exercises.check_gather_rows(gather_rows_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def gather_rows_kernel_solution(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak,
                                stride_om, TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                                BLOCK_SIZE_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    tokens = (slots // TOP_K).to(tl.int64)   # slot t*TOP_K + j reads token t; int64: T*stride_am may pass 2^31
    row_ok = slots < num_slots               # padding rows hold the sentinel num_slots
    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = (k0 + offs_k) < K
        a_ptrs = a_ptr + tokens[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + (k0 + offs_k)[None, :], a,
                 mask=k_ok[None, :])


exercises.check_gather_rows(gather_rows_kernel_solution, strict=True)

# %% [markdown]
# The grouped matmul kernel below loads its A tile with these same lines, then adds the expert's
# weight tile and `tl.dot`.

# %%
@triton.jit
def my_grouped_matmul_kernel(a_ptr, w_ptr, c_ptr, sorted_token_ids_ptr, expert_ids_ptr, N, K, num_slots,
                             stride_am, stride_we, stride_wn, stride_cm, TOP_K: tl.constexpr,
                             BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:                       # a block past num_tokens_post_padded: nothing to do
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    row_ok = slots < num_slots           # padding rows hold the sentinel T*k
    tokens = (slots // TOP_K).to(tl.int64)   # gather: slot t*k+j reads token t (int64: see the exercise)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(a_ptr + tokens[:, None] * stride_am + (k0 + offs_k)[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None],
                    mask=(offs_n[None, :] < N) & k_ok[:, None], other=0.0)
        acc = tl.dot(a, w, acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask=offs_n[None, :] < N)


def my_grouped_matmul(a, w, routing, block_n=64, block_k=32):
    """a [T, K] token rows, w [E, N, K] float32 -> [max_num_tokens_padded, N] in expert-sorted order."""
    num_experts, N, K = w.shape
    c = torch.zeros(routing.max_num_tokens_padded, N, dtype=a.dtype, device=a.device)
    grid = (routing.max_num_m_blocks, triton.cdiv(N, block_n))
    my_grouped_matmul_kernel[grid](a, w, c, routing.sorted_token_ids, routing.expert_ids, N, K, routing.num_slots,
                                   a.stride(0), w.stride(0), w.stride(1), c.stride(0), TOP_K=routing.top_k,
                                   BLOCK_SIZE_M=routing.block_size_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k)
    return c


# %%
gate_up_mine = my_grouped_matmul(hidden_states, w1, routing)

# torch, row by row: output row r = hidden_states[slot // k] @ w1[expert of r's block].T
used = int(routing.num_tokens_post_padded.item())
slots = routing.sorted_token_ids[:used].long()
real = slots < routing.num_slots
rows = torch.arange(used, device=device)[real]
experts = routing.expert_ids[rows // BLOCK_SIZE_M].long()
want = workbook.expert_rows_matmul(hidden_states[slots[real] // k], w1, experts)
err = workbook.check("my_grouped_matmul vs torch (real rows)", gate_up_mine[rows], want, tol=workbook.fp32_dot_tol())
workbook.check_equal("padding rows are zero", (gate_up_mine[:used][~real] != 0).sum(), torch.tensor(0))

# %% [markdown]
# Now the package's version. `moe_lab.grouped_matmul` takes the same schedule and a `GemmConfig`;
# `gather_a=True` means "rows of `a` are tokens, gather them through `sorted_token_ids`". Blocks
# past the end are not written, so compare only the rows in use.

# %%
config = moe_lab.GemmConfig(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=4)
gate_up_pkg = moe_lab.grouped_matmul(hidden_states, w1, routing, config, gather_a=True)
err = workbook.check("my_grouped_matmul vs moe_lab.grouped_matmul", gate_up_mine[:used], gate_up_pkg[:used],
                     tol=workbook.fp32_dot_tol())
print("load path used by moe_lab:", moe_lab.select_load_path(hidden_states, w1, config, gather_a=True).reason)

# %% [markdown]
# The package's kernel has more in it: the TMA load path for the weights (notebooks 04–05), an optional
# routed-weight multiply and a scatter of rows back to (token, k) slots for the down projection (06),
# and **GROUP_SIZE_M ordering** of the tiles, next.

# %% [markdown]
# ## 3. Which program computes which tile
#
# The package launches a 1-D grid and turns `pid` into (pid_m, pid_n). With GROUP_SIZE_M = 1,
# consecutive programs sweep along N for one M-block, then the next M-block: every program of a row
# needs a different weight tile, and the same weight tile is needed again only a whole row later.
# With GROUP_SIZE_M = G, consecutive programs walk **down** a group of G M-blocks in one N column
# first: programs running at the same time share weight tiles, which then come from L2 instead of
# HBM. Within one expert's run of blocks, that sharing is real — they use the very same `w1[e]` tile.

# %%
print("GROUP_SIZE_M = 1:\n", viz_tiles.tile_order(4, 3, 1))
print("GROUP_SIZE_M = 2:\n", viz_tiles.tile_order(4, 3, 2))

# %% [markdown]
# The tile map of the up projection above: each cell is a (M-block, N-block) tile, colored and numbered
# by the program that computes it; the strip on the left gives each M-block's expert; grey blocks
# (expert -1) are past the end and their programs exit at once. Red lines separate groups.

# %%
viz_tiles.plot_tile_map(routing, n=2 * I, block_size_n=64, group_size_m=4)

# %%
print(viz_tiles.tile_report(routing, n=2 * I, k=H, block_size_n=64, block_size_k=32))

# %% [markdown]
# ### Widget: block sizes and GROUP_SIZE_M
#
# BLOCK_SIZE_M changes the schedule (more padding, fewer M-blocks), BLOCK_SIZE_N the number of
# columns, BLOCK_SIZE_K the number of steps of each program's loop, GROUP_SIZE_M the order. The program
# count is printed above the picture. A static copy of the default state follows.

# %%
# NBVAL_IGNORE_OUTPUT
# The sliders' first values, and the static copy's below: one place for both.
TILES_WIDGET_STATE = dict(block_size_m=BLOCK_SIZE_M, block_size_n=64, block_size_k=32, group_size_m=4)
viz_tiles.tiles_explorer(topk_ids, E, n=2 * I, k=H, **TILES_WIDGET_STATE)

# %%
viz_tiles.tiles_snapshot(topk_ids, E, n=2 * I, k=H, **TILES_WIDGET_STATE)

# %% [markdown]
# ## Exercise: from `pid` to a tile
#
# Write `my_program_tile(pid, num_m_blocks, num_n_blocks, group_size_m)` returning `(pid_m, pid_n)`
# with GROUP_SIZE_M ordering: programs come in groups of `group_size_m * num_n_blocks`; group g covers
# M-blocks `g*group_size_m ...` (the last group may have fewer rows); inside a group, programs go down
# the rows first, then move one column right.

# %%
def my_program_tile(pid, num_m_blocks, num_n_blocks, group_size_m):
    # TODO: replace this row-major order with GROUP_SIZE_M ordering
    return pid // num_n_blocks, pid % num_n_blocks


# %%
def check_program_tile(fn, strict=False):
    """Compare fn with the kernel's mapping on a few grids; say what is wrong instead of raising."""
    problem = None
    for num_m, num_n, group in [(4, 3, 1), (4, 3, 2), (7, 5, 4), (9, 2, 8)]:
        for pid in range(num_m * num_n):
            got, want = tuple(fn(pid, num_m, num_n, group)), viz_tiles.program_tile(pid, num_m, num_n, group)
            if got != want:
                problem = (f"grid {num_m}x{num_n}, GROUP_SIZE_M={group}: pid {pid} gave {got}, expected {want}")
                if group == 1:
                    problem += " (with GROUP_SIZE_M = 1 the order is plain row-major)"
                elif want[0] >= (num_m // group) * group:
                    problem += " (the last group has fewer rows: use min(num_m_blocks - first_pid_m, G))"
                break
        if problem:
            break
    if problem is None:
        print("PASS my_program_tile: all pids of 4 grids map to the kernel's tiles")
    elif strict:
        raise AssertionError(f"FAIL my_program_tile: {problem}")
    else:
        print(f"NOT YET my_program_tile: {problem}")


check_program_tile(my_program_tile)


# %% jupyter={"source_hidden": true}
# Solution
def my_program_tile_solution(pid, num_m_blocks, num_n_blocks, group_size_m):
    per_group = group_size_m * num_n_blocks
    first_pid_m = (pid // per_group) * group_size_m
    rows = min(num_m_blocks - first_pid_m, group_size_m)
    return first_pid_m + (pid % per_group) % rows, (pid % per_group) // rows


check_program_tile(my_program_tile_solution, strict=True)

# %% [markdown]
# ## Summary
#
# - A tiled matmul: one program per BLOCK_SIZE_M × BLOCK_SIZE_N tile, a loop over K, `tl.dot` into a
#   float32 accumulator, masks at the edges.
# - The grouped matmul adds three loads: the block's expert, its slot ids, and the gathered token rows.
#   One launch then covers every expert; blocks past the end exit at once. Ours matched
#   `moe_lab.grouped_matmul` and torch.
# - The gathered A tile: row `slot // TOP_K` of A at `tokens * stride_am` (int64: T * stride_am can pass
#   2^31), padding rows (the sentinel `num_slots`) masked to zero, the last K block masked with `< K`.
# - GROUP_SIZE_M orders the tiles so that programs running together share weight tiles in L2.
# - Next, **04_tma_basics**: loading tiles through tensor descriptors instead of pointers.
