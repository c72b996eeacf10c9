"""The top-k reduce: each token's k expert outputs summed into one row.

The down projection writes each routed (token, k) slot once, already multiplied by its routed weight;
slots whose expert is not computed here (another rank's, under an `expert_map`) are never written, and
the reduce skips them by looking at `topk_ids` again, so `out_k` needs no zero fill.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._ints import cdiv
from ._kernels.reduce import topk_reduce_kernel
from ._launch import LaunchSite, launch
from ._validate import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_kernel_device,
    check_not_aliased,
    check_positive_int,
    check_tensor,
    output_buffer,
)
from .runtime import interpreter_active, interpreter_serialized

BLOCK_SIZE = 1024


@interpreter_serialized
def topk_reduce(
    out_k: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    expert_map: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out_k [T*k, H] float, topk_ids [T, k] int -> out [T, H] (float32 accumulation). out_k may have any
    strides (copied first where its last stride is not 1).

    Slots whose id lies outside [0, E_global) (E_global = len(expert_map), or num_experts without a map),
    or whose local expert is -1, contribute zero. Raises TypeError/ValueError for bad arguments."""
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, layout="[T, k]")
    num_experts = check_positive_int("num_experts", num_experts)
    if expert_map is not None:
        check_tensor("expert_map", expert_map, ndim=1, dtypes=INDEX_DTYPES, layout="[E_global]")
        expert_map = expert_map.contiguous()
    num_tokens, top_k = topk_ids.shape
    check_tensor("out_k", out_k, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens * top_k, None), layout="[T*k, H]")
    hidden = out_k.shape[1]
    if out_k.stride(1) != 1:
        out_k = out_k.contiguous()
    out = output_buffer(out, (num_tokens, hidden), out_k.dtype, out_k.device, "[T, H]")
    check_kernel_device(out_k=out_k, topk_ids=topk_ids, expert_map=expert_map, out=out)
    check_not_aliased(out, out_k=out_k, topk_ids=topk_ids, expert_map=expert_map)
    return run_topk_reduce(out_k, topk_ids, num_experts, expert_map, out)


def run_topk_reduce(
    out_k: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    expert_map: Optional[torch.Tensor],
    out: torch.Tensor,
    site: Optional[LaunchSite] = None,
) -> torch.Tensor:
    """`topk_reduce` on arguments already checked (out_k with a last stride of 1, a contiguous expert_map;
    `fused_moe` checks its inputs once): no check here. `site`: where a cached layer plan keeps the compiled
    kernel (`moe_lab._launch`), or None."""
    num_tokens, top_k = topk_ids.shape
    hidden = out_k.shape[1]
    if num_tokens == 0 or hidden == 0:
        return out
    launch(
        topk_reduce_kernel,
        (num_tokens, cdiv(hidden, BLOCK_SIZE)),
        (out_k, topk_ids, expert_map, out, hidden, expert_map.numel() if expert_map is not None else num_experts)
        + (num_experts, out_k.stride(0), topk_ids.stride(0), topk_ids.stride(1), out.stride(0)),
        dict(
            TOP_K=top_k,
            HAS_EXPERT_MAP=expert_map is not None,
            EMULATE_BF16=interpreter_active() and out.dtype == torch.bfloat16,
            BLOCK_SIZE=BLOCK_SIZE,
        ),
        site,
    )
    return out
