# %% [markdown]
# # 05 · The grouped GEMM with TMA loads
#
# Notebook 04 showed tensor descriptors on their own. Here they go into the grouped matmul, the kernel
# that computes every expert's GEMM of a MoE layer in one launch.
#
# **Goals**
# 1. Read expert weights through a 3-D descriptor, and the token rows of the **down** projection through
#    a 2-D descriptor on the expert-sorted, per-expert-padded rows.
# 2. Understand why the **up** projection cannot read its rows through TMA on Hopper.
# 3. See the tile that would cross an expert boundary, and how moe-lab's padding avoids it.
# 4. Build a small TMA grouped GEMM and check it; then check that moe-lab's TMA and pointer paths agree.
# 5. Compare pointer and TMA timings (live on a GPU, committed H200 data otherwise).
# 6. Look inside a kernel: print from it, step through it, and read the PTX that shows the TMA copies.

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

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_lab import GemmConfig, workbook
from moe_lab.workbook.viz import performance as perf_viz
from moe_lab.workbook.viz import tma as tma_viz

device = moe_lab.runtime.default_device()

# %% [markdown]
# ## 1. A small problem
#
# T tokens, each routed to k of E experts. `moe_align` sorts the T·k (token, k) slots by expert and pads
# each expert's run to a multiple of BLOCK_SIZE_M: `sorted_token_ids` (padding = T·k), `expert_ids` (the
# expert of each M-block), `num_tokens_post_padded` (rows in use). float16 keeps the interpreter's `tl.dot`
# exact (its bfloat16 dot is wrong).

# %%
# NBVAL_CHECK_OUTPUT
T, E, TOP_K, H, I = 24, 4, 2, 64, 32
BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K = 16, 32, 32
dtype = torch.float16

gen = torch.Generator().manual_seed(0)
hidden_states = torch.randn(T, H, generator=gen).to(dtype).to(device)
w1 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).to(dtype).to(device)   # [E, 2I, H]
w2 = (torch.randn(E, H, I, generator=gen) / I ** 0.5).to(dtype).to(device)       # [E, H, I]
topk_ids = torch.rand(T, E, generator=gen).topk(TOP_K, dim=1).indices.to(torch.int32).to(device)

routing = moe_lab.moe_align(topk_ids, E, BLOCK_SIZE_M)
print("tokens per expert (counts):   ", routing.counts.tolist())
print("num_tokens_post_padded:       ", routing.num_tokens_post_padded.item())
print("expert_ids (one per M-block): ", routing.expert_ids.tolist())

# %% [markdown]
# ## 2. Which operand can go through TMA?
#
# **Weights.** `w1 [E, 2I, H]` and `w2 [E, H, I]` are dense: a 3-D descriptor with block shape
# `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]` loads expert `e`'s tile at `[e, n0, k0]` (notebook 04, section 7).
#
# **Token rows of the up projection.** An M-block of expert e needs the rows
# `hidden_states[sorted_token_ids[r] // k]` — tokens scattered all over `hidden_states [T, H]`. A TMA box is
# a rectangle of consecutive rows, so these rows must be *gathered*, row by row, with pointer loads.
# Hardware gather of scattered rows through a tensor map (TMA gather4) first came with Blackwell (sm_100);
# on Hopper the up projection's token rows take the pointer path.
#
# **Token rows of the down projection.** Its input is the activation `act [max_num_tokens_padded, I]`,
# written by the up projection *already in the expert-sorted, padded order*: M-block b owns rows
# `b·BLOCK_SIZE_M … (b+1)·BLOCK_SIZE_M − 1`, consecutive rows. That is a box: a 2-D descriptor with
# block shape `[BLOCK_SIZE_M, BLOCK_SIZE_K]` loads it at `[b·BLOCK_SIZE_M, k0]`.

# %% [markdown]
# ## 3. The tile at an expert boundary
#
# A box of BLOCK_SIZE_M rows must hold the rows of **one** expert: the program multiplies them all by one
# expert's weights. moe-lab pads each expert's run of rows to a multiple of BLOCK_SIZE_M (grey rows below),
# so no box ever spans two experts. The price: padding rows, computed and thrown away — up to
# BLOCK_SIZE_M − 1 per expert in use.
#
# A **packed** layout (experts back to back, as `torch._grouped_mm` reads them) saves those rows, but then
# some tiles span a boundary (red). A kernel on a packed layout would have to compute such a tile once per
# expert it touches and **mask the store**, writing only the rows of the expert whose weights it used — and
# a TMA store cannot mask rows, so the store goes back to pointers (or the boxes get clipped per expert).

# %%
counts = routing.counts.tolist()
tma_viz.plot_expert_tiles(counts, BLOCK_SIZE_M)

# %%
tma_viz.plot_expert_tiles(counts, BLOCK_SIZE_M, packed=True)

# %%
# NBVAL_IGNORE_OUTPUT
tma_viz.expert_tiles_widget(counts, BLOCK_SIZE_M)

# %%
tma_viz.plot_expert_tiles([5, 0, 13, 3, 9], 4)

# %% [markdown]
# ## 4. Build: a small TMA grouped GEMM
#
# The down projection's shape: `act` in the sorted layout `[max_num_tokens_padded, K]` times `w [E, N, K]`.
# One program computes one `BLOCK_SIZE_M × BLOCK_SIZE_N` tile of `out` (same sorted layout):
# A through a 2-D descriptor, W through a 3-D descriptor, and the result stored through a third descriptor
# (every row of the tile belongs to this program's expert, so a box store is safe here).
#
# ### Exercise: the weight tile of an M-block's expert
#
# First the load that makes a GEMM *grouped*: the W tile. Program `(pid_m, pid_n)` of the GEMM multiplies
# the rows of M-block `pid_m` by the weights of that block's expert, `expert_ids[pid_m]`, one K step at a
# time. Write that load on its own: program `(pid_m, pid_n, pid_k)` loads the `BLOCK_SIZE_N × BLOCK_SIZE_K`
# tile of `w [E, N, K]` that the GEMM's program `(pid_m, pid_n)` uses in K step `pid_k`, and stores it into
# `out [M-blocks, 48, K]` (48 = N rounded up to BLOCK_SIZE_N) through the `out_ptrs` the stub gives, so
# that the check can look at it. Two pieces:
#
# 1. `expert_weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)`: the host descriptor over `w`, one box = one
#    expert's tile, so its block shape is `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`.
# 2. `expert_tile_kernel`: load `expert = expert_ids[pid_m]`; an M-block whose expert is **-1** holds no
#    rows (it lies past `num_tokens_post_padded`): return without storing. Then load the box at
#    `[expert, n0, k0]`, with the element offsets `n0 = pid_n * BLOCK_SIZE_N` and
#    `k0 = pid_k * BLOCK_SIZE_K`. It comes back 3-D, `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`: reshape it to
#    `[BLOCK_SIZE_N, BLOCK_SIZE_K]` and store it. (`N = w.shape[1]` is passed too; the 3-D descriptor
#    already knows it.)
#
# The check: float16 `w [5, 40, 64]`, `BLOCK_SIZE_N = 16`, `BLOCK_SIZE_K = 32`,
# `expert_ids = [0, 1, 1, 3, 4, -1, -1]` (expert 2 got no tokens; two unused blocks), grid `(7, 3, 2)`.
# N = 40 is not a multiple of 16: the last N-block's box covers rows 32–47 of an expert, of which only
# 32–39 exist, and rows 40–47 must come back as **zeros**. The 3-D descriptor's bounds are per expert;
# a 2-D descriptor over `w.view(E * N, K)` would hand you the next expert's first rows there. (In the GEMM
# those rows only reach output columns past N, which the store drops, so a GEMM check would not see that
# mistake; this one does.)

# %%
def expert_weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    """The host descriptor the kernel reads w [E, N, K] through: one box = one expert's tile."""
    return None  # TODO: TensorDescriptor.from_tensor(w, block_shape)


@triton.jit
def expert_tile_kernel(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on,
                       BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    pid_m = tl.program_id(0)   # the M-block
    pid_n = tl.program_id(1)   # the N-block of w
    pid_k = tl.program_id(2)   # the K step
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = pid_k * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    out_ptrs = out_ptr + pid_m * stride_ob + offs_n[:, None] * stride_on + offs_k[None, :]
    # TODO: expert = the expert of this M-block (from expert_ids_ptr); return if it is -1
    # TODO: tile = the box of w_desc at [expert, n0, k0], reshaped to [BLOCK_SIZE_N, BLOCK_SIZE_K]
    # TODO: tl.store(out_ptrs, tile)
    pass


# %%
from moe_lab.workbook import exercises

exercises.check_expert_tile(expert_tile_kernel, expert_weight_desc)


# %% jupyter={"source_hidden": true}
# Solution
def expert_weight_desc_solution(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N, BLOCK_SIZE_K])


@triton.jit
def expert_tile_kernel_solution(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on,
                                BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = pid_k * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    out_ptrs = out_ptr + pid_m * stride_ob + offs_n[:, None] * stride_on + offs_k[None, :]
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:
        return                                                                 # an unused M-block
    tile = w_desc.load([expert, pid_n * BLOCK_SIZE_N, pid_k * BLOCK_SIZE_K])  # [1, BLOCK_SIZE_N, BLOCK_SIZE_K]
    tl.store(out_ptrs, tile.reshape(BLOCK_SIZE_N, BLOCK_SIZE_K))


exercises.check_expert_tile(expert_tile_kernel_solution, expert_weight_desc_solution, strict=True)

# %% [markdown]
# ### The whole kernel
#
# The GEMM program does the same per K step (its unused blocks end before the loop: past
# `num_tokens_post_padded`), adds the A box of its rows at `[row0, k0]`, and accumulates `a @ w.T`.

# %%
@triton.jit
def tma_grouped_gemm_kernel(a_desc, w_desc, c_desc, expert_ids_ptr, num_tokens_post_padded_ptr, K,
                            BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return                                        # a block past the rows in use
    expert = tl.load(expert_ids_ptr + pid_m)
    row0 = pid_m * BLOCK_SIZE_M
    col0 = pid_n * BLOCK_SIZE_N
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        a = a_desc.load([row0, k0])                                            # [BM, BK]
        w = w_desc.load([expert, col0, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)  # [BN, BK]
        acc = tl.dot(a, w.T, acc)
    c_desc.store([row0, col0], acc.to(c_desc.dtype))


def tma_grouped_gemm(a_sorted, w, routing):
    """out[r] = a_sorted[r] @ w[expert of r's block].T for the rows in use; a_sorted in the padded order."""
    rows, k = a_sorted.shape
    n = w.shape[1]
    out = torch.zeros(rows, n, dtype=a_sorted.dtype, device=a_sorted.device)
    a_desc = TensorDescriptor.from_tensor(a_sorted, [BLOCK_SIZE_M, BLOCK_SIZE_K])
    w_desc = TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N, BLOCK_SIZE_K])
    c_desc = TensorDescriptor.from_tensor(out, [BLOCK_SIZE_M, BLOCK_SIZE_N])
    grid = (routing.max_num_m_blocks, triton.cdiv(n, BLOCK_SIZE_N))
    tma_grouped_gemm_kernel[grid](a_desc, w_desc, c_desc, routing.expert_ids, routing.num_tokens_post_padded, k,
                                  BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K)
    return out


# %% [markdown]
# An input in the sorted layout, and the answer in plain PyTorch: for each M-block in use, its rows times
# its expert's weights. Padding rows of `act` are zero (as the layer's up projection leaves them).

# %%
used_rows = routing.num_tokens_post_padded.item()
is_real = (routing.sorted_token_ids < T * TOP_K)
act_sorted = torch.zeros(routing.max_num_tokens_padded, I, dtype=dtype, device=device)
act_sorted[is_real] = torch.randn(int(is_real.sum()), I, generator=gen).to(dtype).to(device)


def sorted_gemm_reference(a_sorted, w, routing):
    out = torch.zeros(a_sorted.shape[0], w.shape[1], dtype=torch.float32, device=a_sorted.device)
    for b, e in enumerate(routing.expert_ids.tolist()):
        if e >= 0:
            rows = slice(b * routing.block_size_m, (b + 1) * routing.block_size_m)
            out[rows] = a_sorted[rows].float() @ w[e].float().T
    return out


want_down = sorted_gemm_reference(act_sorted, w2, routing)

# %%
# NBVAL_CHECK_OUTPUT
mine_down = tma_grouped_gemm(act_sorted, w2, routing)
_ = workbook.check("own TMA grouped GEMM (down projection shape)", mine_down[:used_rows], want_down[:used_rows], tol=1e-3)

# %% [markdown]
# ## 5. moe-lab's grouped matmul: TMA path against pointer path
#
# `moe_lab.grouped_matmul` runs the same computation with either load path. `select_load_path` says which
# operand goes through a descriptor and why.

# %%
cfg = GemmConfig(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
for label, a, w, gather in (("up  ", hidden_states, w1, True), ("down", act_sorted, w2, False)):
    path = moe_lab.select_load_path(a, w, cfg, gather_a=gather, use_tma="auto")
    print(f"{label}: {path.name:<14} {path.reason}")

# %%
# NBVAL_CHECK_OUTPUT
# use_tma="auto": TMA on a Hopper GPU and under the interpreter, pointer loads elsewhere (an A100), as the
# cell above printed; use_tma=True would raise there instead.
down_tma = moe_lab.grouped_matmul(act_sorted, w2, routing, cfg, gather_a=False, use_tma="auto")
down_ptr = moe_lab.grouped_matmul(act_sorted, w2, routing, cfg, gather_a=False, use_tma=False)
workbook.check("moe-lab down, TMA path vs reference", down_tma[:used_rows], want_down[:used_rows], tol=1e-3)
workbook.check_equal("moe-lab down, TMA path vs pointer path", down_tma[:used_rows], down_ptr[:used_rows])
workbook.check_equal("moe-lab down (TMA) vs own kernel", down_tma[:used_rows], mine_down[:used_rows])

# %%
# NBVAL_CHECK_OUTPUT
# The up projection: token rows gathered (pointer), weights through the 3-D descriptor.
x_sorted = torch.zeros(routing.max_num_tokens_padded, H, dtype=dtype, device=device)
x_sorted[is_real] = hidden_states[(routing.sorted_token_ids[is_real] // TOP_K).long()]
want_up = sorted_gemm_reference(x_sorted, w1, routing)
up_tma = moe_lab.grouped_matmul(hidden_states, w1, routing, cfg, gather_a=True, use_tma="auto")
up_ptr = moe_lab.grouped_matmul(hidden_states, w1, routing, cfg, gather_a=True, use_tma=False)
workbook.check("moe-lab up (a:ptr w:tma) vs reference", up_tma[:used_rows], want_up[:used_rows], tol=1e-3)
workbook.check_equal("moe-lab up, TMA weights vs pointer weights", up_tma[:used_rows], up_ptr[:used_rows])

# %% [markdown]
# ## 6. Pointer vs TMA: time
#
# On a GPU the next cell times both paths of both GEMMs on a real layer (Qwen3-30B-A3B, T = 4096, bf16).
# Under the interpreter it refuses: a CPU time says nothing about a GPU.

# %%
# NBVAL_IGNORE_OUTPUT
if workbook.timing_allowed("the pointer vs TMA timing"):
    from moe_lab.tools.timing import median_ms

    preset = moe_lab.get_preset("qwen3-30b-a3b")
    hs, g1, g2, (tw, ti) = preset.build(4096, dtype=torch.bfloat16, device="cuda")
    gpu_cfg = moe_lab.default_config(4096, preset.num_experts, preset.top_k, preset.hidden_size,
                                     preset.intermediate_size)
    r = moe_lab.moe_align(ti, preset.num_experts, gpu_cfg.block_size_m)
    gate_up = moe_lab.grouped_matmul(hs, g1, r, gpu_cfg.up, gather_a=True)
    act = moe_lab.silu_and_mul(gate_up, routing=r)
    for use_tma in (False, True):
        up_ms = median_ms(lambda: moe_lab.grouped_matmul(hs, g1, r, gpu_cfg.up, gather_a=True, out=gate_up,
                                                         use_tma=use_tma))
        down_ms = median_ms(lambda: moe_lab.grouped_matmul(act, g2, r, gpu_cfg.down, gather_a=False,
                                                           use_tma=use_tma))
        print(f"use_tma={use_tma!s:<5}: up {up_ms:.3f} ms, down {down_ms:.3f} ms "
              f"(median, L2 flushed, {torch.cuda.get_device_name()})")

# %% [markdown]
# The committed H200 results (`benchmarks/results/`, written by `moe-lab bench`; **committed data, not
# measured here**): A = pointer path, B = TMA path, for each model and token count.

# %%
results = perf_viz.load_results()
print(perf_viz.describe_results(results))
print(perf_viz.compare_table(results))

# %%
perf_viz.plot_time_grid(results, metric="down_ms", impls=("moe-lab pointer", "moe-lab tma"))

# %% [markdown]
# How to read it: at T = 1 there is one token per expert in use, every tile is mostly padding and the
# GEMMs only stream weights: both paths take the same time. From a few hundred tokens on, tiles are full
# and the TMA path is faster, most of all in the down projection, where both operands come through
# descriptors (2 to 12 % at T = 4096–16384 in the committed H200 run).

# %% [markdown]
# ### Exercise: how many padding rows?
#
# Write `padding_rows(counts, block_size_m)`: the padding rows moe-lab's layout adds when expert e gets
# `counts[e]` rows (each expert's run is rounded up to a multiple of `block_size_m`; an expert with no rows
# takes no block). The check compares with `moe_align`.

# %%
def padding_rows(counts, block_size_m):
    return None  # TODO: your code here


def check_padding_rows(fn, strict=False):
    if fn([3, 0, 5], 4) is None:
        return exercises.report("padding_rows", "it returns None (hint: round each count up to block_size_m)",
                                "", strict)
    cases = [(routing.counts.tolist(), BLOCK_SIZE_M, routing.num_tokens_post_padded.item() - T * TOP_K),
             ([3, 0, 5], 4, 4), ([16, 16], 16, 0), ([0, 0, 1], 8, 7)]
    for c, bm, want in cases:
        got = fn(c, bm)
        if got != want:
            extra = " (an expert with 0 rows needs no block)" if got and got > want and 0 in c else ""
            return exercises.report("padding_rows", f"padding_rows({c}, {bm}) = {got}, expected {want}{extra}",
                                    "", strict)
    return exercises.report("padding_rows", None, f"all {len(cases)} cases right", strict)


check_padding_rows(padding_rows)

# %% jupyter={"source_hidden": true}
# Solution
def padding_rows_solution(counts, block_size_m):
    return sum((-c) % block_size_m for c in counts)


check_padding_rows(padding_rows_solution, strict=True)

# %% [markdown]
# ### Taking back part of the padding price
#
# Padding rows cost tensor-core work like real ones. Two switches of `GemmConfig`, which `moe-lab tune`
# sets per shape, win some of it back:
#
# - **`tail_tiles`**: valid rows come first in every M-block, so the kernel loads the slot id halfway
#   (and a quarter of the way) into the block; if it is padding, the block runs as a half (quarter) tile.
#   Look for `TAIL_SPLITS` in `moe_lab/_kernels/grouped_matmul.py`. On the H200 it made the down GEMM
#   3–8 % faster at 64–4096 rows per expert; less than the padding share, because a half tile still reads
#   the whole weight tile.
# - **A permuted copy** (`moe_lab.permute_tokens`): the up projection could copy its gathered rows into
#   expert order once and read them through a descriptor like the down projection. The tuner chose that for
#   no entry of the H200 table, so the layer no longer offers it (docs/experiments.md, "prepermute").

# %% [markdown]
# ## 7. Look inside: print, step, and read the compiled code
#
# A kernel that gives wrong numbers, or a fast path you are not sure was taken, needs a look inside.
# Three ways, from the quickest:
#
# 1. **`tl.static_print`** runs when the kernel is *compiled* (once per specialization) and prints
#    compile-time facts: constexprs, block shapes, dtypes. **`tl.device_print`** runs in every program
#    and prints run-time values. Under the interpreter both go to this notebook, and since nothing is
#    compiled there, `static_print` prints once per program. On a GPU `device_print` writes from the GPU
#    to the process's standard output, which in Jupyter is the terminal the server runs in, not the cell:
#    `workbook.capture_device_print()` catches it around the launch and shows it here (under the
#    interpreter it changes nothing). Keep the grid and the blocks tiny: every thread prints.

# %%
@triton.jit
def peek_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.static_print("compiling peek_kernel, BLOCK =", BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.device_print("x", x)
    tl.store(out_ptr + offs, 2 * x, mask=offs < n)


x_peek = torch.arange(6, dtype=torch.float32, device=device)
out_peek = torch.empty_like(x_peek)
with workbook.capture_device_print():  # on a GPU: waits for the kernel, then prints its device_print text here
    peek_kernel[(2,)](x_peek, out_peek, 6, BLOCK=4)
_ = workbook.check("peek_kernel", out_peek, 2 * x_peek, tol=1e-6)

# %% [markdown]
# 2. **A debugger, under the interpreter.** With `TRITON_INTERPRET=1` a kernel is ordinary Python run once
#    per program, so `breakpoint()` inside it stops there, and `p offs`, `p x` show the blocks as numpy
#    arrays (`c` goes on to the next program, `q` stops). JupyterLab's debugger (the bug icon) stops at a
#    breakpoint set in a kernel's cell the same way. Remove the `breakpoint()` before compiling for a GPU:
#    Triton cannot compile it.
#
#    ```python
#    @triton.jit
#    def peek_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
#        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
#        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
#        breakpoint()          # (Pdb) p offs  ->  array([0, 1, 2, 3], dtype=int32)
#        ...
#    ```
#
# 3. **The compiled code.** Triton lowers a kernel through its own IRs to **PTX**, NVIDIA's virtual GPU
#    assembly, which `ptxas` turns into machine code. Compiling needs no GPU, only a target, so this works
#    on a laptop: `moe_lab.tools.look_inside` compiles the package's grouped matmul for a chosen GPU in a child
#    process (with the interpreter off) and counts the instructions that move tiles. The layout is the
#    down projection's (rows already in sorted order), where both A and w can go through descriptors.

# %%
from moe_lab.tools import look_inside

compiled = {(path, cc): look_inside.compile_grouped_matmul(path, cc)
            for path, cc in (("tma", 90), ("pointer", 90), ("tma", 80))}
for kernel_code in compiled.values():
    print(kernel_code.summary())
print()
for instruction, meaning in look_inside.MEMORY_INSTRUCTIONS.items():
    print(f"{instruction:<27} {meaning}")

# %% [markdown]
# The TMA path still holds a few `cp.async` copies and `mma.sync`: the tail tiles (a mostly padded block run
# as a half or quarter tile) read A by pointer, since the descriptor's box is BLOCK_SIZE_M rows, and
# multiply with `mma.sync`, since `wgmma` works on 64 rows at a time.
#
# The TMA copies of the sm_90 kernel. The coordinates in braces go innermost first: `{k0, row}` for the
# 2-D descriptor of A, `{k0, n0, expert}` for the 3-D weight descriptor, the load at `[expert, n0, k0]`
# that this notebook built. One thread issues each copy; the `mbarrier` tells the waiting warps when the
# box's bytes have arrived.

# %%
tma_code = compiled[("tma", 90)]
for line in tma_code.lines("cp.async.bulk.tensor", limit=2):
    print(line)
print("...")
for line in compiled[("pointer", 90)].lines("cp.async.cg.shared.global", limit=2):
    print(line)
tma_copies = {key: code.count("cp.async.bulk.tensor") for key, code in compiled.items()}
if not (tma_copies[("tma", 90)] > 0 and tma_copies[("pointer", 90)] == 0 and tma_copies[("tma", 80)] == 0):
    raise AssertionError(f"FAIL look inside: TMA copies per (path, target) {tma_copies}; expected some on the "
                         "sm_90 TMA path only")
print(f"PASS look inside: {tma_copies[('tma', 90)]} TMA copies on sm_90's TMA path, none on its pointer path "
      "or on sm_80 (no TMA there: the same request takes pointer loads)")

# %% [markdown]
# The pointer path moves the same tiles with `cp.async.cg.shared.global`: every thread copies 16 bytes
# (`0x10`), so a 64x64 fp16 tile takes 512 of them spread over the warps, plus the address arithmetic for
# each. With TMA one thread hands over a descriptor and two coordinates, and the copy engine does the rest,
# which frees registers and issue slots for the math (`wgmma.mma_async`, Hopper's warpgroup matmul).
# On a GPU, a kernel you launched keeps its compiled forms too: `k = my_kernel[grid](...)` returns it,
# and `k.asm["ptx"]` (also "ttir", "ttgir", "llir", "cubin") holds each stage.

# %% [markdown]
# ## Summary
#
# - Weights: a 3-D descriptor, block `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`, for both GEMMs.
# - Down projection token rows: a 2-D descriptor on the expert-sorted, padded `act`, block
#   `[BLOCK_SIZE_M, BLOCK_SIZE_K]` at `[b·BLOCK_SIZE_M, k0]`.
# - Up projection token rows are gathered: pointer loads on Hopper (TMA gather needs Blackwell).
# - Padding each expert to BLOCK_SIZE_M keeps every box inside one expert; a packed layout would need tiles
#   per expert and masked stores.
# - Both paths give the same numbers; on the H200 TMA pays off once tiles are full (T ≥ a few hundred).
# - Tail tiles win back part of the padding cost; the tuner decides per shape.
# - To look inside a kernel: `tl.static_print` (compile time), `tl.device_print` (run time), `breakpoint()`
#   under the interpreter, and the PTX, which shows the TMA copies (`cp.async.bulk.tensor`) on sm_90's TMA
#   path only, compiled here without a GPU (`moe_lab.tools.look_inside`).
#
# Next: notebook 06 puts all stages together into the fused MoE layer.
