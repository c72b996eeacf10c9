"""Token rows into expert order: out[r] = a[sorted_token_ids[r] // TOP_K], zeros for padding rows."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_slots"])
def permute_tokens_kernel(a_ptr, out_ptr, sorted_token_ids_ptr, num_tokens_post_padded_ptr, num_slots,
                          K, stride_am, stride_ak, stride_om,
                          TOP_K: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows_in_use = tl.load(num_tokens_post_padded_ptr)
    if tl.program_id(0) * BLOCK_ROWS >= rows_in_use:
        return
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_use = rows < rows_in_use
    token_ids = tl.load(sorted_token_ids_ptr + rows, mask=in_use, other=num_slots)
    valid = token_ids < num_slots
    src = (token_ids // TOP_K).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    col_ok = cols < K
    x = tl.load(a_ptr + src[:, None] * stride_am + cols[None, :] * stride_ak,
                mask=valid[:, None] & col_ok[None, :], other=0.0)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :], x,
             mask=in_use[:, None] & col_ok[None, :])
