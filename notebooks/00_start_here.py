# %% [markdown]
# # 00 · Start here: check your environment
#
# This workbook builds a fast Mixture-of-Experts (MoE) layer in Triton, one kernel at a time.
# Before any MoE code, this notebook makes sure the tools work, and **fails loudly** if they do not.
#
# **Goals**
# 1. See which torch, Triton and numpy you have, and where kernels run: a GPU, or Triton's interpreter on the CPU.
# 2. Run a three-line Triton kernel and check that it really computed something (not all zeros).
# 3. Learn whether this machine can use TMA (the Hopper tensor memory accelerator), and why or why not.
# 4. See how the twelve notebooks are laid out.

# %% [markdown]
# ## 0. Setup
#
# Every notebook starts with this cell. On your own machine (`make lab`) moe-lab is installed already and
# it only says so. On a hosted notebook (a GPU runtime, or a CPU one: the interpreter needs no GPU) it
# installs moe-lab from the clone this notebook sits in, and keeps the host's torch, Triton, numpy and
# ipywidgets. It also switches on matplotlib's inline pictures.

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

# %% [markdown]
# ## 1. Versions and device
#
# `import moe_lab` comes first, always. Without a CUDA GPU it switches on Triton's interpreter
# (`TRITON_INTERPRET=1`), and that switch only works if it happens before any `@triton.jit` function is
# defined — including the kernels you write in these notebooks.

# %%
import moe_lab  # first: picks GPU or interpreter before any kernel is defined

import platform

import numpy as np
import torch
import triton
import triton.language as tl

from moe_lab import workbook

print(f"python {platform.python_version()}")
print(f"torch {torch.__version__}")
print(f"triton {triton.__version__}")
print(f"numpy {np.__version__}")
print(f"moe_lab {moe_lab.__version__}")

# %%
device = moe_lab.runtime.default_device()
print("CUDA GPU visible to PyTorch:", torch.cuda.is_available())
if torch.cuda.is_available():
    print("GPU:", torch.cuda.get_device_name(), "compute capability", torch.cuda.get_device_capability())
print("Triton interpreter on:", moe_lab.interpreter_active())
print("tensors for kernels live on:", device)
print("sizes in these notebooks:", "real model shapes" if workbook.on_gpu() else "scaled down for the CPU")

# %% [markdown]
# The interpreter runs each Triton program one after the other with numpy. It is slow, but every
# kernel in this workbook gives the same answer there as on a GPU, so you can learn without one. Two
# known traps, both handled in moe_lab and in these notebooks:
# - `tl.dot` on **bfloat16** tiles is silently wrong under the interpreter: we use float32 or float16
#   in the notebook kernels (or upcast tiles to float32 before `tl.dot`).
# - Triton 3.6's interpreter breaks loops with a runtime bound under numpy ≥ 2.4: the setup cell installs
#   numpy < 2.4 where that pair would run, and moe_lab refuses the pair with an error that says what to install.
#
# `moe-lab doctor` (here as a function) checks the rest: versions that belong together, the notebook
# extras, the front end, the tuned launch table, and what to fix.

# %%
from moe_lab.tools import doctor

environment = doctor.report()
print(environment.text())
if environment.problems:
    raise RuntimeError("FAIL environment: fix the problems listed above, then restart the kernel")
print("PASS versions: this torch/Triton/numpy combination is supported")


# %% [markdown]
# ## 2. A three-line Triton kernel
#
# Each program adds one block of `x` and `y`. The check matters: a misconfigured interpreter can
# return a buffer of zeros without any error, which would make every later check meaningless.

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + tl.load(y_ptr + offs, mask=offs < n),
             mask=offs < n)


# %%
n = 1000
x = torch.arange(n, dtype=torch.float32, device=device) + 1
y = torch.full((n,), 0.5, device=device)
out = torch.zeros(n, device=device)
add_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
if not out.abs().sum() > 0:
    raise AssertionError("FAIL: the Triton kernel returned all zeros. Was TRITON_INTERPRET set after a "
                         "kernel was defined? Restart the kernel and run `import moe_lab` first.")
err = workbook.check("add_kernel vs torch", out, x + y, tol=1e-6)

# %% [markdown]
# ## 3. Can this machine use TMA?
#
# On Hopper GPUs (compute capability 9.0, e.g. an H200) a kernel can describe a tile with a
# **tensor descriptor** and let the TMA engine copy it from global to shared memory. moe_lab decides in
# one place whether that path is allowed, and always says why.

# %%
support = moe_lab.tma_support()
print("TMA path available:", support.available)
print("emulated (interpreter):", support.emulated)
print("why:", support.reason)

# %% [markdown]
# Under the interpreter descriptors are *emulated*: the TMA code paths run and give the right numbers,
# which is enough to learn and test them, but say nothing about speed. On a GPU below capability 9.0
# the answer is "no" and moe_lab uses ordinary pointer loads. `MOE_LAB_TMA=0` turns the TMA path off.

# %% [markdown]
# ## 4. How the workbook is laid out
#
# Each notebook builds its own small version of one piece, checks it, and then shows the package's.

# %%
NOTEBOOKS = {
    "00_start_here": "environment check, interpreter, TMA support (this notebook)",
    "01_moe_in_pytorch": "router, top-k, the MoE layer in plain PyTorch, why a per-expert loop is slow",
    "02_align": "from topk_ids to a block schedule: histogram, prefix sum, scatter",
    "03_grouped_gemm_pointers": "one launch for all experts' matmuls, with pointer loads",
    "04_tma_basics": "tensor descriptors and TMA loads",
    "05_grouped_gemm_tma": "the grouped matmul with TMA loads",
    "05b_capstone": "the whole grouped GEMM written from a skeleton, up and down (the capstone)",
    "06_fused_moe_layer": "the whole layer: align, up GEMM, SiLU-and-mul, down GEMM",
    "07_performance": "measuring and tuning on an H200",
    "08_persistent_and_fused": "one program per SM walking the tiles; SiLU-and-mul in the up GEMM's epilogue",
    "09_fp8": "FP8 (e4m3) weights and activations with block scales: accuracy and speed",
    "10_warp_specialization": "a warp-specialized Hopper FP8 GEMM in Gluon: a TMA producer warp, MMA warpgroups",
}
for name, what in NOTEBOOKS.items():
    print(f"{name:<26} {what}")

# %% [markdown]
# ## 5. Words used across the workbook
#
# | term | meaning |
# |---|---|
# | **expert**, **router**, **top-k** | an MoE layer holds E small feed-forward networks (experts); a router scores them per token and each token goes to its `top_k` best |
# | `topk_ids`, `topk_weights` | `[T, top_k]`: which experts each token goes to, and the weights its outputs are summed with |
# | **slot**, `num_slots` | one (token, chosen expert) pair; there are `num_slots = T * top_k` of them |
# | `sorted_token_ids`, `expert_ids`, `num_tokens_post_padded` | the schedule the **align** step builds: slots grouped by expert, each expert padded to a multiple of `BLOCK_SIZE_M`, one expert per block of rows |
# | `w1` `[E, 2I, H]`, `w2` `[E, H, I]` | each expert's up (gate and up halves together) and down projection weights; H hidden size, I intermediate size |
# | **SwiGLU** | the experts' activation: `silu(gate) * up`, where `silu(x) = x * sigmoid(x)`; `gate` and `up` are the two halves of `x @ w1.T` |
# | **program**, **grid** | one instance of a Triton kernel, and how many are launched; `tl.program_id(0)` says which one this is |
# | **block**, **tile**, `BLOCK_SIZE_M/N/K` | the part of a tensor one program works on at once, and its sizes (powers of two) |
# | **mask** | a boolean block saying which lanes of a load or store are real; the rest are skipped, so a block may run past the end of a tensor |
# | **warp**, `num_warps` | 32 GPU threads that execute together; a program runs on `num_warps` warps |
# | **HBM**, **L2** | the GPU's main memory (an H200: 141 GB at about 4.8 TB/s) and the on-chip cache in front of it (tens of MB) |
# | **shared memory** | fast on-chip memory of one streaming multiprocessor (up to 227 KiB per program on an H200) where tiles wait for the tensor cores |
# | `num_stages` | how many tiles are loaded ahead into shared memory while the current one is multiplied (software pipelining) |
# | **TMA**, **tensor descriptor**, **block shape** | Hopper's tensor memory accelerator copies a whole tile (a box of *block shape*) to shared memory on one instruction; a *tensor descriptor* tells it the tensor's base, shape and strides |
# | **epilogue** | the last part of a matmul kernel: what happens to the finished accumulator tile before it is stored (a cast, a routed weight, an activation) |
# | **interpreter** | `TRITON_INTERPRET=1`: Triton runs kernels on the CPU with numpy, one program at a time; right answers, no speed |

# %% [markdown]
# ## Exercise: a masked kernel
#
# Write `scale_kernel` so that `out[i] = alpha * x[i]` for every `i < n`. The length `n = 1000` is not
# a multiple of `BLOCK = 256`, so the last program must mask its loads and stores. Replace the stub's
# body, then run the check cell. (The solution is in the hidden cell below it.)

# %%
@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # TODO: load x (masked), multiply by alpha, store into out (masked)
    pass


# %% [markdown]
# The checker runs your kernel on **guarded buffers**: each tensor sits inside a larger buffer with known
# values (canaries) around it, and every load and store is checked. A store past the end of `out` is
# reported with its offsets instead of corrupting memory (under the interpreter it would write into this
# Python process and can kill the Jupyter kernel; on a GPU it would often pass unnoticed). Every
# exercise in the workbook is checked this way and answers **PASS**, or **NOT YET** with what is wrong.

# %%
from moe_lab.workbook import exercises

exercises.check_scale(scale_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def scale_kernel_solution(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


exercises.check_scale(scale_kernel_solution, strict=True)

# %% [markdown]
# **Which elements did each program store?** The guarded run records every access (under the interpreter,
# and on a GPU in the interpreter's check that runs first). One row per program; the black lines are the
# ends of `out`; red cells would be stores out of bounds. Run it with your `scale_kernel`, and with the
# mask left out, to see the last program's 24 stray stores.

# %%
from moe_lab.workbook.guarded import run_guarded
from moe_lab.workbook.viz.accesses import plot_accesses

x_ex = torch.randn(1000, device=device)
run = run_guarded(scale_kernel_solution, (4,), x_ptr=x_ex, out_ptr=torch.empty_like(x_ex), alpha=2.5, n=1000,
                  BLOCK=256)
plot_accesses(run, "out_ptr")

# %% [markdown]
# ## Summary
#
# - `import moe_lab` comes first; it switches on the interpreter when there is no GPU.
# - Kernels run here on the device printed above; a simple kernel computed the right numbers.
# - `moe_lab.tma_support()` says whether the TMA path is used on this machine, and why.
# - Next: **01_moe_in_pytorch** — what an MoE layer computes, in plain PyTorch.
