"""Top-k routing: which experts each token goes to, and with what weight.

`topk_routing` covers the three schemes in common use:
- softmax over all experts, top-k, optional renormalization over the k (Mixtral, Qwen-MoE, OLMoE);
- sigmoid scores with a score-correction bias that steers the choice but not the weights, and grouped
  top-k: keep the `topk_group` best of `num_expert_group` groups (scored by the sum of each group's two
  best biased scores), then top-k inside them (DeepSeek-V3, arXiv:2412.19437, section 2.1.2);
- DeepSeek-V2's group-limited greedy routing: softmax scores, groups scored by their best expert
  (`group_scoring="max"`), top-k inside the kept groups (arXiv:2405.04434, section 2.1.3; transformers'
  DeepseekV2 `topk_method="group_limited_greedy"`).
Routing is a few small PyTorch ops; the kernels of this package start at alignment.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import torch

from ._validate import FLOAT_DTYPES, check_bool, check_one_device, check_positive_int, check_tensor, is_bool, type_name


class TopKRouting(NamedTuple):
    """`topk_weights` [T, k] float32: each token's routed weights. `topk_ids` [T, k] int32: its experts.
    A tuple: `topk_weights, topk_ids = topk_routing(...)`, `routing[0]` and `routing.topk_weights` all work."""

    topk_weights: torch.Tensor
    topk_ids: torch.Tensor


def topk_routing(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    correction_bias: Optional[torch.Tensor] = None,
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    routed_scaling_factor: float = 1.0,
    group_scoring: str = "top2_sum",
) -> TopKRouting:
    """Pick `top_k` experts per token.

    Args:
        router_logits: [T, E] float16/bfloat16/float32, the router's output.
        top_k: experts per token, 1 <= top_k <= E.
        renormalize: divide the k weights by their sum.
        scoring: "softmax" or "sigmoid".
        correction_bias: [E] float, added to the scores for choosing only (DeepSeek-V3's
            e_score_correction_bias); the weights come from the unbiased scores.
        num_expert_group, topk_group: grouped top-k; both or neither; E must divide into groups.
        group_scoring: how a group is scored for grouped top-k: "top2_sum", the sum of its two best
            (biased) scores (DeepSeek-V3's noaux_tc), or "max", its best score (DeepSeek-V2's
            group_limited_greedy, with scoring="softmax"). Only read with num_expert_group.
        routed_scaling_factor: multiplies the final weights (2.5 for DeepSeek-V3).
    Returns:
        TopKRouting(topk_weights [T, k] float32, topk_ids [T, k] int32).
    Raises:
        TypeError / ValueError naming the argument for a wrong type, dtype, shape or value. The logits' values
        are not checked (that would wait for the device): a row holding NaN or +inf gets NaN weights.
    """
    check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES, layout="[T, E]", kernel_reads=False)
    num_tokens, num_experts = router_logits.shape
    top_k = check_positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(f"top_k must be <= the number of experts E={num_experts}, got {top_k}")
    check_bool("renormalize", renormalize)
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if correction_bias is not None:
        check_tensor(
            "correction_bias",
            correction_bias,
            ndim=1,
            dtypes=FLOAT_DTYPES,
            shape=(num_experts,),
            layout="[E]",
            kernel_reads=False,
        )
        check_one_device(router_logits=router_logits, correction_bias=correction_bias)
    routed_scaling_factor = _scaling_factor(routed_scaling_factor)
    if group_scoring not in ("top2_sum", "max"):
        raise ValueError(f"group_scoring must be 'top2_sum' or 'max', got {group_scoring!r}")
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError(
            "num_expert_group and topk_group go together: give both or neither, got "
            f"num_expert_group={num_expert_group}, topk_group={topk_group}"
        )

    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.float()

    if num_expert_group is not None:
        num_expert_group = check_positive_int("num_expert_group", num_expert_group)
        topk_group = check_positive_int("topk_group", topk_group)
        if num_experts % num_expert_group:
            raise ValueError(f"num_expert_group={num_expert_group} must divide E={num_experts}")
        if topk_group > num_expert_group:
            raise ValueError(f"topk_group must be <= num_expert_group={num_expert_group}, got {topk_group}")
        per_group = num_experts // num_expert_group
        if top_k > topk_group * per_group:
            raise ValueError(f"top_k={top_k} exceeds the {topk_group * per_group} experts in the kept groups")
        grouped = choice.view(num_tokens, num_expert_group, per_group)
        if group_scoring == "max":
            group_score = grouped.amax(dim=-1)
        else:
            group_score = grouped.topk(min(2, per_group), dim=-1).values.sum(-1)
        kept = group_score.topk(topk_group, dim=-1).indices
        keep_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
        choice = choice.masked_fill(~keep_mask.repeat_interleave(per_group, dim=1), float("-inf"))

    topk_ids = choice.topk(top_k, dim=-1).indices
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(-1, keepdim=True).clamp_min(1e-20)
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    return TopKRouting(topk_weights.contiguous(), topk_ids.to(torch.int32).contiguous())


def uniform_routing(num_tokens: int, num_experts: int, top_k: int, *, device="cuda", seed: int = 0):
    """The routing benchmarks use: topk_weights [T, k] float32 (softmax over k random logits), topk_ids
    [T, k] int32 (k distinct experts per token, uniformly at random), from a seeded generator on `device`,
    so every implementation timed sees the same, typical expert load."""
    gen = torch.Generator(device=device).manual_seed(seed)
    topk_ids = torch.rand(num_tokens, num_experts, generator=gen, device=device).topk(top_k, dim=1).indices
    topk_weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen, device=device), dim=-1)
    return topk_weights, topk_ids.to(torch.int32)


def _scaling_factor(value) -> float:
    """routed_scaling_factor as a float: a real number (numpy's and 0-d CPU tensors' too, as read from a config;
    not a GPU tensor, which each call would synchronize to read), finite and > 0."""
    cpu_scalar = isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu"
    if is_bool(value) or not (isinstance(value, numbers.Real) or cpu_scalar):
        raise TypeError(
            f"routed_scaling_factor must be a real number, got {type_name(value)}"
            + (f" on {value.device} (read it once with .item())" if isinstance(value, torch.Tensor) else "")
        )
    factor = float(value)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"routed_scaling_factor must be a finite number > 0, got {factor}")
    return factor
