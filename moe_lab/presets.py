"""Real MoE layer shapes, from each model's public config.json, and random layers built at those shapes.

Each preset can be scaled down for the CPU interpreter: H and I are divided, E and k stay real, so the
routing (and the alignment's padding) looks like the real model's.

A preset whose checkpoint ships its experts in FP8 says so, in the words of its config.json's
`quantization_config`: `quantization="fp8"` (float8_e4m3fn) and `weight_block_size` (one float32 scale per
block; DeepSeek-V3: [128, 128]). `build` makes weights in `dtype` (bfloat16 by default) whatever the
checkpoint's format; `quantize_fp8(w1, w2)` turns them into that format: float8_e4m3fn weights and their
scales, as `fused_moe` and `fused_moe_reference` take them (`moe-lab demo --dtype fp8` runs it).

`PRESETS` holds the models with SwiGLU experts (the notebooks, the demo and the benchmark tour it).
`EXPERT_KIND_PRESETS` holds those whose experts are of another kind (gpt-oss: clamped SwiGLU on
interleaved gate/up rows, biases): `activation` and `biases` say so, `build` makes w1 and w2 only (in
the activation's row order), `expert_kind` the rest of `fused_moe`'s arguments (the activation, random
biases), and `get_preset` finds them too (so does `moe-lab demo --model gpt-oss-20b`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

from ._validate import check_positive_int
from .expert_kind import GPT_OSS, SILU, Activation
from .routing import topk_routing

DEFAULT_FP8_BLOCK = (128, 128)  # FP8 weight scale blocks where a preset names none: DeepSeek-V3's
# The tools' defaults (moe-lab demo, bench and tune; here so that `moe-lab --help` needs no kernel): the three
# main models, and the token counts a benchmark or a tuning run sweeps, decode to prefill.
MAIN_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
SWEEP_TOKENS = (1, 8, 64, 512, 4096, 16384)


def _check_device(device) -> torch.device:
    """`device` (None: the CPU) as a torch.device this machine has: the CPU or a CUDA GPU it sees. TypeError
    for a device of the wrong type, ValueError for a name torch does not know or a device this machine lacks."""
    try:
        device = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"device must be a torch.device or a name such as 'cpu' or 'cuda', got {device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be the CPU or a CUDA GPU, got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {str(device)!r} but this machine has no CUDA GPU (torch sees none); use 'cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device is {str(device)!r} but torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return device


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
    quantization: Optional[str] = None  # "fp8": the checkpoint's experts are float8_e4m3fn; None: bf16
    weight_block_size: Optional[Tuple[int, int]] = None  # the checkpoint's FP8 scale blocks [bn, bk]
    activation: Activation = SILU  # `fused_moe(..., activation=)`: the experts' kind and w1's row order
    biases: bool = False  # the experts have biases: w1_bias [E, 2I], w2_bias [E, H]

    def scaled(self, divisor: int) -> "MoEPreset":
        """The same routing (E, k, scoring) with H and I divided by `divisor` (rounded up to 16).
        Raises TypeError unless divisor is an int, ValueError if it is < 1."""
        divisor = check_positive_int("divisor", divisor, minimum=1)

        def shrink(x: int) -> int:
            return max(16, -(-(x // divisor) // 16) * 16)

        return replace(self, hidden_size=shrink(self.hidden_size), intermediate_size=shrink(self.intermediate_size))

    def flops(self, num_tokens: int) -> int:
        """Matmul FLOPs of one layer call: 2*T*k*(H*2I + I*H). Raises TypeError/ValueError unless num_tokens is an
        int >= 0."""
        num_tokens = check_positive_int("num_tokens", num_tokens, minimum=0)
        return 2 * num_tokens * self.top_k * 3 * self.hidden_size * self.intermediate_size

    def build(self, num_tokens: int, *, dtype=torch.bfloat16, device=None, seed: int = 0):
        """Random layer at this shape: hidden_states ~ N(0, 1), weights with nn.Linear's init scale
        (uniform ±1/sqrt(fan_in)), a random router. Returns (hidden_states, w1, w2, TopKRouting).
        Weights are drawn one expert at a time into `dtype` (memory beyond the outputs: one expert in float32,
        so DeepSeek-V3's full size fits an 80 GB GPU; on the CPU the values are one draw of the whole tensor's).
        hidden_states are drawn first, so the weights depend on num_tokens too: to compare T, build once at the
        largest and slice hidden_states and the routing.
        Raises TypeError for num_tokens or seed not an int, a device of the wrong type or a dtype that is not a
        16, 32 or 64-bit floating torch.dtype (FP8: build in bfloat16, then `quantize_fp8`), ValueError for
        num_tokens < 0, a seed outside [0, 2**64) or a device that torch does not know or this machine lacks."""
        num_tokens = check_positive_int("num_tokens", num_tokens, minimum=0)
        _check_dtype(dtype)
        device = _check_device(device)
        seed = _check_seed(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        h, i, e = self.hidden_size, self.intermediate_size, self.num_experts

        def uniform(shape, fan_in):
            out = torch.empty(shape, dtype=dtype, device=device)
            for part in out.unbind(0) if len(shape) == 3 else (out,):
                x = torch.rand(part.shape, generator=gen, device=device, dtype=torch.float32)
                part.copy_(x.mul_(2).sub_(1).div_(math.sqrt(fan_in)))
            return out

        hidden_states = torch.randn((num_tokens, h), generator=gen, device=device).to(dtype)
        w1 = uniform((e, 2 * i, h), h)
        w2 = uniform((e, h, i), i)
        router = uniform((e, h), h).float()
        bias = torch.rand(e, generator=gen, device=device) * 0.1 if self.scoring == "sigmoid" else None
        routing = topk_routing(
            hidden_states.float() @ router.T,
            self.top_k,
            renormalize=self.renormalize,
            scoring=self.scoring,
            correction_bias=bias,
            num_expert_group=self.num_expert_group,
            topk_group=self.topk_group,
            routed_scaling_factor=self.routed_scaling_factor,
        )
        return hidden_states, w1, w2, routing

    def expert_kind(self, *, dtype=torch.bfloat16, device=None, seed: int = 0) -> dict:
        """The keyword arguments that say this preset's kind of experts to `fused_moe` and
        `fused_moe_reference`: {} for SwiGLU experts without biases, else `activation` and, with biases,
        random w1_bias [E, 2I] and w2_bias [E, H] in `dtype` (uniform ±1/sqrt(fan_in), nn.Linear's bias init)
        at this preset's sizes. Raises TypeError / ValueError for a dtype, device or seed as `build` does."""
        _check_dtype(dtype)
        device = _check_device(device)
        seed = _check_seed(seed)
        if self.activation == SILU and not self.biases:
            return {}
        kind = dict(activation=self.activation)
        if self.biases:
            gen = torch.Generator(device=device).manual_seed(seed)
            h, i, e = self.hidden_size, self.intermediate_size, self.num_experts
            for name, shape, fan_in in (("w1_bias", (e, 2 * i), h), ("w2_bias", (e, h), i)):
                x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
                kind[name] = x.mul_(2).sub_(1).div_(math.sqrt(fan_in)).to(dtype)
        return kind

    def quantize_fp8(self, w1: torch.Tensor, w2: torch.Tensor, block_shape=None):
        """w1 [E, 2I, H] and w2 [E, H, I] (from `build`) as FP8 experts: (w1_fp8, w2_fp8, scales), the weights
        float8_e4m3fn and `scales` = dict(w1_scale=, w2_scale=, block_shape=) for `fused_moe(...,
        **scales)` and `fused_moe_reference(..., **scales)`. One float32 scale per [bn, bk] weight block:
        `block_shape`, else this preset's `weight_block_size`, else DeepSeek-V3's (128, 128)
        (`moe_lab.quantize_weights_fp8`; H and I need not be multiples of the block). Raises TypeError /
        ValueError naming w1 or w2 when either is not a float16, bfloat16 or float32 tensor [E, 2I, H] /
        [E, H, I] of this preset's sizes, and as quantize_weights_fp8 does for a bad block_shape."""
        from ._validate import FLOAT_DTYPES, check_tensor
        from .quantize import quantize_weights_fp8

        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        check_tensor("w1", w1, ndim=3, dtypes=FLOAT_DTYPES, shape=(e, 2 * i, h), layout="[E, 2I, H]")
        check_tensor("w2", w2, ndim=3, dtypes=FLOAT_DTYPES, shape=(e, h, i), layout="[E, H, I]")
        if block_shape is None:
            block_shape = self.weight_block_size or DEFAULT_FP8_BLOCK
        block = tuple(block_shape) if isinstance(block_shape, (tuple, list)) else block_shape
        w1_fp8, w1_scale = quantize_weights_fp8(w1, block)
        w2_fp8, w2_scale = quantize_weights_fp8(w2, block)
        return w1_fp8, w2_fp8, dict(w1_scale=w1_scale, w2_scale=w2_scale, block_shape=block)


def _check_seed(seed) -> int:
    """A seed torch.Generator.manual_seed takes: an int in [0, 2**64)."""
    seed = check_positive_int("seed", seed, minimum=0)
    if seed >= 2**64:
        raise ValueError(f"seed must be < 2**64, got {seed}")
    return seed


def _check_dtype(dtype) -> None:
    """A dtype `build` and `expert_kind` can draw in: a 16, 32 or 64-bit floating torch.dtype."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize == 1:
        fp8 = isinstance(dtype, torch.dtype) and dtype.is_floating_point
        raise TypeError(
            f"dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}"
            + ("; for FP8 build in bfloat16, then preset.quantize_fp8(w1, w2)" if fp8 else "")
        )


PRESETS = {
    p.name: p
    for p in (
        MoEPreset("mixtral-8x7b", 8, 2, 4096, 14336, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
        MoEPreset("qwen3-30b-a3b", 128, 8, 2048, 768, source="Qwen/Qwen3-30B-A3B config.json"),
        # Its checkpoint's quantization_config: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        # "weight_block_size": [128, 128]}.
        MoEPreset(
            "deepseek-v3",
            256,
            8,
            7168,
            2048,
            scoring="sigmoid",
            num_expert_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            quantization="fp8",
            weight_block_size=(128, 128),
            source="deepseek-ai/DeepSeek-V3 config.json (routed experts)",
        ),
        MoEPreset("olmoe-1b-7b", 64, 8, 2048, 1024, renormalize=False, source="allenai/OLMoE-1B-7B-0924 config.json"),
        MoEPreset(
            "qwen1.5-moe-a2.7b",
            60,
            4,
            2048,
            1408,
            renormalize=False,
            source="Qwen/Qwen1.5-MoE-A2.7B config.json (routed experts)",
        ),
    )
}


# Models whose experts are not plain SwiGLU; kept apart from PRESETS, which the notebooks and the demo tour
# with SwiGLU layers. gpt-oss: the router's top-k logits through a softmax (= softmax, top-k, renormalized).
EXPERT_KIND_PRESETS = {
    p.name: p
    for p in (
        MoEPreset(
            "gpt-oss-20b", 32, 4, 2880, 2880, activation=GPT_OSS, biases=True, source="openai/gpt-oss-20b config.json"
        ),
        MoEPreset(
            "gpt-oss-120b",
            128,
            4,
            2880,
            2880,
            activation=GPT_OSS,
            biases=True,
            source="openai/gpt-oss-120b config.json",
        ),
    )
}


def get_preset(name: str) -> MoEPreset:
    """The preset called `name` (see PRESETS and EXPERT_KIND_PRESETS); raises ValueError listing the names
    otherwise, TypeError for a name that is not a string."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a model preset's name (str), got {type(name).__name__}")
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    if key in EXPERT_KIND_PRESETS:
        return EXPERT_KIND_PRESETS[key]
    names = ", ".join([*PRESETS, *EXPERT_KIND_PRESETS])
    raise ValueError(f"unknown model preset {name!r}; choose one of {names}")
