"""A warp-specialized Hopper grouped GEMM for block-scaled float8 (DeepSeek-V3's w8a8 recipe), in Gluon.

The same function as `grouped_matmul(a, w, routing, config, gather_a=..., a_scale=..., w_scale=...,
block_shape=(128, 128))` with float8_e4m3fn operands: per M-block of the routing, out = sum over 128-deep K
blocks of (a @ w[e].T) x a_scale x w_scale, float32 sums, bfloat16 out. The kernel
(moe_lab/_kernels/gluon_fp8.py) gives TMA loads to one warp and wgmmas to one or two warpgroups that scale
each K block's product while the next block's wgmma runs; one program per SM walks the tiles, or one program
runs each tile (`moe_lab.plan.gluon_programs`).

Hopper's TMA copies boxes and cannot gather rows, so with gather_a (the up GEMM) the token rows and their
scales are first copied into the routing's padded expert order (`permute_tokens`: [rows, K] float8 and
[rows, K/128] float32, zero padding rows), and the kernel reads that copy through a descriptor.

With `activation` (the up projection of a gated expert) the kernel computes the activation [rows, I] from w1
[E, 2I, K] (gate rows, then up rows) in its epilogue, and with `out_scale` writes it as float8 with one float32
scale per row per 128 columns: the input of the down GEMM, in the format `fused_moe`'s Triton up GEMM writes.

`fused_moe` runs it for block-scaled float8 layers, per chunk, where the experts get 256 rows each or more
(128 for large experts, whose w1 takes 16 MiB or more each) and no config is given, or with MOE_LAB_GLUON=1
at every T (`moe_lab.plan.gluon_applies`);
`moe_lab.capability.gluon_fp8_support()` says where it can run (Triton with Gluon's `warp_specialize`, an
sm_90 GPU, no interpreter), and the Triton kernel runs everywhere else.
The compile check builds it for sm_90 under Triton 3.6.0, 3.7.1, 3.8.0 and 3.9.0; it has run on an H200 under 3.6.0.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._validate import (
    FLOAT_DTYPES,
    check_not_aliased,
    check_own_memory,
    check_same_device,
    check_tensor,
    output_buffer,
)
from .align import AlignedRouting
from .capability import descriptor_problem, gluon_fp8_support
from .configs import GemmConfig
from .expert_kind import Activation, check_activation
from .gemm import check_fp8_scales, check_gemm_rows
from .permute import permute_tokens
from .plan import (
    GLUON_BLOCK_SIZE_N,
    GLUON_PARTITION_ROWS,
    GluonFp8Plan,
    gluon_block_shape_problem,
    gluon_weight_problem,
    plan_gluon_fp8,
)
from .quantize import FP8_DTYPE

__all__ = ["GluonFp8Plan", "grouped_matmul_fp8_gluon", "gluon_fp8_support"]


def grouped_matmul_fp8_gluon(
    a: torch.Tensor,
    w: torch.Tensor,
    routing: AlignedRouting,
    config: Optional[GemmConfig] = None,
    *,
    gather_a: bool,
    scatter: bool = False,
    topk_weights: Optional[torch.Tensor] = None,
    a_scale: torch.Tensor,
    w_scale: torch.Tensor,
    block_shape=(128, 128),
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    activation=None,
    out_scale: Optional[torch.Tensor] = None,
    return_plan: bool = False,
):
    """Every expert's block-scaled float8 GEMM of one projection, warp-specialized Gluon kernel (Hopper).

    Args:
        a: float8_e4m3fn [T, K] token rows (gather_a=True, the up projection) or [routing.max_num_tokens_padded,
            K] rows in padded sorted order (gather_a=False); any strides with gather_a (the rows are copied
            into sorted order first), else a last stride of 1 and 16-byte aligned rows (TMA).
        w: float8_e4m3fn [E, N, K] weights read as one [E * N, K] TMA matrix: last stride 1, stride(1) a
            multiple of 16, stride(0) = N * stride(1) (unless E = 1), a 16-byte aligned base; K a multiple of
            16 (`moe_lab.plan.gluon_weight_problem`).
        routing: the schedule from `moe_align`, BLOCK_SIZE_M 64 or 128.
        config: BLOCK_SIZE_M (the routing's), BLOCK_SIZE_N (dividing block_n), GROUP_SIZE_M and num_stages;
            BLOCK_SIZE_K and num_warps are the kernel's (128, one warpgroup per 64 rows). Default:
            `plan_gluon_fp8`'s.
        gather_a, scatter, topk_weights: as in `moe_lab.grouped_matmul` (topk_weights only with scatter).
        a_scale: float32 [rows, ceil(K/128)], rows as for a; w_scale: float32 [E, ceil(N/block_n), ceil(K/128)].
        block_shape: [block_n, block_k] of the weight scales; block_k must be 128, block_n a multiple of
            BLOCK_SIZE_N (`moe_lab.plan.gluon_block_shape_problem`).
        out: optional output [rows_sorted, N] (or [T*k, N] with scatter), last stride 1; out_dtype: bfloat16
            (default), float16 or float32. Rows of blocks past num_tokens_post_padded are left as they were;
            so are, with activation and 128-row tiles, the rows of a 64-row half of an M-block that holds
            padding alone (an expert's last block with 64 routed rows or fewer), which the kernel passes by.
        activation: None (the plain GEMM), or the SwiGLU epilogue's `moe_lab.Activation` ("silu" or
            "swigluoai" with gate and up as halves; interleaved rows raise ValueError) for the up projection
            (gather_a=True): w [E, 2I, K], out [rows_sorted, I], I a multiple of BLOCK_SIZE_N.
        out_scale: with activation, an optional float32 [rows_sorted, I/128] buffer: the output is then float8_e4m3fn
            (out_dtype), each row's 128-column group quantized with scale max(amax, 1e-10)/448 written here.
        return_plan: also return the GluonFp8Plan launched.
    Returns:
        out, or (out, GluonFp8Plan) with return_plan.
    Raises:
        TypeError / ValueError naming the argument for wrong types, dtypes, shapes, strides, devices or configs
        (checked first: the arguments' errors come before the device's);
        RuntimeError where the kernel cannot run (`moe_lab.capability.gluon_fp8_support`'s reason).
    """
    check_gemm_rows(routing, topk_weights, gather_a=gather_a, scatter=scatter, return_plan=return_plan)
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
    if activation is not None:
        activation = check_activation(activation)
        if not gather_a:
            raise ValueError("activation needs gather_a=True: the SwiGLU epilogue belongs to the up projection")
    elif out_scale is not None:
        raise ValueError("out_scale needs activation: only the SwiGLU epilogue quantizes its output")
    check_tensor("w", w, ndim=3, dtypes=(FP8_DTYPE,), shape=(routing.num_experts, None, None), layout="[E, N, K]")
    _, n, k = w.shape
    rows = routing.num_tokens if gather_a else routing.max_num_tokens_padded
    layout = "[T, K]" if gather_a else "[max_num_tokens_padded, K]"
    check_tensor("a", a, ndim=2, dtypes=(FP8_DTYPE,), shape=(rows, k), layout=layout)
    if block_shape is None:
        raise ValueError("block_shape must be given ([block_n, 128]): the Gluon kernel takes block scales only")
    scales = check_fp8_scales(a, w, a_scale, w_scale, block_shape, rows)
    a_scale, w_scale, block_shape = scales.a_scale, scales.w_scale, (scales.group_n, scales.group_k)
    if activation is not None and n % 2:
        raise ValueError(f"w must have shape [E, 2I, K] with activation, got an odd {n} rows per expert")
    n_out = n // 2 if activation is not None else n
    out_dtype = out.dtype if out_dtype is None and isinstance(out, torch.Tensor) else out_dtype
    out_dtype = out_dtype or (FP8_DTYPE if out_scale is not None else torch.bfloat16)
    if out_scale is not None:
        if out_dtype != FP8_DTYPE:
            raise TypeError(f"out must be float8_e4m3fn with out_scale, got {out_dtype}")
        check_tensor(
            "out_scale",
            out_scale,
            ndim=2,
            dtypes=(torch.float32,),
            shape=(routing.max_num_tokens_padded, -(-n_out // 128)),
            layout="[max_num_tokens_padded, I/128]",
        )
        check_own_memory("out_scale", out_scale)
    elif out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    out_rows = routing.num_slots if scatter else routing.max_num_tokens_padded
    out = output_buffer(out, (out_rows, n_out), out_dtype, a.device, "[rows, N]")
    check_same_device(
        a=a,
        w=w,
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=topk_weights,
        sorted_token_ids=routing.sorted_token_ids,
        out=out,
        out_scale=out_scale,
    )
    check_not_aliased(out, a=a, w=w, a_scale=a_scale, w_scale=w_scale, topk_weights=topk_weights, out_scale=out_scale)
    block_size_n = config.BLOCK_SIZE_N if config is not None else GLUON_BLOCK_SIZE_N
    problem = gluon_weight_problem("w", w) or gluon_block_shape_problem(block_shape, block_size_n)
    if problem:
        raise ValueError(problem)
    plan = plan_gluon_fp8(routing, n, k, block_shape, a.device, config, out.element_size(), activation)
    reason = gluon_fp8_support(a.device)
    if reason is not None:
        raise RuntimeError(f"the Gluon FP8 grouped GEMM cannot run here: {reason}")
    if routing.max_num_tokens_padded and n and k:
        run_gluon_fp8(plan, a, w, routing, out, a_scale, w_scale, topk_weights, gather_a, scatter, out_scale)
    return (out, plan) if return_plan else out


def run_gluon_fp8(
    plan: GluonFp8Plan,
    a,
    w,
    routing,
    out,
    a_scale,
    w_scale,
    topk_weights=None,
    gather_a=False,
    scatter=False,
    out_scale=None,
):
    """Build the descriptors (A permuted first with gather_a) and launch `plan`; operands checked by the
    caller (`grouped_matmul_fp8_gluon`, or `fused_moe` for a planned layer)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ._kernels.gluon_fp8 import fp8_grouped_matmul_ws_kernel

    config = plan.config
    num_experts, n, k = w.shape
    if gather_a:
        a, a_scale = permute_tokens(a, routing), permute_tokens(a_scale, routing)
    a_block_shape = [GLUON_PARTITION_ROWS, config.BLOCK_SIZE_K]  # each MMA partition's rows
    problem = descriptor_problem(a, a_block_shape)
    if problem:
        raise ValueError(f"a cannot be read through a tensor descriptor: {problem}")
    w_rows = w.as_strided((num_experts * n, k), (w.stride(1), 1))
    a_layout = gl.NVMMASharedLayout.get_default_for(a_block_shape, gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([config.BLOCK_SIZE_N, config.BLOCK_SIZE_K], gl.float8e4nv)
    a_desc = TensorDescriptor.from_tensor(a, a_block_shape, a_layout)
    w_desc = TensorDescriptor.from_tensor(w_rows, [config.BLOCK_SIZE_N, config.BLOCK_SIZE_K], w_layout)
    weights = topk_weights.reshape(-1) if topk_weights is not None else None
    if weights is not None and not weights.is_contiguous():
        weights = weights.contiguous()
    scale_strides = out_scale.stride() if out_scale is not None else (0, 0)
    activation = plan.activation if plan.activation is not None else Activation()
    fp8_grouped_matmul_ws_kernel[(plan.grid,)](
        a_desc,
        w_desc,
        out,
        out.stride(0),
        out_scale,
        *scale_strides,
        a_scale,
        *a_scale.stride(),
        w_scale,
        *w_scale.stride(),
        weights,
        routing.sorted_token_ids,
        routing.expert_ids,
        routing.num_tokens_post_padded,
        activation.alpha,
        activation.limit,
        out.shape[1],
        k,
        routing.num_slots,
        SCATTER=scatter,
        **plan.constexprs,
    )
