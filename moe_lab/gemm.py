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

import logging
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch
import triton

from ._kernels.grouped_matmul import grouped_matmul_kernel, grouped_matmul_persistent_kernel
from ._validate import FLOAT_DTYPES, check_not_aliased, check_same_device, check_tensor, output_buffer
from .align import AlignedRouting
from .capability import descriptor_problem, fp8_support, multiprocessor_count, shared_memory_limit, tma_support
from .configs import GemmConfig, fit_to_shared_memory, full_precision_fp32
from .quantize import FP8_DTYPE, MIN_FP8_DOT_K, check_gemm_block_shape, check_static_scale
from .runtime import interpreter_active, interpreter_serialized

log = logging.getLogger(__name__)
_logged_fallbacks: set = set()

UseTma = Union[bool, str]
# Programs of a persistent launch under the interpreter (no SMs to count): enough to make each walk tiles.
INTERPRETER_PROGRAMS = 3
# use_tma is True, False or "auto" everywhere in Python; where only words will do (the command line),
# these are the words, mapped in this one place.
USE_TMA_WORDS = {"auto": "auto", "on": True, "off": False}


@dataclass(frozen=True)
class LoadPath:
    """How one grouped matmul loads its operands, and why."""
    a_tma: bool
    w_tma: bool
    reason: str

    @property
    def name(self) -> str:
        """Short form for tables, e.g. "a:ptr w:tma"."""
        return f"a:{'tma' if self.a_tma else 'ptr'} w:{'tma' if self.w_tma else 'ptr'}"


@dataclass(frozen=True)
class LaunchPlan:
    """What one `grouped_matmul` call launches, decided once (`plan_gemm`) and launched as is.

    config: the GemmConfig as launched: the one asked for, with num_stages lowered where the device's
        shared memory (or the compiler) needed it.
    path: each operand's load path and why (`select_load_path`).
    gather_a: the kernel gathers token rows itself (the up projection).
    scatter: output rows go to their (token, k) slot. swiglu: the epilogue applies SiLU-and-mul, each
    program reading BLOCK_SIZE_N/2 gate rows and the matching BLOCK_SIZE_N/2 up rows of w.
    grid: programs launched (M-blocks x N-tiles, or with `persistent` one per SM at most).
    persistent: `grouped_matmul_persistent_kernel` walks the tiles (config.persistent); tail tiles are off.
    fold_m (property): config.fold_tail_rows, which the plan sets to 0 where folds do not apply (the
    persistent kernel, slot order, float8): an expert's last block of at most that many valid rows is
    computed by the block before.
    scales: "none", or for float8 operands where their scales enter: "outer" (per tensor, channel or token:
    once, on the float32 sum) or "block" (block_shape: at every K step; config.BLOCK_SIZE_K divides the
    block's K, or is a multiple of it: see dots_per_step). w_scale_per_tile: with block scales, a program's
    weight rows (each half's, with swiglu) lie in one scale block, so each dot reads one weight scale
    (per half) rather than one per column. dots_per_step: with block scales and a BLOCK_SIZE_K of several
    scale blocks, each K step loads and scales them one block at a time (that many dots, load boxes of
    BLOCK_SIZE_K / dots_per_step channels): larger loads per step where one scale block's are small
    (FP8 decode streams 128-byte rows per block).
    out_quant_group: the epilogue writes float8 with one scale per row per this many columns (0: the output
    dtype as is)."""
    config: GemmConfig
    path: LoadPath
    gather_a: bool
    scatter: bool
    grid: int
    swiglu: bool = False
    persistent: bool = False
    scales: str = "none"
    out_quant_group: int = 0
    w_scale_per_tile: bool = False
    dots_per_step: int = 1

    @property
    def fold_m(self) -> int:
        """Rows of an expert's last block folded into the block before (config.fold_tail_rows, 0 where the
        plan turned it off)."""
        return self.config.fold_tail_rows

    @property
    def box_k(self) -> int:
        """K channels of each load (a tensor descriptor's box) and dot."""
        return self.config.BLOCK_SIZE_K // self.dots_per_step

    @property
    def tile_n(self) -> int:
        """Output columns per program: BLOCK_SIZE_N, or half of it with the SwiGLU epilogue."""
        return self.config.BLOCK_SIZE_N // 2 if self.swiglu else self.config.BLOCK_SIZE_N




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
        check_tensor(name, w_scale, ndim=3, dtypes=(torch.float32,),
                     shape=(num_experts, triton.cdiv(n, block_shape[0]), triton.cdiv(k, block_shape[1])),
                     layout="[E, ceil(N/block_n), ceil(K/block_k)]")
        return w_scale
    layout = "[E] (per expert) or [E, N] (per channel)"
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() not in (1, 2):
        hint = ": a 3-D scale is one per weight block, pass block_shape (e.g. (128, 128))" if w_scale.dim() == 3 else ""
        raise ValueError(f"{name} must have 1 or 2 dimensions {layout} without block_shape, got shape "
                         f"{tuple(w_scale.shape)}{hint}")
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() == 1:
        check_tensor(name, w_scale, ndim=1, dtypes=(torch.float32,), shape=(num_experts,), layout=layout)
        return w_scale[:, None, None].expand(num_experts, n, 1)
    check_tensor(name, w_scale, ndim=2, dtypes=(torch.float32,), shape=(num_experts, n), layout=layout)
    return w_scale[:, :, None]


def check_activation_scale(name: str, a_scale, rows: int, k: int, block_shape: Optional[tuple]) -> torch.Tensor:
    """a_scale of float8 a [rows, K] as [rows, K groups] (size-1 layouts expanded, stride 0), after checking
    it, float32: [rows, ceil(K/block_k)] with block_shape, else [1] or [] (per tensor) or [rows, 1] (per token)."""
    if block_shape is not None:
        check_tensor(name, a_scale, ndim=2, dtypes=(torch.float32,), shape=(rows, triton.cdiv(k, block_shape[1])),
                     layout="[rows, ceil(K/block_k)]")
        return a_scale
    layout = "[1] or [] (per tensor) or [rows, 1] (per token)"
    if isinstance(a_scale, torch.Tensor) and a_scale.dim() <= 1:
        return check_static_scale(name, a_scale, layout)[:, None].expand(rows, 1)
    check_tensor(name, a_scale, ndim=2, dtypes=(torch.float32,), shape=(rows, 1), layout=layout)
    return a_scale


def _fp8_scales(a: torch.Tensor, w: torch.Tensor, a_scale, w_scale, block_shape, rows: int) -> Optional[Fp8Scales]:
    """Check the scale arguments against a and w; None for float operands (which take none)."""
    block_shape = check_gemm_block_shape(block_shape)
    if w.dtype != FP8_DTYPE:
        for name, given in (("a_scale", a_scale), ("w_scale", w_scale), ("block_shape", block_shape)):
            if given is not None:
                raise ValueError(f"{name} is for float8_e4m3fn operands; a and w are {str(w.dtype)[6:]}")
        return None
    if a_scale is None or w_scale is None:
        raise ValueError("float8_e4m3fn a and w need a_scale and w_scale (moe_lab.quantize_weights_fp8 and "
                         "quantize_activations_fp8 make them)")
    support = fp8_support(a.device)
    if not support.available:
        raise RuntimeError(f"float8_e4m3fn operands cannot run here: {support.reason}")
    w_scale = check_weight_scale("w_scale", w_scale, w, block_shape)
    a_scale = check_activation_scale("a_scale", a_scale, rows, w.shape[2], block_shape)
    if block_shape is not None:
        return Fp8Scales("block", a_scale, w_scale, *block_shape)
    return Fp8Scales("outer", a_scale, w_scale)


def check_use_tma(use_tma: UseTma) -> None:
    """Raise ValueError unless use_tma is the bool True or False or the string "auto" (not 0, 1, ...)."""
    if not (isinstance(use_tma, bool) or (isinstance(use_tma, str) and use_tma == "auto")):
        raise ValueError(f"use_tma must be True, False or 'auto', got {use_tma!r}")


def select_load_path(a: torch.Tensor, w: torch.Tensor, config: GemmConfig, *, gather_a: bool,
                     use_tma: UseTma = "auto", swiglu: bool = False) -> LoadPath:
    """Decide the load path of each operand: does this call use TMA (`moe_lab.capability` answers the
    other question, whether this device and Triton can). Precedence, first match wins:
    1. `use_tma=False`: pointer loads. 2. `MOE_LAB_TMA=0`, or a device/Triton without TMA: pointer loads
    (and ValueError with `use_tma=True`). 3. `use_tma="auto"` with `config.tma=False` (the tuner found
    pointer loads faster for this shape): pointer loads. 4. Per operand, TMA where its tensor meets the
    descriptor rules; elsewhere pointer loads with the broken rule as the reason, or ValueError with
    `use_tma=True` (for w, and for a sorted-layout a). With `swiglu` the weights are read
    as [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, BLOCK_SIZE_K]: gate and up rows in one tile. (With
    block scales a step of several scale blocks loads boxes of one block's K, `LaunchPlan.box_k`: valid
    wherever BLOCK_SIZE_K's are, the inner box staying >= 16 bytes.)"""
    check_use_tma(use_tma)
    if use_tma is False:
        return LoadPath(False, False, "use_tma=False")
    if use_tma == "auto" and not config.tma:
        return LoadPath(False, False, "the config for this shape prefers pointer loads (config.tma=False)")
    support = tma_support(a.device)
    if not support.available:
        if use_tma is True:
            raise ValueError(f"use_tma=True but TMA cannot be used here: {support.reason}")
        return LoadPath(False, False, f"no TMA: {support.reason}")
    reasons = []
    w_view, w_box = _weight_box(w, config, swiglu, config.BLOCK_SIZE_K)
    w_problem = descriptor_problem(w_view, w_box)
    if w_problem and use_tma is True:
        viewed = f", viewed as [E, 2, I, K] {tuple(w_view.shape)} for the SwiGLU epilogue," if swiglu else ""
        raise ValueError(f"use_tma=True but w {tuple(w.shape)} ({w.dtype}){viewed} cannot be read through a tensor "
                         f"descriptor: {w_problem}")
    if w_problem and swiglu:
        w_problem = f"the SwiGLU epilogue's 4-D view of w: {w_problem}"  # no " [": readers split the device off there
    reasons.append(f"w: {'pointer (' + w_problem + ')' if w_problem else 'tma'}")
    if gather_a:
        a_problem = "gathered token rows (TMA gather needs Blackwell)"
    else:
        a_problem = descriptor_problem(a, [config.BLOCK_SIZE_M, config.BLOCK_SIZE_K])
        if a_problem and use_tma is True:
            raise ValueError(f"use_tma=True but a {tuple(a.shape)} ({a.dtype}) cannot be read through a "
                             f"tensor descriptor: {a_problem}")
    reasons.append(f"a: {'pointer (' + a_problem + ')' if a_problem else 'tma'}")
    path = LoadPath(not a_problem, not w_problem, "; ".join(reasons) + f" [{support.reason}]")
    fallback = (w_problem, None if gather_a else a_problem)
    if any(fallback) and fallback not in _logged_fallbacks:
        _logged_fallbacks.add(fallback)
        log.debug("grouped_matmul falls back to pointer loads: %s", path.reason)
    return path


@interpreter_serialized
def grouped_matmul(a: torch.Tensor, w: torch.Tensor, routing: AlignedRouting, config: GemmConfig, *,
                   gather_a: bool, scatter: bool = False, topk_weights: Optional[torch.Tensor] = None,
                   swiglu: bool = False, out: Optional[torch.Tensor] = None, use_tma: UseTma = "auto",
                   a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                   block_shape=None, out_dtype: Optional[torch.dtype] = None, return_plan: bool = False):
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
    if not isinstance(routing, AlignedRouting):
        raise TypeError(f"routing must be an AlignedRouting (from moe_align), got {type(routing).__name__}")
    if not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    # Every program reads its block's schedule words before it knows whether its block is in use.
    if routing.sorted_token_ids.numel() < routing.max_num_m_blocks * routing.block_size_m:
        raise ValueError(f"routing.sorted_token_ids has {routing.sorted_token_ids.numel()} rows; its "
                         f"{routing.max_num_m_blocks} M-blocks of block_size_m={routing.block_size_m} need "
                         f"{routing.max_num_m_blocks * routing.block_size_m} (moe_align sizes it so)")
    for name, flag in (("gather_a", gather_a), ("scatter", scatter), ("swiglu", swiglu),
                       ("return_plan", return_plan)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    check_tensor("w", w, ndim=3, dtypes=FLOAT_DTYPES + (FP8_DTYPE,), shape=(routing.num_experts, None, None),
                 layout="[E, N, K]")
    num_experts, n, k = w.shape
    rows = routing.num_tokens if gather_a else routing.max_num_tokens_padded
    check_tensor("a", a, ndim=2, dtypes=(w.dtype,), shape=(rows, k),
                 layout="[T, K]" if gather_a else "[max_num_tokens_padded, K]", dtype_of="w")
    scales = _fp8_scales(a, w, a_scale, w_scale, block_shape, rows)
    if config.BLOCK_SIZE_M != routing.block_size_m:
        raise ValueError(f"config.BLOCK_SIZE_M={config.BLOCK_SIZE_M} must equal the routing's block_size_m="
                         f"{routing.block_size_m}")
    if topk_weights is not None:
        check_tensor("topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES,
                     shape=(routing.num_tokens, routing.top_k), layout="[T, k]")
    if swiglu:
        if n % 2 or n == 0:
            raise ValueError(f"swiglu=True needs w [E, 2I, K] with an even, non-zero 2I, got {tuple(w.shape)}")
        if config.BLOCK_SIZE_N < 32:
            raise ValueError(f"swiglu=True needs config.BLOCK_SIZE_N >= 32 (half for the gate rows, half for the "
                             f"up rows, each at least 16 for tl.dot), got {config.BLOCK_SIZE_N}")
        if scatter:
            raise ValueError("swiglu=True with scatter=True is not supported: the SwiGLU epilogue belongs to the "
                             "up projection, which writes sorted rows")
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
            raise ValueError(f"out_dtype=float8_e4m3fn quantizes whole groups of block_k={quant_group} output columns "
                             f"per program into sorted rows: needs scatter=False and the {tile_n} columns a program "
                             f"writes (config.BLOCK_SIZE_N{'/2 with swiglu' if swiglu else ''}) to be a multiple of "
                             f"{quant_group}")
    out = output_buffer(out, (out_rows, out_cols), out_dtype, a.device, "[rows, I]" if swiglu else "[rows, N]")
    out_scale = (torch.empty((out_rows, triton.cdiv(out_cols, quant_group)), dtype=torch.float32, device=a.device)
                 if quant_group else None)
    check_same_device(a=a, w=w, sorted_token_ids=routing.sorted_token_ids, out=out, topk_weights=topk_weights,
                      a_scale=a_scale, w_scale=w_scale)
    check_not_aliased(out, a=a, w=w, topk_weights=topk_weights, a_scale=a_scale, w_scale=w_scale,
                      sorted_token_ids=routing.sorted_token_ids, expert_ids=routing.expert_ids,
                      num_tokens_post_padded=routing.num_tokens_post_padded)

    if gather_a and scatter:
        raise ValueError("gather_a=True with scatter=True is not a supported combination (the up projection "
                         "writes sorted rows; the down projection reads them and scatters)")
    if topk_weights is not None and not scatter:
        raise ValueError("topk_weights needs scatter=True: routed weights are applied as rows go to their slots")
    plan = plan_gemm(a, w, routing, config, gather_a=gather_a, scatter=scatter, swiglu=swiglu, use_tma=use_tma,
                        scales=scales, out_quant_group=quant_group, out=out)
    result = (out, out_scale) if quant_group else out
    if plan.grid == 0:
        return (result, plan) if return_plan else result
    a_desc = w_desc = None
    if plan.path.a_tma or plan.path.w_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        if plan.path.a_tma:
            a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()),
                                      [plan.config.BLOCK_SIZE_M, plan.box_k])
        if plan.path.w_tma:
            w_view, box = _weight_box(w, plan.config, plan.swiglu, plan.box_k)
            w_desc = TensorDescriptor(w_view, list(w_view.shape), list(w_view.stride()), box)
    weights = topk_weights.reshape(-1) if topk_weights is not None else None
    if weights is not None and not weights.is_contiguous():
        weights = weights.contiguous()

    while True:
        try:
            _launch(plan, a, a_desc, w, w_desc, out, weights, routing, scales, out_scale)
            return (result, plan) if return_plan else result
        except triton.runtime.errors.OutOfResources as exc:  # the compiler's count beat our estimate
            if plan.config.num_stages == 1:
                raise ValueError(f"config {plan.config} does not fit this device: {exc}") from None
            plan = replace(plan, config=replace(plan.config, num_stages=plan.config.num_stages - 1))


def plan_gemm(a: torch.Tensor, w: torch.Tensor, routing: AlignedRouting, config: GemmConfig, *,
                 gather_a: bool, scatter: bool = False, swiglu: bool = False,
                 use_tma: UseTma = "auto", scales: Optional[Fp8Scales] = None,
                 out_quant_group: int = 0, out: Optional[torch.Tensor] = None) -> LaunchPlan:
    """The LaunchPlan of a `grouped_matmul` call with these arguments, which grouped_matmul has checked:
    the config fitted to the device's shared memory (and, with block scales, BLOCK_SIZE_K to the scale
    block), the load paths, the grid. Launches nothing. Callers get the plan with
    `grouped_matmul(..., return_plan=True)`."""
    if not routing.expert_sorted and config.persistent:  # its blocks may name no expert: skipped per program
        config = replace(config, persistent=False)
    if scales is not None and config.BLOCK_SIZE_K < MIN_FP8_DOT_K:
        config = replace(config, BLOCK_SIZE_K=MIN_FP8_DOT_K)
    dots_per_step = 1
    if scales is not None and scales.mode == "block":
        if config.BLOCK_SIZE_K > scales.group_k and config.BLOCK_SIZE_K % scales.group_k == 0:
            dots_per_step = config.BLOCK_SIZE_K // scales.group_k  # a step of whole scale blocks, one dot each
        elif scales.group_k % config.BLOCK_SIZE_K:
            # each dot must lie in one scale block: the largest power of two dividing block_k (>= 32)
            config = replace(config, BLOCK_SIZE_K=min(config.BLOCK_SIZE_K, scales.group_k & -scales.group_k))
    # Folded tails need blocks of one expert in a row (expert-sorted) and a program per tile to skip; off
    # before the shared-memory fit, which would count their rows.
    if config.fold_tail_rows and (not routing.expert_sorted or config.persistent or scales is not None):
        config = replace(config, fold_tail_rows=0)
    budget = _shared_memory_budget(a.device)
    if budget is not None:  # a config tuned on a bigger GPU must not crash this one
        config = fit_to_shared_memory(config, a.element_size(), budget)
    # With the SwiGLU epilogue a program covers BLOCK_SIZE_N/2 of the I output columns: the same grid.
    grid = routing.max_num_m_blocks * triton.cdiv(w.shape[1], config.BLOCK_SIZE_N) if w.shape[1] else 0
    if config.persistent and grid:
        grid = min(grid, INTERPRETER_PROGRAMS if interpreter_active() else multiprocessor_count(a.device))
    if grid == 0:
        path = LoadPath(False, False, "nothing to launch (no rows or no columns)")
    else:
        path = select_load_path(a, w, config, gather_a=gather_a, use_tma=use_tma, swiglu=swiglu)
    # A program's weight rows (each half's, with SwiGLU) start at a multiple of their count, so they lie in
    # one scale block when block_n is a multiple of that count (and, for the up half, I too). Not with
    # K = 0: that loop loads the first step's scales before it starts, and there are no K groups.
    tile_rows = config.BLOCK_SIZE_N // 2 if swiglu else config.BLOCK_SIZE_N
    w_scale_per_tile = (scales is not None and scales.mode == "block" and scales.group_n % tile_rows == 0
                        and (not swiglu or (w.shape[1] // 2) % tile_rows == 0) and w.shape[2] > 0)
    return LaunchPlan(config, path, gather_a, scatter, grid, swiglu, config.persistent,
                      scales.mode if scales is not None else "none", out_quant_group, w_scale_per_tile, dots_per_step)


def _weight_box(w: torch.Tensor, config: GemmConfig, swiglu: bool, box_k: int):
    """The view of w that the weight descriptor covers, and its block shape: [E, N, K] in boxes of
    [1, BLOCK_SIZE_N, box_k]; with the SwiGLU epilogue [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, box_k],
    whose two halves are a gate tile and the matching up tile. box_k: BLOCK_SIZE_K, or one dot's K where a
    K step runs several (`LaunchPlan.box_k`); validity does not depend on it (the inner box stays >= 16 bytes)."""
    if swiglu:
        return w.unflatten(1, (2, w.shape[1] // 2)), [1, 2, config.BLOCK_SIZE_N // 2, box_k]
    return w, [1, config.BLOCK_SIZE_N, box_k]


def _shared_memory_budget(device: torch.device) -> Optional[int]:
    """Bytes of shared memory one program may use where kernels compile for a CUDA GPU; None under the
    interpreter (no limit to fit)."""
    if device.type != "cuda" or interpreter_active():
        return None
    return shared_memory_limit(device)


def _launch(plan: LaunchPlan, a, a_desc, w, w_desc, out, weights, routing, scales: Optional[Fp8Scales],
            out_scale: Optional[torch.Tensor]):
    """Launch the plan's kernel: operands as the kernels' tuples (see moe_lab/_kernels/grouped_matmul.py)."""
    config, (_, n, k) = plan.config, w.shape
    if plan.swiglu:
        n //= 2  # the output width I; the up rows start at row I of w
    operands = (
        (a, a.stride(0), a.stride(1)), a_desc, (w, *w.stride()), w_desc,
        (out, out_scale, *out.stride(), *(out_scale.stride() if out_scale is not None else (0, 0))),
        (None, None, 0, 0, 0, 0, 0, 1) if scales is None else
        (scales.a_scale, scales.w_scale, *scales.a_scale.stride(), *scales.w_scale.stride(), scales.group_n),
        weights, routing.sorted_token_ids, routing.expert_ids, routing.num_tokens_post_padded)
    interpreted = interpreter_active()
    modes = dict(ROWS="gather" if plan.gather_a else "scatter" if plan.scatter else "sorted", SWIGLU=plan.swiglu,
                 SCALES="block_tile" if plan.w_scale_per_tile else plan.scales,
                 SCALE_GROUP_K=scales.group_k if scales is not None else 1, EVEN_K=k % config.BLOCK_SIZE_K == 0,
                 DOT="interpreter" if interpreted else "ieee" if full_precision_fp32(a.dtype) else "mma")
    tiles = dict(BLOCK_SIZE_M=config.BLOCK_SIZE_M, BLOCK_SIZE_N=config.BLOCK_SIZE_N, BLOCK_SIZE_K=config.BLOCK_SIZE_K,
                 GROUP_SIZE_M=config.GROUP_SIZE_M, num_warps=config.num_warps, num_stages=config.num_stages)
    if plan.persistent:
        grouped_matmul_persistent_kernel[(plan.grid,)](
            *operands, n, k, routing.num_slots, routing.top_k, **modes, **tiles)
    else:
        grouped_matmul_kernel[(plan.grid,)](
            *operands, n, k, routing.num_slots, routing.max_num_m_blocks, routing.num_experts, routing.top_k,
            **modes, TAIL_SPLITS=config.tail_splits, FOLD_M=plan.fold_m, **tiles)
