"""SiLU-and-mul, the activation between the two GEMMs of a SwiGLU expert, and the expert kinds it comes in.

out[r, :] = silu(x[r, :I]) * x[r, I:], computed in float32 and stored in x's dtype. The gate half comes
first, matching w1 = [gate; up] stacked along N (the layout of vLLM and of Hugging Face's Mixtral
w1/w3 once concatenated). Source: Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202.

`Activation` names the gated activation of an expert and how its w1 rows hold gate and up: SiLU-and-mul
with gate rows, then up rows (the default), or gpt-oss's clamped SwiGLU with gate and up rows interleaved
(`GPT_OSS`; transformers' GptOssExperts, vLLM's "swigluoai"). `fused_moe`, `grouped_matmul(swiglu=...)`
and `silu_and_mul` take it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import triton

from ._kernels.activation import silu_and_mul_kernel
from ._validate import FLOAT_DTYPES, check_not_aliased, check_same_device, check_tensor, output_buffer
from .align import AlignedRouting
from .runtime import interpreter_active, interpreter_serialized

BLOCK_SIZE = 1024
ACTIVATION_KINDS = ("silu", "swigluoai")
GATE_UP_LAYOUTS = ("halves", "interleaved")


@dataclass(frozen=True)
class Activation:
    """The gated activation of an expert: act = f(gate, up), gate and up the two projections of w1's rows.

    kind: "silu": silu(gate) * up (SwiGLU: Mixtral, Qwen, DeepSeek, OLMoE). "swigluoai": gpt-oss's clamped
        SwiGLU, gate = min(gate, limit), up = clamp(up, -limit, limit), act = (up + 1) * gate *
        sigmoid(alpha * gate) (openai/gpt-oss; transformers' GptOssExperts; vLLM's "swigluoai").
    gate_up_layout: how w1 [E, 2I, H] holds them: "halves": gate rows [0, I), up rows [I, 2I) (vLLM's w13);
        "interleaved": row 2j gate j, row 2j + 1 up j (gpt-oss's checkpoints), read as stored (no copy).
        Biases of w1 ([E, 2I]) follow the same order.
    alpha, limit: swigluoai's sigmoid scale and clamp (gpt-oss: 1.702 and 7.0); finite, limit > 0. kind
        "silu" has neither: other values than the defaults raise ValueError.
    Raises ValueError naming the field for anything else."""

    kind: str = "silu"
    gate_up_layout: str = "halves"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if self.kind not in ACTIVATION_KINDS:
            kinds = ", ".join(map(repr, ACTIVATION_KINDS))
            raise ValueError(f"activation kind must be one of {kinds}, got {self.kind!r}")
        if self.gate_up_layout not in GATE_UP_LAYOUTS:
            raise ValueError(
                f"activation gate_up_layout must be one of {', '.join(map(repr, GATE_UP_LAYOUTS))}, "
                f"got {self.gate_up_layout!r}"
            )
        for name in ("alpha", "limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"activation {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))  # frozen; the kernels take it as a float32 scalar
        if self.limit <= 0:
            raise ValueError(f"activation limit must be > 0, got {self.limit!r}")
        if self.kind == "silu" and (self.alpha, self.limit) != (1.702, 7.0):
            raise ValueError(
                f"activation alpha and limit belong to kind 'swigluoai'; kind 'silu' takes neither, got "
                f"alpha={self.alpha!r}, limit={self.limit!r}"
            )

    @property
    def kernel_name(self) -> str:
        """The kernels' name of this activation (their SWIGLU / ACTIVATION constexpr): the kind, with
        "_interleaved" for interleaved gate and up rows."""
        return self.kind if self.gate_up_layout == "halves" else f"{self.kind}_interleaved"

    @property
    def interleaved(self) -> bool:
        return self.gate_up_layout == "interleaved"


SILU = Activation()
GPT_OSS = Activation("swigluoai", "interleaved")


def check_activation(activation: Union[Activation, str, None], name: str = "activation") -> Activation:
    """`activation` as an Activation: None means SILU; a string is a kind with gate and up in halves
    ("silu", "swigluoai"). Raises TypeError/ValueError naming the argument otherwise."""
    if activation is None:
        return SILU
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        try:
            return Activation(activation)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    raise TypeError(
        f"{name} must be a moe_lab.Activation, 'silu', 'swigluoai' or None, got {type(activation).__name__}"
    )


@interpreter_serialized
def silu_and_mul(
    x: torch.Tensor,
    *,
    routing: Optional[AlignedRouting] = None,
    out: Optional[torch.Tensor] = None,
    activation: Union[Activation, str, None] = None,
) -> torch.Tensor:
    """x [R, 2I] float16/bfloat16/float32 (any strides; copied first if the last is not 1) -> [R, I] in
    x's dtype. Source: Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202.

    activation: an `Activation` (None: SiLU-and-mul of halves): the function, and whether x's columns hold
    gate and up as halves or interleaved (column 2j gate j, 2j + 1 up j), as w1's rows did; the same
    function as the up GEMM's epilogue computes.

    routing: optional AlignedRouting whose padded order x is in (R = routing.max_num_tokens_padded), as
    the layer's up projection writes it: rows past its num_tokens_post_padded are skipped (left as they
    were in `out`), so the bound-sized buffers cost only the rows in use, and padding rows are set to zero
    without being read (the grouped matmul leaves padding rows of tail tiles unwritten). In slot order
    (`moe_lab.align.slot_order_routing`) the rows of a block whose id lies outside [0, E) are computed from
    whatever x holds there; the down projection skips them too.
    Raises TypeError/ValueError for a wrong dtype, rank, an odd last dimension, x's rows not matching the
    routing, tensors on different devices, or an `out` that overlaps x."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, layout="[R, 2I]")
    activation = check_activation(activation)
    if routing is not None:
        if not isinstance(routing, AlignedRouting):
            raise TypeError(f"routing must be an AlignedRouting (from moe_align), got {type(routing).__name__}")
        check_tensor(
            "x",
            x,
            ndim=2,
            dtypes=FLOAT_DTYPES,
            shape=(routing.max_num_tokens_padded, None),
            layout="[max_num_tokens_padded, 2I]",
        )
    rows, two_inter = x.shape
    if two_inter % 2:
        raise ValueError(f"x must have an even last dimension [R, 2I], got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    inter = two_inter // 2
    out = output_buffer(out, (rows, inter), x.dtype, x.device, "[R, I]")
    check_same_device(x=x, out=out, sorted_token_ids=routing.sorted_token_ids if routing is not None else None)
    check_not_aliased(
        out,
        x=x,
        **(
            {}
            if routing is None
            else dict(sorted_token_ids=routing.sorted_token_ids, num_tokens_post_padded=routing.num_tokens_post_padded)
        ),
    )
    if rows == 0 or inter == 0:
        return out
    silu_and_mul_kernel[(rows, triton.cdiv(inter, BLOCK_SIZE))](
        x,
        out,
        routing.num_tokens_post_padded if routing is not None else None,
        routing.sorted_token_ids if routing is not None else None,
        routing.num_slots if routing is not None else 0,
        inter,
        x.stride(0),
        out.stride(0),
        activation.alpha,
        activation.limit,
        ROUTED=routing is not None,
        ACTIVATION=activation.kernel_name,
        EMULATE_BF16=interpreter_active() and x.dtype == torch.bfloat16,
        BLOCK_SIZE=BLOCK_SIZE,
    )
    return out
