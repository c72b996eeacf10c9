"""moe-lab as an experts implementation of transformers: `experts_implementation="moe_lab"`.

    import moe_lab.integrations.transformers  # registers "moe_lab" (register() does it again, by name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, experts_implementation="moe_lab")
    model.set_experts_implementation("moe_lab")  # or switch a loaded model

transformers (>= 5.17) runs the routed experts of its MoE models through a registry of functions
(`transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS`; the FP8 experts of its finegrained-fp8 integration
through `ALL_FP8_EXPERTS_FUNCTIONS`), each called as `fn(experts_module, hidden_states [T, H],
top_k_index [T, k], top_k_weights [T, k])`. Its experts keep moe-lab's layout: `gate_up_proj` [E, 2I, H]
(gate rows, then up rows) and `down_proj` [E, H, I], or their transposes; `experts_forward` hands them to
`moe_lab.fused_moe` as they are stored (views, no copies). The router, shared experts and everything else of
the model stay transformers' own.

What an experts module computes is told by its traits (`TRAITS`): biases, interleaved gate/up rows,
gpt-oss's clamped SwiGLU, a gate of its own, an activation other than SiLU, ... Each trait either has the
fused_moe arguments that run it or is refused with NotImplementedError naming the experts class and the
trait. The verdict is made once per module and dtype and kept on the module, so a call costs a dictionary
lookup on top of fused_moe. Under torch.compile (transformers compiles `generate`'s decoding steps with a static
cache) the experts run as the custom op `torch.ops.moe_lab.fused_moe`, which dynamo keeps as one node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

try:
    from transformers.activations import SiLUActivation
    from transformers.integrations.moe import ExpertsInterface, _default_apply_gate
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "moe_lab.integrations.transformers needs transformers >= 5.17 (its experts registry): "
        "pip install 'moe-lab[transformers]'"
    ) from error
try:
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8ExpertsInterface
except ImportError:  # pragma: no cover - a transformers without its FP8 experts
    FP8Experts = FP8ExpertsInterface = None

from ..expert_kind import Activation
from ..gemm import check_weight_scale
from ..layer import fused_moe, fused_moe_through_op
from ..quantize import FP8_DTYPE

__all__ = ["TRAITS", "Trait", "experts_forward", "experts_modules", "register"]

DEFAULT_NAME = "moe_lab"
RUNS = (torch.bfloat16, torch.float16, torch.float32, FP8_DTYPE)  # the weight dtypes fused_moe takes
FP8_OPTIONS = ("limit", "swiglu_alpha", "gate_softcap")  # FP8Experts' _apply_gate departs from SwiGLU with any


def _gate(module: torch.nn.Module) -> str:
    """What the module's gate computes on the gate/up output: "swiglu" (silu(gate) * up: transformers'
    default), "gpt-oss" (gpt-oss's clamped SwiGLU, alpha and limit) or "its own"."""
    apply_gate = getattr(type(module), "_apply_gate", _default_apply_gate)
    if apply_gate is _default_apply_gate:
        return "swiglu"
    if FP8Experts is not None and apply_gate is FP8Experts._apply_gate:
        return "its own" if any(getattr(module, name, None) is not None for name in FP8_OPTIONS) else "swiglu"
    if apply_gate.__module__.endswith(".gpt_oss.modeling_gpt_oss"):
        return "gpt-oss"
    return "its own"


def _is_silu(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "act_fn", None), (torch.nn.SiLU, SiLUActivation))


def _scales_dtype(module: torch.nn.Module) -> Optional[torch.dtype]:
    scale = getattr(module, "gate_up_proj_scale_inv", None)
    return None if scale is None else scale.dtype


def _fp8_arguments(module: torch.nn.Module) -> Dict[str, object]:
    """DeepSeek-style block-scaled float8 experts (the finegrained-fp8 integration): value = float8 x
    scale_inv, one float32 scale per [block_n, block_k] block, as fused_moe's w1_scale/w2_scale/block_shape."""
    return dict(
        w1_scale=module.gate_up_proj_scale_inv, w2_scale=module.down_proj_scale_inv, block_shape=module.block_size
    )


def _transposed_arguments(module: torch.nn.Module) -> Dict[str, object]:
    """Weights stored as [E, H, 2I] and [E, I, H]: fused_moe reads their transposed views (any strides)."""
    return dict(w1=module.gate_up_proj.transpose(1, 2), w2=module.down_proj.transpose(1, 2))


def _bias_arguments(module: torch.nn.Module) -> Dict[str, object]:
    """Biases of both projections ([E, 2I] in gate_up_proj's order, [E, H]), added before the activation
    and before the routed weight, as transformers' experts add them."""
    return dict(w1_bias=module.gate_up_proj_bias, w2_bias=module.down_proj_bias)


def _activation_arguments(module: torch.nn.Module) -> Dict[str, object]:
    """The activation and gate/up layout (`moe_lab.Activation`): gpt-oss's clamped SwiGLU with the module's
    alpha and limit, else SiLU; gate/up rows interleaved where is_concatenated=False (row 2j gate, 2j + 1 up),
    else halves. Both traits that need it give the same."""
    layout = "halves" if getattr(module, "is_concatenated", True) else "interleaved"
    if _gate(module) == "gpt-oss":
        return dict(activation=Activation("swigluoai", layout, float(module.alpha), float(module.limit)))
    return dict(activation=Activation("silu", layout))


@dataclass(frozen=True)
class Trait:
    """A property of an experts module that changes what it computes or how its weights are stored.

    name: what a refusal calls it. present(module): whether the module has it. arguments(module): the
    fused_moe arguments that run it, read at each call (weights may be replaced between calls); None: moe-lab
    cannot run it yet, and a module with it is refused."""

    name: str
    present: Callable[[torch.nn.Module], bool]
    arguments: Optional[Callable[[torch.nn.Module], Dict[str, object]]] = None


def _flag(name: str, value: bool = True) -> Callable[[torch.nn.Module], bool]:
    """Present where `@use_experts_implementation`'s flag `name` is `value` (absent flags: the other value)."""
    return lambda m: getattr(m, name, not value) == value


def _fp8(test: Callable[[torch.nn.Module], bool]) -> Callable[[torch.nn.Module], bool]:
    """Present on transformers' FP8 experts (FP8Experts) that pass `test`."""
    return lambda m: FP8Experts is not None and isinstance(m, FP8Experts) and test(m)


def _scale_grid_differs(module: torch.nn.Module) -> bool:
    """A block-scaled FP8 module whose scales fused_moe's own check refuses (not one per [block_n, block_k]
    block of the weights: transformers keeps two gate/up scale rows where 2I <= block_n)."""
    weights = [getattr(module, name, None) for name in ("gate_up_proj", "down_proj")]
    scales = [getattr(module, f"{name}_scale_inv", None) for name in ("gate_up_proj", "down_proj")]
    if module.block_size is None or any(not isinstance(t, torch.Tensor) for t in weights + scales):
        return False  # (no gate projection, or no weights: refused by their own traits)
    if weights[0].dtype != torch.float8_e4m3fn or any(t.dtype != torch.float32 for t in scales):
        return False  # (other weights, or UE8M0 scales: their own traits)
    if getattr(module, "is_transposed", False):
        weights = [w.transpose(1, 2) for w in weights]  # as fused_moe reads them
    try:
        for name, weight, scale in zip(("w1_scale", "w2_scale"), weights, scales):
            check_weight_scale(name, scale, weight, tuple(module.block_size))
    except (TypeError, ValueError):
        return True
    return False


# Every trait of transformers' experts that moe-lab knows of. A feature fused_moe gains is one `arguments=`
# here.
TRAITS: Tuple[Trait, ...] = (
    Trait("transposed weights (is_transposed=True)", _flag("is_transposed"), _transposed_arguments),
    Trait("biases (has_bias=True)", _flag("has_bias"), _bias_arguments),
    Trait("interleaved gate/up rows (is_concatenated=False)", _flag("is_concatenated", False), _activation_arguments),
    Trait("gpt-oss's clamped SwiGLU (alpha, limit)", lambda m: _gate(m) == "gpt-oss", _activation_arguments),
    Trait("a gate of its own (_apply_gate: clamped or soft-capped)", lambda m: _gate(m) == "its own"),
    Trait("no gate projection (has_gate=False)", _flag("has_gate", False)),
    Trait("an activation other than SiLU", lambda m: _gate(m) == "swiglu" and not _is_silu(m)),
    Trait("a post-expert norm (has_post_expert_norm=True)", _flag("has_post_expert_norm")),
    Trait("block-scaled float8 weights", _fp8(lambda m: m.block_size is not None), _fp8_arguments),
    Trait("per-tensor float8 scales (block_size=None)", _fp8(lambda m: m.block_size is None)),
    Trait("static activation scales (activation_scheme='static')", _fp8(lambda m: m.activation_scheme != "dynamic")),
    Trait("float8 scales that are not float32 (UE8M0)", _fp8(lambda m: _scales_dtype(m) not in (None, torch.float32))),
    Trait("float8 scales not one per [block_n, block_k] block of the weights", _fp8(_scale_grid_differs)),
)


@dataclass(frozen=True)
class _Verdict:
    """What moe-lab makes of one experts module with weights of one dtype: the fused_moe arguments of its
    traits (`arguments`), or why it cannot run it (`refusal`)."""

    dtype: Optional[torch.dtype]
    arguments: Tuple[Callable[[torch.nn.Module], Dict[str, object]], ...] = ()
    refusal: Optional[str] = None


def _weights_dtype(module: torch.nn.Module) -> Optional[torch.dtype]:
    weight = getattr(module, "gate_up_proj", None)
    if weight is None:
        weight = getattr(module, "up_proj", None)
    return weight.dtype if isinstance(weight, torch.Tensor) else None


def _judge(module: torch.nn.Module, dtype: Optional[torch.dtype]) -> _Verdict:
    present = [trait for trait in TRAITS if trait.present(module)]
    missing = [trait.name for trait in present if trait.arguments is None]
    if dtype is not None and dtype not in RUNS:
        missing.append(f"weights of dtype {str(dtype)[6:]} (moe-lab runs bfloat16, float16, float32, float8_e4m3fn)")
    if dtype is None or not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")):
        missing.append("no gate_up_proj/down_proj weights")
    if missing:
        cls = type(module)
        return _Verdict(
            dtype,
            refusal=(
                f"moe-lab cannot run {cls.__name__} ({cls.__module__}): it has {'; '.join(missing)}. Use another "
                "experts_implementation for this model, e.g. 'grouped_mm' or 'eager'"
            ),
        )
    return _Verdict(dtype, arguments=tuple(trait.arguments for trait in present))


def _verdict(module: torch.nn.Module) -> _Verdict:
    """The module's verdict for its weights' current dtype: made once, then read from the module."""
    dtype = _weights_dtype(module)
    cached = module.__dict__.get("_moe_lab_verdict")
    if cached is None or cached.dtype != dtype:
        cached = _judge(module, dtype)
        module.__dict__["_moe_lab_verdict"] = cached
    return cached


def _is_experts_module(module) -> bool:
    """Looks like transformers' experts: a weight of theirs (gate_up_proj, up_proj, down_proj) or a flag of
    their decorator (has_gate, has_bias, is_transposed); the verdict names what moe-lab cannot run of one."""
    names = ("gate_up_proj", "up_proj", "down_proj", "has_gate", "has_bias", "is_transposed")
    return isinstance(module, torch.nn.Module) and any(hasattr(module, name) for name in names)


def _not_an_experts_module(module) -> str:
    cls = type(module)
    text = (
        f"self must be an experts module of transformers (gate_up_proj [E, 2I, H] and down_proj [E, H, I]), got "
        f"{cls.__name__} ({cls.__module__}): it is not an experts module (no gate_up_proj/down_proj weights)"
    )
    inner = getattr(module, "experts", None) if isinstance(module, torch.nn.Module) else None
    if _is_experts_module(inner):
        text += f"; its .experts ({type(inner).__name__}) is one: pass that (the MoE block's experts, not the block)"
    return text


# fused_moe's argument names -> what the experts module (or transformers' call) calls them
_MODULE_NAMES = dict(
    w1="gate_up_proj", w2="down_proj", w1_bias="gate_up_proj_bias", w2_bias="down_proj_bias",
    w1_scale="gate_up_proj_scale_inv", w2_scale="down_proj_scale_inv", block_shape="block_size",
    topk_ids="top_k_index", topk_weights="top_k_weights",
)  # fmt: skip
_ARGUMENT = re.compile(r"^(w1_bias|w2_bias|w1_scale|w2_scale|w1|w2|block_shape|topk_ids|topk_weights)\b")


def _in_module_terms(module: torch.nn.Module, exc: Exception, arguments: dict) -> Optional[Exception]:
    """fused_moe's TypeError / ValueError about one of its arguments, said in the module's names
    (MixtralExperts.gate_up_proj for w1, ...), or None where the message names no argument of its own."""
    match = _ARGUMENT.match(str(exc))
    if match is None:
        return None
    name = match.group(1)
    cls = type(module).__name__
    owner = "" if name.startswith("topk") else f"{cls}."  # top_k_index / top_k_weights: transformers' call's
    shapes = ", ".join(
        f"{key} is {cls}.{_MODULE_NAMES[key]}"
        + (f" {tuple(arguments[key].shape)}" if isinstance(arguments.get(key), torch.Tensor) else "")
        for key in ("w1", "w2")
    )
    transposed = " (read transposed: is_transposed=True)" if getattr(module, "is_transposed", False) else ""
    text = f"{owner}{_MODULE_NAMES[name]} (fused_moe's {name}): {exc} [{shapes}{transposed}]"
    return (TypeError if isinstance(exc, TypeError) else ValueError)(text)


def experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts function, through `moe_lab.fused_moe`: the registry calls it in place of the
    experts module's forward.

    Args:
        self: an experts module of transformers (`@use_experts_implementation`): `gate_up_proj` [E, 2I, H]
            (gate rows, then up rows; interleaved with is_concatenated=False) and `down_proj` [E, H, I] in
            bfloat16, float16 or float32, their transposes (is_transposed), with biases (has_bias:
            `gate_up_proj_bias`, `down_proj_bias`), gpt-oss's clamped SwiGLU (GptOssExperts' alpha and
            limit), or block-scaled float8_e4m3fn (FP8Experts, with `gate_up_proj_scale_inv`,
            `down_proj_scale_inv` and `block_size`).
        hidden_states: [T, H] float; cast to the weights' dtype if it differs (as transformers' grouped_mm
            does), the output cast back.
        top_k_index: [T, k] int experts; ids outside [0, E) (expert parallelism's sentinels) contribute zero.
        top_k_weights: [T, k] float routed weights.
    Returns:
        [T, H] in hidden_states' dtype: sum_j top_k_weights[t, j] * down[e] (silu(gate[e] x_t) * up[e] x_t)
        (with biases and gpt-oss's activation as `moe_lab.fused_moe` computes them).
    Raises:
        TypeError for a module that is not an experts module (no gate_up_proj/down_proj: an nn.Linear, or the
        MoE block instead of its .experts, which the message names) and for hidden states that are not float;
        NotImplementedError naming the experts class and its traits that moe-lab cannot run (`TRAITS`);
        fused_moe's TypeError/ValueError for bad inputs, said in the module's names (`MixtralExperts.gate_up_proj
        (fused_moe's w1): ...`), and ValueError where grad is on and an input requires it
        (inference only: call the model under torch.no_grad() or torch.inference_mode()).
    """
    judged = _verdict(self)  # made once per module and dtype: the checks below cost nothing after
    if judged.refusal is not None:
        if not _is_experts_module(self):
            raise TypeError(_not_an_experts_module(self))
        raise NotImplementedError(judged.refusal)
    if not isinstance(hidden_states, torch.Tensor) or not hidden_states.is_floating_point():
        got = hidden_states.dtype if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise TypeError(f"hidden_states must be a float tensor [T, H], got {got}")
    if torch.is_grad_enabled():
        named = dict(hidden_states=hidden_states, top_k_weights=top_k_weights)
        named.update(gate_up_proj=self.gate_up_proj, down_proj=self.down_proj)
        requiring = [name for name, t in named.items() if isinstance(t, torch.Tensor) and t.requires_grad]
        if requiring:
            raise ValueError(
                f"{requiring[0]} requires grad: moe-lab's experts are inference-only (no backward): run the model "
                "under torch.no_grad() or torch.inference_mode(), or train with experts_implementation='eager' "
                "or 'grouped_mm'"
            )
    arguments = dict(w1=self.gate_up_proj, w2=self.down_proj)
    for read in judged.arguments:
        arguments.update(read(self))
    compute_dtype = hidden_states.dtype if judged.dtype == FP8_DTYPE else judged.dtype
    x = hidden_states.to(compute_dtype)
    if torch.compiler.is_compiling():  # torch.compile traces the custom op, one opaque node, not fused_moe's Python
        out = fused_moe_through_op(x, topk_weights=top_k_weights, topk_ids=top_k_index, check_ids=False, **arguments)
    else:
        try:
            out = fused_moe(x, topk_weights=top_k_weights, topk_ids=top_k_index, check_ids=False, **arguments)
        except (TypeError, ValueError) as exc:
            said = _in_module_terms(self, exc, arguments)
            if said is None:
                raise
            raise said from exc
    return out.to(hidden_states.dtype)


def register(name: str = DEFAULT_NAME) -> str:
    """Register `experts_forward` in transformers' experts registries under `name` (and in its FP8 experts
    registry where transformers has one), so that `experts_implementation=name` in `from_pretrained` /
    `from_config`, or `model.set_experts_implementation(name)`, runs the experts through moe-lab.
    Idempotent. Importing this module registers the default name, "moe_lab".

    Returns the name. Raises TypeError for a name that is not a string, ValueError for an empty one or one
    that transformers already gives another function (its own "grouped_mm", "batched_mm", ...)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name or name == "eager":
        raise ValueError(f"name must be a non-empty name other than 'eager', got {name!r}")
    registries = [ExpertsInterface] + ([FP8ExpertsInterface] if FP8ExpertsInterface is not None else [])
    for registry in registries:
        taken = registry._global_mapping.get(name)
        if taken is not None and not _is_ours(taken):
            raise ValueError(
                f"name {name!r} is already transformers' experts implementation {taken.__module__}."
                f"{taken.__qualname__}: choose another name (default {DEFAULT_NAME!r})"
            )
    for registry in registries:
        registry.register(name, experts_forward)
    return name


def experts_modules(model: torch.nn.Module) -> list:
    """The experts modules of `model` that transformers dispatches through its experts registry (classes
    decorated with `@use_experts_implementation`), as (name, module) pairs: the modules that
    `experts_implementation="moe_lab"` runs through moe-lab (or refuses by name). A model whose MoE layers keep
    code of their own (transformers 5.17's Llama 4) has none: the setting then changes nothing in it."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "_is_expert_parallel")
        # the decorated forward: the class's own, or a base class's that an override calls
        and any(hasattr(vars(cls).get("forward"), "__wrapped__") for cls in type(module).__mro__)
    ]


def _is_ours(function) -> bool:
    """`experts_forward`, also as defined by an earlier import of this module (importlib.reload)."""
    return getattr(function, "__module__", None) == __name__ and function.__qualname__ == "experts_forward"


register()
