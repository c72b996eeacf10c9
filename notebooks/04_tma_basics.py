# %% [markdown]
# # 04 · TMA basics: tensor descriptors, boxes and the rules they follow
#
# Hopper GPUs (H100, H200) have a **tensor memory accelerator (TMA)**: a copy engine that moves a whole
# rectangular *box* of a tensor between global memory and shared memory in one instruction. Triton exposes
# it through **tensor descriptors**. The grouped matmul of moe-lab reads its expert weights (and, in the
# down projection, its token rows) this way.
#
# **Goals**
# 1. Know what TMA does and what a `TensorDescriptor` holds: shape, strides, block shape.
# 2. Write a 2-D copy kernel through descriptors and check it.
# 3. See what a box that runs past the edge of a tensor loads (zeros), with a real load.
# 4. Learn the alignment rules, in a small quiz checked by `moe_lab.descriptor_problem`.
# 5. Read one expert's weight tile through a 3-D descriptor over `w [E, N, K]`.
# 6. Understand how moe-lab decides whether TMA can be used (`moe_lab.tma_support()`).

# %%
# %matplotlib inline
import moe_lab  # first: picks GPU or interpreter before any kernel below is defined

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_lab import workbook
from moe_lab.viz import tma as tma_viz

device = moe_lab.runtime.default_device()
print("kernels run on:", "a GPU" if workbook.on_gpu() else "the CPU, under Triton's interpreter")

# %% [markdown]
# ## 1. What TMA is
#
# Without TMA, every thread of a program computes addresses and loads a few elements; a 64×64 tile is
# thousands of address computations and a mask per element. With TMA:
#
# - the host (or the kernel) writes a **tensor map** once: the base address, the shape and strides of the
#   tensor in global memory, and the **box** (block shape) one copy moves;
# - a program asks for "the box at coordinates `[row, col]`"; one thread issues the copy, the hardware
#   computes the addresses, fetches the box into shared memory, and **fills with zeros** whatever part of
#   the box lies outside the tensor's shape — no masks in the kernel;
# - the copy runs asynchronously, so the warps are free to do math while the next tiles arrive.
#
# In Triton the tensor map is a `TensorDescriptor`. Under the interpreter descriptors are emulated on
# the CPU: same results, no speed.

# %% [markdown]
# ## 2. A `TensorDescriptor`: shape, strides, block shape
#
# A descriptor is built on the host from a tensor: its **shape** (the bounds of valid data), its
# **strides** in elements, and the **block shape** (the box every `load` / `store` moves).

# %%
# NBVAL_CHECK_OUTPUT
x = torch.arange(12 * 20, dtype=torch.float32, device=device).reshape(12, 20)
x_desc = TensorDescriptor(x, shape=list(x.shape), strides=list(x.stride()), block_shape=[8, 8])
print("shape       ", x_desc.shape, "(elements)")
print("strides     ", x_desc.strides, "(elements; the last must be 1)")
print("block shape ", x_desc.block_shape, "(the box one load moves)")
print("box bytes   ", 8 * 8 * x.element_size())

# %% [markdown]
# ## 3. Build: a 2-D copy kernel through descriptors
#
# Each program copies one box: `src_desc.load([row, col])` returns a `[BLOCK_M, BLOCK_N]` tile and
# `dst_desc.store([row, col], tile)` writes it. No pointers, no masks: boxes at the right and bottom edges
# load zeros outside the tensor, and stores outside the tensor are dropped.

# %%
@triton.jit
def copy_2d_kernel(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    tile = src_desc.load([row, col])
    dst_desc.store([row, col], tile)


def copy_2d(src, block_shape=(8, 8)):
    """Copy a 2-D tensor box by box through tensor descriptors."""
    dst = torch.full_like(src, -1.0)  # -1 everywhere, so a missed element shows
    bm, bn = block_shape
    src_desc = TensorDescriptor.from_tensor(src, [bm, bn])
    dst_desc = TensorDescriptor.from_tensor(dst, [bm, bn])
    grid = (triton.cdiv(src.shape[0], bm), triton.cdiv(src.shape[1], bn))
    copy_2d_kernel[grid](src_desc, dst_desc, BLOCK_M=bm, BLOCK_N=bn)
    return dst


# %%
# NBVAL_CHECK_OUTPUT
workbook.check_equal("copy_2d of a 12x20 tensor with 8x8 boxes", copy_2d(x), x)
workbook.check_equal("copy_2d with 4x16 boxes", copy_2d(x, (4, 16)), x)

# %% [markdown]
# The 12×20 tensor needs 2×3 boxes of 8×8: the boxes of the last row and column stick out. The picture
# shows each program's box; orange cells are outside the tensor.

# %%
tma_viz.plot_descriptor_box((12, 20), (8, 8), [(r, c) for r in (0, 8) for c in (0, 8, 16)])

# %% [markdown]
# ## 4. A box past the edge: the out-of-bounds zero fill
#
# What does a load at `[8, 16]` return? Rows 8–15 and columns 16–23 — but the tensor ends at row 11 and
# column 19. This kernel stores the loaded box into a plain `[BLOCK_M, BLOCK_N]` buffer so we can look at it.

# %%
@triton.jit
def load_box_kernel(src_desc, out_ptr, row, col, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile = src_desc.load([row, col])
    rows = tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    tl.store(out_ptr + rows * BLOCK_N + cols, tile)


def load_box(src_desc, row, col):
    bm, bn = src_desc.block_shape
    out = torch.full((bm, bn), -1.0, device=src_desc.base.device)
    load_box_kernel[(1,)](src_desc, out, row, col, BLOCK_M=bm, BLOCK_N=bn)
    return out


# %%
# NBVAL_CHECK_OUTPUT
edge_box = load_box(x_desc, 8, 16)
print(edge_box.cpu().int())

# %%
# NBVAL_CHECK_OUTPUT
# What it must be: the 4x4 corner of x that lies inside, zeros everywhere else.
expected = torch.zeros(8, 8, device=device)
expected[:4, :4] = x[8:12, 16:20]
workbook.check_equal("box at [8, 16]: inside part copied, outside part zero", edge_box, expected)

# %%
tma_viz.plot_descriptor_box((12, 20), (8, 8), [(8, 16)], values=edge_box.cpu())

# %% [markdown]
# Move the box yourself. The column slider moves in steps of 16 bytes (4 float32 elements): see the rules
# below for why.

# %%
# NBVAL_IGNORE_OUTPUT
tma_viz.box_widget((12, 20), (8, 8), itemsize=4)

# %%
tma_viz.plot_descriptor_box((12, 20), (8, 8), [(-4, 4)], title="a box at [-4, 4]: negative offsets zero-fill too")

# %% [markdown]
# ## 5. The alignment rules
#
# The hardware (through CUDA's `cuTensorMapEncodeTiled`) and Triton require:
#
# 1. the **base address** is 16-byte aligned;
# 2. every **stride but the last** is a multiple of 16 bytes;
# 3. the **last stride is 1** (rows are contiguous);
# 4. every **block dimension is a power of two**, and the **inner block dimension holds at least 16 bytes**;
# 5. inside a kernel, a box **offset in the last dimension** must be 16-byte aligned (the interpreter
#    asserts it; keep such offsets at multiples of 16 bytes and the kernel is valid everywhere).
#
# Rules 1–4 are checked once per call by `moe_lab.descriptor_problem(tensor, block_shape)`, which returns
# `None` or the broken rule in words; the grouped matmul falls back to pointer loads when it says no.
# Rule 5, seen with a real load at column 3 (12 bytes):

# %%
# NBVAL_CHECK_OUTPUT
if moe_lab.interpreter_active():
    try:
        load_box(x_desc, 0, 3)
        print("no error?")
    except Exception as err:  # the interpreter raises InterpreterError wrapping an AssertionError
        print(type(err).__name__, "-", str(err).strip().splitlines()[-1])
else:
    print("On a GPU this is not checked for you; keep last-dimension offsets at multiples of 16 bytes.")

# %% [markdown]
# ### Exercise 1: which tensors can have a descriptor?
#
# For each case, decide: can a tensor descriptor with this block shape be built over it? Put `True` or
# `False` in `quiz_answers`, then run the check, which compares with `moe_lab.descriptor_problem` and
# says which rule each "no" breaks.

# %%
quiz_base = torch.empty(64, 64, dtype=torch.float16, device=device)
quiz = {
    "a": ("float16 [64, 64], block [16, 16]", quiz_base, [16, 16]),
    "b": ("float16 x[:, 1:] of a [64, 64], block [16, 16]", quiz_base[:, 1:], [16, 16]),
    "c": ("float16 [64, 60], block [16, 16]", torch.empty(64, 60, dtype=torch.float16, device=device), [16, 16]),
    "d": ("float32 [64, 64].t(), block [16, 16]", torch.empty(64, 64, device=device).t(), [16, 16]),
    "e": ("float16 w [8, 64, 64], block [1, 32, 4]",
          torch.empty(8, 64, 64, dtype=torch.float16, device=device), [1, 32, 4]),
    "f": ("bfloat16 w[2:5] of a [8, 64, 64], block [1, 32, 32]",
          torch.empty(8, 64, 64, dtype=torch.bfloat16, device=device)[2:5], [1, 32, 32]),
}

quiz_answers = {"a": None, "b": None, "c": None, "d": None, "e": None, "f": None}  # your answers: True / False


def check_quiz(answers):
    """Compare answers with moe_lab.descriptor_problem; print PASS/FAIL per case, hints for blanks."""
    right = 0
    for key, (label, tensor, block) in quiz.items():
        problem = moe_lab.descriptor_problem(tensor, block)
        ok = problem is None
        given = answers.get(key)
        if given is None:
            print(f"  {key}) {label}: not answered yet (hint: walk through rules 1-4 above)")
        elif given == ok:
            right += 1
            print(f"PASS {key}) {label}: {'yes' if ok else 'no — ' + problem}")
        else:
            print(f"FAIL {key}) {label}: you said {given}, but "
                  f"{'a descriptor can be built' if ok else 'it breaks a rule: ' + problem}")
    print(f"{right} of {len(quiz)} right")


check_quiz(quiz_answers)

# %% jupyter={"source_hidden": true}
# Solution to exercise 1
quiz_solution = {"a": True, "b": False, "c": False, "d": False, "e": False, "f": True}
check_quiz(quiz_solution)

# %% [markdown]
# ## 6. A 3-D descriptor over expert weights
#
# The weights of all experts sit in one tensor `w [E, N, K]` (for the up projection `w1 [E, 2I, H]`, for
# the down projection `w2 [E, H, I]`). A 3-D descriptor with block shape `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`
# loads one expert's `BLOCK_SIZE_N × BLOCK_SIZE_K` tile at `[expert, n0, k0]`; the kernel reshapes it to 2-D.
#
# Why 3-D and not a 2-D descriptor over `w.view(E*N, K)`? Bounds are checked **per dimension**: a 3-D box
# that runs past row N of expert e loads zeros, while a 2-D box would silently read expert e+1's rows.

# %%
@triton.jit
def load_expert_tile_kernel(w_desc, out_ptr, expert, n0, k0,
                            BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    tile = w_desc.load([expert, n0, k0])              # [1, BLOCK_SIZE_N, BLOCK_SIZE_K]
    tile = tile.reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
    rows = tl.arange(0, BLOCK_SIZE_N)[:, None]
    cols = tl.arange(0, BLOCK_SIZE_K)[None, :]
    tl.store(out_ptr + rows * BLOCK_SIZE_K + cols, tile)


def load_expert_tile(w, expert, n0, k0, block_n=16, block_k=16):
    w_desc = TensorDescriptor.from_tensor(w, [1, block_n, block_k])
    out = torch.empty(block_n, block_k, dtype=w.dtype, device=w.device)
    load_expert_tile_kernel[(1,)](w_desc, out, expert, n0, k0, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k)
    return out


E, N, K = 4, 32, 32
gen = torch.Generator().manual_seed(0)
w = torch.randn(E, N, K, generator=gen).to(torch.float16).to(device)

# %%
# NBVAL_CHECK_OUTPUT
workbook.check_equal("3-D box at [2, 16, 16]", load_expert_tile(w, 2, 16, 16), w[2, 16:32, 16:32])
# A box running past the end of expert 1's rows: zeros, not expert 2's rows.
tail = load_expert_tile(w, 1, 24, 0)
want = torch.zeros(16, 16, dtype=w.dtype, device=device)
want[:8] = w[1, 24:32, :16]
workbook.check_equal("3-D box at [1, 24, 0]: rows past N are zero", tail, want)

# %%
tma_viz.plot_expert_weights_box(E, N, K, (1, 16, 16), (1, 24, 0))

# %% [markdown]
# ## 7. Can this machine use TMA? `moe_lab.tma_support()`
#
# One module, `moe_lab/capability.py`, answers the question, with the reason:
#
# - Triton must have host tensor descriptors (`triton.tools.tensor_descriptor`, Triton ≥ 3.4);
# - under the interpreter descriptors are emulated: the TMA path runs (for correctness), `emulated=True`;
# - the device must be an **NVIDIA** GPU of compute capability ≥ 9.0 (Hopper). A ROCm/HIP build of PyTorch
#   answers `torch.cuda.get_device_capability()` with the AMD GPU's own architecture numbers — an RX 7900
#   (gfx1100) reports `(11, 0)` — so a bare `capability >= (9, 0)` test would say "yes" on a GPU without
#   TMA. moe-lab checks `torch.version.hip` first;
# - the environment variable `MOE_LAB_TMA` overrides: `0` never, `1` whenever the tensors allow (even
#   below 9.0, where Triton turns descriptor loads into plain loads), `auto` (default) decides as above.

# %%
support = moe_lab.tma_support()
print("available:", support.available)
print("emulated: ", support.emulated)
print("reason:   ", support.reason)
print("torch.version.hip:", torch.version.hip)

# %%
# NBVAL_CHECK_OUTPUT
def naive_has_tma(capability):
    """The trap: reads any (major, minor) as a CUDA capability."""
    return capability >= (9, 0)


for label, cap in (("NVIDIA A100", (8, 0)), ("NVIDIA H200", (9, 0)), ("AMD RX 7900 (ROCm gfx1100)", (11, 0))):
    print(f"{label:<28} capability {cap}: naive check says TMA = {naive_has_tma(cap)}")
print("-> the ROCm answer is wrong: check torch.version.hip before reading the numbers.")

# %%
# NBVAL_CHECK_OUTPUT
previous = os.environ.get("MOE_LAB_TMA")
try:
    os.environ["MOE_LAB_TMA"] = "0"
    print("MOE_LAB_TMA=0 ->", moe_lab.tma_support())
finally:
    if previous is None:
        os.environ.pop("MOE_LAB_TMA")
    else:
        os.environ["MOE_LAB_TMA"] = previous

# %% [markdown]
# ## Summary
#
# - TMA copies boxes between global and shared memory; a `TensorDescriptor` holds the tensor's shape,
#   strides and the block shape of one box.
# - A box that runs past the shape (on any side) loads zeros there; stores outside are dropped.
# - Rules: 16-byte aligned base and strides (all but the last), last stride 1, power-of-two block dims with
#   ≥ 16 bytes inside, 16-byte aligned last-dimension offsets. `moe_lab.descriptor_problem` checks 1–4.
# - Expert weights `[E, N, K]` are read with a 3-D descriptor and block `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`,
#   so a box never crosses into the next expert.
# - `moe_lab.tma_support()` decides per device (NVIDIA ≥ 9.0, ROCm excluded, `MOE_LAB_TMA` overrides).
#
# Next: notebook 05 uses these descriptors inside the grouped matmul.
