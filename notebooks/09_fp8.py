# %% [markdown]
# # 09 · FP8: block-scaled weights and activations (w8a8)
#
# Notebooks 03 to 08 multiplied bf16 numbers. At decode sizes the grouped GEMM's time is the time to read
# the experts' weights from memory (07), and moe-lab already reads them near the memory's limit; the one
# way left to go faster there is to read fewer bytes. DeepSeek-V3 ships its experts in FP8: one byte per
# weight, in the e4m3 format, with one float32 scale per 128 x 128 block of each weight matrix, and it
# quantizes activations to FP8 too, with one scale per token per 128 channels ("w8a8": 8-bit weights and
# 8-bit activations). moe-lab runs that format; this notebook shows what it is and what it costs.
#
# **Goals**
# 1. Read e4m3: 4 exponent bits, 3 mantissa bits, largest value 448, and a grid whose spacing doubles
#    every power of two.
# 2. See why a tensor needs a scale before it fits in e4m3, and why one scale per 128 x 128 block rather than
#    one per tensor: one outlier, measured.
# 3. Draw a weight matrix's scales over it, and quantize activations per token per 128 channels.
# 4. Write the quantization kernel yourself (exercise), checked bit for bit against moe-lab's.
# 5. Find where the scales enter the grouped GEMM's K loop, and why each dot lies in one 128-channel group.
# 6. Measure the accuracy cost: the kernel against the same math done in float32, and FP8 against bf16.
# 7. Timings: live on a GPU, committed H200 data otherwise.

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

from moe_lab import GemmConfig, workbook
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import fp8 as fp8_viz

device = moe_lab.runtime.default_device()
support = moe_lab.fp8_support(device)
print("FP8 kernels can run here:", support.available)
print("why:", support.reason)

# %% [markdown]
# FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper: H100, H200). Under the
# interpreter e4m3 is emulated on the CPU: right numbers (its float8 cast rounds a few values wrongly, which
# moe-lab's kernels and section 4's exercise work around), no speed. On an older GPU `fp8_support` says no,
# and the FP8 functions raise an error that says so.
#
# ## 1. e4m3: eight bits
#
# A float8_e4m3fn number is 1 sign bit, 4 exponent bits (bias 7) and 3 mantissa bits. A normal value is
# `(-1)^s * 2^(e-7) * 1.mmm` (binary); exponent bits 0000 give the subnormals `2^-6 * 0.mmm`. The "fn" says
# finite: there is no infinity, and only the codes with every exponent and mantissa bit set (S.1111.111) are
# NaN, so S.1111.110 = 2^8 * 1.75 = **448** is the largest value. (Its sibling e5m2 trades a mantissa bit for
# range, up to 57344; DeepSeek-V3 uses e4m3 for every tensor and gets range from its scales instead,
# arXiv:2412.19437 §3.3.2, "Mantissa over Exponents".)
#
# torch decodes all 256 codes for us:

# %%
# NBVAL_CHECK_OUTPUT
codes = torch.arange(256, dtype=torch.uint8)
values = codes.view(torch.float8_e4m3fn).float()
finite = values[torch.isfinite(values)]
positive = finite[finite > 0].unique()
print(f"{codes.numel()} codes: {int(torch.isnan(values).sum())} NaN, {finite.numel()} finite "
      f"({positive.numel()} positive, their negatives, +0 and -0)")
print(f"largest {positive.max().item():g}, smallest normal 2^-6 = {2 ** -6:g}, smallest subnormal 2^-9 = "
      f"{positive.min().item():g}")
print(f"{'binade':>16} {'values':>6} {'spacing':>9}")
for e in range(-6, 9):
    inside = positive[(positive >= 2.0 ** e) & (positive < 2.0 ** (e + 1))]
    print(f"[2^{e:<3}, 2^{e + 1:<3}) {inside.numel():>6} {(inside[1] - inside[0]).item():>9g}")

# %% [markdown]
# Eight values per binade (the top one has seven: its eighth code is NaN), so the spacing doubles from one
# power of two to the next: 0.125 between 1 and 2, 32 between 256 and 448. The relative step is the same
# everywhere, 1/16 to 1/8 of the value, so rounding to the nearest e4m3 value costs up to 1/32 to 1/16 of
# it (3 to 6 %). Drawn: the linear axis shows the spacing grow, the log axis shows every binade alike.

# %%
fp8_viz.plot_e4m3_grid()

# %% [markdown]
# Rounding to e4m3, as torch's cast does it (round to the nearest value, ties to even):

# %%
# NBVAL_CHECK_OUTPUT
x = torch.tensor([0.3, 3.14159, 100.0, 127.9, 300.0, 448.0, 0.01, 0.0001])
q = x.to(torch.float8_e4m3fn).float()
for before, after in zip(x.tolist(), q.tolist()):
    print(f"{before:>9g} -> {after:<9g} relative error {abs(after - before) / before:.3f}")

# %% [markdown]
# 127.9 rounds up into the next binade, to 128. 0.01 lands among the subnormals, the multiples of
# 2^-9 = 0.00195 (it became 5 x 2^-9): below 2^-6 the spacing stops shrinking, so the smaller a value there,
# the fewer bits it keeps. 0.0001 is below half the smallest subnormal and becomes 0. What a cast does
# with a value above 448 depends on who casts (448, or NaN), so quantizers clamp to [-448, 448] before they
# cast.
#
# ## 2. Scales, and why blocks
#
# A weight of an expert initialised like `nn.Linear` is at most 1/sqrt(H): 0.012 at DeepSeek-V3's H = 7168,
# below 2^-6 = 0.0156, where e4m3 has only subnormals left. So a tensor is stored as `q = x / s` in e4m3 with
# a float32 scale `s`, and `x ≈ q * s`. The best `s` maps the largest |x| to 448: `s = amax / 448`. Then every
# value down to 2^-6 / 448 = 1/28672 of the largest is a normal e4m3 number and keeps its 3 mantissa bits:
# e4m3's exponent covers a spread of about 3 x 10^4.
#
# One `s` for what, though? One for the whole tensor puts every value under the largest one. The
# measurement: a 1024 x 2048 weight matrix with DeepSeek-V3's initial magnitude, quantized without a scale,
# with one scale, one per row and one per 128 x 128 block; then with one weight made 100, 10^4 and 10^5 times
# larger than the largest of the others. The error is the relative Frobenius error of the dequantized
# matrix (`q * s`) on the other weights. The last row quantizes to int8 with one scale, for contrast: its
# 255 steps are evenly spaced.

# %%
# NBVAL_CHECK_OUTPUT
gen = torch.Generator().manual_seed(0)
N, K = 1024, 2048
w = (torch.rand(1, N, K, generator=gen) * 2 - 1) / 7168 ** 0.5    # one expert: [E = 1, N, K]
OUTLIER = (300, 1500)
others = torch.ones(1, N, K, dtype=torch.bool)
others[0, OUTLIER[0], OUTLIER[1]] = False
FORMATS = {"e4m3, no scale": None, "e4m3, one per tensor": dict(block_shape=None),
           "e4m3, one per row": dict(block_shape=None, per_channel=True),
           "e4m3, one per 128 x 128 block": dict(block_shape=(128, 128)), "int8, one per tensor": "int8"}


def dequantized(weights, fmt):
    if fmt is None:  # cast as it is (clamped, so nothing becomes NaN)
        return weights.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    if fmt == "int8":
        s = weights.abs().max() / 127
        return (weights / s).round().clamp(-127, 127) * s
    q, s = moe_lab.quantize_weights_fp8(weights, **fmt)
    return moe_lab.dequantize_fp8(q, s, fmt.get("block_shape"))


FACTORS = (1, 100, 10 ** 4, 10 ** 5)
print(f"{'outlier / largest other:':<30}" + "".join(f"{'x' + format(f, 'g'):>9}" for f in FACTORS))
for name, fmt in FORMATS.items():
    errors = []
    for factor in FACTORS:
        w_outlier = w.clone()
        w_outlier[0, OUTLIER[0], OUTLIER[1]] = factor * w.abs().max()
        errors.append(moe_lab.relative_error(dequantized(w_outlier, fmt)[others], w[others]))
    print(f"{name:<30}" + "".join(f"{e:>9.3f}" for e in errors))

# %% [markdown]
# - Without a scale the smallest weights fall among the subnormals: 8 % error.
# - With any scale, about 2.6 %: e4m3's own rounding, the 3 mantissa bits.
# - One outlier 100 or 10^4 times larger costs e4m3 with one scale per tensor almost nothing: the exponent
#   absorbs it, the other weights just move down a few binades. int8, whose steps are evenly spaced, loses a
#   third of the other weights' signal at 100, and all of it at 10^4 (they all round to 0).
# - At 10^5 the spread passes e4m3's range: with one scale per tensor the other weights sink into the
#   subnormals and lose their bits. One scale per row or per block confines the damage to the outlier's own
#   row (2048 weights) or block (16384).
#
# Weights rarely spread that far; activations do. A few activations of large language models are about
# 10^5 times larger than the rest, always in the same few channels, for the same few tokens (Sun et al.,
# "Massive Activations in Large Language Models", arXiv:2402.17762). That is where section 4 goes. And
# blocks rather than rows for the weights: a GEMM sums over K, so the activations' scales must change along
# K where their outliers are, every 128 channels, and the weights' scales then change along K at the same
# places. Both are constant inside each 128-channel group, which is what the K loop needs (section 5).
# DeepSeek-V3's config.json: `"quantization_config": {"fmt": "e4m3", "weight_block_size": [128, 128]}`.
#
# ## 3. A weight matrix's scales, drawn
#
# `quantize_weights_fp8(w)` returns `w_scale [E, ceil(N/128), ceil(K/128)]`: 8 x 16 scales for our matrix,
# here with the 10^5 outlier (the red cross). Each block is coloured by its scale.

# %%
w_outlier = w.clone()
w_outlier[0, OUTLIER[0], OUTLIER[1]] = 10 ** 5 * w.abs().max()
w_q, w_scale = moe_lab.quantize_weights_fp8(w_outlier, block_shape=(128, 128))
print("w_q:", tuple(w_q.shape), w_q.dtype, "  w_scale:", tuple(w_scale.shape), w_scale.dtype)
fp8_viz.plot_scale_blocks(w_scale[0], (N, K), (128, 128), marks=[OUTLIER],
                          title="w_scale over the 1024 x 2048 matrix: one float32 per 128 x 128 block")

# %% [markdown]
# Every block's scale is about `(1/sqrt(7168)) / 448`, except the outlier's, 10^5 times larger. The scales
# cost little: one float32 per 16384 one-byte weights.

# %%
# NBVAL_CHECK_OUTPUT
ds = moe_lab.get_preset("deepseek-v3")
n1, k1 = 2 * ds.intermediate_size, ds.hidden_size
blocks = triton.cdiv(n1, 128) * triton.cdiv(k1, 128)
print(f"DeepSeek-V3, one expert's w1 [2I, H] = [{n1}, {k1}]: {n1 * k1 / 2 ** 20:.1f} MiB of e4m3, "
      f"{blocks} scales = {4 * blocks / 2 ** 10:.1f} KiB ({100 * 4 * blocks / (n1 * k1):.3f} %); in bf16 the weights "
      f"take {2 * n1 * k1 / 2 ** 20:.1f} MiB")

# %% [markdown]
# ## 4. Activations: one scale per token per 128 channels
#
# Activations are made while the model runs, so their scales are computed then, by a kernel:
# `quantize_activations_fp8(x, group_size=128)` returns `x_fp8 [T, K]` and `x_scale [T, ceil(K/128)]`, one
# scale per token (row) per 128 consecutive channels: DeepSeek-V3's "1 x 128 tiles" (§3.3.2). Below, 16
# tokens of H = 1024 channels, where token 0 carries two massive activations, 10^5 in channels 7 and 300
# (the rest are about 1). Three ways to scale them: one scale for the whole tensor (`per_tensor=True`), one
# per token (`group_size=None`), one per token per 128 channels. The error is measured on the other values:
# all of them, and token 0's.

# %%
# NBVAL_CHECK_OUTPUT
T, H = 16, 1024
x = torch.randn(T, H, generator=gen)
x[0, [7, 300]] = 1e5
x = x.to(device)
ordinary = torch.ones(T, H, dtype=torch.bool, device=device)
ordinary[0, [7, 300]] = False
clean_groups = ordinary.clone()
clean_groups[0, 0:128] = False    # token 0's groups 0 and 2, which hold its massive activations
clean_groups[0, 256:384] = False
print(f"{'scales':<28} {'x_scale':>8} {'error':>7} {'in token 0':>11}")
for name, kwargs, block in (("one per tensor", dict(per_tensor=True), None),
                            ("one per token", dict(group_size=None), None),
                            ("one per token per 128", dict(group_size=128), (1, 128))):
    x_q, x_scale = moe_lab.quantize_activations_fp8(x, **kwargs)
    deq = moe_lab.dequantize_fp8(x_q, x_scale, block_shape=block)
    print(f"{name:<28} {str(list(x_scale.shape)):>8} {moe_lab.relative_error(deq[ordinary], x[ordinary]):>7.3f} "
          f"{moe_lab.relative_error(deq[0][ordinary[0]], x[0][ordinary[0]]):>11.3f}")
print(f"one per token per 128, outside token 0's groups 0 and 2: "
      f"{moe_lab.relative_error(deq[clean_groups], x[clean_groups]):.3f}")

# %% [markdown]
# One scale per tensor coarsens every token; one per token, all of token 0; one per token per 128 channels,
# only token 0's channels 0..127 and 256..383, and every other value keeps e4m3's own rounding error. The
# scales of the first four tokens, drawn over them (the last call's `x_scale`): token 0's groups 0 and 2
# stand out.

# %%
fp8_viz.plot_scale_blocks(x_scale[:4], (4, H), (1, 128),
                          title="x_scale of tokens 0..3: one scale per token per 128 channels")

# %% [markdown]
# ### Exercise: quantize rows, one scale per 128 channels
#
# Write `quantize_rows_kernel`, the kernel behind `quantize_activations_fp8(x, group_size=GROUP)`:
#
# - `x [rows, K]` float32, `q [rows, K]` float8_e4m3fn, `scale [rows, tl.cdiv(K, GROUP)]` float32, all
#   contiguous. The grid is `(rows, tl.cdiv(K, GROUP))`: program `(row, group)` quantizes channels
#   `group * GROUP .. group * GROUP + GROUP - 1` of its row. K is not a multiple of GROUP: mask (`cols < K`,
#   and `other=0.0` on the load, so the lanes past K add nothing to the amax).
# - `amax = max(max |x| over the group, 1e-10)` (the floor keeps an all-zero group from dividing 0 by 0),
#   `scale = amax / 448`.
# - `q = clamp(x / scale, -448, 448)`, then `q = round_to_e4m3_grid(q)`, then store `q.to(tl.float8e4nv)`.
# - Store the scale at `scale_ptr + row * tl.cdiv(K, GROUP) + group`, the layout the GEMM reads.
#
# **Why `round_to_e4m3_grid`.** The checker compares your q and scales with `quantize_activations_fp8`'s
# **bit for bit**. Triton's interpreter casts float32 to float8e4nv wrongly where rounding carries into the
# next power of two (127.9 becomes 64, not 128: about one value in fifty here); a GPU's cast is right.
# `round_to_e4m3_grid` rounds to the e4m3 grid first (a few integer operations on the float's bits), so the
# interpreter's cast has nothing left to round; on a GPU it changes nothing. moe-lab's own kernel calls it
# under the interpreter. The other way out, grading dequantized values with a tolerance, would have to
# forgive a wrong value of half its size, and the slips this exercise is about (a scale one rounding off, a
# group boundary a few channels off) would hide inside that tolerance: a bit-for-bit PASS means your kernel
# computes what the package's does.
#
# **Divisions.** On an NVIDIA GPU a plain `/` in Triton is a fast division that can be off in the last bit;
# moe-lab's kernel divides with `tl.math.div_rn(a, b)`, rounded as torch rounds (the solution does too). The
# checker runs your kernel under the interpreter on every machine, a GPU included, where `/` is exact, so
# either passes here.
#
# (The clamp: with `scale = amax / 448`, no `|x| / scale` passes 448 by more than a rounding, and
# `round_to_e4m3_grid` saturates at 448 anyway, so the checker cannot see a missing clamp. It matters for a
# static, calibrated scale, which `quantize_activations_fp8(x, scale=...)` also takes.)
#
# The checker runs 5 rows of K = 200 in groups of 128 (the last group 72 wide, one group all zero), then 3
# rows of K = 300 in groups of 64, with q and the scales poisoned (NaN).

# %%
from moe_lab._kernels.common import round_to_e4m3_grid


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    row = tl.program_id(0)
    group = tl.program_id(1)
    # TODO: the group's columns, and x loaded at row * K + cols (masked: cols < K, other=0.0)
    # TODO: amax = max |x| (at least 1e-10); scale = amax / 448 (tl.math.div_rn)
    # TODO: q = clamp(x / scale, -448, 448), then round_to_e4m3_grid(q); store q.to(tl.float8e4nv), masked
    # TODO: store scale at scale_ptr + row * tl.cdiv(K, GROUP) + group


# %%
exercises.check_quantize_rows(quantize_rows_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def quantize_rows_kernel_solution(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    row = tl.program_id(0)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10)
    scale = tl.math.div_rn(amax, 448.0)
    q = tl.math.div_rn(x, tl.zeros_like(x) + scale)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    q = round_to_e4m3_grid(q)
    tl.store(q_ptr + row * K + cols, q.to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptr + row * tl.cdiv(K, GROUP) + group, scale)


exercises.check_quantize_rows(quantize_rows_kernel_solution, strict=True)

# %% [markdown]
# ## 5. Where the scales enter the K loop
#
# A GEMM sums over K. Cut K into groups of 128: inside group g the token's scale `a_s[m, g]` and the weight
# block's scale `w_s[n // 128, g]` are constants, so they come out of that group's part of the sum:
#
# `C[m, n] = Σ_k x[m, k] w[n, k] ≈ Σ_g a_s[m, g] * w_s[n // 128, g] * Σ_{k in group g} q_x[m, k] q_w[n, k]`
#
# The inner sums are what FP8 tensor cores compute. The grouped GEMM's K loop for block scales
# (`_k_loop_block_scaled` in `moe_lab/_kernels/grouped_matmul.py`) does exactly this, one BLOCK_SIZE_K
# step at a time:
#
# ```python
# for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
#     a = ...                                             # [TILE_M, BLOCK_SIZE_K] e4m3 token rows
#     w = ...                                             # [BLOCK_SIZE_K, BLOCK_SIZE_N] e4m3 weights
#     group = (kb * BLOCK_SIZE_K) // SCALE_GROUP_K        # which 128-channel group this step lies in
#     a_s = tl.load(a_scale_ptrs + group * stride_ask)    # [TILE_M]: each row's scale of that group
#     w_s = tl.load(w_scale_ptrs + group * stride_wsk)    # [BLOCK_SIZE_N]: each weight row's block scale
#     acc += tl.dot(a, w) * (a_s[:, None] * w_s[None, :])
# ```
#
# - **One dot per group.** A step of 64 or 128 lies inside one group, so one pair of scale vectors serves
#   the whole step. One dot over 256 channels would sum two groups with different scales into one product,
#   and no scale could be pulled out of it; so a step of 256 (larger loads, which decode wants) runs two
#   dots of 128, each scaled by its own group's scales. Other sizes are lowered to divide the group.
# - **Each step's product is scaled, then added in float32.** `tl.dot(a, w)` is a fresh float32 tile per
#   step, not accumulated inside the tensor cores (`tl.dot(a, w, acc)`, as the bf16 loop does). Besides the
#   scales, there is a second reason: on Hopper the FP8 MMA instruction keeps only about 14 bits of its
#   accumulator (DeepSeek-V3 §3.3.2, "Increasing Accumulation Precision"), fine for one step of 128 products
#   and not for the 7168 of a whole row. DeepSeek moves partial sums to float32 every 128 elements; here
#   every step does.
# - Per-channel weights with per-token activations ("outer" scales) have one scale per row for all of K:
#   there the sum of the unscaled steps is scaled once, after the loop.
# - **The loop above is the general case.** When all of a tile's weight rows lie in one 128-row block (tiles
#   of up to 128 columns, as the tuned ones are), `w_s` is one number per step, not a vector: the kernel
#   loads it as a scalar, folds it into the rows' scales (`a_s * w_s`, two multiplies per thread instead of
#   one per element) and loads the next step's scales a step ahead, so their latency hides behind this step's
#   MMA (the `SCALES == "block_tile"` branch). Same numbers, bit for bit; 13 to 15 % faster in prefill on an
#   H200.
#
# The lines of `_k_loop_block_scaled`, the K loop of the installed moe-lab's float8 tiles with block scales,
# that read or apply the scales (`_step_scales` loads a step's, `_dot_scale` picks a dot's):

# %%
import inspect
import re

from moe_lab._kernels import grouped_matmul as gemm_kernels

loop = gemm_kernels._k_loop_block_scaled.fn  # .fn: the Python function under @triton.jit
lines, first = inspect.getsourcelines(loop)
body = [i for i, line in enumerate(lines) if '"""' in line][1] + 1  # the lines after the docstring
scale_words = r"\b(next_|step_)?([aw]|w_up)_s\b|\bscale =|\bgroup =|_scale_(ptrs?|expert) =|SCALES ==|acc \+="
for number, line in enumerate(lines[body:], first + body):
    if re.search(scale_words, line):
        print(f"grouped_matmul.py:{number:<4} {line.rstrip()}")

# %% [markdown]
# The FP8 up GEMM, run: 8 tokens, 4 experts, K = 384 (three groups), block scales, and a config asking for
# BLOCK_SIZE_K = 256. The plan keeps it and runs two dots of 128 per step, one per group; the result matches
# the same sums done in float32 on the dequantized operands (`q * scale`), so the kernel adds only float32
# rounding to the quantization.

# %%
# NBVAL_CHECK_OUTPUT
T_UP, E_UP, TOP_K_UP, N_UP, K_UP = 8, 4, 2, 256, 384
a = torch.randn(T_UP, K_UP, generator=gen).to(device)
w_up = (torch.randn(E_UP, N_UP, K_UP, generator=gen) / K_UP ** 0.5).to(device)
ids = torch.rand(T_UP, E_UP, generator=gen).topk(TOP_K_UP, dim=1).indices.to(torch.int32).to(device)
routing = moe_lab.moe_align(ids, E_UP, 16)
a_q, a_scale = moe_lab.quantize_activations_fp8(a, group_size=128)
w_up_q, w_up_scale = moe_lab.quantize_weights_fp8(w_up, block_shape=(128, 128))
out, plan = moe_lab.grouped_matmul(a_q, w_up_q, routing, GemmConfig(16, 64, 256, 1, 4, 1), gather_a=True,
                                   a_scale=a_scale, w_scale=w_up_scale, block_shape=(128, 128),
                                   out_dtype=torch.float32, return_plan=True)
print("scales:", plan.scales, "  BLOCK_SIZE_K asked 256, launched", plan.config.BLOCK_SIZE_K,
      f"in {plan.dots_per_step} dots of {plan.box_k}")
used = routing.num_tokens_post_padded.item()
rows = routing.sorted_token_ids[:used]
valid = rows < routing.num_slots
experts = routing.expert_ids[torch.arange(used, device=device) // 16][valid]
a_deq = moe_lab.dequantize_fp8(a_q, a_scale, block_shape=(1, 128))
w_deq = moe_lab.dequantize_fp8(w_up_q, w_up_scale, block_shape=(128, 128))
want = workbook.expert_rows_matmul(a_deq[(rows[valid] // TOP_K_UP).long()], w_deq, experts)
_ = workbook.check("FP8 up GEMM vs float32 math on the dequantized operands", out[:used][valid], want, tol=1e-5)

# %% [markdown]
# ## 6. The accuracy cost, measured
#
# The layer: DeepSeek-V3's shape (on a CPU with H and I divided by 16), one GPU's share of its experts as it
# is served with 8-way expert parallelism: 32 of the 256, given to `fused_moe` with an `expert_map` (tokens
# routed elsewhere contribute zero here). Two errors per format, both relative Frobenius:
#
# - **kernel**: the FP8 layer against `fused_moe_reference` given the same FP8 weights and scales, which
#   dequantizes them and quantizes each GEMM's input as the layer does, then computes in float32: what the
#   kernels add (mostly the bf16 rounding of the output).
# - **vs bf16 weights**: the FP8 layer against the float32 reference on the original weights: what FP8
#   costs.
#
# The weights come from the preset (uniform, no outliers), so the three formats come out close; sections 2
# and 4 showed where they part.

# %%
preset = moe_lab.get_preset("deepseek-v3").scaled(workbook.pick(1, 16))
TOKENS, LOCAL = workbook.pick(256, 32), 32
hidden_states, w1_all, w2_all, (topk_weights, topk_ids) = preset.build(TOKENS, device=device)
expert_map = torch.full((preset.num_experts,), -1, dtype=torch.int32, device=device)
expert_map[:LOCAL] = torch.arange(LOCAL, dtype=torch.int32, device=device)
w1, w2 = w1_all[:LOCAL].contiguous(), w2_all[:LOCAL].contiguous()
del w1_all, w2_all
print(f"H = {preset.hidden_size}, I = {preset.intermediate_size}, {LOCAL} of {preset.num_experts} experts, "
      f"T = {TOKENS}, {int((topk_ids < LOCAL).sum())} of {topk_ids.numel()} (token, expert) slots local")

ref_bf16_weights = moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids, expert_map=expert_map)
out_bf16 = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, expert_map=expert_map)
print(f"{'format':<30} {'kernel':>8} {'vs bf16 weights':>16}")
print(f"{'bf16 (for comparison)':<30} {moe_lab.relative_error(out_bf16, ref_bf16_weights):>8.1e} {'':>16}")
LAYER_FORMATS = {"block 128 x 128, 1 x 128 tokens": dict(block_shape=(128, 128)),
                 "per channel, per token": dict(block_shape=None, per_channel=True),
                 "per tensor, per token": dict(block_shape=None)}
for name, fmt in LAYER_FORMATS.items():
    w1_q, w1_scale = moe_lab.quantize_weights_fp8(w1, **fmt)
    w2_q, w2_scale = moe_lab.quantize_weights_fp8(w2, **fmt)
    scales = dict(w1_scale=w1_scale, w2_scale=w2_scale, block_shape=fmt["block_shape"], expert_map=expert_map)
    out_fp8 = moe_lab.fused_moe(hidden_states, w1_q, w2_q, topk_weights, topk_ids, **scales)
    kernel_error = moe_lab.relative_error(
        out_fp8, moe_lab.fused_moe_reference(hidden_states, w1_q, w2_q, topk_weights, topk_ids, **scales))
    print(f"{name:<30} {kernel_error:>8.1e} {moe_lab.relative_error(out_fp8, ref_bf16_weights):>16.1e}")
    assert kernel_error < 1e-2, f"FAIL {name}: the FP8 kernels differ from their reference by {kernel_error:.1e}"
print("PASS every FP8 format: kernel error below 1e-2 against the dequantized reference")

# %% [markdown]
# The kernels add about what bf16 rounding adds (a few 1e-3, the same as the bf16 layer against its own
# reference). FP8 itself costs about 6 %: two quantized GEMMs, each with both operands rounded to 3 mantissa
# bits. That is the quantization's error on random weights; whether a model's answers notice it is a
# question for its evaluation, which is why DeepSeek-V3 was trained in this format rather than converted
# to it afterwards.
#
# ## 7. What it buys, measured
#
# On a GPU the next cell times both GEMMs of DeepSeek-V3 (full size, all 256 experts) in bf16 and in FP8
# with block scales, at a few token counts, each with its default config (the activations' quantization
# kernels are not in the pair). Under the interpreter it refuses: a CPU time says nothing about a GPU.

# %%
# NBVAL_IGNORE_OUTPUT
if workbook.timing_allowed("the bf16 vs FP8 timing"):
    from moe_lab.routing import uniform_routing
    from moe_lab.tools.timing import graph_ms

    del hidden_states, w1, w2
    full = moe_lab.get_preset("deepseek-v3")
    E, k, H, I = full.num_experts, full.top_k, full.hidden_size, full.intermediate_size
    _, g1, g2, _ = full.build(1, device="cuda")
    (q1, s1), (q2, s2) = (moe_lab.quantize_weights_fp8(g, (128, 128)) for g in (g1, g2))
    print(f"{'T':>5} {'bf16 pair ms':>13} {'FP8 pair ms':>12} {'speedup':>8}   ({torch.cuda.get_device_name()}, "
          "CUDA-graph medians, L2 flushed)")
    for T_time in (1, 64, 4096):
        hs = torch.randn(T_time, H, device="cuda").bfloat16()
        tw, ti = uniform_routing(T_time, E, k, seed=1)
        cfg = moe_lab.default_config(T_time, E, k, H, I)
        cfg8 = moe_lab.default_config(T_time, E, k, H, I, torch.float8_e4m3fn)
        r, r8 = moe_lab.moe_align(ti, E, cfg.block_size_m), moe_lab.moe_align(ti, E, cfg8.block_size_m)
        act = moe_lab.grouped_matmul(hs, g1, r, cfg.up, gather_a=True, swiglu=True)
        out_k = torch.empty(T_time * k, H, dtype=torch.bfloat16, device="cuda")
        bf16_ms = graph_ms(lambda: moe_lab.grouped_matmul(hs, g1, r, cfg.up, gather_a=True, swiglu=True, out=act)) \
            + graph_ms(lambda: moe_lab.grouped_matmul(act, g2, r, cfg.down, gather_a=False, scatter=True,
                                                      topk_weights=tw, out=out_k))
        hs_q, hs_s = moe_lab.quantize_activations_fp8(hs, group_size=128)
        act8 = torch.empty(r8.max_num_tokens_padded, I, device="cuda")  # float32 until it is quantized
        moe_lab.grouped_matmul(hs_q, q1, r8, cfg8.up, gather_a=True, swiglu=True, a_scale=hs_s, w_scale=s1,
                               block_shape=(128, 128), out=act8)
        act_q, act_s = moe_lab.quantize_activations_fp8(act8, group_size=128, num_rows=r8.num_tokens_post_padded)
        fp8_ms = graph_ms(lambda: moe_lab.grouped_matmul(hs_q, q1, r8, cfg8.up, gather_a=True, swiglu=True,
                                                         a_scale=hs_s, w_scale=s1, block_shape=(128, 128), out=act8)) \
            + graph_ms(lambda: moe_lab.grouped_matmul(act_q, q2, r8, cfg8.down, gather_a=False, scatter=True,
                                                      topk_weights=tw, out=out_k, a_scale=act_s, w_scale=s2,
                                                      block_shape=(128, 128)))
        print(f"{T_time:>5} {bf16_ms:>13.3f} {fp8_ms:>12.3f} {bf16_ms / fp8_ms:>7.2f}x")
    del g1, g2, q1, q2

# %% [markdown]
# Committed H200 measurements (**committed data, not measured here**), as bf16 GEMM-pair time over FP8
# GEMM-pair time per model and token count: above 1 FP8 is faster; 2 is what halving the weight bytes can
# give where reading them is all the time. First, and plotted, the first experiment
# (docs/experiments.md, "FP8 w8a8, block-scaled", made with the best
# of a few configs per point, before the kernel's prefill work). Then the package's kernel today, with its
# FP8 configs tuned on the same kind of GPU: 1.4x to 1.9x up to T = 512 and 1.15x to 1.45x in prefill
# (`moe-lab bench --dtype fp8`; the table is in docs/performance.md).

# %%
try:
    experiment = fp8_viz.load_fp8_experiment()
except FileNotFoundError:
    experiment = None
    print(f"No committed FP8 measurement in this checkout (benchmarks/results/studies/{fp8_viz.FP8_EXPERIMENT}): "
          "nothing to plot; on a GPU the cell above measures it.")
if experiment is not None:
    rows = experiment["rows"]
    tokens = sorted({r["T"] for r in rows})
    print(f"{'first experiment':<16}" + "".join(f"{'T=' + str(t):>9}" for t in tokens))
    for model in dict.fromkeys(r["model"] for r in rows):
        speedup = {r["T"]: r["speedup"] for r in rows if r["model"] == model}
        print(f"{model:<16}" + "".join(f"{speedup[t]:>8.2f}x" if t in speedup else f"{'-':>9}" for t in tokens))
    for regime, inside in (("decode, T <= 64", lambda t: t <= 64), ("T = 512", lambda t: t == 512),
                           ("prefill, T >= 4096", lambda t: t >= 4096)):
        chosen = [r["speedup"] for r in rows if inside(r["T"])]
        if chosen:
            print(f"{regime:<19} FP8 pair {min(chosen):.2f}x to {max(chosen):.2f}x the speed of the bf16 pair")
# The package's kernel today, with its tuned FP8 table (`moe-lab bench --dtype fp8`, committed results):
import json
import os

from moe_lab.workbook.viz.performance import results_dir

bench_file = os.path.join(results_dir(), "fp8", "bench-fp8-NVIDIA_H200-2026-12-01_step_scales.json")
if os.path.exists(bench_file):
    with open(bench_file) as f:
        fp8_rows = [r for r in json.load(f)["rows"] if r.get("speedup_gemms")]
    print("\ntoday's kernel   " + "".join(f"{'T=' + str(t):>9}" for t in sorted({r['T'] for r in fp8_rows})))
    for model in dict.fromkeys(r["model"] for r in fp8_rows):
        print(f"{model:<16} " + "".join(f"{r['speedup_gemms']:>8.2f}x" for r in fp8_rows if r["model"] == model))
else:
    print(f"No committed FP8 bench in this checkout ({bench_file})")
figure = fp8_viz.plot_fp8_speedup(experiment) if experiment is not None else None
figure

# %% [markdown]
# How to read it (measured on an H200, Triton 3.6): at decode sizes FP8 is up to about twice as fast. The
# GEMMs read half the weight bytes, and the scales add 1/16384 to them; at T = 1 fixed costs (launch, the
# schedule) make the gain smaller. In prefill, where the tensor cores set the time, this experiment's kernel
# gained little over bf16, although Hopper's FP8 tensor cores have twice bf16's rate; the package's kernel
# now gains 1.15x to 1.45x, after each K step's weight scale became one number per tile, loaded a step ahead
# (docs/experiments.md, "One weight scale per tile"). It still does not reach that rate: each step's product is
# needed at once, to be scaled, so within a program one step's MMA cannot overlap the scaling, and the
# product is a second float32 tile beside the accumulator, so tiles larger than 64 x 128 run out of
# registers. Two or three programs per SM fill part of the gap. DeepSeek-V3 keeps its tensor cores busy with
# two warpgroups, one multiplying while the other scales and adds (§3.3.2): notebook 10 builds that kernel in
# Gluon (warp-specialized: a load warp, two MMA warpgroups), which `fused_moe` runs where the experts get 256
# rows each or more (128 for large experts); it closes part of the gap, not all (docs/experiments.md has the
# measurements).
#
# ## Summary
#
# - e4m3 keeps 3 mantissa bits (a relative step of 1/16 to 1/8) over values up to 448; a float32 scale per
#   block (`amax / 448`) brings each block's values into that range: `x ≈ q * scale`.
# - One scale per tensor lets one outlier coarsen every value; one per 128 x 128 weight block, and one per
#   token per 128 activation channels, confine it to its block or group (DeepSeek-V3's format).
# - The scales are constant inside each 128-channel group of K, so the K loop scales each group's FP8
#   product (a BLOCK_SIZE_K step is one group or part of one; at decode a step of 256 holds two, one dot
#   each) and adds it to a float32 accumulator, which also sidesteps the FP8 MMA's short accumulator.
# - Cost: the kernels add bf16-rounding-sized error to the quantized math; the quantization itself about 6 %
#   on random weights. Gain: up to about 2x in decode, where the weight bytes set the time; 1.15x to 1.45x
#   in prefill, short of the FP8 tensor cores' 2x.
