"""SiLU-and-mul, the activation between the two GEMMs of a SwiGLU expert, and the expert kinds it comes in.

out[r, :] = silu(x[r, :I]) * x[r, I:], computed in float32 and stored in x's dtype. The gate half comes
first, matching w1 = [gate; up] stacked along N (the layout of vLLM and of Hugging Face's Mixtral
w1/w3 once concatenated). Source: Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202.

`silu_and_mul(..., activation=)` also computes gpt-oss's clamped SwiGLU and reads interleaved gate/up
columns: the kinds are named by `moe_lab.Activation` (moe_lab/expert_kind.py).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ._ints import cdiv
from ._kernels.activation import silu_and_mul_kernel
from ._launch import launch
from ._validate import FLOAT_DTYPES, check_kernel_device, check_not_aliased, check_tensor, output_buffer
from .align import AlignedRouting, check_routing
from .expert_kind import Activation, check_activation
from .runtime import interpreter_active, interpreter_serialized

BLOCK_SIZE = 1024


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
        check_routing(routing)
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
    check_kernel_device(x=x, out=out, sorted_token_ids=routing.sorted_token_ids if routing is not None else None)
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
    launch(
        silu_and_mul_kernel,
        (rows, cdiv(inter, BLOCK_SIZE)),
        (
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
        ),
        dict(
            ROUTED=routing is not None,
            ACTIVATION=activation.kernel_name,
            EMULATE_BF16=interpreter_active() and x.dtype == torch.bfloat16,
            BLOCK_SIZE=BLOCK_SIZE,
        ),
    )
    return out
