"""The fused MoE layer: align, gate/up GEMM with SiLU-and-mul, down GEMM with routed weights, top-k reduce.

    topk_ids ──moe_align──▶ routing (sorted_token_ids, expert_ids, num_tokens_post_padded); one token: slot order
    hidden_states [T, H] ──grouped_matmul(w1, gather rows, swiglu)──▶ act [padded, I], expert-sorted
    act ──grouped_matmul(w2, × topk_weights, scatter)──▶ out_k [T*k, H] ──topk_reduce──▶ out [T, H]

The up GEMM applies SiLU-and-mul in its epilogue (`GemmConfig.fuse_swiglu`, on by default); with it off,
the up GEMM writes gate_up [padded, 2I] and `silu_and_mul` makes act from it, as the workbook builds it.

No stage asks the host for a size, so the layer can be captured in a CUDA graph. The layer computes the
same function as vLLM's `fused_experts` (vllm-project/vllm, model_executor/layers/fused_moe), with its
own kernels.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import List, Optional, Tuple, Union

import torch

from ._launch import Program, recording
from ._validate import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_kernel_device,
    check_layer_out,
    check_layer_out_overlap,
    check_one_device,
    check_positive_int,
    check_same_device,
    check_tensor,
)
from .activation import Activation, check_activation, silu_and_mul
from .align import AlignedRouting, align_buffers, run_align, run_slot_order
from .capability import require_fp8
from .configs import ConfigLike, GemmConfig, MoEConfig
from .gemm import (
    check_bias,
    check_gemm_block_shape,
    check_weight_scale,
    input_descriptor,
    kernel_scales,
    run_gemm,
    weight_descriptor_maker,
)
from .plan import (
    ChunkPlan,
    GluonLayerPlan,
    LaunchPlan,
    LayerPlan,
    LoadPath,
    UseTma,
    cached_layer_plan,
    check_use_tma,
    layer_key,
    plan_layer,
    quantized_by_epilogue,
    remember_layer_plan,
    reserve_workspace,
    workspace_slot,
)
from .quantize import (
    FP8_DTYPE,
    check_scale_values,
    check_scale_values_on_cpu,
    check_static_scale,
    run_quantize_activations,
)
from .reduce import run_topk_reduce
from .runtime import interpreter_serialized, keeping_no_buffers


@dataclass(frozen=True)
class FusedMoEInfo:
    """What a `fused_moe` call did: the config, each GEMM's load path (with the reason), the schedule,
    and `config_source`, where the config came from (`moe_lab.tuned.choose_config` decides):
    "user config", "user config (dict) over <default source>", "tuned: <table>, T bucket <n>" (e.g.
    "tuned: NVIDIA H200, Triton 3.6.0 (exact), T bucket 64"; `moe_lab.tuned.table_for_device()` says
    why that table), "heuristic (no tuned table for this device)" or "heuristic (no tuned entry for
    this shape: ...)". `routing` is the schedule (at T = 1 in slot order: `moe_lab.align.slot_order_routing`,
    whose expert_ids is topk_ids' own view). `config` is the config chosen;
    `up_plan` / `down_plan` are what each GEMM launched
    (`moe_lab.LaunchPlan`: the config as fitted to the device, fewer stages where its shared
    memory needed it; the load paths, also in `up_path` / `down_path`; the grid). None at T = 0.
    `gemm_kernel`: "triton", or "gluon" where the warp-specialized Gluon FP8 GEMMs ran instead
    (`moe_lab.plan.gluon_applies`; `gluon_plan` is then what they launched, and up_plan / down_plan the
    Triton plans not launched); `gemm_reason` says why. With chunks (chunk_size), all of it is the last
    chunk's. `print(info)` gives it in a few lines (each GEMM's block sizes, programs and load path); repr() every
    field."""

    config: MoEConfig
    up_path: Optional[LoadPath]
    down_path: Optional[LoadPath]
    routing: Optional[AlignedRouting]
    config_source: str = ""
    up_plan: Optional[LaunchPlan] = None
    down_plan: Optional[LaunchPlan] = None
    gemm_kernel: str = "triton"
    gemm_reason: str = ""
    gluon_plan: Optional[GluonLayerPlan] = None

    def __str__(self) -> str:
        lines = [
            f"FusedMoEInfo: config from {self.config_source}",
            f"  kernels: {self.gemm_reason or self.gemm_kernel}",
        ]
        gluon = self.gluon_plan is not None
        plans = (self.gluon_plan.up, self.gluon_plan.down) if gluon else (self.up_plan, self.down_plan)
        notes = set()
        for name, plan in zip(("up", "down"), plans):
            if plan is None:  # T = 0
                continue
            c = plan.config
            path = "tma (the Gluon kernel loads by TMA alone)" if gluon else plan.path.choice
            notes.add("" if gluon else plan.path.device_note)
            lines.append(
                f"  {name + ':':5} BLOCK_SIZE_M/N/K {c.BLOCK_SIZE_M}/{c.BLOCK_SIZE_N}/{c.BLOCK_SIZE_K}, GROUP_SIZE_M "
                f"{c.GROUP_SIZE_M}, num_warps {c.num_warps}, num_stages {c.num_stages}, {plan.grid} programs; {path}"
            )
        if self.up_plan is None and not gluon:
            lines.append("  nothing launched (T = 0)")
        lines += [f"  TMA here: {note}" for note in sorted(notes - {""})]
        if self.routing is not None:
            lines.append(f"  routing: {self.routing!r}")
        return "\n".join(lines)


def _check_weights(w1, w2, dtypes=FLOAT_DTYPES, hidden=None, dtype_of=None, prefix="", hidden_of="hidden_states"):
    """w1 [E, 2I, H] with an even, non-zero 2I, and w2 [E, H, I] to match (fused_moe and FusedMoE); `prefix`
    names shared experts' (shared_w1, shared_w2) in messages; `hidden_of` names where H comes from."""
    n1, n2 = prefix + "w1", prefix + "w2"
    e, i = ("S", "I_s") if prefix else ("E", "I")  # shared experts: S of width I_s
    if _stored_transposed(w1, w2, hidden):
        raise ValueError(
            f"{n1} must have shape [{e}, 2{i}, H], got {tuple(w1.shape)}: stored [{e}, H, 2{i}]? Pass "
            f"{n1}.transpose(1, 2) (a view; any strides are read as they are)"
        )
    if hidden is not None and isinstance(w1, torch.Tensor) and w1.dim() == 3 and w1.shape[2] != hidden:
        raise ValueError(
            f"{n1} must have shape [{e}, 2{i}, H] with H = {hidden} (the last dimension of {hidden_of}), got "
            f"{tuple(w1.shape)}"
        )
    check_tensor(n1, w1, ndim=3, dtypes=dtypes, layout=f"[{e}, 2{i}, H]", dtype_of=dtype_of)  # H: checked above
    num_experts, two_inter, hidden = w1.shape
    if num_experts == 0:
        raise ValueError(f"{n1} must have shape [{e}, 2{i}, H] with at least one expert, got {tuple(w1.shape)}")
    if two_inter % 2 or two_inter == 0:
        raise ValueError(f"{n1} must have shape [{e}, 2{i}, H] with an even, non-zero 2{i}, got {tuple(w1.shape)}")
    if isinstance(w2, torch.Tensor) and tuple(w2.shape) == (num_experts, hidden, two_inter):
        # I is read from w1's rows: a w1 of I rows (its up half missing) would read as a wrong w2
        raise ValueError(
            f"{n1} must have shape [{e}, 2{i}, H] (gate rows, then up rows) = [{num_experts}, "
            f"{2 * two_inter}, {hidden}] for {n2} [{e}, H, {i}] {tuple(w2.shape)}, got {tuple(w1.shape)}: "
            f"only one of the gate and up projections?"
        )
    if (
        isinstance(w2, torch.Tensor)
        and hidden != two_inter // 2
        and tuple(w2.shape) == (num_experts, two_inter // 2, hidden)
    ):
        raise ValueError(
            f"{n2} must have shape [{e}, H, {i}] = [{num_experts}, {hidden}, {two_inter // 2}], got "
            f"{tuple(w2.shape)}: stored [{e}, {i}, H]? Pass {n2}.transpose(1, 2) (a view; any strides are read as "
            "they are)"
        )
    check_tensor(
        n2,
        w2,
        ndim=3,
        dtypes=(w1.dtype,),
        shape=(num_experts, hidden, two_inter // 2),
        layout=f"[{e}, H, {i}]",
        dtype_of=n1,
    )


def _stored_transposed(w1, w2, hidden) -> bool:
    """Whether w1 looks stored as [E, H, 2I] (transformers' is_transposed layout): its last size is not H but its
    middle one is (H from hidden_states, or from w2 [E, H, I] with 2I = 2 * I). Where H = 2I nothing tells."""
    if not (isinstance(w1, torch.Tensor) and w1.dim() == 3) or w1.shape[1] == w1.shape[2]:
        return False
    if hidden is not None:  # and w2 [E, H, I] or [E, I, H] of that I, where w2 is there to tell
        fits = not (isinstance(w2, torch.Tensor) and w2.dim() == 3) or tuple(w2.shape) in (
            (w1.shape[0], hidden, w1.shape[2] // 2),
            (w1.shape[0], w1.shape[2] // 2, hidden),
        )
        return w1.shape[2] != hidden and w1.shape[1] == hidden and fits
    # w2 [E, H, I], or stored transposed too ([E, I, H])
    return isinstance(w2, torch.Tensor) and tuple(w2.shape) in (
        (w1.shape[0], w1.shape[1], w1.shape[2] // 2),
        (w1.shape[0], w1.shape[2] // 2, w1.shape[1]),
    )


def _grad_refused(name: str) -> ValueError:
    """The error for an input that requires grad while grad is on: the layer and its custom op say the same."""
    return ValueError(
        f"{name} requires grad: fused_moe is inference-only (no backward): call it under torch.no_grad() or "
        "torch.inference_mode(), or pass tensors that do not require grad"
    )


def _check_no_grad(**tensors) -> None:
    """Where grad is on, `_grad_refused` for the first of `tensors` (None skipped) that requires grad."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if t is not None and t.requires_grad:
                raise _grad_refused(name)


def _check_shared_weights(shared_w1, shared_w2, dtypes, hidden, **named):
    """Shared experts' shared_w1 [S, 2I_s, H] and shared_w2 [S, H, I_s]: both or neither, then checked as w1
    and w2 are (`_check_weights`, `named`: dtype_of, hidden_of)."""
    if (shared_w1 is None) != (shared_w2 is None):
        raise ValueError("shared_w1 and shared_w2 go together: give both or neither")
    if shared_w1 is not None:
        _check_weights(shared_w1, shared_w2, dtypes, hidden, prefix="shared_", **named)


def _check_layer(hidden_states, w1, w2, topk_weights, topk_ids, expert_map):
    check_tensor("hidden_states", hidden_states, ndim=2, dtypes=FLOAT_DTYPES, layout="[T, H]")
    num_tokens, hidden = hidden_states.shape
    if isinstance(w1, torch.Tensor) and w1.dtype in FLOAT_DTYPES and w1.dtype != hidden_states.dtype:
        # neither is wrong alone: say both (the layer computes in hidden_states' dtype)
        raise TypeError(
            f"hidden_states is {str(hidden_states.dtype)[6:]} but w1 is {str(w1.dtype)[6:]}: the layer computes in "
            f"one dtype; cast one to the other's (or pass float8_e4m3fn weights with w1_scale and w2_scale)"
        )
    _check_weights(w1, w2, (hidden_states.dtype, FP8_DTYPE), hidden, "hidden_states, or float8_e4m3fn")
    num_experts = w1.shape[0]
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, shape=(num_tokens, None), layout="[T, k]")
    check_tensor(
        "topk_weights",
        topk_weights,
        ndim=2,
        dtypes=FLOAT_DTYPES,
        shape=tuple(topk_ids.shape),
        layout="[T, k] (same as topk_ids)",
    )
    if expert_map is not None:
        check_tensor("expert_map", expert_map, ndim=1, dtypes=INDEX_DTYPES, layout="[E_global]")
        if expert_map.numel() == 0:
            raise ValueError(
                "expert_map must have one entry per global expert [E_global], E_global >= 1, got shape (0,)"
            )
    num_global = expert_map.numel() if expert_map is not None else num_experts
    if expert_map is not None and topk_ids.shape[1] > num_global:  # k distinct experts need k global ones
        raise ValueError(
            f"expert_map must have one entry per global expert [E_global], E_global >= k={topk_ids.shape[1]} "
            f"(topk_ids' columns), got shape ({num_global},)"
        )
    if topk_ids.shape[1] > num_global or topk_ids.shape[1] == 0:
        raise ValueError(f"topk_ids must have 1 <= k <= E={num_global} columns, got shape {tuple(topk_ids.shape)}")
    _check_no_grad(hidden_states=hidden_states, w1=w1, w2=w2, topk_weights=topk_weights)
    check_kernel_device(
        hidden_states=hidden_states, w1=w1, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids, expert_map=expert_map
    )


def _check_ids(
    topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor], num_experts: int, check_ids: Optional[bool]
) -> None:
    """Raise ValueError for experts outside [0, E) (or E_global), for an expert_map shorter than the
    experts topk_ids name, and for expert_map entries outside [-1, E) or repeated (two global experts on one
    local one). On a GPU this reads values back to the host (a sync that CUDA-graph capture forbids),
    so there it runs only when asked (check_ids=True)."""
    if check_ids is False or (check_ids is None and topk_ids.device.type != "cpu"):
        return
    num_global = expert_map.numel() if expert_map is not None else num_experts
    if topk_ids.numel():
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if expert_map is not None and low >= 0 and high >= num_global:
            raise ValueError(
                f"expert_map must have one entry per global expert [E_global]: topk_ids name experts up to {high} "
                f"(E_global >= {high + 1}), got shape ({num_global},)"
            )
        if low < 0 or high >= num_global:
            where = " (E_global: expert_map's length)" if expert_map is not None else ""
            raise ValueError(f"topk_ids must hold experts in [0, {num_global}){where}, got values from {low} to {high}")
    if expert_map is not None:
        _check_expert_map_values(expert_map, num_experts)


def _check_scales_on_cpu(scales: tuple) -> None:
    """`check_scale_values_on_cpu` for each scale given (w1_scale, w2_scale, a1_scale, a2_scale)."""
    for name, scale in zip(("w1_scale", "w2_scale", "a1_scale", "a2_scale"), scales):
        if isinstance(scale, torch.Tensor):
            check_scale_values_on_cpu(name, scale)


_SHARED_WITH_EXPERT_MAP = (
    "shared_w1 with expert_map is not supported: every rank would add the shared experts' output; run them on one "
    "rank (a fused_moe call of their own) instead"
)


def _check_expert_map_values(expert_map: torch.Tensor, num_experts: int) -> None:
    """Raise ValueError for expert_map entries outside [-1, E) or repeated (two global experts on one local one);
    reads the values (a sync on a GPU; none on the meta device, which holds none)."""
    if expert_map.numel() and expert_map.device.type != "meta":
        low, high = int(expert_map.min()), int(expert_map.max())
        if low < -1 or high >= num_experts:
            raise ValueError(
                f"expert_map must hold local experts in [0, {num_experts}) or -1, got values from {low} to {high}"
            )
        values, counts = torch.unique(expert_map, return_counts=True)
        repeated = values[(counts > 1) & (values >= 0)]
        if repeated.numel():
            local = int(repeated[0])
            shared = torch.nonzero(expert_map == local).flatten().tolist()
            raise ValueError(
                "expert_map must map each local expert to at most one global expert (entries other than -1 "
                f"distinct), got global experts {shared} all mapped to local expert {local}"
            )


@dataclass(frozen=True)
class Fp8Weights:
    """The float8 side of a layer call, checked once: the weight scales, block_shape, and the static
    activation scales as [1] (None: dynamic)."""

    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
    block_shape: Optional[tuple]
    a1_scale: Optional[torch.Tensor]
    a2_scale: Optional[torch.Tensor]

    def quantized_by_epilogue(self, up: GemmConfig) -> bool:
        """`moe_lab.plan.quantized_by_epilogue` for these weights: whether the up GEMM's SwiGLU epilogue
        writes its output as float8 itself."""
        return quantized_by_epilogue(self.block_shape, up)

    def quantize(self, x: torch.Tensor, static_scale: Optional[torch.Tensor], num_rows=None, site=None):
        """x as float8 with the scales the next GEMM reads: per token per block_k channels with block_shape;
        per tensor with a static scale; else per token (dynamic). `site`: as `run_quantize_activations` takes it."""
        if self.block_shape is not None:
            return run_quantize_activations(x, self.block_shape[1], None, num_rows, site)
        return run_quantize_activations(x, None, static_scale, num_rows, site)


def _check_no_scales(w1: torch.Tensor, **given) -> None:
    """Scales (or a block_shape) given with weights that are not float8 are refused, by name."""
    extra = [name for name, value in given.items() if value is not None]
    if extra:
        raise ValueError(
            f"{', '.join(extra)} given, but w1 and w2 are {str(w1.dtype)[6:]}: scales are for "
            "float8_e4m3fn weights (moe_lab.quantize_weights_fp8)"
        )


def _check_fp8(w1, w2, w1_scale, w2_scale, a1_scale, a2_scale, block_shape) -> Optional[Fp8Weights]:
    block_shape = check_gemm_block_shape(block_shape)
    given = dict(w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, block_shape=block_shape)
    if w1.dtype != FP8_DTYPE:
        _check_no_scales(w1, **given)
        return None
    for name in ("w1_scale", "w2_scale"):
        if given[name] is None:
            raise ValueError(f"float8_e4m3fn weights need {name} (moe_lab.quantize_weights_fp8 returns it)")
    check_weight_scale("w1_scale", w1_scale, w1, block_shape)
    check_weight_scale("w2_scale", w2_scale, w2, block_shape)
    if block_shape is not None:
        for name in ("a1_scale", "a2_scale"):
            if given[name] is not None:
                raise ValueError(
                    f"{name} must be None with block_shape: block-scaled activations are quantized "
                    "per token per block_k channels as they come (dynamic)"
                )
    if a1_scale is not None:
        a1_scale = check_static_scale("a1_scale", a1_scale)
    if a2_scale is not None:
        a2_scale = check_static_scale("a2_scale", a2_scale)
    check_same_device(w1=w1, w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale)
    _check_no_grad(w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale)
    require_fp8(w1.device, "float8_e4m3fn weights")
    return _fp8_weights(w1, w1_scale, w2_scale, a1_scale, a2_scale, block_shape)


def _fp8_weights(w1, w1_scale, w2_scale, a1_scale, a2_scale, block_shape) -> Optional[Fp8Weights]:
    """The Fp8Weights of checked arguments (`_check_fp8`), without checking them again; None for float weights."""
    if w1.dtype != FP8_DTYPE:
        return None
    a1_scale = a1_scale.reshape(1) if a1_scale is not None else None  # [1] or []: read as [1]
    a2_scale = a2_scale.reshape(1) if a2_scale is not None else None
    return Fp8Weights(w1_scale, w2_scale, block_shape, a1_scale, a2_scale)


# --- Expert kinds: the activation, biases and shared experts (checked once per key, run by the chunks). ---


@dataclass(frozen=True)
class ExpertKind:
    """The expert-kind side of a layer call: the activation, the biases ([E, 2I] in w1's row order, [E, H];
    None: none) and the shared experts (None: none) with their weights [T, S] (None: 1)."""

    activation: Activation
    w1_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None
    shared_w1: Optional[torch.Tensor] = None
    shared_w2: Optional[torch.Tensor] = None
    shared_weights: Optional[torch.Tensor] = None

    @property
    def tensors(self) -> tuple:
        return (self.w1_bias, self.w2_bias, self.shared_w1, self.shared_w2, self.shared_weights)


def _check_expert_kind(hidden_states, w1, w2, expert_map, kind: ExpertKind) -> None:
    dtype = hidden_states.dtype
    check_bias("w1_bias", kind.w1_bias, w1, dtype, "[E, 2I]")
    check_bias("w2_bias", kind.w2_bias, w2, dtype, "[E, H]")
    shared_w1, shared_w2, shared_weights = kind.shared_w1, kind.shared_w2, kind.shared_weights
    _check_shared_weights(shared_w1, shared_w2, (dtype,), hidden_states.shape[1], dtype_of="hidden_states")
    if shared_w1 is None:
        if shared_weights is not None:
            raise ValueError("shared_weights given without shared_w1 and shared_w2: the shared experts' weights")
    else:
        if expert_map is not None:
            raise ValueError(_SHARED_WITH_EXPERT_MAP)
        if shared_weights is not None:
            check_tensor(
                "shared_weights",
                shared_weights,
                ndim=2,
                dtypes=FLOAT_DTYPES,
                shape=(hidden_states.shape[0], shared_w1.shape[0]),
                layout="[T, S]",
            )
    expert_tensors = dict(zip(_EXPERT_TENSORS, kind.tensors))
    _check_no_grad(**expert_tensors)
    check_same_device(hidden_states=hidden_states, **expert_tensors)


_EXPERT_TENSORS = ("w1_bias", "w2_bias", "shared_w1", "shared_w2", "shared_weights")
_PLAIN = ExpertKind(check_activation(None))  # the plain call's kind, made once


def _shared_experts(hidden_states, kind: ExpertKind, config, use_tma, chunk_size) -> torch.Tensor:
    """The shared experts' output [T, H]: every token routed to each of the S shared experts, with weight
    shared_weights (or 1), through the same kernels (no copy of any weight)."""
    num_tokens, num_shared = hidden_states.shape[0], kind.shared_w1.shape[0]
    device = hidden_states.device
    ids = torch.arange(num_shared, dtype=torch.int32, device=device).repeat(num_tokens, 1)
    weights = kind.shared_weights
    if weights is None:
        weights = torch.ones((num_tokens, num_shared), dtype=torch.float32, device=device)
    return fused_moe(
        hidden_states,
        kind.shared_w1,
        kind.shared_w2,
        weights,
        ids,
        config=config,
        use_tma=use_tma,
        chunk_size=chunk_size,
        check_ids=False,
        activation=kind.activation,
    )


@interpreter_serialized
def fused_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: ConfigLike = None,
    use_tma: UseTma = "auto",
    expert_map: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    chunk_size: Optional[int] = None,
    check_ids: Optional[bool] = None,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    block_shape=None,
    return_info: bool = False,
    activation: Union[Activation, str, None] = None,
    w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    shared_w1: Optional[torch.Tensor] = None,
    shared_w2: Optional[torch.Tensor] = None,
    shared_weights: Optional[torch.Tensor] = None,
):
    """A Mixture-of-Experts feed-forward layer with gated (SwiGLU) experts, through moe-lab's Triton kernels.

    out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(w1[e, :I] @ x_t) * (w1[e, I:] @ x_t)), e = topk_ids[t, j]
    and in general, with the optional activation, biases and shared experts s:
    out[t] = sum_j topk_weights[t, j] * (w2[e] @ act(w1[e] @ x_t + b1[e]) + b2[e])
             + sum_s shared_weights[t, s] * shared_w2[s] @ act(shared_w1[s] @ x_t)

    Args:
        hidden_states: [T, H] float16/bfloat16/float32 (any strides); T may be 0.
        w1: [E, 2I, H] gate (rows :I) and up (rows I:) projections, dtype of hidden_states, or
            float8_e4m3fn with w1_scale (w8a8, below).
        w2: [E, H, I] down projection, same dtype as w1.
        topk_weights: [T, k] routed weights (float32 usually), applied in the down GEMM's epilogue.
        topk_ids: [T, k] int32/int64 experts in [0, E) (in [0, E_global) with expert_map).
        config: None (tuned table or heuristic), a MoEConfig, a GemmConfig for both GEMMs, or a dict.
        use_tma: "auto" (TMA where device and tensors allow), True (raise ValueError if not; the up GEMM's
            gathered token rows are read by pointer all the same: TMA cannot gather on Hopper), False (pointer
            loads: the Triton GEMMs, also where the Gluon FP8 kernel, which loads by TMA, would run).
        expert_map: optional [E_global] int: global expert -> local index in w1/w2, -1 if not on this
            rank (expert parallelism); slots on other ranks contribute zero. Entries other than -1 distinct.
        out: optional [T, H] output buffer (last stride 1), dtype of hidden_states; `hidden_states` itself
            computes in place. ValueError if it overlaps any input otherwise.
        chunk_size: process at most this many tokens at a time, bounding the intermediate buffers
            (about chunk_size*k*(I + H) elements; chunk_size*k*(3I + H) with the activation unfused)
            for very large T.
        check_ids: raise ValueError for topk_ids outside [0, E), an expert_map shorter than the experts
            topk_ids name, and expert_map entries outside [-1, E) or repeated.
            Default: on CPU tensors only, since on a GPU it costs a device-to-host sync; unchecked
            out-of-range ids (and map entries) contribute zero.
        w1_scale, w2_scale, block_shape: float32 scales of float8_e4m3fn w1 and w2 (value = fp8 value x
            scale; `moe_lab.quantize_weights_fp8` makes both). With block_shape [block_n, block_k]
            (DeepSeek-V3's [128, 128]): [E, ceil(2I/block_n), ceil(H/block_k)] and
            [E, ceil(H/block_n), ceil(I/block_k)], one per weight block; the activations are quantized per
            token per block_k channels. Without it: [E] (per expert) or [E, 2I] / [E, H] (per channel).
        a1_scale, a2_scale: static float32 scales, shape [1] or [] (0-d), of the up GEMM's input
            (hidden_states) and the down GEMM's input (the SwiGLU output), without block_shape only; None
            (default): dynamic, one scale per token computed on the device. Every float8 product
            accumulates in float32; the output has hidden_states' dtype. Needs FP8 tensor cores (compute
            capability >= 8.9) or the interpreter: elsewhere RuntimeError with the reason
            (`moe_lab.fp8_support`).
            Scales must be finite and positive: on CPU tensors each call checks their values (ValueError);
            on a GPU they are taken as given (reading them would cost a host sync; a zero scale gives zeros,
            an inf one inf or NaN), and `FusedMoE` checks its weight scales' values once, when it is built. A NaN
            in hidden_states makes its 128-channel group NaN, which reaches that token's output. Source:
            DeepSeek-V3 technical report (arXiv:2412.19437) §3.3; the argument names are vLLM's
            fused_experts' (use_fp8_w8a8).
        return_info: also return a FusedMoEInfo (config used and where it came from, load paths, for
            the last chunk; of the routed experts).
        activation: the experts' gated activation and how w1's rows hold gate and up: a `moe_lab.Activation`
            (e.g. `moe_lab.GPT_OSS`: gpt-oss's clamped SwiGLU on interleaved rows), "silu" or "swigluoai"
            (gate and up as halves), or None: SiLU-and-mul of halves (the default). Applied in the up
            GEMM's epilogue (or by `silu_and_mul` where the config unfuses it): the same function.
        w1_bias, w2_bias: optional biases [E, 2I] (in w1's row order) and [E, H], dtype of hidden_states or
            float32: added to the float32 sums before the activation and before the routed weight,
            out = w * (w2 @ act + b2) (transformers' GptOssExperts, vLLM). Any strides.
        shared_w1, shared_w2, shared_weights: optional shared experts, always routed (DeepSeek's and
            Qwen2-MoE's): shared_w1 [S, 2I_s, H], shared_w2 [S, H, I_s] in hidden_states' dtype, the same
            activation as the routed experts, no biases; shared_weights [T, S] their weight per token (None:
            1; Qwen2-MoE: sigmoid(shared_expert_gate(x))). They run as a second pass of the same kernels,
            every token routed to each of the S experts, and are added to the routed output: no weight is
            copied, any I_s; a shared MLP of intermediate size S*I may also be given as S experts of I.
            Not with expert_map (each rank would add them).
    Returns:
        [T, H] in hidden_states' dtype (and the FusedMoEInfo if return_info).
    Memory: the second call of a key keeps its intermediate buffers (align, act, out_k: about T*k*(I + H)
    elements) for the next call of that key on the same CUDA stream and thread, at most 256 MiB over all keys
    (`moe_lab.plan.WORKSPACE_BUDGET`); `moe_lab.plan.clear_layer_plans()` frees them. None while a CUDA graph
    is captured or inside `moe_lab.runtime.keeping_no_buffers()` (as the custom op calls it).
    Raises:
        TypeError / ValueError naming the argument for wrong types, dtypes, shapes, devices or configs;
        ValueError for inputs or an `out` that require grad while grad is on (inference only), for ids as
        `check_ids` says, and for FP8 scales on CPU tensors that are not finite and positive.
    Source: the fused-MoE design of vLLM (vllm-project/vllm, model_executor/layers/fused_moe); TMA loads
    as in Triton's tensor-descriptor tutorials.
    """
    if check_ids is not None and not isinstance(check_ids, bool):
        raise TypeError(f"check_ids must be None, True or False, got {check_ids!r}")
    if not isinstance(return_info, bool):
        raise TypeError(f"return_info must be True or False, got {return_info!r}")
    check_use_tma(use_tma)
    if chunk_size is not None:
        chunk_size = check_positive_int("chunk_size", chunk_size)
    block_shape = check_gemm_block_shape(block_shape)
    if activation is w1_bias is w2_bias is shared_w1 is shared_w2 is shared_weights is None:
        kind = _PLAIN
    else:
        kind = ExpertKind(check_activation(activation), w1_bias, w2_bias, shared_w1, shared_w2, shared_weights)
    scales = (w1_scale, w2_scale, a1_scale, a2_scale)
    key = layer_key(
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        expert_map=expert_map,
        out=out,
        scales=scales,
        block_shape=block_shape,
        config=config,
        use_tma=use_tma,
        chunk_size=chunk_size,
        activation=kind.activation,
        expert_tensors=kind.tensors,
    )
    plan = cached_layer_plan(key)
    kept = plan is not None and not return_info  # (info's routing must outlive the next call: not a workspace)
    if plan is None:  # a call of a new key: every check that its key decides, then its plan, kept
        _check_layer(hidden_states, w1, w2, topk_weights, topk_ids, expert_map)
        _check_fp8(w1, w2, *scales, block_shape)
        _check_expert_kind(hidden_states, w1, w2, expert_map, kind)
        if out is not None:
            check_layer_out(out, hidden_states, "fused_moe")
        plan = remember_layer_plan(plan_layer(key, w1, w2, config))
    # What the key cannot decide, every call: the ids' and (on the CPU) the scales' values, and where `out` lies.
    _check_ids(topk_ids, expert_map, w1.shape[0], check_ids)
    _check_scales_on_cpu(scales)
    if out is None:
        out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    else:
        inputs = dict(w1=w1, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids, expert_map=expert_map)
        inputs.update(w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale)
        inputs.update(zip(_EXPERT_TENSORS, kind.tensors))
        check_layer_out_overlap(out, hidden_states, **inputs)
    fp8 = _fp8_weights(w1, *scales, block_shape)
    if expert_map is not None:
        expert_map = expert_map.contiguous()
    # The shared experts first: with out=hidden_states the routed experts overwrite their input.
    shared = _shared_experts(hidden_states, kind, config, use_tma, chunk_size) if shared_w1 is not None else None
    info = None
    for index, (start, end, chunk) in enumerate(plan.chunks):
        args = (hidden_states, topk_weights, topk_ids, out)
        if len(plan.chunks) > 1:
            args = tuple(t[start:end] for t in args)
        workspace = _workspace(plan, index, chunk, w1, *args) if kept else None
        roles = None
        # A kept chunk replays its launches; not where its stages make temporaries (FP8's quantized inputs, the
        # unfused activation's output, the shared experts' sum).
        if workspace is not None and fp8 is None and shared is None and chunk.up.swiglu:
            roles = (hidden_states, w1, w2, topk_weights, topk_ids, out, expert_map, kind.w1_bias, kind.w2_bias)
            if workspace.program and workspace.program.run(roles):
                continue
        with recording() if roles is not None and workspace.program is None else nullcontext() as launches:
            routing, up, down = _run_chunk(chunk, *args, w1, w2, expert_map, fp8, kind, plan, index, workspace)
        if launches is not None:
            workspace.record(launches, roles, routing)
        if up is not chunk.up or down is not chunk.down:  # launched with fewer stages: kept for the next call
            plan = remember_layer_plan(plan.launched(index, up, down))
            chunk = plan.chunks[index][2]
        if return_info:
            path = (up.path, down.path) if up is not None else (None, None)
            kernel = "gluon" if chunk.gluon is not None else "triton"
            info = FusedMoEInfo(
                chunk.choice.config,
                *path,
                routing,
                chunk.choice.source,
                up,
                down,
                kernel,
                chunk.gemm_reason,
                chunk.gluon,
            )
    if shared is not None:
        out.add_(shared)
    return (out, info) if return_info else out


class _Workspace:
    """A kept plan's buffers for one chunk (`moe_lab.plan.workspace_slot`): the align's, the up GEMM's output
    (act, and its float8 scales where the epilogue quantizes) and the down GEMM's (out_k); `act_desc`, the down
    GEMM's tensor descriptor of act where it reads act by TMA, made on first use; `program`: the chunk's
    launches on these buffers, recorded from a call and replayed with the next calls' tensors
    (`moe_lab._launch.Program`: the host's work of a decode call is then the key and the launches), None
    until recorded, False where a call's launches cannot be replayed."""

    __slots__ = ("align", "act", "out_scale", "out_k", "act_desc", "nbytes", "program")

    def __init__(self, chunk: ChunkPlan, w1, hidden_states, topk_ids):
        num_slots, device = topk_ids.numel(), hidden_states.device
        self.align = None if chunk.slot_order else align_buffers(device, num_slots, w1.shape[0], chunk.block_size_m)
        self.act, self.out_scale, self.out_k = _chunk_buffers(chunk, hidden_states, num_slots)
        self.act_desc = None
        buffers = (*(self.align[:1] if self.align else ()), self.act, self.out_scale, self.out_k)
        self.nbytes = sum(t.untyped_storage().nbytes() for t in buffers if t is not None)
        self.program = None

    def record(self, launches: list, roles: tuple, routing: Optional[AlignedRouting]) -> None:
        """Make `program` of a chunk's `launches` (`moe_lab._launch.recording`) on this workspace, the call's
        tensors `roles`; `routing`: its schedule (slot order's rows are kept buffers too). Where a launch went
        through Triton (a first launch, the interpreter, Triton 3.8+) the next call records again."""
        buffers = (*(self.align or ()), self.act, self.out_scale, self.out_k, self.act_desc)
        constants = [t for t in buffers if t is not None]
        if routing is not None and not routing.expert_sorted:
            constants += [routing.sorted_token_ids, routing.num_tokens_post_padded]
        made = partial(weight_descriptor_maker, weights=roles)
        program = Program.of(launches, roles, constants, made)
        if program is not None:
            self.program = program
        elif launches and None not in launches:
            self.program = False


def _chunk_buffers(chunk: ChunkPlan, hidden_states, num_slots: int) -> tuple:
    """New buffers for a chunk's GEMMs: act [rows, act_cols] (the up GEMM's output), its float8 scales where the
    up GEMM's epilogue quantizes (else None) and out_k [T*k, H] (the down GEMM's)."""
    device = hidden_states.device
    act = torch.empty((chunk.rows, chunk.act_cols), dtype=chunk.act_dtype, device=device)
    out_scale = None
    if chunk.out_scale_cols:
        out_scale = torch.empty((chunk.rows, chunk.out_scale_cols), dtype=torch.float32, device=device)
    out_k = torch.empty((num_slots, hidden_states.shape[1]), dtype=hidden_states.dtype, device=device)
    return act, out_scale, out_k


def _workspace(plan: LayerPlan, index: int, chunk: ChunkPlan, w1, hidden_states, topk_weights, topk_ids, out):
    """Chunk `index`'s workspace on this thread and stream: the kept one, or new buffers, kept where the budget
    allows; None where there is nothing to launch or a CUDA graph is being captured (the call allocates)."""
    if chunk.up is None:
        return None
    slot = workspace_slot(index, hidden_states.device)
    if slot is None:
        return None
    workspace = plan.workspaces.get(slot)
    if workspace is None:
        workspace = _Workspace(chunk, w1, hidden_states, topk_ids)
        if reserve_workspace(workspace.nbytes):
            plan.workspaces[slot] = workspace
        else:
            workspace.program = False  # (one call's buffers: nothing to replay)
    return workspace


def _run_chunk(
    chunk: ChunkPlan,
    hidden_states,
    topk_weights,
    topk_ids,
    out,
    w1,
    w2,
    expert_map,
    fp8: Optional[Fp8Weights],
    kind: ExpertKind,
    plan: LayerPlan,
    index: int,
    workspace: Optional[_Workspace] = None,
) -> Tuple[Optional[AlignedRouting], Optional[LaunchPlan], Optional[LaunchPlan]]:
    """Run one chunk's stages as planned, on checked inputs: (the schedule, each GEMM's plan as launched).
    `plan` and `index`: the layer plan and this chunk's place in it, whose sites keep the launches' compiled
    kernels (`LayerPlan.site`); `workspace`: the chunk's kept buffers, or None (new ones)."""
    if chunk.up is None:  # an idle rank (T = 0), or no channels (H = 0: the output [T, 0] holds nothing)
        return None, None, None
    num_tokens, (num_experts, top_k) = hidden_states.shape[0], (w1.shape[0], topk_ids.shape[1])
    block_size_m = chunk.block_size_m
    routing = chunk.slot_order and run_slot_order(topk_ids, num_experts, block_size_m)
    # The GEMMs' sites by schedule: slot order's and the align's differ in the schedule tensors they read.
    schedule = "slot order" if routing else "aligned"
    if not routing:  # (slot order's rows cannot be made while a CUDA graph is being captured)
        buffers = workspace.align if workspace is not None else None
        routing = run_align(topk_ids, num_experts, block_size_m, expert_map, plan.site(index, "align"), buffers)
    if workspace is not None:
        buffers = workspace.act, workspace.out_scale, workspace.out_k
    else:
        buffers = _chunk_buffers(chunk, hidden_states, num_tokens * top_k)
    if chunk.gluon is not None:
        _run_gluon_gemms(chunk.gluon, hidden_states, topk_weights, w1, w2, fp8, routing, *buffers)
        up, down = chunk.up, chunk.down
    else:
        gemms = (chunk, hidden_states, topk_weights, w1, w2, fp8, kind, routing, *buffers)
        up, down = _run_triton_gemms(*gemms, plan, index, schedule, workspace)
    run_topk_reduce(buffers[2], topk_ids, num_experts, expert_map, out, plan.site(index, "reduce"))
    return routing, up, down


def _run_triton_gemms(
    chunk: ChunkPlan,
    hidden_states,
    topk_weights,
    w1,
    w2,
    fp8: Optional[Fp8Weights],
    kind: ExpertKind,
    routing: AlignedRouting,
    act,
    out_scale,
    out_k,
    plan: LayerPlan,
    index: int,
    schedule: str,
    workspace: Optional[_Workspace],
) -> Tuple[LaunchPlan, LaunchPlan]:
    """A chunk's GEMMs on the Triton kernels: the up GEMM into act (and its float8 scales into out_scale where
    its epilogue quantizes), the activation and quantization its epilogue leaves, the down GEMM into out_k.
    Returns each GEMM's plan as launched."""
    x, up_scales, down_scales = hidden_states, None, None
    if fp8 is not None:  # float8 inputs for both GEMMs, float32 sums, outputs in hidden_states' dtype
        x, a1_scale = fp8.quantize(hidden_states, fp8.a1_scale, site=plan.site(index, "quantize x"))
        up_scales = kernel_scales(a1_scale, fp8.w1_scale, w1, fp8.block_shape, hidden_states.shape[0])
    up_out = act
    up = run_gemm(
        chunk.up,
        x,
        w1,
        routing,
        act,
        out_scale=out_scale,
        scales=up_scales,
        w_bias=kind.w1_bias,
        site=plan.site(index, "up " + schedule),
    )
    if not up.swiglu:
        act = silu_and_mul(act, routing=routing, activation=kind.activation)
    if fp8 is not None:
        if out_scale is not None:  # quantized by the up GEMM's epilogue
            a2_scale = out_scale
        else:  # rows past num_tokens_post_padded are never read: not quantized
            site = plan.site(index, "quantize act")
            act, a2_scale = fp8.quantize(act, fp8.a2_scale, routing.num_tokens_post_padded, site)
        down_scales = kernel_scales(a2_scale, fp8.w2_scale, w2, fp8.block_shape, chunk.rows)
    act_desc = None
    if workspace is not None and act is up_out and chunk.down.path.a_tma:  # reads the kept act: descriptor kept
        if workspace.act_desc is None:
            workspace.act_desc = input_descriptor(chunk.down, act)
        act_desc = workspace.act_desc
    down = run_gemm(
        chunk.down,
        act,
        w2,
        routing,
        out_k,
        topk_weights=topk_weights,
        scales=down_scales,
        w_bias=kind.w2_bias,
        site=plan.site(index, "down " + schedule),
        a_desc=act_desc,
    )
    return up, down


def _run_gluon_gemms(
    gluon: GluonLayerPlan,
    hidden_states,
    topk_weights,
    w1,
    w2,
    fp8: Fp8Weights,
    routing: AlignedRouting,
    act,
    act_scale,
    out_k,
) -> None:
    """A chunk's GEMMs on the warp-specialized Gluon FP8 kernel (`moe_lab.plan.gluon_applies` chose it): the
    up GEMM writes the activation as float8 into act [rows, I] with its per-row 128-column scales into
    act_scale (the Triton up GEMM's format; `ChunkPlan` sizes both), the down GEMM reads it and scatters the
    routed rows into out_k [T*k, H]."""
    from .gluon_fp8 import run_gluon_fp8

    x, x_scale = fp8.quantize(hidden_states, None)
    run_gluon_fp8(gluon.up, x, w1, routing, act, x_scale, fp8.w1_scale, gather_a=True, out_scale=act_scale)
    run_gluon_fp8(gluon.down, act, w2, routing, out_k, act_scale, fp8.w2_scale, topk_weights, scatter=True)


# --- The torch face: a custom op (so torch.compile sees one opaque node) and an nn.Module. ---


@torch.library.custom_op("moe_lab::fused_moe", mutates_args=())
def fused_moe_op(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: Optional[torch.Tensor] = None,
    use_tma: Optional[bool] = None,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    block_shape: Optional[List[int]] = None,
    activation: str = "silu",
    gate_up_layout: str = "halves",
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    shared_w1: Optional[torch.Tensor] = None,
    shared_w2: Optional[torch.Tensor] = None,
    shared_weights: Optional[torch.Tensor] = None,
    check_ids: bool = True,
) -> torch.Tensor:
    """`torch.ops.moe_lab.fused_moe`: `fused_moe` as a PyTorch custom op. use_tma: True or False as in
    `fused_moe`, None for "auto" (an op's schema has no bool-or-string type; PyTorch's schema check refuses
    other values). w1_scale, w2_scale, block_shape: for float8_e4m3fn weights, as in `fused_moe`
    (activations quantized dynamically). activation, gate_up_layout, swiglu_alpha, swiglu_limit: the fields
    of `moe_lab.Activation` (a schema has no dataclass type). The biases, shared experts and check_ids as in
    `fused_moe`. It keeps no buffer past the call (`moe_lab.runtime.keeping_no_buffers`): torch.compile's CUDA
    graphs may run it on their own memory pool."""
    with keeping_no_buffers():
        return fused_moe(
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            expert_map=expert_map,
            use_tma="auto" if use_tma is None else use_tma,
            w1_scale=w1_scale,
            w2_scale=w2_scale,
            block_shape=block_shape,
            activation=Activation(activation, gate_up_layout, swiglu_alpha, swiglu_limit),
            w1_bias=w1_bias,
            w2_bias=w2_bias,
            shared_w1=shared_w1,
            shared_w2=shared_w2,
            shared_weights=shared_weights,
            check_ids=check_ids,
        )


@fused_moe_op.register_fake
def _fused_moe_fake(
    hidden_states,
    w1,
    w2,
    topk_weights,
    topk_ids,
    expert_map=None,
    use_tma=None,
    w1_scale=None,
    w2_scale=None,
    block_shape=None,
    activation="silu",
    gate_up_layout="halves",
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    w1_bias=None,
    w2_bias=None,
    shared_w1=None,
    shared_w2=None,
    shared_weights=None,
    check_ids=True,
):
    # PyTorch also picks this for a real call with one input on the meta device: refuse mixed devices, as
    # fused_moe does, rather than return an empty tensor as if it were the result
    check_one_device(
        hidden_states=hidden_states,
        w1=w1,
        w2=w2,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        expert_map=expert_map,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        w1_bias=w1_bias,
        w2_bias=w2_bias,
        shared_w1=shared_w1,
        shared_w2=shared_w2,
        shared_weights=shared_weights,
    )
    return hidden_states.new_empty(hidden_states.shape)


def _refuse_grad(ctx, inputs, output):
    """The op's autograd: PyTorch calls this in the forward where an input requires grad and grad is on (the
    op's body then sees tensors that do not, so `fused_moe`'s own check cannot): the same ValueError."""
    names = inspect.signature(_fused_moe_fake).parameters  # the op's arguments, in the order of `inputs`
    requiring = [name for name, t in zip(names, inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    raise _grad_refused((requiring or ["an input"])[0])


def _no_backward(ctx, grad):  # never reached: _refuse_grad raises in the forward
    raise ValueError("fused_moe is inference-only (no backward)")


fused_moe_op.register_autograd(_no_backward, setup_context=_refuse_grad)


def fused_moe_through_op(
    hidden_states, w1, w2, topk_weights, topk_ids, *, use_tma="auto", block_shape=None, activation=None, **tensors
):
    """`fused_moe` with its own arguments, called as the custom op `torch.ops.moe_lab.fused_moe`: what
    torch.compile traces as one node (and meta tensors run as the op's fake). Takes the arguments the op has:
    expert_map, use_tma, w1_scale, w2_scale, block_shape, activation, the biases, the shared experts and
    check_ids (default: checked as fused_moe's default does, on CPU tensors only)."""
    activation = check_activation(activation)
    return torch.ops.moe_lab.fused_moe(
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        use_tma=None if use_tma == "auto" else use_tma,  # the op's spelling of "auto"
        block_shape=None if block_shape is None else list(block_shape),
        activation=activation.kind,
        gate_up_layout=activation.gate_up_layout,
        swiglu_alpha=activation.alpha,
        swiglu_limit=activation.limit,
        **tensors,
    )


class FusedMoE(torch.nn.Module):
    """The experts of a MoE layer as a module: holds w1 [E, 2I, H] and w2 [E, H, I] as parameters and
    calls `fused_moe`, and under torch.compile the custom op `torch.ops.moe_lab.fused_moe` (one node, so
    `torch.compile(fullgraph=True)` works).
    The router stays with the caller: forward(hidden_states [T, H], topk_weights [T, k], topk_ids [T, k]).
    use_tma: "auto", True or False, as in `fused_moe`. Inference only (the weights do not require grad).
    FP8: float8_e4m3fn w1 and w2 with w1_scale, w2_scale and block_shape as `fused_moe` takes them (kept as
    buffers; `moe_lab.quantize_weights_fp8` makes them), activations quantized dynamically; ValueError at
    construction for a scale that is not finite and positive.
    activation, w1_bias, w2_bias, shared_w1, shared_w2: as in `fused_moe` (biases kept as buffers, shared
    experts as parameters, none of them copied); forward then takes shared_weights [T, S] (None: 1)."""

    def __init__(
        self,
        w1: torch.Tensor,
        w2: torch.Tensor,
        expert_map: Optional[torch.Tensor] = None,
        use_tma: UseTma = "auto",
        *,
        w1_scale: Optional[torch.Tensor] = None,
        w2_scale: Optional[torch.Tensor] = None,
        block_shape=None,
        activation: Union[Activation, str, None] = None,
        w1_bias: Optional[torch.Tensor] = None,
        w2_bias: Optional[torch.Tensor] = None,
        shared_w1: Optional[torch.Tensor] = None,
        shared_w2: Optional[torch.Tensor] = None,
    ):
        super().__init__()
        _check_weights(w1, w2, FLOAT_DTYPES + (FP8_DTYPE,))
        fp8 = _check_fp8(w1, w2, w1_scale, w2_scale, None, None, block_shape)
        self.activation = check_activation(activation)
        # float weights are the activations' dtype; with float8 ones each call checks against hidden_states
        self.register_buffer("w1_bias", check_bias("w1_bias", w1_bias, w1, w1.dtype, "[E, 2I]"))
        self.register_buffer("w2_bias", check_bias("w2_bias", w2_bias, w2, w1.dtype, "[E, H]"))
        # shared experts run in hidden_states' dtype: float w1's, or any float dtype beside float8 w1
        if w1.dtype == FP8_DTYPE:
            _check_shared_weights(shared_w1, shared_w2, FLOAT_DTYPES, w1.shape[2], hidden_of="w1")
        else:
            _check_shared_weights(shared_w1, shared_w2, (w1.dtype,), w1.shape[2], hidden_of="w1", dtype_of="w1")
        if shared_w1 is not None:
            shared_w1 = torch.nn.Parameter(shared_w1, requires_grad=False)
            shared_w2 = torch.nn.Parameter(shared_w2, requires_grad=False)
        self.shared_w1, self.shared_w2 = shared_w1, shared_w2
        self.block_shape = list(fp8.block_shape) if fp8 is not None and fp8.block_shape else None
        if fp8 is not None:  # their values checked once here, as a module is built once (fused_moe: on a CPU only)
            check_scale_values("w1_scale", w1_scale)
            check_scale_values("w2_scale", w2_scale)
        self.register_buffer("w1_scale", w1_scale)
        self.register_buffer("w2_scale", w2_scale)
        if expert_map is not None:  # checked once here, as a module is built once (fused_moe reads them on the CPU)
            check_tensor("expert_map", expert_map, ndim=1, dtypes=INDEX_DTYPES, layout="[E_global]")
            _check_expert_map_values(expert_map, w1.shape[0])
            if shared_w1 is not None:
                raise ValueError(_SHARED_WITH_EXPERT_MAP)
        check_use_tma(use_tma)
        self.w1 = torch.nn.Parameter(w1, requires_grad=False)
        self.w2 = torch.nn.Parameter(w2, requires_grad=False)
        self.register_buffer("expert_map", expert_map)
        self.use_tma = use_tma

    def extra_repr(self) -> str:
        e, two_i, h = self.w1.shape
        parts = [f"E={e}, H={h}, I={two_i // 2}, dtype={str(self.w1.dtype)[6:]}"]
        if self.block_shape is not None:
            parts.append(f"block_shape={self.block_shape}")
        if self.activation != Activation():
            parts.append(f"activation={self.activation.kind}/{self.activation.gate_up_layout}")
        if self.shared_w1 is not None:
            parts.append(f"shared experts={self.shared_w1.shape[0]}")
        if self.expert_map is not None:
            parts.append(f"expert_map of {self.expert_map.shape[0]}")
        return ", ".join(parts + [f"use_tma={self.use_tma!r}"])

    def forward(self, hidden_states, topk_weights, topk_ids, shared_weights=None):
        if self.w1_scale is not None and self.w1.dtype != FP8_DTYPE:
            raise TypeError(
                f"FusedMoE holds FP8 weights, but w1 is now {str(self.w1.dtype)[6:]}: a module.to(dtype) "
                "cast them (and their float32 scales); move the module with .to(device) only"
            )
        # Eager: fused_moe itself, which keeps its buffers between calls; torch.compile and meta tensors: the op
        call = fused_moe if not torch.compiler.is_compiling() and not hidden_states.is_meta else fused_moe_through_op
        return call(
            hidden_states,
            self.w1,
            self.w2,
            topk_weights,
            topk_ids,
            expert_map=self.expert_map,
            use_tma=self.use_tma,
            w1_scale=self.w1_scale,
            w2_scale=self.w2_scale,
            block_shape=self.block_shape,
            activation=self.activation,
            w1_bias=self.w1_bias,
            w2_bias=self.w2_bias,
            shared_w1=self.shared_w1,
            shared_w2=self.shared_w2,
            shared_weights=shared_weights,
        )
