"""Per-token-group FP8 quantization: each row of x is cut into groups of GROUP_SIZE consecutive channels;
each group gets scale = max(amax(|group|), 1e-10) / 448 and q = clamp(x / scale, -448, 448) in e4m3
(round to nearest even). With STATIC_SCALE, one given float32 scale serves every group and none is stored.

A program quantizes GROUPS_PER_PROGRAM groups of ROWS_PER_PROGRAM rows: a [ROWS_PER_PROGRAM,
GROUPS_PER_PROGRAM, GROUP_BLOCK] tile, where GROUP_BLOCK is GROUP_SIZE rounded up to a power of two (the
extra lanes are masked), so one reduction along the tile's last axis gives every group's amax. Rows at or
past *num_rows_ptr (HAS_ROW_BOUND) are left as they were, without a read of the bound on the host."""
import triton
import triton.language as tl

from .common import cast_e4m3, clamp_e4m3, quantize_groups_e4m3


@triton.jit(do_not_specialize=["num_rows"])
def per_token_group_quant_fp8_kernel(x_ptr, q_ptr, scale_ptr, num_rows_ptr, num_rows, K, stride_xm, stride_xk,
                                     stride_qm, stride_sm, stride_sg, GROUP_SIZE: tl.constexpr,
                                     GROUP_BLOCK: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr,
                                     ROWS_PER_PROGRAM: tl.constexpr, STATIC_SCALE: tl.constexpr,
                                     HAS_ROW_BOUND: tl.constexpr, EMULATE_FP8: tl.constexpr):
    first_row = tl.program_id(0) * ROWS_PER_PROGRAM
    if HAS_ROW_BOUND:  # buffers sized by a bound: stop at the rows in use
        num_rows = tl.minimum(num_rows, tl.load(num_rows_ptr))
        if first_row >= num_rows:
            return
    rows = first_row + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = rows < num_rows
    rows = rows.to(tl.int64)[:, None, None]  # rows * K can pass 2^31
    groups = tl.program_id(1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    lane = tl.arange(0, GROUP_BLOCK)
    cols = (groups[:, None] * GROUP_SIZE + lane[None, :])[None, :, :]
    mask = row_ok[:, None, None] & (lane[None, None, :] < GROUP_SIZE) & (cols < K)
    x = tl.load(x_ptr + rows * stride_xm + cols.to(tl.int64) * stride_xk, mask=mask, other=0.0).to(tl.float32)
    if STATIC_SCALE:
        # div_rn: IEEE division, as torch divides (a plain `/` is approximate on NVIDIA GPUs)
        q = clamp_e4m3(tl.math.div_rn(x, tl.zeros_like(x) + tl.load(scale_ptr)), EMULATE_FP8)
    else:  # masked lanes are 0: no group's amax
        q, scale = quantize_groups_e4m3(x, EMULATE_FP8)
        tl.store(scale_ptr + rows.reshape(ROWS_PER_PROGRAM, 1) * stride_sm + groups[None, :] * stride_sg, scale,
                 mask=row_ok[:, None] & (groups[None, :] * GROUP_SIZE < K))
    tl.store(q_ptr + rows * stride_qm + cols, cast_e4m3(q, EMULATE_FP8), mask=mask)
