# %% [markdown]
# # 01 · A Mixture-of-Experts layer in plain PyTorch
#
# An MoE feed-forward layer holds E expert MLPs but runs only k of them per token. A small **router**
# picks the k experts and their weights; each expert is a SwiGLU MLP; the token's output is the weighted
# sum of its k experts' outputs.
#
# **Goals**
# 1. Build the router, top-k and renormalization yourself and check them against `moe_lab.topk_routing`;
#    then write the renormalization as a Triton kernel (an exercise, graded by a checker).
# 2. Build the layer one token at a time and check it against `moe_lab.fused_moe_reference`, on a real
#    model's shape.
# 3. See the routing: which token goes to which expert, and how uneven the load can be.
# 4. Count why the usual per-expert loop is slow on a GPU — the reason for the kernels in 02–06.

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
import torch.nn.functional as F
import triton
import triton.language as tl

from moe_lab import workbook
from moe_lab.workbook import exercises
from moe_lab.workbook.viz import routing as viz_routing

# Settings. None = decided by the machine: real shapes on a GPU, scaled down (H and I / 64) on the CPU.
MODEL = "mixtral-8x7b"
FULL_SIZE = None     # True: real H and I; False: scaled by 64
NUM_TOKENS = None    # T; default 4096 on a GPU, 32 on the CPU

device = moe_lab.runtime.default_device()
full = workbook.pick(True, False, FULL_SIZE)
preset = moe_lab.get_preset(MODEL) if full else moe_lab.get_preset(MODEL).scaled(64)
T = workbook.pick(4096, 32, NUM_TOKENS)
E, k, H, I = preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size
print(f"{preset.name}: E={E} experts, top_k={k}, H={H}, I={I}, T={T} tokens, on {device}"
      f"{'' if full else ' (H and I scaled down by 64 for the CPU)'}")

# %% [markdown]
# The presets hold the shapes of real models, read from their public `config.json`. E and k stay real
# when scaled, so the routing looks like the real model's:

# %%
for p in moe_lab.PRESETS.values():
    print(f"{p.name:<18} E={p.num_experts:<4} top_k={p.top_k}  H={p.hidden_size:<5} I={p.intermediate_size:<6}"
          f" scoring={p.scoring}, renormalize={p.renormalize}")

# %% [markdown]
# ## 1. The router
#
# The router is one linear layer: `router_logits = hidden_states @ W_router.T`, shape [T, E]. We make
# a random layer at the preset's shape: `hidden_states` [T, H], `w1` [E, 2I, H] (gate rows, then up
# rows), `w2` [E, H, I]. Everything is float32 in this notebook.

# %%
gen = torch.Generator().manual_seed(0)
hidden_states = torch.randn(T, H, generator=gen).to(device)
w1 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).to(device)
w2 = (torch.randn(E, H, I, generator=gen) / I ** 0.5).to(device)
w_router = (torch.randn(E, H, generator=gen) / H ** 0.5).to(device)
router_logits = hidden_states @ w_router.T
print("hidden_states", tuple(hidden_states.shape), "w1", tuple(w1.shape), "w2", tuple(w2.shape),
      "router_logits", tuple(router_logits.shape))

# %% [markdown]
# ## 2. Top-k and renormalization
#
# Softmax over the E logits gives each expert a probability; each token keeps its k best experts
# (`topk_ids` [T, k]) and their probabilities (`topk_weights` [T, k]). Mixtral then **renormalizes**:
# it divides the k weights by their sum so they add up to 1. (OLMoE does not; its weights sum to less.)

# %%
probs = torch.softmax(router_logits.float(), dim=-1)
my_weights, my_ids = probs.topk(k, dim=-1)
my_weights = my_weights / my_weights.sum(dim=-1, keepdim=True)
print("token 0 goes to experts", my_ids[0].tolist(), "with weights", [round(w, 3) for w in my_weights[0].tolist()])

# %%
# NBVAL_CHECK_OUTPUT
topk_weights, topk_ids = moe_lab.topk_routing(router_logits, k, renormalize=True)
workbook.check_equal("topk_ids vs moe_lab.topk_routing", my_ids.to(torch.int32), topk_ids)

# %%
err = workbook.check("topk_weights vs moe_lab.topk_routing", my_weights, topk_weights, tol=1e-6)
err = workbook.check("renormalized weights sum to 1", topk_weights.sum(-1), torch.ones(T), tol=1e-6)

# %% [markdown]
# ### Exercise: renormalize in a Triton kernel
#
# On a GPU the renormalization is a small kernel of its own: **one program per token** loads the
# token's k weights, divides them by their sum and stores them. Write `renormalize_kernel`:
#
# - `topk_weights_ptr`: the weights [T, top_k] float32. Row t starts at `t * weights_row_stride`, and
#   its k weights follow one after another. The rows need not be packed: here `topk_weights` is the view
#   `buffer[:, :6]` of a [T, 8] buffer (a routing buffer with spare columns), so `weights_row_stride = 8`,
#   not top_k.
# - `out_ptr`: the result [T, top_k] float32, contiguous: row t starts at `t * out_row_stride` (= top_k).
# - `top_k = 6`, not a power of two. `tl.arange` needs a power of two, so each program has
#   `BLOCK_K = 8` lanes `j = 0..7`; lanes 6 and 7 are not slots of the token and must be **masked** on
#   the load (with `other=0.0`, so they add nothing to the sum) and on the store.
#
# The checker launches the grid `(T,)` with T = 37, and says what is wrong if the result is.

# %%
@triton.jit
def renormalize_kernel(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
                       BLOCK_K: tl.constexpr):
    t = tl.program_id(0)           # this program's token
    j = tl.arange(0, BLOCK_K)      # lane j = the token's j-th choice (j < top_k) or a spare lane
    # TODO: mask = the lanes that are slots of the token
    # TODO: w = load row t of topk_weights (masked, other=0.0)
    # TODO: store w divided by its sum (tl.sum(w, axis=0)) into row t of out (masked)
    pass


# %%
exercises.check_renormalize(renormalize_kernel)


# %% jupyter={"source_hidden": true}
# Solution
@triton.jit
def renormalize_kernel_solution(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k,
                                BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    mask = j < top_k
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=mask, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=mask)


exercises.check_renormalize(renormalize_kernel_solution, strict=True)

# %% [markdown]
# ## 3. Picture: who goes where
#
# Left: cell (token, expert) shows the routed weight (white = not routed). Right: how many (token, k)
# slots each expert receives. With a random router the load is uneven already; trained routers are often
# worse, and the kernels must be fast for every expert count, from 0 to T.

# %%
viz_routing.plot_routing(topk_ids, E, topk_weights)

# %%
print(viz_routing.load_summary(topk_ids, E))

# %% [markdown]
# ## 4. The layer, one token at a time
#
# Each expert e is a SwiGLU MLP: `gate_up = w1[e] @ x` (2I values), `act = silu(gate) * up` (I values),
# `y = w2[e] @ act` (H values). The token's output is `sum_j topk_weights[t, j] * y_j`. Written as
# plainly as possible:

# %%
def moe_layer_per_token(x, w1, w2, topk_weights, topk_ids):
    """out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), one token at a time."""
    inter = w2.shape[-1]
    out = torch.zeros(x.shape[0], w2.shape[1], device=x.device)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = w1[e] @ x[t]
            act = F.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += topk_weights[t, j] * (w2[e] @ act)
    return out


# %%
out_mine = moe_layer_per_token(hidden_states, w1, w2, topk_weights, topk_ids)
out_ref = moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids)
err = workbook.check("per-token layer vs moe_lab.fused_moe_reference", out_mine, out_ref, tol=1e-5)

# %% [markdown]
# `fused_moe_reference` computes the same thing **one expert at a time**: for each expert, find its
# tokens, gather them into a small matrix, run two matmuls, and add the weighted rows back. That is how
# most PyTorch MoE code is written. The rest of this workbook builds `moe_lab.fused_moe`, which does the
# same in a handful of Triton launches. Here it is, as a preview:

# %%
out_fused = moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids)
err = workbook.check("moe_lab.fused_moe (Triton) vs reference", out_fused, out_ref, tol=workbook.fp32_dot_tol())

# %% [markdown]
# ## 5. Widget: change E, top_k and the routing skew
#
# `skew` makes low-numbered experts popular (logits minus `skew * log(1 + e)`); at skew 2–3 a few hot
# experts take most tokens while others get none. Watch the max/mean load. The sliders redraw when
# released. The widget opens at skew 2; a static copy of that first picture follows for viewers without
# a live kernel (both are drawn from the settings in `ROUTING_WIDGET`).

# %%
# NBVAL_IGNORE_OUTPUT
ROUTING_WIDGET = dict(num_tokens=32, num_experts=8, top_k=2, skew=2.0)  # the sliders' first values
viz_routing.routing_explorer(**ROUTING_WIDGET)

# %%
first = viz_routing.skewed_routing(**ROUTING_WIDGET)
viz_routing.plot_routing(first.topk_ids, ROUTING_WIDGET["num_experts"], first.topk_weights)

# %% [markdown]
# ## 6. Why a per-expert loop is slow
#
# Count what the loop asks of the device. For every expert it runs: `nonzero` to find the expert's
# tokens, a gather, two matmuls, SiLU, a multiply, the weight multiply and an `index_add_`. Each is a
# kernel launch on a GPU, and `nonzero` is worse: the size of its result depends on the data, so the
# CPU must **wait for the GPU** (a device-to-host sync) before it can launch the next kernel. We count
# the ATen operators the loop calls with a `TorchDispatchMode`, PyTorch's hook that sees every
# operator call (on the CPU here; the same operators run on a GPU).

# %%
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Count ATen operator calls by name while active."""
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn, names=("nonzero", "index", "mm", "silu", "mul", "index_add_")):
    """Run fn(); return {operator name: calls} for the named operators."""
    with CountOps() as counter:
        fn()
    return {name: counter.counts[name] for name in names}


ops = count_ops(lambda: moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids))
used_experts = int((viz_routing.expert_load(topk_ids, E) > 0).sum())
print(f"{preset.name}, T={T}: {used_experts} of {E} experts receive tokens")
for name, count in ops.items():
    print(f"  {name:<18} {count:>5} calls")
print(f"  -> {ops['nonzero']} host syncs (one per expert), and every expert's matmuls have only "
      f"about T*k/E = {T * k / E:.0f} rows")

# %% [markdown]
# The loop grows with E. For the routing of each real model at T = 64 tokens (routing only, no weights
# needed), the loop would do this much:

# %%
for p in moe_lab.PRESETS.values():
    logits = viz_routing.skewed_router_logits(64, p.num_experts, seed=1)
    ids = moe_lab.topk_routing(logits, p.top_k).topk_ids
    used = int((viz_routing.expert_load(ids, p.num_experts) > 0).sum())
    print(f"{p.name:<18} E={p.num_experts:<4} experts used: {used:<4} -> {used} syncs, ~{8 * used} launches, "
          f"{64 * p.top_k / p.num_experts:5.1f} rows per expert on average")

# %% [markdown]
# With 128 or 256 experts that is hundreds of tiny kernels and syncs per layer, per forward pass. The
# fused path replaces them with: one align step (02) that sorts the slots by expert *on the device*, one
# grouped matmul per projection that does every expert's work in **one launch** (03, 05), one
# activation kernel, and no host sync at all.
#
# On a GPU the cell below times both; under the interpreter a time would mean nothing, so it is skipped.
# This notebook works in float32 at full precision (PyTorch's default), which runs on the CUDA cores, not
# the tensor cores; there cuBLAS's float32 GEMMs are about twice as fast as a Triton dot, so at Mixtral's
# size the loop can win (on an H200: about 63 ms against 133 ms at T = 4096). The fused kernels are built
# for bfloat16 on the tensor cores, where one layer at that size takes under 5 ms (notebook 07).

# %%
if workbook.timing_allowed("the per-expert loop vs fused_moe timing"):
    import triton.testing

    loop_ms = triton.testing.do_bench(
        lambda: moe_lab.fused_moe_reference(hidden_states, w1, w2, topk_weights, topk_ids))
    fused_ms = triton.testing.do_bench(lambda: moe_lab.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids))
    print(f"per-expert PyTorch loop (float32): {loop_ms:.3f} ms; moe_lab.fused_moe (float32): {fused_ms:.3f} ms "
          f"on {torch.cuda.get_device_name()}, {preset.name}, T={T}")

# %% [markdown]
# ## Exercise: sigmoid routing with a correction bias (DeepSeek-V3)
#
# DeepSeek-V3 scores experts with a **sigmoid** instead of a softmax, and adds a per-expert
# `correction_bias` [E] to the scores **only to choose** the experts; the weights come from the
# unbiased sigmoid scores of the chosen experts, then renormalized to sum to 1. (The real model also
# picks expert groups first; leave that out.) Fill in `my_sigmoid_routing` and run the check.

# %%
def my_sigmoid_routing(router_logits, top_k, correction_bias):
    """Return (topk_weights [T, k] float32, topk_ids [T, k] int32)."""
    # TODO: scores = sigmoid(logits); choose top_k of scores + bias; weights = unbiased scores, renormalized
    return None


# %%
def check_sigmoid_routing(fn, strict=False):
    """Compare fn with moe_lab.topk_routing(scoring="sigmoid"); say what is wrong instead of raising."""
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(16, 8, generator=g), torch.rand(8, generator=g)
    want_w, want_ids = moe_lab.topk_routing(logits, 2, scoring="sigmoid", correction_bias=bias)
    got = fn(logits, 2, bias)
    problem = None
    if got is None:
        problem = "the function returns None; return (topk_weights, topk_ids)"
    elif not torch.equal(got[1].to(torch.int32).sort(-1).values, want_ids.sort(-1).values):
        problem = "topk_ids differ: choose on sigmoid(logits) + correction_bias"
    else:
        order = lambda w, i: w.gather(1, i.long().argsort(-1))
        got_w = order(got[0].float(), got[1])
        if torch.allclose(got_w, order(want_w, want_ids), atol=1e-5):
            workbook.check("my_sigmoid_routing", got_w, order(want_w, want_ids), tol=1e-5)
            return
        problem = ("weights differ: take the unbiased sigmoid scores of the chosen experts and divide by "
                   "their sum")
    if strict:
        raise AssertionError(f"FAIL my_sigmoid_routing: {problem}")
    print(f"NOT YET my_sigmoid_routing: {problem}")


check_sigmoid_routing(my_sigmoid_routing)


# %% jupyter={"source_hidden": true}
# Solution
def my_sigmoid_routing_solution(router_logits, top_k, correction_bias):
    scores = torch.sigmoid(router_logits.float())
    ids = (scores + correction_bias).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)


check_sigmoid_routing(my_sigmoid_routing_solution, strict=True)

# %% [markdown]
# ## Summary
#
# - Routing: `router_logits` [T, E] → softmax (or sigmoid) → `topk_ids` [T, k] and `topk_weights` [T, k],
#   renormalized for most models. `moe_lab.topk_routing` does it; yours matched it exactly.
# - A Triton kernel is one program per row here: mask the lanes past top_k, and step rows by the
#   tensor's row stride, which a sliced tensor does not share with its width.
# - The layer: `out[t] = Σ_j topk_weights[t, j] · w2[e] (silu(w1_gate[e] x) ⊙ w1_up[e] x)`, checked
#   against `moe_lab.fused_moe_reference` on the preset's shape.
# - Expert load is uneven; the kernels must handle anything from an idle expert to a hot one.
# - A per-expert loop costs about 8 launches and one host sync per expert. Next, **02_align** sorts the
#   slots by expert on the device, so one launch can serve every expert.
