"""Real MoE layer shapes, from each model's public config.json, and random layers built at those shapes.

Each preset can be scaled down for the CPU interpreter: H and I are divided, E and k stay real, so the
routing (and the alignment's padding) looks like the real model's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from .routing import TopKRouting, topk_routing


@dataclass(frozen=True)
class MoEPreset:
    """One MoE layer's shape. hidden_size H, moe_intermediate_size I, num_experts E, top_k k."""
    name: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    scoring: str = "softmax"
    renormalize: bool = True
    num_expert_group: Optional[int] = None
    topk_group: Optional[int] = None
    routed_scaling_factor: float = 1.0
    source: str = ""

    def scaled(self, divisor: int) -> "MoEPreset":
        """The same routing (E, k, scoring) with H and I divided by `divisor` (rounded up to 16).
        Raises ValueError unless divisor is an int >= 1."""
        if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
            raise ValueError(f"divisor must be an int >= 1, got {divisor!r}")
        def shrink(x: int) -> int:
            return max(16, -(-(x // divisor) // 16) * 16)
        return replace(self, hidden_size=shrink(self.hidden_size), intermediate_size=shrink(self.intermediate_size))

    def flops(self, num_tokens: int) -> int:
        """Matmul FLOPs of one layer call: 2*T*k*(H*2I + I*H)."""
        return 2 * num_tokens * self.top_k * 3 * self.hidden_size * self.intermediate_size

    def build(self, num_tokens: int, *, dtype=torch.bfloat16, device=None, seed: int = 0):
        """Random layer at this shape: hidden_states ~ N(0, 1), weights with nn.Linear's init scale
        (uniform ±1/sqrt(fan_in)), a random router. Returns (hidden_states, w1, w2, TopKRouting)."""
        device = torch.device(device or "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)
        h, i, e = self.hidden_size, self.intermediate_size, self.num_experts

        def uniform(shape, fan_in):
            x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
            return x.mul_(2).sub_(1).div_(math.sqrt(fan_in)).to(dtype)

        hidden_states = torch.randn((num_tokens, h), generator=gen, device=device).to(dtype)
        w1 = uniform((e, 2 * i, h), h)
        w2 = uniform((e, h, i), i)
        router = uniform((e, h), h).float()
        bias = torch.rand(e, generator=gen, device=device) * 0.1 if self.scoring == "sigmoid" else None
        routing = topk_routing(hidden_states.float() @ router.T, self.top_k, renormalize=self.renormalize,
                               scoring=self.scoring, correction_bias=bias,
                               num_expert_group=self.num_expert_group, topk_group=self.topk_group,
                               routed_scaling_factor=self.routed_scaling_factor)
        return hidden_states, w1, w2, routing


PRESETS = {p.name: p for p in (
    MoEPreset("mixtral-8x7b", 8, 2, 4096, 14336, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    MoEPreset("qwen3-30b-a3b", 128, 8, 2048, 768, source="Qwen/Qwen3-30B-A3B config.json"),
    MoEPreset("deepseek-v3", 256, 8, 7168, 2048, scoring="sigmoid", num_expert_group=8, topk_group=4,
              routed_scaling_factor=2.5, source="deepseek-ai/DeepSeek-V3 config.json (routed experts)"),
    MoEPreset("olmoe-1b-7b", 64, 8, 2048, 1024, renormalize=False, source="allenai/OLMoE-1B-7B-0924 config.json"),
    MoEPreset("qwen1.5-moe-a2.7b", 60, 4, 2048, 1408, renormalize=False,
              source="Qwen/Qwen1.5-MoE-A2.7B config.json (routed experts)"),
)}


def get_preset(name: str) -> MoEPreset:
    """The preset called `name` (see PRESETS); raises ValueError listing the names otherwise."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None
