"""Permute token rows into the padded expert order of an `AlignedRouting` (vLLM calls this moe_permute).

The up projection normally gathers its A rows inside the GEMM (row = sorted_token_id // top_k), with
pointer loads: Hopper's TMA copies boxes and cannot gather. When N is wide the GEMM re-reads every A tile
once per N-tile; copying the rows into expert order once (T*k*H elements written) lets them be read
through a tensor descriptor. The layer does not: on an H200 the copy cost what the descriptor saved
(docs/experiments.md). Kept as an op of its own, as engines use it.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._ints import cdiv
from ._kernels.permute import permute_tokens_kernel
from ._validate import FLOAT_DTYPES, check_kernel_device, check_not_aliased, check_tensor, output_buffer
from .align import AlignedRouting, check_routing
from .quantize import FP8_DTYPE
from .runtime import interpreter_serialized

BLOCK_ROWS = 16
BLOCK_K = 256


@interpreter_serialized
def permute_tokens(
    hidden_states: torch.Tensor, routing: AlignedRouting, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """hidden_states [T, K] (float16/bfloat16/float32, or float8_e4m3fn rows and their float32 scales
    [T, K groups] as two calls; any strides) -> [routing.max_num_tokens_padded, K]
    in the routing's padded expert order: row r holds hidden_states[sorted_token_ids[r] // top_k], padding
    rows are zero, rows past num_tokens_post_padded are left as they were. No host synchronization.
    Raises TypeError/ValueError naming the argument for a wrong type, dtype, shape or device, or an `out`
    that shares memory with hidden_states. Source: vLLM's moe_permute (vllm-project/vllm, fused_moe)."""
    check_routing(routing)
    check_tensor(
        "hidden_states",
        hidden_states,
        ndim=2,
        dtypes=FLOAT_DTYPES + (FP8_DTYPE,),
        shape=(routing.num_tokens, None),
        layout="[T, K]",
    )
    rows, k = routing.max_num_tokens_padded, hidden_states.shape[1]
    out = output_buffer(out, (rows, k), hidden_states.dtype, hidden_states.device, "[max_num_tokens_padded, K]")
    check_kernel_device(
        hidden_states=hidden_states,
        sorted_token_ids=routing.sorted_token_ids,
        num_tokens_post_padded=routing.num_tokens_post_padded,
        out=out,
    )
    check_not_aliased(out, hidden_states=hidden_states)
    if rows == 0 or k == 0:
        return out
    permute_tokens_kernel[(cdiv(rows, BLOCK_ROWS), cdiv(k, BLOCK_K))](
        hidden_states,
        out,
        routing.sorted_token_ids,
        routing.num_tokens_post_padded,
        routing.num_slots,
        k,
        hidden_states.stride(0),
        hidden_states.stride(1),
        out.stride(0),
        TOP_K=routing.top_k,
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_K=BLOCK_K,
    )
    return out
