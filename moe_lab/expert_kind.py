"""What kind of gated activation an expert applies, and how its w1 rows hold gate and up (`Activation`).

Kept apart from the kernels so that the model presets (and the tools that read them) import without Triton.
`fused_moe`, `grouped_matmul(swiglu=...)` and `silu_and_mul` take an `Activation`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Union

from ._validate import described, is_bool

ACTIVATION_KINDS = ("silu", "swigluoai")
GATE_UP_LAYOUTS = ("halves", "interleaved")
FLOAT32_MAX = 3.4028234663852886e38  # the kernels take alpha and limit as float32 scalars


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
    Raises ValueError naming the field for anything else (TypeError for an alpha or limit that is not a number)."""

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
            if is_bool(value) or not isinstance(value, numbers.Real):  # numpy's reals too, as read from a config
                raise TypeError(f"activation {name} must be a finite number, got {described(value)}")
            if not abs(value) <= FLOAT32_MAX:  # NaN fails too
                raise ValueError(
                    f"activation {name} must be a finite number, got {value!r} (the kernels take it as a float32: "
                    "|x| <= 3.4e38)"
                )
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


def check_activation(activation: Union[Activation, str, None]) -> Activation:
    """`activation` as an Activation: None means SILU; a string is a kind with gate and up in halves
    ("silu", "swigluoai"). Raises TypeError/ValueError naming the argument otherwise."""
    if activation is None:
        return SILU
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        return Activation(activation)
    raise TypeError(
        f"activation must be a moe_lab.Activation, 'silu', 'swigluoai' or None, got {type(activation).__name__}"
    )
