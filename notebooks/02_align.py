# %% [markdown]
# # 02 · Align: from `topk_ids` to a block schedule
#
# One launch should compute every expert's matmul. For that, the rows of each expert must sit next to
# each other, in blocks of BLOCK_SIZE_M rows that never mix two experts. The **align** step builds
# that schedule on the device, from `topk_ids` alone:
#
# - `sorted_token_ids`: the flat slot ids `t*k + j`, grouped by expert, each expert's run padded to a
#   multiple of BLOCK_SIZE_M with the sentinel `T*k`;
# - `expert_ids`: the expert of each M-block (-1 for blocks past the end);
# - `num_tokens_post_padded`: how many rows are in use.
#
# **Goals**
# 1. Build the three steps as small Triton kernels: histogram (yours to write, graded by a checker),
#    prefix sum, scatter.
# 2. Check each one, and the whole schedule, exactly against `moe_lab.moe_align`.
# 3. See the schedule as a strip, and how BLOCK_SIZE_M trades padding for bigger tiles —
#    cheap for prefill (many tokens), wasteful for decode (few tokens).

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
from moe_lab.align import max_num_tokens_padded
from moe_lab.workbook.viz import align as viz_align
from moe_lab.workbook.viz.routing import skewed_router_logits

device = moe_lab.runtime.default_device()

# %% [markdown]
# ## A small example
#
# T = 8 tokens, top_k = 2, E = 4 experts, BLOCK_SIZE_M = 4. Slot `t*k + j` is token t's j-th choice.

# %%
# NBVAL_CHECK_OUTPUT
T, k, E, BLOCK_SIZE_M = 8, 2, 4, 4
gen = torch.Generator().manual_seed(0)
topk_ids = torch.rand(T, E, generator=gen).topk(k, dim=-1).indices.to(torch.int32).to(device)
flat_ids = topk_ids.reshape(-1)
print("topk_ids [T, k]:", topk_ids.tolist())
print("expert of each slot t*k+j:", flat_ids.tolist())


# %% [markdown]
# ## Step 1: histogram — how many slots each expert gets
#
# Each program reads a block of BLOCK slots and adds 1 to the counter of each slot's expert with
# `tl.atomic_add` (atomic, because two lanes or two programs may hit the same expert).
#
# ### Exercise: write `histogram_kernel`
#
# - `topk_ids_ptr`: `topk_ids` read flat, `num_slots = T*k` int32 expert ids; slot `t*k + j` holds the
#   expert of token t's j-th choice (the `flat_ids` above).
# - `counts_ptr`: `counts` [E] int32, zeroed by the host; the kernel adds into it.
# - Program p takes the slots `offs = p*BLOCK + [0, 1, ..., BLOCK-1]`; the grid is `cdiv(num_slots, BLOCK)`.
#
# Two things matter. The last block runs past `num_slots` unless it is **masked**: its spare lanes would
# read ids that belong to no slot and add 1 to whatever counter those point at. And many lanes add to the
# same counter: with `tl.store` they overwrite each other's counts, `tl.atomic_add` adds them all.
# The checker uses T = 45 tokens, top_k = 6, E = 10 experts: 270 slots, BLOCK = 64, 5 programs.

# %%
@triton.jit
def histogram_kernel(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # the slots of this program
    # TODO: ids = the expert id of each slot (tl.load, masked with offs < num_slots)
    # TODO: add 1 to counts[ids] with tl.atomic_add (same mask)
    pass


# %%
exercises.check_expert_histogram(histogram_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def histogram_kernel_solution(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.atomic_add(counts_ptr + ids, 1, mask=mask)


exercises.check_expert_histogram(histogram_kernel_solution, strict=True)


# %% [markdown]
# The steps below launch the solution kernel (put `histogram_kernel` in its place once it passes).

# %%
def my_histogram(flat_ids, num_experts, block=64):
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat_ids.device)
    histogram_kernel_solution[(triton.cdiv(flat_ids.numel(), block),)](flat_ids, counts, flat_ids.numel(),
                                                                       BLOCK=block)
    return counts


# %%
# NBVAL_CHECK_OUTPUT
counts = my_histogram(flat_ids, E)
print("counts:", counts.tolist())
workbook.check_equal("histogram vs torch.bincount", counts, torch.bincount(flat_ids.long(), minlength=E).int())


# %% [markdown]
# ## Step 2: prefix sum — where each expert's rows start
#
# Round each count up to a multiple of BLOCK_SIZE_M, then an exclusive prefix sum gives each expert's
# first row; the sum of the padded counts is `num_tokens_post_padded`. One program does it all with
# `tl.cumsum` (E is small).

# %%
@triton.jit
def prefix_kernel(counts_ptr, expert_start_ptr, total_ptr, num_experts,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_E: tl.constexpr):
    e = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + e, mask=e < num_experts, other=0)
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    start = tl.cumsum(padded, axis=0) - padded
    tl.store(expert_start_ptr + e, start, mask=e < num_experts)
    tl.store(total_ptr, tl.sum(padded, axis=0))


def my_prefix(counts, block_size_m):
    expert_start = torch.empty_like(counts)
    total = torch.empty(1, dtype=torch.int32, device=counts.device)
    prefix_kernel[(1,)](counts, expert_start, total, counts.numel(), BLOCK_SIZE_M=block_size_m,
                        BLOCK_E=triton.next_power_of_2(counts.numel()))
    return expert_start, total


# %%
# NBVAL_CHECK_OUTPUT
expert_start, num_tokens_post_padded = my_prefix(counts, BLOCK_SIZE_M)
print("expert_start:", expert_start.tolist(), " num_tokens_post_padded:", num_tokens_post_padded.item())
padded_counts = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
workbook.check_equal("expert_start vs torch.cumsum", expert_start, torch.cumsum(padded_counts, 0) - padded_counts)


# %% [markdown]
# ## Step 3: scatter — put each slot in its row
#
# Our simple version runs one program per expert. Each program reads *all* slots, keeps those of its
# expert, and ranks them with a cumulative sum: rank r goes to row `expert_start[e] + r`. Slot order
# inside an expert is kept (a stable sort), which is what `moe_align` does too. The program then writes
# its expert's id into `expert_ids` for each of its blocks.
#
# The buffers are allocated at their **bound** (`max_num_tokens_padded`), which depends only on T·k, E
# and BLOCK_SIZE_M, never on the routing, so no host sync is needed. We fill them on the host with
# the padding sentinel `T*k` and -1 first; `moe_align` writes those in its kernels instead.

# %%
@triton.jit
def scatter_kernel(flat_ids_ptr, expert_start_ptr, counts_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_slots,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    offs = tl.arange(0, BLOCK)                      # BLOCK >= num_slots: this program sees every slot
    mine = tl.load(flat_ids_ptr + offs, mask=offs < num_slots, other=-1) == e
    rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1  # 0, 1, 2, ... among this expert's slots
    start = tl.load(expert_start_ptr + e)
    tl.store(sorted_token_ids_ptr + start + rank, offs, mask=mine)
    first_block = start // BLOCK_SIZE_M
    for b in range(0, tl.cdiv(tl.load(counts_ptr + e), BLOCK_SIZE_M)):
        tl.store(expert_ids_ptr + first_block + b, e)


def my_align(topk_ids, num_experts, block_size_m):
    """Our whole align step: returns (sorted_token_ids, expert_ids, num_tokens_post_padded, counts)."""
    flat = topk_ids.reshape(-1).contiguous()
    num_slots = flat.numel()
    counts = my_histogram(flat, num_experts)
    expert_start, total = my_prefix(counts, block_size_m)
    rows = max_num_tokens_padded(num_slots, num_experts, block_size_m)
    sorted_token_ids = torch.full((rows,), num_slots, dtype=torch.int32, device=flat.device)
    expert_ids = torch.full((rows // block_size_m,), -1, dtype=torch.int32, device=flat.device)
    scatter_kernel[(num_experts,)](flat, expert_start, counts, sorted_token_ids, expert_ids, num_slots,
                                   BLOCK_SIZE_M=block_size_m, BLOCK=triton.next_power_of_2(num_slots))
    return sorted_token_ids, expert_ids, total, counts


# %%
# NBVAL_CHECK_OUTPUT
mine = my_align(topk_ids, E, BLOCK_SIZE_M)
print("sorted_token_ids:", mine[0].tolist())
print("expert_ids:      ", mine[1].tolist())

# %% [markdown]
# ## Check against `moe_lab.moe_align`
#
# `moe_align` returns an `AlignedRouting`: the same tensors, plus the sizes it was built for. The two
# must agree exactly, including the padding and the -1 blocks past the end.

# %%
# NBVAL_CHECK_OUTPUT
def check_align(topk_ids, num_experts, block_size_m, label):
    ours = my_align(topk_ids, num_experts, block_size_m)
    ref = moe_lab.moe_align(topk_ids, num_experts, block_size_m)
    for name, got in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded", "counts"), ours):
        workbook.check_equal(f"{label} {name}", got, getattr(ref, name))
    return ref


routing = check_align(topk_ids, E, BLOCK_SIZE_M, "small example:")

# %% [markdown]
# And on a real model's routing: Qwen3-30B-A3B has E = 128 experts and top_k = 8; 64 tokens make 512 slots.

# %%
# NBVAL_CHECK_OUTPUT
qwen = moe_lab.get_preset("qwen3-30b-a3b")
qwen_ids = moe_lab.topk_routing(skewed_router_logits(64, qwen.num_experts, skew=0.5, seed=1), qwen.top_k).topk_ids
qwen_routing = check_align(qwen_ids.to(device), qwen.num_experts, 16, "qwen3 T=64:")

# %% [markdown]
# ## Picture: the alignment strip
#
# Each cell is one row of the schedule, colored by expert, with its slot id; grey hatched cells are
# padding (the sentinel T·k = 16). Thick lines are BLOCK_SIZE_M boundaries; above each block is its
# entry of `expert_ids`. A grouped matmul program takes one block: all its rows belong to one expert.

# %%
viz_align.plot_alignment_strip(routing)

# %% [markdown]
# ## How BLOCK_SIZE_M changes the padding
#
# Each used expert wastes up to BLOCK_SIZE_M − 1 rows. With many tokens per expert (prefill) that is a
# small share; with few (decode) most rows are padding — the tensor cores multiply zeros. Bigger
# blocks make faster tiles, so the config picks BLOCK_SIZE_M by the expected rows per expert.
# Here: Mixtral's routing (E = 8, top_k = 2) for a prefill of 256 tokens and a decode step of 4 tokens.

# %%
mixtral = moe_lab.get_preset("mixtral-8x7b")
cases = {
    "prefill (T=256)": moe_lab.topk_routing(skewed_router_logits(256, 8, seed=2), 2).topk_ids.to(device),
    "decode (T=4)": moe_lab.topk_routing(skewed_router_logits(4, 8, seed=3), 2).topk_ids.to(device),
}
for bm in (16, 32, 64, 128):
    for name, ids in cases.items():
        print(f"{name:<16} {viz_align.padding_report(moe_lab.moe_align(ids, 8, bm))}")

# %% [markdown]
# ### Widget: pick BLOCK_SIZE_M
#
# The slider redraws both strips and reports the waste when released. It starts at BLOCK_SIZE_M = 16;
# a static copy of that first picture follows for viewers without a live kernel.

# %%
# NBVAL_IGNORE_OUTPUT
WIDGET_BLOCK_SIZE_M = 16   # the slider's first value, and the static copy's
viz_align.align_explorer(cases, num_experts=8, block_sizes=(16, 32, 64, 128), value=WIDGET_BLOCK_SIZE_M)

# %%
viz_align.plot_alignment_cases({name: moe_lab.moe_align(ids, 8, WIDGET_BLOCK_SIZE_M)
                                for name, ids in cases.items()})

# %% [markdown]
# ## What `moe_align` does differently
#
# Our version is short but does T·k·E work (every program reads every slot), needs one program that
# sees all slots, and relies on a host-side fill. `moe_align` (see `moe_lab/_kernels/align.py`)
# instead: counts per chunk of 128 slots with `tl.histogram` (no atomics), scans those chunk counts
# in one program so every chunk knows where its slots of each expert go, and scatters each chunk in
# parallel with a rank inside the chunk — stable and deterministic, three launches, and it writes
# the padding and the -1 blocks itself. Same schedule, checked above. For a few slots (decode: a
# handful of tokens) one program does it all in registers instead: each slot compares its expert
# with every other slot's to find its count, its rank and where its expert's run starts — one launch,
# no round trip through memory. And one token needs no align at all: its k experts are distinct, so
# each slot is an M-block of its own, and `fused_moe` runs them in slot order, with the GEMMs reading
# each block's expert straight from `topk_ids` (`moe_lab.align.slot_order_routing`).

# %% [markdown]
# ## Exercise: `expert_ids` from the counts
#
# Given `counts` [E] and BLOCK_SIZE_M, build `expert_ids` of length `num_m_blocks` in plain PyTorch:
# expert e owns `ceil(counts[e] / BLOCK_SIZE_M)` consecutive blocks (experts in order), and every block
# after the last used one is -1. Hint: `torch.repeat_interleave`.

# %%
def my_expert_ids(counts, block_size_m, num_m_blocks):
    """counts [E] int -> expert_ids [num_m_blocks] int32."""
    # TODO
    return torch.zeros(num_m_blocks, dtype=torch.int32)


# %%
def check_expert_ids(fn, strict=False):
    """Compare fn with moe_align's expert_ids on the Qwen3 routing; say what is wrong instead of raising."""
    want = qwen_routing.expert_ids.cpu()
    got = fn(qwen_routing.counts.cpu(), qwen_routing.block_size_m, want.numel()).cpu().to(torch.int32)
    used = int((want >= 0).sum())
    problem = None
    if got.shape != want.shape:
        problem = f"length {got.numel()}, expected num_m_blocks = {want.numel()}"
    elif torch.equal(got[:used], want[:used]) and not torch.equal(got, want):
        problem = f"the first {used} blocks are right, but blocks past the end must be -1 (not expert 0)"
    elif not torch.equal(got, want):
        i = int((got != want).nonzero()[0])
        problem = (f"block {i} is expert {int(got[i])}, expected {int(want[i])}: each expert owns "
                   "ceil(count / BLOCK_SIZE_M) blocks, and experts with no slots own none")
    if problem is None:
        workbook.check_equal("my_expert_ids", got, want)
    elif strict:
        raise AssertionError(f"FAIL my_expert_ids: {problem}")
    else:
        print(f"NOT YET my_expert_ids: {problem}")


check_expert_ids(my_expert_ids)


# %% jupyter={"source_hidden": true}
# Solution
def my_expert_ids_solution(counts, block_size_m, num_m_blocks):
    blocks = (counts + block_size_m - 1) // block_size_m
    used = torch.repeat_interleave(torch.arange(counts.numel()), blocks.long())
    out = torch.full((num_m_blocks,), -1, dtype=torch.int32)
    out[:used.numel()] = used.to(torch.int32)
    return out


check_expert_ids(my_expert_ids_solution, strict=True)

# %% [markdown]
# ## Summary
#
# - Align = histogram → padded prefix sum → scatter. Its output, `sorted_token_ids`, `expert_ids` and
#   `num_tokens_post_padded` (an `AlignedRouting`), is all a grouped matmul needs to know which rows
#   each program takes and which expert's weights it uses.
# - Many lanes and programs add to the same counter: `tl.atomic_add` counts them all, a `tl.store` loses
#   counts; the last block is masked (`offs < num_slots`).
# - Buffers are sized by a bound, so nothing waits for the host.
# - BLOCK_SIZE_M sets the padding: a few percent for prefill, most of the rows for decode.
# - Next, **03_grouped_gemm_pointers**: one launch that computes every expert's matmul on this schedule.
