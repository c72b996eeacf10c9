# %% [markdown]
# # 05b · Capstone: the grouped GEMM, written whole
#
# Notebooks 03 to 05 had you write pieces of the grouped GEMM: the gathered A tile, a descriptor copy, the
# weight box of a block's expert. Here you write the whole kernel from a skeleton, for both projections of
# a MoE layer, and the checkers grade it as they graded the pieces.
#
# **Goals**
# 1. Map a program to its output tile in Triton's grouped order (`GROUP_SIZE_M`).
# 2. Find the block's expert, read its weights through a 3-D descriptor, and run the K loop.
# 3. Up projection: gather the token rows by pointer, with the masks that padding rows and the K tail need.
# 4. Down projection: read the sorted rows through a 2-D descriptor; multiply by the routed weight once and
#    scatter each row to its (token, k) slot in a masked epilogue.
# 5. On a GPU: see how close your kernel comes to `moe_lab.grouped_matmul` on the same inputs.

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

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401 - for your descriptor helpers

from moe_lab.workbook import exercises
from moe_lab.workbook.exercises import capstone

device = moe_lab.runtime.default_device()

# %% [markdown]
# ## 1. The two GEMMs, and what each program does
#
# Notebooks 03 to 05 built the grouped GEMM piece by piece: the gathered A tile (03), descriptors (04), the
# weight box of a block's expert (05). Here you write the whole kernel, twice:
#
# | | A (token rows) | W | epilogue | output |
# |---|---|---|---|---|
# | **up** `hidden_states @ w1[e].T` | gathered: row r is `a[sorted_token_ids[r] // TOP_K]`, **pointer** loads | 3-D **descriptor** | none | sorted layout `[max_num_tokens_padded, N]`, padding rows 0 |
# | **down** `act @ w2[e].T` | already in sorted order: one **descriptor** box per M-block | 3-D **descriptor** | × routed weight | scattered to row `sorted_token_ids[r]` of `[T·k, N]` |
#
# Why the up projection gathers by pointer (notebook 05, section 2): an M-block's rows are tokens scattered
# over `hidden_states`, and a TMA box is a rectangle of consecutive rows. Hopper has no TMA gather (it came
# with Blackwell's gather4), so those rows take pointer loads. The down projection's input was written by
# the up projection in the sorted, per-expert-padded order: M-block b's rows are consecutive, one box.
#
# One program per output tile, on a 1-D grid of `num_m_blocks * cdiv(N, BLOCK_SIZE_N)` programs:
#
# 1. **Program to tile.** `pid` → `(pid_m, pid_n)` in Triton's *grouped* order (tutorial 03): groups of
#    `GROUP_SIZE_M` M-blocks walk the N-blocks together, so programs running side by side share weight
#    tiles in the L2. The last group may be shorter: `group_size_m = min(num_m_blocks - first_pid_m,
#    GROUP_SIZE_M)`.
# 2. **Block and expert.** A block past `num_tokens_post_padded` holds no rows: return. Otherwise its
#    expert is `expert_ids[pid_m]`.
# 3. **The K loop.** `for k0 in range(0, K, BLOCK_SIZE_K)`: load the A tile and the W box
#    `[expert, n0, k0]` (reshaped to `[BLOCK_SIZE_N, BLOCK_SIZE_K]`) and `acc = tl.dot(a, w.T, acc)`.
#    K is not a multiple of BLOCK_SIZE_K in the check: a descriptor fills past K with zeros by itself, a
#    pointer load needs a mask (and `other=0.0`).
# 4. **The masked epilogue.** Columns past N are masked; in the down projection, each row is multiplied by
#    its slot's routed weight `topk_weights.flatten()[slot]` and stored at row `slot`; padding rows (slot =
#    the sentinel `num_slots = T·k`) store nothing.
#
# The grouped order on a small grid (5 M-blocks, 2 N-blocks, `GROUP_SIZE_M = 3`), the tile each program takes:

# %%
# NBVAL_CHECK_OUTPUT
num_m, num_n, group = 5, 2, 3
order = {moe_lab.plan.tile_of_program(pid, num_m, num_n, group): pid for pid in range(num_m * num_n)}
print("program of each tile (rows: pid_m, columns: pid_n)")
for pid_m in range(num_m):
    print(f"pid_m {pid_m}: " + "  ".join(f"{order[pid_m, pid_n]:2d}" for pid_n in range(num_n)))

# %% [markdown]
# ## 2. The check's problem
#
# Each checker runs your kernel on guarded buffers at two sizes. The first: float16, T = 7 tokens routed to
# k = 2 of E = 5 experts (expert 2 gets none, E is not a power of two), `BLOCK_SIZE_M = 16`,
# `BLOCK_SIZE_N = 32`, `BLOCK_SIZE_K = 16`, `GROUP_SIZE_M = 3`; up: K = 56, N = 48; down: K = 24, N = 56.
# Neither K is a multiple of BLOCK_SIZE_K, nor N of BLOCK_SIZE_N. The schedule `moe_align` makes for it:

# %%
# NBVAL_CHECK_OUTPUT
problem = capstone._inputs(capstone.CASES[capstone.UP][0], capstone.UP)
routing = problem.routing
print("tokens per expert (counts):   ", routing.counts.tolist())
print("num_tokens_post_padded:       ", routing.num_tokens_post_padded.item())
print("expert_ids (one per M-block): ", routing.expert_ids.tolist())
print("num_m_blocks:                 ", routing.max_num_m_blocks)

# %% [markdown]
# ### Exercise 1: the up projection
#
# Write `weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)`, the host descriptor over `w [E, N, K]` (one box = one
# expert's tile), and `capstone_up_kernel`. Its A rows are gathered: `slots = sorted_token_ids[offs_m]`,
# `row_ok = slots < num_slots`, `tokens = (slots // TOP_K).to(tl.int64)` (int64: `tokens * stride_am` passes
# 2^31 at real sizes), and the tile `a_ptr + tokens[:, None] * stride_am + (k0 + offs_k)[None, :]` loaded
# under the row and K masks with `other=0.0`. Store every row of the block at `out_ptr + offs_m[:, None] *
# stride_om + offs_n[None, :]` (padding rows hold zeros), masking the columns past N.

# %%
def weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    """The host descriptor the kernels read w [E, N, K] through: one box = one expert's tile."""
    return None  # TODO: TensorDescriptor.from_tensor(w, block_shape)


@triton.jit
def capstone_up_kernel(a_ptr, w_desc, out_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
                       num_m_blocks, N, K, num_slots, stride_am, stride_om,
                       TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                       BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """out[r] = a[sorted_token_ids[r] // TOP_K] @ w[expert of r's block].T, for the rows of blocks in use;
    padding rows get zeros. a [T, K] (rows stride_am apart), w through w_desc [E, N, K], out
    [max_num_tokens_padded, N] (rows stride_om apart)."""
    pid = tl.program_id(0)
    # TODO 1: pid_m, pid_n in the grouped order (num_pid_n = tl.cdiv(N, BLOCK_SIZE_N), groups of GROUP_SIZE_M)
    # TODO 2: return if this block lies past num_tokens_post_padded; expert = its entry of expert_ids
    # TODO 3: offs_m, offs_n, offs_k; slots, row_ok, tokens (int64)
    # TODO 4: acc = zeros; for k0 in range(0, K, BLOCK_SIZE_K): masked A tile (other=0.0), the W box at
    #         [expert, n0, k0] reshaped to [BLOCK_SIZE_N, BLOCK_SIZE_K], acc = tl.dot(a, w.T, acc)
    # TODO 5: store acc (as out's dtype: out_ptr.dtype.element_ty) at rows offs_m, columns masked by offs_n < N
    pass


# %%
exercises.check_capstone_up(capstone_up_kernel, weight_desc)

# %% jupyter={"source_hidden": true}
# Solution: moe_lab/workbook/exercises/capstone_solution.py (open it once you pass, or when stuck)
from moe_lab.workbook.exercises.capstone_solution import capstone_up_kernel_solution, weight_desc_solution

exercises.check_capstone_up(capstone_up_kernel_solution, weight_desc_solution, strict=True)

# %% [markdown]
# ### Exercise 2: the down projection
#
# Now both operands come through descriptors. Write `sorted_rows_desc(a, BLOCK_SIZE_M, BLOCK_SIZE_K)`, the
# descriptor over `a [max_num_tokens_padded, K]` whose box is one M-block's rows, and
# `capstone_down_kernel`: the same program-to-tile walk and K loop, with the A box at
# `[pid_m * BLOCK_SIZE_M, k0]` (no mask: the descriptor stops at K). In the epilogue load the block's
# `slots`, multiply each row of `acc` **once** by its routed weight
# (`tl.load(topk_weights_ptr + slots, mask=row_ok, other=0.0)`: a padding row's slot is one past
# `topk_weights`), and store row i at `out_ptr + slots[i] * stride_om` under the row mask (`slots <
# num_slots`) and the column mask.

# %%
def sorted_rows_desc(a, BLOCK_SIZE_M, BLOCK_SIZE_K):
    """The host descriptor over the down projection's a [max_num_tokens_padded, K]: one box = one M-block."""
    return None  # TODO


@triton.jit
def capstone_down_kernel(a_desc, w_desc, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                         num_tokens_post_padded_ptr, num_m_blocks, N, K, num_slots, stride_om,
                         BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                         GROUP_SIZE_M: tl.constexpr):
    """out[sorted_token_ids[r]] = topk_weights.flatten()[sorted_token_ids[r]] * (a[r] @ w[expert].T) for the
    real rows r of the blocks in use. a through a_desc [max_num_tokens_padded, K], w through w_desc
    [E, N, K], topk_weights [T, TOP_K] float32 contiguous, out [T * TOP_K, N] (rows stride_om apart)."""
    pid = tl.program_id(0)
    # TODO 1: pid_m, pid_n in the grouped order
    # TODO 2: return if this block lies past num_tokens_post_padded; expert = its entry of expert_ids
    # TODO 3: the K loop: the A box at [pid_m * BLOCK_SIZE_M, k0], the W box at [expert, n0, k0]
    # TODO 4: slots, row_ok; acc times the routed weight of each row (once)
    # TODO 5: store at rows slots, masked by row_ok and offs_n < N
    pass


# %%
exercises.check_capstone_down(capstone_down_kernel, weight_desc, sorted_rows_desc)

# %% jupyter={"source_hidden": true}
# Solution: moe_lab/workbook/exercises/capstone_solution.py
from moe_lab.workbook.exercises.capstone_solution import capstone_down_kernel_solution, sorted_rows_desc_solution

exercises.check_capstone_down(capstone_down_kernel_solution, weight_desc_solution, sorted_rows_desc_solution,
                              strict=True)

# %% [markdown]
# ## 3. How fast is yours?
#
# On a GPU, once a kernel passes, its checker also times it against `moe_lab.grouped_matmul` on the same
# inputs, at Qwen3-30B-A3B's shape with T = 512 in bfloat16: moe-lab with its tuned config, your kernel
# with that config's tiles, `GROUP_SIZE_M`, warps and stages. It prints both medians (CUDA-graph replays,
# L2 flushed) and the ratio. Under the interpreter it does not time: a CPU time says nothing about a GPU.
# `benchmarks/capstone.py` times the reference solution so at Qwen3-30B-A3B's and Mixtral-8x7B's shapes
# (T = 64, 512, 4096); the target is within 1.5x of moe-lab's kernel, which adds tail tiles, folded tails
# and a persistent walk where its tuned table chose them. The cell below times the solutions at T = 4096 (on a
# GPU only), the prefill end of that range.

# %%
# NBVAL_IGNORE_OUTPUT
if moe_lab.workbook.timing_allowed("the capstone timing"):
    for projection in (capstone.UP, capstone.DOWN):
        kernel = capstone_up_kernel_solution if projection == capstone.UP else capstone_down_kernel_solution
        print(capstone.time_against_moe_lab(kernel, projection, num_tokens=4096).describe())

# %% [markdown]
# ## Summary
#
# - One program per output tile; the grouped order keeps a group's weight tiles in the L2.
# - A block past `num_tokens_post_padded` returns; a block's weights are `expert_ids[pid_m]`'s, read
#   through a 3-D descriptor at `[expert, n0, k0]`.
# - Up: token rows gathered by pointer (row and K masks, `other=0.0`); down: the sorted rows through a
#   2-D descriptor, which needs no mask.
# - The epilogue masks the columns past N; the down projection multiplies by the routed weight once and
#   scatters each row to its slot, padding rows dropped.
#
# Next: notebook 06 puts all stages together into the fused MoE layer.
