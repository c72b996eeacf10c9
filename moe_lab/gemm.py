"""The grouped matmul launcher: one Triton kernel computes every expert's GEMM of a MoE layer.

For each M-block b of an `AlignedRouting` (rows of one expert e = expert_ids[b]):
    out[rows of b] = a[rows of b] @ w[e].T   (fp32 accumulation, optional routed-weight multiply)
with a in one of two layouts:
    gather_a=True:  a is [T, K], token rows; block rows are sorted_token_ids // top_k (the up projection).
    gather_a=False: a is [max_num_tokens_padded, K], rows already in the padded expert-sorted order
                    (the intermediate of the down projection).
and the output either in the same padded order ([max_num_tokens_padded, N], scatter=False) or scattered
to flat (token, k) slots ([T*k, N], scatter=True). With swiglu=True (the up projection of SwiGLU experts,
w = w1 = [gate; up] of 2I rows) the epilogue writes silu(a @ gate.T) * (a @ up.T), [max_num_tokens_padded, I],
from the float32 accumulators: the separate activation kernel and its [rows, 2I] buffer are not needed.
swiglu=Activation(...) names another gated activation or gate/up layout (gpt-oss's clamped SwiGLU on
interleaved rows), and w_bias a bias per weight row, added to the float32 sums first.

Load paths (see `select_load_path`): weights through a 3-D tensor descriptor (block [1, BLOCK_SIZE_N,
BLOCK_SIZE_K]) and sorted A rows through a 2-D descriptor (block [BLOCK_SIZE_M, BLOCK_SIZE_K]) on Hopper;
pointer loads otherwise. Gathered A rows use pointer loads: Hopper's TMA copies boxes, and gathering
scattered rows through TMA (tensor-map gather4) first came with Blackwell (sm_100).

float32 operands follow PyTorch's float32 matmul precision: full float32 by default ("highest"), TF32
tensor cores after `torch.set_float32_matmul_precision("high")`.

The kernel follows Triton's grouped-ordering matmul tutorial (python/tutorials/03-matrix-multiplication.py)
and vLLM's fused_moe kernel layout (vllm-project/vllm, model_executor/layers/fused_moe).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Union

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ._ints import cdiv
from ._kernels.grouped_matmul import grouped_matmul_kernel, grouped_matmul_persistent_kernel
from ._launch import LaunchSite, launch
from ._validate import FLOAT_DTYPES, check_bool, check_kernel_device, check_not_aliased, check_tensor, output_buffer
from .align import AlignedRouting, check_routing
from .capability import require_fp8
from .configs import GemmConfig
from .expert_kind import SILU, Activation
from .plan import LaunchPlan, LoadPath, UseTma, check_use_tma, plan_gemm, select_load_path, weight_box
from .quantize import FP8_DTYPE, check_gemm_block_shape, check_static_scale
from .runtime import interpreter_serialized

__all__ = [
    "Fp8Scales",
    "LaunchPlan",
    "LoadPath",
    "UseTma",
    "check_activation_scale",
    "check_fp8_scales",
    "check_gemm_rows",
    "check_use_tma",
    "check_weight_scale",
    "grouped_matmul",
    "plan_gemm",
    "run_gemm",
    "select_load_path",
]


@dataclass(frozen=True)
class Fp8Scales:
    """The scales of a float8 GEMM as the kernel reads them: a_scale [rows, K groups] and w_scale
    [E, N groups, K groups], float32, size-1 layouts expanded with stride 0. `mode` is "outer" (constant
    along K: per tensor, per channel, per token) or "block" (`block_shape` [group_n, group_k])."""

    mode: str
    a_scale: torch.Tensor
    w_scale: torch.Tensor
    group_n: int = 1
    group_k: int = 1


def check_weight_scale(name: str, w_scale, w: torch.Tensor, block_shape: Optional[tuple]) -> torch.Tensor:
    """w_scale of float8 w [E, N, K] as [E, N groups, K groups] (size-1 layouts expanded, stride 0), after
    checking it: [E, ceil(N/block_n), ceil(K/block_k)] with block_shape, else [E] (per expert) or [E, N]
    (per channel); float32. `name` is the argument's name in messages (w_scale, w1_scale, ...)."""
    num_experts, n, k = w.shape
    if block_shape is not None:
        check_tensor(
            name,
            w_scale,
            ndim=3,
            dtypes=(torch.float32,),
            shape=(num_experts, cdiv(n, block_shape[0]), cdiv(k, block_shape[1])),
            layout="[E, ceil(N/block_n), ceil(K/block_k)]",
        )
        return w_scale
    layout = "[E] (per expert) or [E, N] (per channel)"
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() <= 1 and w_scale.numel() == 1 and num_experts > 1:
        raise ValueError(
            f"{name} must be {layout} without block_shape, got shape {tuple(w_scale.shape)}: one scale for "
            f"every expert is {name}.expand({num_experts})"
        )
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() not in (1, 2):
        hint = ": a 3-D scale is one per weight block, pass block_shape (e.g. (128, 128))" if w_scale.dim() == 3 else ""
        raise ValueError(
            f"{name} must have 1 or 2 dimensions {layout} without block_shape, got shape {tuple(w_scale.shape)}{hint}"
        )
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() == 1:
        check_tensor(name, w_scale, ndim=1, dtypes=(torch.float32,), shape=(num_experts,), layout=layout)
    else:
        check_tensor(name, w_scale, ndim=2, dtypes=(torch.float32,), shape=(num_experts, n), layout=layout)
    return _weight_scale_view(w_scale, num_experts, n)


def check_activation_scale(name: str, a_scale, rows: int, k: int, block_shape: Optional[tuple]) -> torch.Tensor:
    """a_scale of float8 a [rows, K] as [rows, K groups] (size-1 layouts expanded, stride 0), after checking
    it, float32: [rows, ceil(K/block_k)] with block_shape, else [1] or [] (per tensor) or [rows, 1] (per token)."""
    if block_shape is not None:
        check_tensor(
            name,
            a_scale,
            ndim=2,
            dtypes=(torch.float32,),
            shape=(rows, cdiv(k, block_shape[1])),
            layout="[rows, ceil(K/block_k)]",
        )
        return a_scale
    layout = "[1] or [] (per tensor) or [rows, 1] (per token)"
    if isinstance(a_scale, torch.Tensor) and a_scale.dim() <= 1:
        return _activation_scale_view(check_static_scale(name, a_scale, layout), rows)
    check_tensor(name, a_scale, ndim=2, dtypes=(torch.float32,), shape=(rows, 1), layout=layout)
    return a_scale


# The kernel's views of per-expert / per-channel / per-tensor / per-token scales (size-1 dims expanded, stride 0):
# checked (check_weight_scale, check_activation_scale) or taken as checked (kernel_scales).
def _weight_scale_view(w_scale: torch.Tensor, num_experts: int, n: int) -> torch.Tensor:
    return w_scale[:, None, None].expand(num_experts, n, 1) if w_scale.dim() == 1 else w_scale[:, :, None]


def _activation_scale_view(a_scale: torch.Tensor, rows: int) -> torch.Tensor:
    return a_scale.reshape(1)[:, None].expand(rows, 1) if a_scale.dim() <= 1 else a_scale


def kernel_scales(
    a_scale: torch.Tensor, w_scale: torch.Tensor, w: torch.Tensor, block_shape: Optional[tuple], rows: int
) -> Fp8Scales:
    """Checked float8 scales (as `fused_moe` checks them) in the layout the kernel reads, without checking
    them again: size-1 layouts expanded with stride 0 (see `check_weight_scale`, `check_activation_scale`)."""
    if block_shape is not None:
        return Fp8Scales("block", a_scale, w_scale, *block_shape)
    num_experts, n, _ = w.shape
    return Fp8Scales("outer", _activation_scale_view(a_scale, rows), _weight_scale_view(w_scale, num_experts, n))


def check_fp8_scales(a: torch.Tensor, w: torch.Tensor, a_scale, w_scale, block_shape, rows: int) -> Optional[Fp8Scales]:
    """The scale arguments of a grouped GEMM of a [rows, K] and w [E, N, K] (`grouped_matmul`'s and the Gluon
    FP8 GEMM's), checked against them: None for float operands (which take none), else the Fp8Scales the
    kernel reads. Raises ValueError naming the argument, RuntimeError where float8 cannot run."""
    block_shape = check_gemm_block_shape(block_shape)
    if w.dtype != FP8_DTYPE:
        for name, given in (("a_scale", a_scale), ("w_scale", w_scale), ("block_shape", block_shape)):
            if given is not None:
                raise ValueError(f"{name} is for float8_e4m3fn operands; a and w are {str(w.dtype)[6:]}")
        return None
    if a_scale is None or w_scale is None:
        raise ValueError(
            "float8_e4m3fn a and w need a_scale and w_scale (moe_lab.quantize_weights_fp8 and "
            "quantize_activations_fp8 make them)"
        )
    require_fp8(a.device, "float8_e4m3fn operands")
    w_scale = check_weight_scale("w_scale", w_scale, w, block_shape)
    a_scale = check_activation_scale("a_scale", a_scale, rows, w.shape[2], block_shape)
    if block_shape is not None:
        return Fp8Scales("block", a_scale, w_scale, *block_shape)
    return Fp8Scales("outer", a_scale, w_scale)


def check_gemm_rows(routing, topk_weights, *, gather_a, scatter, return_plan) -> None:
    """The arguments that say which rows a grouped GEMM reads and writes, as `grouped_matmul` and
    `moe_lab.gluon_fp8.grouped_matmul_fp8_gluon` take them: an AlignedRouting whose sorted_token_ids covers
    its M-blocks; gather_a, scatter and return_plan bools, not gather_a with scatter; topk_weights None, or
    [T, k] float16/bfloat16/float32 with scatter. Raises TypeError / ValueError naming the argument."""
    check_routing(routing)
    # Every program reads its block's schedule words before it knows whether its block is in use.
    if routing.sorted_token_ids.numel() < routing.max_num_m_blocks * routing.block_size_m:
        raise ValueError(
            f"routing.sorted_token_ids has {routing.sorted_token_ids.numel()} rows; its "
            f"{routing.max_num_m_blocks} M-blocks of block_size_m={routing.block_size_m} need "
            f"{routing.max_num_m_blocks * routing.block_size_m} (moe_align sizes it so)"
        )
    for name, flag in (("gather_a", gather_a), ("scatter", scatter), ("return_plan", return_plan)):
        check_bool(name, flag)
    if gather_a and scatter:
        raise ValueError(
            "gather_a=True with scatter=True is not a supported combination (the up projection "
            "writes sorted rows; the down projection reads them and scatters)"
        )
    if topk_weights is not None:
        if not scatter:
            raise ValueError("topk_weights needs scatter=True: routed weights are applied as rows go to their slots")
        check_tensor(
            "topk_weights",
            topk_weights,
            ndim=2,
            dtypes=FLOAT_DTYPES,
            shape=(routing.num_tokens, routing.top_k),
            layout="[T, k]",
        )


def check_bias(name: str, bias, w: torch.Tensor, a_dtype: torch.dtype, layout: str = "[E, N]"):
    """A bias per weight row of w [E, N, K]: None, or [E, N] in the activations' dtype `a_dtype` or float32,
    whatever w's dtype (the layer passes hidden_states' dtype, so float and float8 weights take the same
    biases); float16, bfloat16 or float32 for float8 activations (grouped_matmul's float8 a). Raises
    TypeError/ValueError naming `name` otherwise."""
    if bias is None:
        return None
    dtypes = FLOAT_DTYPES if a_dtype == FP8_DTYPE else tuple(dict.fromkeys((a_dtype, torch.float32)))
    of = "" if a_dtype == FP8_DTYPE else "the activations, or float32"
    check_tensor(name, bias, ndim=2, dtypes=dtypes, shape=tuple(w.shape[:2]), layout=layout, dtype_of=of)
    return bias


@interpreter_serialized
def grouped_matmul(
    a: torch.Tensor,
    w: torch.Tensor,
    routing: AlignedRouting,
    config: GemmConfig,
    *,
    gather_a: bool,
    scatter: bool = False,
    topk_weights: Optional[torch.Tensor] = None,
    swiglu: Union[bool, Activation] = False,
    w_bias: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    use_tma: UseTma = "auto",
    a_scale: Optional[torch.Tensor] = None,
    w_scale: Optional[torch.Tensor] = None,
    block_shape=None,
    out_dtype: Optional[torch.dtype] = None,
    return_plan: bool = False,
):
    """Run every expert's GEMM of one projection in one launch.

    Args:
        a: [T, K] token rows (gather_a=True) or [routing.max_num_tokens_padded, K] rows in padded sorted
            order (gather_a=False); float16/bfloat16/float32, or float8_e4m3fn with a_scale; any strides.
        w: [E, N, K] expert weights, same dtype as a; any strides (TMA needs the last one to be 1).
        routing: the schedule from `moe_align`, built with BLOCK_SIZE_M = config.BLOCK_SIZE_M.
        config: the GemmConfig to launch with.
        gather_a: True for the up projection: row r of each block reads token row
            a[sorted_token_ids[r] // top_k] (each token feeds its top_k slots; padding rows read nothing),
            so `a` is hidden_states in token order. False for the down projection: row r reads a[r], rows
            already in padded sorted order (the up projection's activation), which a 2-D tensor
            descriptor can load as one box. Gathered rows use pointer loads (TMA gather is Blackwell-only).
        scatter: write row r of each block to out[sorted_token_ids[r]] ([T*k, N]) instead of out[r]
            ([max_num_tokens_padded, N]); padding rows are then dropped.
        topk_weights: [T, k] routed weights; when given, each row is multiplied by its slot's weight.
        swiglu: the SwiGLU epilogue: w is w1 [E, 2I, K] (gate rows first, then up rows) and the output is
            silu(gate) * up, [rows, I], computed in float32 and rounded once. Needs config.BLOCK_SIZE_N >= 32:
            each program reads BLOCK_SIZE_N/2 gate and BLOCK_SIZE_N/2 up rows (the same weight tile and
            accumulator size as without the epilogue) and writes BLOCK_SIZE_N/2 columns. Not with scatter.
            An `Activation` instead of True: that activation and gate/up layout (`moe_lab.Activation`;
            interleaved rows 2j, 2j + 1 are read as stored, in a descriptor box of BLOCK_SIZE_N rows).
        w_bias: optional [E, N] bias of each weight row (N = 2I in w's row order with swiglu), dtype of a
            or float32 (bfloat16/float16/float32 for float8 a), any strides: added to the float32 sums
            before the activation and before the routed weight (out = weight * (a @ w.T + bias)).
        out: optional output buffer of the shape above (N = I with swiglu), dtype of a. Rows of blocks past
            `num_tokens_post_padded` (sorted layout), or of slots not routed here (scatter with an
            expert_map), are left as they were; so may padding rows be, when `config.tail_tiles` runs a
            mostly padded block as a smaller tile or `config.fold_tail_rows` folds it into the block
            before (`silu_and_mul(..., routing=)` zeroes them).
        use_tma: "auto", True or False, see `select_load_path`.
        a_scale, w_scale, block_shape: the float32 scales of float8_e4m3fn a and w (value = fp8 value x
            scale; `moe_lab.quantize_weights_fp8`, `moe_lab.quantize_activations_fp8`). With block_shape
            [block_n, block_k] (DeepSeek-V3's [128, 128]): w_scale [E, ceil(N/block_n), ceil(K/block_k)],
            one per weight block, and a_scale [rows, ceil(K/block_k)], one per row per block_k channels,
            applied at every K step (config.BLOCK_SIZE_K is lowered to divide block_k where needed; a multiple
            of block_k runs one dot per scale block in each step). block_k must be a multiple of 32, and
            float8 configs' BLOCK_SIZE_K is raised to 32 at least (the least K of a float8 tensor-core dot).
            Without it: w_scale [E] (per expert) or [E, N] (per channel) and a_scale [1] or [] (per tensor)
            or [rows, 1] (per token), applied once to the float32 sum. rows as for a. Needs FP8 tensor cores
            (compute capability >= 8.9) or the interpreter: elsewhere RuntimeError (`moe_lab.fp8_support`).
        out_dtype: dtype of a new output: a's dtype by default, bfloat16 for float8 a; `out` decides when given
            (float8 a may write float16/bfloat16/float32). With block scales also float8_e4m3fn: the epilogue
            quantizes the float32 result as `quantize_activations_fp8(..., group_size=block_k)` would (bit for
            bit), for the next GEMM; the call then returns (out, out_scale [rows, ceil(N_out/block_k)] float32).
            Sorted rows only (not scatter), and each program's columns (BLOCK_SIZE_N, half with swiglu) must
            hold whole groups of block_k.
        return_plan: also return the LaunchPlan: what was launched (config as fitted, load paths, grid).
    Returns:
        `out`, or (`out`, LaunchPlan) with return_plan. Supported: gather_a without scatter (the up
        projection), sorted rows with or without scatter, topk_weights only with scatter.
    Raises:
        TypeError / ValueError naming the argument for wrong types, dtypes, shapes, devices or configs.
    """
    check_gemm_rows(routing, topk_weights, gather_a=gather_a, scatter=scatter, return_plan=return_plan)
    if not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    if not isinstance(swiglu, (bool, Activation)):
        raise TypeError(f"swiglu must be a bool or a moe_lab.Activation, got {swiglu!r}")
    activation = swiglu if isinstance(swiglu, Activation) else SILU
    swiglu = swiglu is not False
    check_tensor(
        "w", w, ndim=3, dtypes=FLOAT_DTYPES + (FP8_DTYPE,), shape=(routing.num_experts, None, None), layout="[E, N, K]"
    )
    num_experts, n, k = w.shape
    rows = routing.num_tokens if gather_a else routing.max_num_tokens_padded
    check_tensor(
        "a",
        a,
        ndim=2,
        dtypes=(w.dtype,),
        shape=(rows, k),
        layout="[T, K]" if gather_a else "[max_num_tokens_padded, K]",
        dtype_of="w",
    )
    scales = check_fp8_scales(a, w, a_scale, w_scale, block_shape, rows)
    if config.BLOCK_SIZE_M != routing.block_size_m:
        raise ValueError(
            f"config.BLOCK_SIZE_M={config.BLOCK_SIZE_M} must equal the routing's block_size_m={routing.block_size_m}"
        )
    w_bias = check_bias("w_bias", w_bias, w, a.dtype)
    if swiglu:
        if n % 2 or n == 0:
            raise ValueError(f"swiglu=True needs w [E, 2I, K] with an even, non-zero 2I, got {tuple(w.shape)}")
        if config.BLOCK_SIZE_N < 32:
            raise ValueError(
                f"swiglu=True needs config.BLOCK_SIZE_N >= 32 (half for the gate rows, half for the "
                f"up rows, each at least 16 for tl.dot), got {config.BLOCK_SIZE_N}"
            )
        if scatter:
            raise ValueError(
                "swiglu=True with scatter=True is not supported: the SwiGLU epilogue belongs to the "
                "up projection, which writes sorted rows"
            )
    out_cols = n // 2 if swiglu else n
    out_rows = routing.num_slots if scatter else routing.max_num_tokens_padded
    dtype_name = "out_dtype"
    if out_dtype is None:
        if scales is not None and isinstance(out, torch.Tensor):
            out_dtype, dtype_name = out.dtype, "out's dtype"
        else:
            out_dtype = torch.bfloat16 if scales is not None else a.dtype
    allowed = FLOAT_DTYPES + (FP8_DTYPE,) if scales is not None and scales.mode == "block" else FLOAT_DTYPES
    if out_dtype not in allowed or (scales is None and out_dtype != a.dtype):
        words = ", ".join(str(d)[6:] for d in allowed) if scales is not None else f"{str(a.dtype)[6:]} (the dtype of a)"
        got = str(out_dtype).replace("torch.", "") if isinstance(out_dtype, torch.dtype) else repr(out_dtype)
        raise TypeError(f"{dtype_name} must be {words}, got {got}")
    quant_group = scales.group_k if out_dtype == FP8_DTYPE else 0
    if quant_group:
        tile_n = config.BLOCK_SIZE_N // 2 if swiglu else config.BLOCK_SIZE_N
        if scatter or tile_n % quant_group:
            raise ValueError(
                f"out_dtype=float8_e4m3fn quantizes whole groups of block_k={quant_group} output columns "
                f"per program into sorted rows: needs scatter=False and the {tile_n} columns a program "
                f"writes (config.BLOCK_SIZE_N{'/2 with swiglu' if swiglu else ''}) to be a multiple of "
                f"{quant_group}"
            )
    out = output_buffer(out, (out_rows, out_cols), out_dtype, a.device, "[rows, I]" if swiglu else "[rows, N]")
    out_scale = (
        torch.empty((out_rows, cdiv(out_cols, quant_group)), dtype=torch.float32, device=a.device)
        if quant_group
        else None
    )
    check_kernel_device(
        a=a,
        w=w,
        sorted_token_ids=routing.sorted_token_ids,
        out=out,
        topk_weights=topk_weights,
        a_scale=a_scale,
        w_scale=w_scale,
        w_bias=w_bias,
    )
    check_not_aliased(
        out,
        a=a,
        w=w,
        w_bias=w_bias,
        topk_weights=topk_weights,
        a_scale=a_scale,
        w_scale=w_scale,
        sorted_token_ids=routing.sorted_token_ids,
        expert_ids=routing.expert_ids,
        num_tokens_post_padded=routing.num_tokens_post_padded,
    )
    plan = plan_gemm(
        a,
        w,
        routing,
        config,
        gather_a=gather_a,
        scatter=scatter,
        swiglu=swiglu,
        use_tma=use_tma,
        scales=scales,
        out_quant_group=quant_group,
        activation=activation,
    )
    plan = run_gemm(
        plan, a, w, routing, out, out_scale=out_scale, topk_weights=topk_weights, scales=scales, w_bias=w_bias
    )
    result = (out, out_scale) if quant_group else out
    return (result, plan) if return_plan else result


def run_gemm(
    plan: LaunchPlan,
    a: torch.Tensor,
    w: torch.Tensor,
    routing: AlignedRouting,
    out: torch.Tensor,
    *,
    out_scale: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    scales: Optional[Fp8Scales] = None,
    w_bias: Optional[torch.Tensor] = None,
    site: Optional[LaunchSite] = None,
    a_desc=None,
) -> LaunchPlan:
    """Launch `plan` (from `plan_gemm`) on operands that `grouped_matmul` or `fused_moe` has checked: no
    check here (w_bias: [E, N], a bias per weight row, or None). Returns the plan as launched: where the
    compiler needed more shared memory than the plan's estimate, with fewer pipeline stages (ValueError if
    even one stage does not fit). `site`: where a cached layer plan keeps this launch's compiled kernel
    (`moe_lab._launch`), or None. `a_desc`: `input_descriptor(plan, a)` made before (a kept buffer's), or
    None: made here where the plan reads `a` by TMA."""
    if plan.grid == 0:
        return plan
    if plan.path.a_tma and a_desc is None:
        a_desc = input_descriptor(plan, a)
    w_desc = None
    if plan.path.w_tma:
        w_desc = _weight_descriptor(w, (plan.gate_up_halves, plan.config.BLOCK_SIZE_N, plan.box_k))
    weights = topk_weights.contiguous() if topk_weights is not None else None  # read flat, by slot
    while True:
        try:
            _launch(plan, a, a_desc, w, w_desc, out, weights, routing, scales, out_scale, w_bias, site)
            return plan
        except triton.runtime.errors.OutOfResources as exc:  # the compiler's count beat our estimate
            if plan.config.num_stages == 1:
                raise ValueError(f"config {plan.config} does not fit this device: {exc}") from None
            plan = replace(plan, config=replace(plan.config, num_stages=plan.config.num_stages - 1))


def input_descriptor(plan: LaunchPlan, a: torch.Tensor):
    """The tensor descriptor through which `plan` reads `a` (a plan whose path.a_tma is True)."""
    return TensorDescriptor(a, list(a.shape), list(a.stride()), [plan.config.BLOCK_SIZE_M, plan.box_k])


# The tensor descriptors of weight tensors, by id while the tensor lives: (a weak reference to it, its data
# pointer, shape, strides and dtype, {box: descriptor}). Weights stay put between calls, so each descriptor is
# built once; an entry goes with its tensor, and is built again where the tensor's facts changed.
_WEIGHT_DESCRIPTORS: Dict[int, tuple] = {}


def _weight_descriptor(w: torch.Tensor, box: tuple):
    """The tensor descriptor of weights `w` in boxes `box` = (gate_up_halves, BLOCK_SIZE_N, box_k) of a plan
    (`weight_box`), built once per tensor and box. It holds w's memory through a detached tensor, not w itself,
    so the entry does not keep w alive."""
    facts = (w.data_ptr(), w.shape, w.stride(), w.dtype)
    entry = _WEIGHT_DESCRIPTORS.get(id(w))
    if entry is None or entry[0]() is not w or entry[1] != facts:
        key = id(w)
        entry = (weakref.ref(w, lambda _, key=key: _WEIGHT_DESCRIPTORS.pop(key, None)), facts, {})
        _WEIGHT_DESCRIPTORS[key] = entry
    desc = entry[2].get(box)
    if desc is None:
        halves, block_size_n, box_k = box
        view, block_shape = weight_box(w.detach(), block_size_n, halves, box_k)
        desc = entry[2][box] = TensorDescriptor(view, list(view.shape), list(view.stride()), block_shape)
    return desc


def weight_descriptor_maker(desc, weights: tuple) -> Optional[Callable[[tuple], object]]:
    """Where `desc` is the descriptor `run_gemm` reads `weights[i]` through: the function of a tuple like
    `weights` that gives its i-th tensor's descriptor in the same boxes (what `moe_lab._launch.Program` launches
    another layer's weights with); else None."""
    for index, w in enumerate(weights):
        entry = _WEIGHT_DESCRIPTORS.get(id(w)) if w is not None else None
        if entry is not None and entry[0]() is w:
            for box, kept in entry[2].items():
                if kept is desc:
                    return lambda tensors, index=index, box=box: _weight_descriptor(tensors[index], box)
    return None


def _launch(
    plan: LaunchPlan,
    a,
    a_desc,
    w,
    w_desc,
    out,
    weights,
    routing,
    scales: Optional[Fp8Scales],
    out_scale: Optional[torch.Tensor],
    w_bias: Optional[torch.Tensor],
    site: Optional[LaunchSite],
):
    """Launch the plan's kernel: operands as the kernels' tuples (see moe_lab/_kernels/grouped_matmul.py)."""
    _, n, k = w.shape
    if plan.swiglu:
        n //= 2  # the output width I; the up rows start at row I of w
    operands = (
        (a, a.stride(0), a.stride(1)),
        a_desc,
        (w, *w.stride()),
        w_desc,
        (out, out_scale, *out.stride(), *(out_scale.stride() if out_scale is not None else (0, 0))),
        (None, None, 0, 0, 0, 0, 0, 1)
        if scales is None
        else (scales.a_scale, scales.w_scale, *scales.a_scale.stride(), *scales.w_scale.stride(), scales.group_n),
        (w_bias, *(w_bias.stride() if w_bias is not None else (0, 0)), plan.activation.alpha, plan.activation.limit),
        weights,
        routing.sorted_token_ids,
        routing.expert_ids,
        routing.num_tokens_post_padded,
    )
    if plan.persistent:
        sizes = (n, k, routing.num_slots, routing.top_k)
        launch(grouped_matmul_persistent_kernel, (plan.grid,), operands + sizes, plan.constexprs, site)
    else:
        sizes = (n, k, routing.num_slots, routing.max_num_m_blocks, routing.num_experts, routing.top_k)
        launch(grouped_matmul_kernel, (plan.grid,), operands + sizes, plan.constexprs, site)
