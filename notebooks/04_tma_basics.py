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
# 5. Build the descriptors inside the kernel instead (`tl.make_tensor_descriptor`).
# 6. Read one expert's weight tile through a 3-D descriptor over `w [E, N, K]`.
# 7. Understand how moe-lab decides whether TMA can be used (`moe_lab.tma_support()`).

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

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_lab import workbook
from moe_lab.workbook.viz import tma as tma_viz

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
# Each program copies one box. Program `(pid_m, pid_n)` owns the box whose top-left element is at row
# `pid_m * BLOCK_M`, column `pid_n * BLOCK_N`:
#
# - `tile = src_desc.load([row, col])` returns that `[BLOCK_M, BLOCK_N]` box; the offsets are **element
#   offsets** of its corner, not block numbers;
# - `dst_desc.store([row, col], tile)` writes it to the same place of `dst`.
#
# No pointers and **no masks**: the descriptor knows the tensor's shape, so a box at the right or bottom
# edge loads zeros where it sticks out, and the part of a store outside the tensor is dropped. Strides
# are the descriptor's business too: `src` below is not contiguous, and the kernel does not care.
#
# ### Exercise: a copy through host descriptors
#
# Write `copy_2d_kernel`. The check copies a float32 `src` of 60 × 84 that is a view `x[:, :84]` of a
# 60 × 100 tensor (its rows are 100 elements = 400 bytes apart: a multiple of 16 bytes, as descriptors
# need), into a contiguous `dst` filled with NaN, with boxes of 16 × 32 on a grid of 4 × 3 programs
# (axis 0 over rows, axis 1 over columns). Neither 60 nor 84 is a multiple of the box, so the last row
# and column of boxes stick out. The
# descriptors are built on the host and passed in:
#
# ```python
# src_desc = TensorDescriptor(src, shape=[60, 84], strides=[100, 1], block_shape=[16, 32])
# dst_desc = TensorDescriptor.from_tensor(dst, [16, 32])        # shape and strides from the tensor
# copy_2d_kernel[(4, 3)](src_desc, dst_desc, BLOCK_M=16, BLOCK_N=32)
# ```

# %%
@triton.jit
def copy_2d_kernel(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    # TODO: row, col = the element offsets of this program's box
    # TODO: load the box from src_desc, store it into dst_desc at the same offsets
    pass


# %%
from moe_lab.workbook import exercises

exercises.check_descriptor_copy(copy_2d_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def copy_2d_kernel_solution(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    tile = src_desc.load([row, col])
    dst_desc.store([row, col], tile)


exercises.check_descriptor_copy(copy_2d_kernel_solution, strict=True)

# %% [markdown]
# The launcher builds both descriptors from the tensors and starts one program per box. It launches the
# solution kernel (hidden above); put yours in its place once it passes.

# %%
def copy_2d(src, block_shape=(8, 8), kernel=copy_2d_kernel_solution):
    """Copy a 2-D tensor box by box through tensor descriptors."""
    dst = torch.full_like(src, -1.0)  # -1 everywhere, so a missed element shows
    bm, bn = block_shape
    src_desc = TensorDescriptor.from_tensor(src, [bm, bn])
    dst_desc = TensorDescriptor.from_tensor(dst, [bm, bn])
    grid = (triton.cdiv(src.shape[0], bm), triton.cdiv(src.shape[1], bn))
    kernel[grid](src_desc, dst_desc, BLOCK_M=bm, BLOCK_N=bn)
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
# 4. every **block dimension is a power of two of at most 256 elements** (256 is the largest box
#    dimension the TMA unit takes; Triton's `TensorDescriptor` does not check this one), and the **inner
#    block dimension holds at least 16 bytes**;
# 5. inside a kernel, a box **offset in the last dimension** must be 16-byte aligned: offset × element
#    size a multiple of 16 bytes. The interpreter asserts it. An H200 says nothing so helpful: a
#    descriptor load at such an offset raises **"illegal instruction"**, and the CUDA context is unusable
#    from then on (every later GPU call of the process fails until the Python kernel is restarted).
#
# Rules 1–4 are checked once per call by `moe_lab.descriptor_problem(tensor, block_shape)`, which returns
# `None` or the broken rule in words; the grouped matmul falls back to pointer loads when it says no.
# Rule 5, seen with a real load at column 3 (12 bytes), under the interpreter only:

# %%
# Not a checked output: the interpreter's message here, a sentence on a GPU. The assert keeps the trap tested.
if moe_lab.interpreter_active():
    try:
        load_box(x_desc, 0, 3)
    except Exception as err:  # the interpreter raises InterpreterError wrapping an AssertionError
        message = str(err).strip().splitlines()[-1]
        print(type(err).__name__, "-", message)
    assert "16-byte aligned" in message, "the interpreter no longer refuses a misaligned box"
else:
    print("Not run on a GPU: there this load raises 'illegal instruction' and leaves the CUDA context unusable.")

# %% [markdown]
# ### Exercise: which tensors can have a descriptor?
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


def check_quiz(answers, strict=False):
    """Compare answers with moe_lab.descriptor_problem: a line per case, then the verdict."""
    right, wrong = 0, []
    for key, (label, tensor, block) in quiz.items():
        problem = moe_lab.descriptor_problem(tensor, block)
        ok = problem is None
        given = answers.get(key)
        if given is None:
            print(f"  {key}) {label}: not answered yet (hint: walk through rules 1-4 above)")
        elif given == ok:
            right += 1
            print(f"  {key}) {label}: right, {'yes' if ok else 'no — ' + problem}")
        else:
            wrong.append(key)
            print(f"  {key}) {label}: you said {given}, but "
                  f"{'a descriptor can be built' if ok else 'it breaks a rule: ' + problem}")
    problem = None if right == len(quiz) else f"{right} of {len(quiz)} right" + (
        f"; look again at {', '.join(wrong)}" if wrong else "")
    return exercises.report("descriptor quiz", problem, f"all {len(quiz)} right", strict)


check_quiz(quiz_answers)

# %% jupyter={"source_hidden": true}
# Solution
quiz_solution = {"a": True, "b": False, "c": False, "d": False, "e": False, "f": True}
check_quiz(quiz_solution, strict=True)

# %% [markdown]
# ## 6. A descriptor made inside the kernel: `tl.make_tensor_descriptor`
#
# A kernel can also build its descriptors itself, from a pointer and the same three things the host
# gives `TensorDescriptor`:
#
# ```python
# src_desc = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1],
#                                      block_shape=[BLOCK_M, BLOCK_N])
# ```
#
# - **shape**: the real tensor's sizes. They are the bounds: outside them a load gives zeros and a store
#   is dropped. Since the kernel computes them, they can depend on what only the kernel knows, such as
#   the rows of one expert, so that a box stops at that expert's last row.
# - **strides** in elements, the row stride first; the last one is 1.
# - **block shape**: constexpr, the box every `load` / `store` moves.
#
# Two things differ from host descriptors:
#
# - nothing checks rules 1–4 when the descriptor is made: strides that are not multiples of 16 bytes are
#   your problem;
# - on a GPU the kernel writes the descriptor (a 128-byte tensor map) into global memory, and asks Triton
#   for that scratch memory, which Triton takes from an **allocator** you set with `triton.set_allocator`.
#   The allocator lives in a `ContextVar`, and Jupyter does not carry those from one cell to the next:
#   set it **in the cell that launches**. (The checker below does it for you; the interpreter needs none.)
#
# ```python
# def scratch(size, alignment, stream):
#     return torch.empty(size, dtype=torch.int8, device="cuda")
#
# triton.set_allocator(scratch)    # same cell as the launch
# copy_2d_device_kernel[(4, 3)](src, dst, 60, 84, src.stride(0), dst.stride(0), BLOCK_M=16, BLOCK_N=32)
# ```
#
# ### Exercise: a copy through descriptors made in the kernel
#
# Write `copy_2d_device_kernel`: the copy of section 3, with the same `src` (the 60 × 84 view,
# `stride_src_m = 100`) and `dst` (contiguous, `stride_dst_m = 84`), boxes of 16 × 32 on a 4 × 3 grid, but
# with pointers in place of descriptors. The shape you give is `[M, N]`, the tensor's own; not the
# grid's padded size (64 × 96): the descriptor takes care of the boxes that stick out.

# %%
@triton.jit
def copy_2d_device_kernel(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # TODO: src_desc = tl.make_tensor_descriptor(src_ptr, shape=..., strides=..., block_shape=...)
    # TODO: dst_desc = the same over dst_ptr
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    # TODO: copy the box at [row, col] from src_desc to dst_desc
    pass


# %%
exercises.check_device_descriptor_copy(copy_2d_device_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def copy_2d_device_kernel_solution(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    src_desc = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1],
                                         block_shape=[BLOCK_M, BLOCK_N])
    dst_desc = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_dst_m, 1],
                                         block_shape=[BLOCK_M, BLOCK_N])
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    dst_desc.store([row, col], src_desc.load([row, col]))


exercises.check_device_descriptor_copy(copy_2d_device_kernel_solution, strict=True)

# %% [markdown]
# ## 7. A 3-D descriptor over expert weights
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
# ## 8. Can this machine use TMA? `moe_lab.tma_support()`
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
# - Rules: 16-byte aligned base and strides (all but the last), last stride 1, power-of-two block dims of
#   at most 256 elements with ≥ 16 bytes inside, 16-byte aligned last-dimension offsets (broken on an H200:
#   "illegal instruction", and the CUDA context is lost). `moe_lab.descriptor_problem` checks 1–4.
# - A kernel can build its descriptors itself with `tl.make_tensor_descriptor(ptr, shape, strides,
#   block_shape)`; on a GPU it then needs `triton.set_allocator(...)`, set in the cell that launches.
# - Expert weights `[E, N, K]` are read with a 3-D descriptor and block `[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`,
#   so a box never crosses into the next expert.
# - `moe_lab.tma_support()` decides per device (NVIDIA ≥ 9.0, ROCm excluded, `MOE_LAB_TMA` overrides).
#
# Next: notebook 05 uses these descriptors inside the grouped matmul.
