# %% [markdown]
# # 06 · The fused MoE layer, stage by stage
#
# All the pieces of notebooks 01–05 make one layer: route, align, up GEMM, SiLU-and-mul, down GEMM with
# the routed weights, and a sum over the k experts of each token.
#
# **Goals**
# 1. Run the layer on a real model's shape (scaled down on the CPU, full size on a GPU).
# 2. See the data flow: each stage and the shapes it passes on.
# 3. Write a plain PyTorch MoE layer of your own, and check it against the package's reference.
# 4. Run each stage with the package's functions and check each one.
# 5. Ask `fused_moe(..., return_info=True)` which load path each GEMM used, and why.

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
import dataclasses

import moe_lab  # first: picks GPU or interpreter before any kernel is defined

import torch
import torch.nn.functional as F

from moe_lab import workbook
from moe_lab.workbook.viz import dataflow

# Change these to override the defaults (None = pick for this machine).
PRESET_NAME = "mixtral-8x7b"   # any of moe_lab.PRESETS
NUM_TOKENS = None              # default: 256 on a GPU, 16 on the CPU
SCALE = None                   # divide H and I by this; default: 1 on a GPU, 64 on the CPU

# %%
device = moe_lab.runtime.default_device()
scale = workbook.pick(1, 64, SCALE)
preset = moe_lab.get_preset(PRESET_NAME)
preset = preset.scaled(scale) if scale > 1 else preset
num_tokens = workbook.pick(256, 16, NUM_TOKENS)
dtype = torch.bfloat16
print(f"{preset.name}{' scaled by 1/' + str(scale) if scale > 1 else ''}: T={num_tokens}, "
      f"H={preset.hidden_size}, I={preset.intermediate_size}, E={preset.num_experts}, k={preset.top_k}, {dtype}")

hidden_states, w1, w2, (topk_weights, topk_ids) = preset.build(num_tokens, dtype=dtype, device=device, seed=0)
T, H = hidden_states.shape
E, TWO_I, _ = w1.shape
I, K = TWO_I // 2, topk_ids.shape[1]
print("hidden_states", tuple(hidden_states.shape), " w1", tuple(w1.shape), " w2", tuple(w2.shape))
print("topk_ids", tuple(topk_ids.shape), topk_ids.dtype, " topk_weights", tuple(topk_weights.shape), topk_weights.dtype)

# %% [markdown]
# ## 1. The data flow
#
# Blue stages are moe-lab's Triton kernels. The sorted buffers (`sorted_token_ids`, `gate_up`, `act`) are
# sized by a bound on the padded rows, so no stage has to ask the GPU how many rows it needs.

# %%
config = moe_lab.default_config(T, E, K, H, I, dtype)
dataflow.plot_dataflow(preset, T, config.block_size_m)

# %%
# NBVAL_IGNORE_OUTPUT
dataflow.dataflow_widget(PRESET_NAME, 64, 16)

# %%
dataflow.plot_dataflow(moe_lab.get_preset("deepseek-v3"), 64, 16)

# %% [markdown]
# ## 2. Build: a MoE layer in plain PyTorch
#
# For each expert: find the (token, slot) pairs routed to it, run its SwiGLU MLP on those tokens, scale
# by the routed weight, and add into the output. Slow (a Python loop over experts) but easy to read.

# %%
def my_moe_layer(x, w1, w2, topk_weights, topk_ids):
    x = x.float()
    out = torch.zeros(x.shape[0], w2.shape[1], device=x.device)
    inter = w2.shape[2]
    for e in range(w1.shape[0]):
        token, slot = torch.where(topk_ids == e)
        if len(token) == 0:
            continue
        gate_up = x[token] @ w1[e].float().T                   # [n_e, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]   # [n_e, I]
        y = act @ w2[e].float().T                               # [n_e, H]
        out.index_add_(0, token, y * topk_weights[token, slot, None])
    return out


# %%
# NBVAL_CHECK_OUTPUT
reference = moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids)
_ = workbook.check("my_moe_layer vs fused_moe_reference", my_moe_layer(hidden_states, w1, w2, topk_weights, topk_ids),
                   reference, tol=1e-5)

# %% [markdown]
# ## 3. Stage by stage with moe-lab's functions
#
# ### Align
# `moe_align` sorts the T·k slots by expert and pads each expert to BLOCK_SIZE_M; checked against a
# host-side stable sort.

# %%
# NBVAL_CHECK_OUTPUT
routing = moe_lab.moe_align(topk_ids, E, config.block_size_m)
want = moe_lab.moe_align_reference(topk_ids, E, config.block_size_m)
workbook.check_equal("sorted_token_ids", routing.sorted_token_ids, want.sorted_token_ids)
workbook.check_equal("expert_ids", routing.expert_ids, want.expert_ids)
workbook.check_equal("num_tokens_post_padded", routing.num_tokens_post_padded, want.num_tokens_post_padded)

# %%
rows_used = routing.num_tokens_post_padded.item()
print(f"BLOCK_SIZE_M={config.block_size_m}: {T * K} slots -> {rows_used} rows in use "
      f"(bound {routing.max_num_tokens_padded})")

# %% [markdown]
# A helper for the checks below: which sorted rows hold a real slot, the token and the expert of each.

# %%
sid = routing.sorted_token_ids[:rows_used].long()
real = sid < T * K
row_token = sid[real] // K
row_expert = routing.expert_ids.long().repeat_interleave(config.block_size_m)[:rows_used][real]
x32 = hidden_states.float()

# %% [markdown]
# ### Up GEMM: `gate_up = hidden_states[token] @ w1[e].T`, rows gathered

# %%
gate_up = moe_lab.grouped_matmul(hidden_states, w1, routing, config.up, gather_a=True)
want_gate_up = workbook.expert_rows_matmul(x32[row_token], w1, row_expert)
_ = workbook.check("up GEMM (real rows)", gate_up[:rows_used][real], want_gate_up)

# %% [markdown]
# ### SiLU and mul: `act = silu(gate) * up`

# %%
act = moe_lab.silu_and_mul(gate_up, routing=routing)   # padding rows become zeros, never read
g = gate_up[:rows_used][real].float()
_ = workbook.check("silu_and_mul (real rows)", act[:rows_used][real], F.silu(g[:, :I]) * g[:, I:])
padding_rows = act[:rows_used][~real]
_ = workbook.check_equal("silu_and_mul (padding rows are zero)", padding_rows, torch.zeros_like(padding_rows))

# %% [markdown]
# ### The same two steps in one kernel: the SwiGLU epilogue
#
# `fused_moe` does not run these two steps apart. With `swiglu=True` each program of the up GEMM takes
# BLOCK_SIZE_N/2 gate rows of `w1` and the matching BLOCK_SIZE_N/2 up rows, as one tile (through TMA, one
# box of `w1` viewed as `[E, 2, I, H]`). Its float32 accumulator then holds both halves side by side, and
# the epilogue writes `silu(gate) * up` straight away. The `[rows, 2I]` buffer never goes to memory, and
# gate and up are never rounded to bf16 on the way (in float16 they could not overflow either: a gate of
# 1e5 times an up of 1e-3 gives 100, where a float16 `gate_up` would hold inf). `GemmConfig.fuse_swiglu`
# switches it (on by default).

# %%
act_fused = moe_lab.grouped_matmul(hidden_states, w1, routing, config.up, gather_a=True, swiglu=True)
want_act = F.silu(want_gate_up[:, :I]) * want_gate_up[:, I:]   # from the float32 reference of the up GEMM
_ = workbook.check("SwiGLU epilogue (real rows)", act_fused[:rows_used][real], want_act)

# %% [markdown]
# ### Down GEMM: `act @ w2[e].T`, times `topk_weights`, scattered to the (token, k) slot

# %%
out_k = moe_lab.grouped_matmul(act, w2, routing, config.down, gather_a=False, scatter=True,
                               topk_weights=topk_weights)                    # [T*k, H]
act_real = act[:rows_used][real].float()
want_rows = workbook.expert_rows_matmul(act_real, w2, row_expert) * topk_weights.reshape(-1)[sid[real], None]
want_out_k = torch.zeros(T * K, H, device=device)
want_out_k[sid[real]] = want_rows
_ = workbook.check("down GEMM with topk_weights, scattered", out_k, want_out_k)

# %% [markdown]
# ### Sum over k, and the whole layer

# %%
out_steps = out_k.view(T, K, H).sum(dim=1)
_ = workbook.check("stage by stage vs fused_moe_reference", out_steps, reference)
out_fused = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, config=config)
_ = workbook.check("fused_moe vs fused_moe_reference", out_fused, reference)
# With the activation unfused, the layer runs exactly the stages above, bit for bit.
staged = moe_lab.MoEConfig(dataclasses.replace(config.up, fuse_swiglu=False), config.down)
out_staged = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, config=staged)
workbook.check_equal("fused_moe (fuse_swiglu=False) vs stage by stage", out_staged, out_steps)

# %% [markdown]
# ## 4. Which load path did each GEMM take?
#
# `return_info=True` returns a `FusedMoEInfo`: the config used and each GEMM's `LoadPath` with its reason.
# Expected (notebook 05): up = `a:ptr w:tma` (gathered rows), down = `a:tma w:tma` — where TMA is available.

# %%
out, info = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, return_info=True)
print("config:", info.config.up)
print("up:  ", info.up_path.name, "-", info.up_path.reason)
print("down:", info.down_path.name, "-", info.down_path.reason)

# %% [markdown]
# When a tensor breaks a descriptor rule, the GEMM falls back to pointer loads and the reason says which
# rule. Here `w1_odd` holds the same values as `w1`, but is a view into a buffer whose rows are H + 1
# elements long, so its row stride is not a multiple of 16 bytes.

# %%
# NBVAL_CHECK_OUTPUT
w1_odd = torch.zeros(E, TWO_I, H + 1, dtype=dtype, device=device)[:, :, :H]
w1_odd.copy_(w1)
out_odd, info_odd = moe_lab.fused_moe(hidden_states, w1_odd, w2, topk_weights, topk_ids, return_info=True)
print("up:  ", info_odd.up_path.name, "-", info_odd.up_path.reason.split(" [")[0])
workbook.check_equal("same result through the pointer path", out_odd, out_fused)

# %% [markdown]
# `use_tma=False` forces pointer loads; `use_tma=True` raises if TMA cannot be honoured.

# %%
# NBVAL_CHECK_OUTPUT
out_ptr, info_ptr = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, use_tma=False,
                                      return_info=True)
print("use_tma=False:", info_ptr.up_path.name, "/", info_ptr.down_path.name)
workbook.check_equal("pointer path = TMA path", out_ptr, out_fused)
try:
    moe_lab.fused_moe(hidden_states, w1_odd, w2, topk_weights, topk_ids, use_tma=True)
except ValueError as err:
    print("use_tma=True with w1_odd -> ValueError:", str(err).split(":")[-1].strip())

# %% [markdown]
# ### Exercise: apply the routed weights yourself
#
# Run the down GEMM **without** `topk_weights` (below), then write `my_combine(out_k_plain, topk_weights)`
# that returns the layer output `[T, H]`. The check compares with the reference and recognises common
# slips.

# %%
out_k_plain = moe_lab.grouped_matmul(act, w2, routing, config.down, gather_a=False, scatter=True)  # [T*k, H]


def my_combine(out_k_plain, topk_weights):
    return None  # TODO: your code here


def check_combine(fn):
    got = fn(out_k_plain, topk_weights)
    if got is None:
        print("NOT YET my_combine: it returns None (hint: view as [T, k, H], weight each slot, sum over k)")
        return
    plain = out_k_plain.float().view(T, K, H)
    w = topk_weights.float()
    slips = [  # (what went wrong, what that slip computes)
        ("you summed over k but did not multiply by topk_weights", plain.sum(1)),
        ("the k weights are swapped (reversed): slot j of token t took topk_weights[t, k-1-j]; row t*k + j "
         "of out_k_plain takes topk_weights[t, j], so weight the [T, k, H] view with topk_weights[:, :, None]",
         (plain * w.flip(1)[:, :, None]).sum(1)),
        ("the slots were read as [k, T, H] (row j*T + t for slot j of token t); the k rows of a token are "
         "consecutive: view out_k_plain as [T, k, H]", (out_k_plain.float().view(K, T, H) * w.T[:, :, None]).sum(0)),
    ]
    if tuple(got.shape) != (T, H):
        print(f"NOT YET my_combine: shape {tuple(got.shape)}, expected {(T, H)}: did you sum over the k dimension "
              "(dim=1)?")
        return
    for why, slip in slips:
        if moe_lab.relative_error(got, reference) >= 1e-2 and moe_lab.relative_error(got, slip) < 1e-2:
            print(f"NOT YET my_combine: {why}")
            return
    if moe_lab.relative_error(got, reference) >= 1e-2:
        print(f"NOT YET my_combine: relative error {moe_lab.relative_error(got, reference):.1e} vs the reference: "
              "weight row t*k + j of out_k_plain by topk_weights[t, j] (broadcast over H: [T, k, 1]), then sum over k")
    else:
        workbook.check("my_combine vs fused_moe_reference", got, reference)


check_combine(my_combine)

# %% jupyter={"source_hidden": true}
# Solution
def my_combine_solution(out_k_plain, topk_weights):
    y = out_k_plain.float().view(T, K, H) * topk_weights[:, :, None]
    return y.sum(dim=1)


check_combine(my_combine_solution)

# %% [markdown]
# ### Exercise: the top-k reduce as a Triton kernel
#
# The same combine, as the layer's last kernel does it: `out[t, :] = sum_j topk_weights[t, j] * y[t * TOP_K + j, :]`.
# `y` is the down GEMM's output `[num_slots, H]` (num_slots = T·TOP_K), one row per (token, k) slot: the
# k slots of token `t` are the consecutive rows `t * TOP_K + j`, j = 0 … TOP_K-1. One program handles one
# token (`program_id(0)`) and one block of `BLOCK_H` columns (`program_id(1)`), so the grid is
# `(T, cdiv(H, BLOCK_H))`.
#
# - `y_ptr + (t * TOP_K + j) * stride_y_row + offs_h`: slot j's columns `offs_h` (a `[BLOCK_H]` block).
# - `topk_weights_ptr + t * stride_w_token + j`: the scalar weight of that slot.
# - `out_ptr + t * stride_out_row + offs_h`: where the token's sum goes.
#
# Use the strides you are given: the checker's `y` and `topk_weights` are views of wider buffers, so their
# rows are further apart than `H` and `TOP_K`. It runs `TOP_K = 6` (not a power of two; `tl.static_range`
# unrolls the loop over it) and `H = 200`, not a multiple of `BLOCK_H = 64`: mask the last H block.
# Accumulate in float32. The token index is an int64 (`tl.program_id(0).to(tl.int64)`): at real sizes the
# slot rows pass 2^31 elements (T = 37,000 tokens, k = 8, H = 7168), and an int32 offset would wrap around;
# the checker probes it with a row stride of 2^28.

# %%
import triton
import triton.language as tl

from moe_lab.workbook import exercises


@triton.jit
def topk_reduce_kernel(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                       TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)                             # the token (int64: offsets past 2^31)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # this program's columns of H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        # TODO: load the weight topk_weights[t, j] and the row y[t * TOP_K + j, offs_h] (masked: offs_h < H),
        #       and add weight * row to acc
        pass
    # TODO: store acc into out[t, offs_h] (masked)


# %%
exercises.check_topk_reduce(topk_reduce_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def topk_reduce_kernel_solution(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                                TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs_h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        row = tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=mask, other=0.0)
        acc += weight * row.to(tl.float32)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=mask)


exercises.check_topk_reduce(topk_reduce_kernel_solution, strict=True)

# %% [markdown]
# The solution on this notebook's own data: the unweighted down-GEMM rows `out_k_plain` ([T·k, H], bf16)
# and the routed weights give the layer's output.

# %%
# NBVAL_CHECK_OUTPUT
BLOCK_H = 64
out_reduce = torch.empty(T, H, device=device)
topk_reduce_kernel_solution[(T, triton.cdiv(H, BLOCK_H))](
    out_k_plain, topk_weights, out_reduce, H, out_k_plain.stride(0), topk_weights.stride(0), out_reduce.stride(0),
    TOP_K=K, BLOCK_H=BLOCK_H)
_ = workbook.check("topk_reduce_kernel_solution on out_k_plain vs fused_moe_reference", out_reduce, reference)

# %% [markdown]
# ## 5. Every preset
#
# The same layer on each model preset (scaled on the CPU, T = 8 there to stay quick).

# %%
# NBVAL_CHECK_OUTPUT
for name in moe_lab.PRESETS:
    p = moe_lab.get_preset(name)
    p = p.scaled(scale) if scale > 1 else p
    t = workbook.pick(512, 8, None)
    hs, a1, a2, (tw, ti) = p.build(t, dtype=dtype, device=device, seed=1)
    o, inf = moe_lab.fused_moe(hs, a1, a2, tw, ti, return_info=True)
    err = moe_lab.relative_error(o, moe_lab.fused_moe_reference(hs, a1, a2, tw, ti))
    print(f"{'PASS' if err < 1e-2 else 'FAIL'} {name:<18} E={p.num_experts:<4} k={p.top_k} "
          f"up {inf.up_path.name}, down {inf.down_path.name}: relative error {'< 1e-02' if err < 1e-2 else err}")

# %% [markdown]
# ## Summary
#
# - The layer is five stages: align, up GEMM (gathered rows), SiLU-and-mul, down GEMM (routed weight and
#   scatter in the epilogue), sum over k. `fused_moe` runs SiLU-and-mul in the up GEMM's epilogue, and the
#   align in one launch for a handful of tokens.
# - Each stage matches a few lines of PyTorch; the whole layer matches `fused_moe_reference` within bf16
#   rounding.
# - `return_info=True` tells which load path each GEMM used: the up GEMM's token rows are gathered by
#   pointer, everything else goes through descriptors where the device and the tensors allow.
#
# Next: notebook 07 asks how fast it is, and how fast it could be.
