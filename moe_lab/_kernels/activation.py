"""SiLU-and-mul: out[r, j] = silu(x[r, j]) * x[r, I + j], in float32, for rows r < num_tokens_post_padded
that hold a routed slot; or another gated activation, gate and up in halves or interleaved (ACTIVATION,
`common.gated_activation`). Padding rows get zeros without reading x: the grouped matmul may not have written
them, and whatever they held must not reach the next GEMM's tensor cores as NaN or Inf."""
import triton
import triton.language as tl

from .common import gate_up_halves, gated_activation, round_to_bf16_grid


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, num_tokens_post_padded_ptr, sorted_token_ids_ptr, num_slots,
                        inter_size, stride_xm, stride_om, alpha, limit, ROUTED: tl.constexpr,
                        ACTIVATION: tl.constexpr, EMULATE_BF16: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    if ROUTED:  # x is in the routing's padded order, sized by a bound: stop at the rows in use
        if row >= tl.load(num_tokens_post_padded_ptr):
            return
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < inter_size
    if ROUTED:
        # tl.where, not `mask & scalar`: Triton 3.9's interpreter rejects a block mask `&` a scalar bool
        # ("mask has unsupported dtype"); both lower to the same select on a GPU.
        mask_x = tl.where(tl.load(sorted_token_ids_ptr + row) < num_slots, mask, False)
    else:
        mask_x = mask
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    if gate_up_halves(ACTIVATION):  # gate columns [0, I), up columns [I, 2I)
        gate_cols, up_cols = cols, inter_size + cols
    else:  # interleaved: column 2j gate j, 2j + 1 up j
        gate_cols, up_cols = 2 * cols, 2 * cols + 1
    gate = tl.load(x_row + gate_cols, mask=mask_x, other=0.0).to(tl.float32)
    up = tl.load(x_row + up_cols, mask=mask_x, other=0.0).to(tl.float32)
    out = gated_activation(gate, up, ACTIVATION, alpha, limit)
    if EMULATE_BF16:
        out = round_to_bf16_grid(out)
    tl.store(out_ptr + row.to(tl.int64) * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=mask)
