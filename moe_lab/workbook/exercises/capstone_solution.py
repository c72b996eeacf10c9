"""The reference solution of the capstone (notebook 05b): the grouped GEMMs of the up and down projections,
written whole, as the learner writes them from the skeleton.

    capstone_up_kernel:   out[r] = a[sorted_token_ids[r] // TOP_K] @ w[expert].T in the sorted layout
                          [max_num_tokens_padded, N]; token rows gathered by pointer, w through a 3-D
                          descriptor; padding rows get zeros.
    capstone_down_kernel: out[sorted_token_ids[r]] = topk_weights[sorted_token_ids[r]] * (a[r] @ w[expert].T),
                          [T * top_k, N]; a (already in sorted order) and w through descriptors.

The checkers (`moe_lab.workbook.exercises.capstone`) grade them, `benchmarks/capstone.py` times them on an
H200 against `moe_lab.grouped_matmul`. Kept short on purpose: no tail tiles, no persistent walk, no
interpreter-only branch (the workbook's GEMMs run float16 under the interpreter, whose float16 dot is exact).
"""

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def weight_desc_solution(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    """The host descriptor over w [E, N, K]: one box is one expert's BLOCK_SIZE_N x BLOCK_SIZE_K tile."""
    return TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N, BLOCK_SIZE_K])


def sorted_rows_desc_solution(a, BLOCK_SIZE_M, BLOCK_SIZE_K):
    """The host descriptor over the down projection's a [max_num_tokens_padded, K]: one box is the
    BLOCK_SIZE_M rows of one M-block (one expert's, as the per-expert padding guarantees)."""
    return TensorDescriptor.from_tensor(a, [BLOCK_SIZE_M, BLOCK_SIZE_K])


@triton.jit
def _tile_of_program(num_m_blocks, N, BLOCK_SIZE_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """(pid_m, pid_n) of this program: GROUP_SIZE_M M-blocks walk the N-blocks together, so the weight
    tiles of one N-block are read by neighbouring programs (the L2 keeps them)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = min(num_m_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def capstone_up_kernel_solution(
    a_ptr,
    w_desc,
    out_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    num_m_blocks,
    N,
    K,
    num_slots,
    stride_am,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    pid_m, pid_n = _tile_of_program(num_m_blocks, N, BLOCK_SIZE_N, GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return  # a block past the rows in use
    expert = tl.load(expert_ids_ptr + pid_m)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    row_ok = slots < num_slots  # padding rows hold num_slots
    tokens = (slots // TOP_K).to(tl.int64)  # int64: tokens * stride_am may pass 2^31
    a_ptrs = a_ptr + tokens[:, None] * stride_am + offs_k[None, :]
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & (k0 + offs_k[None, :] < K), other=0.0)
        w = w_desc.load([expert, pid_n * BLOCK_SIZE_N, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
        acc = tl.dot(a, w.T, acc)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=offs_n[None, :] < N)


@triton.jit
def capstone_down_kernel_solution(
    a_desc,
    w_desc,
    out_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    num_m_blocks,
    N,
    K,
    num_slots,
    stride_om,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    pid_m, pid_n = _tile_of_program(num_m_blocks, N, BLOCK_SIZE_N, GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        a = a_desc.load([pid_m * BLOCK_SIZE_M, k0])  # the descriptor fills past K with 0
        w = w_desc.load([expert, pid_n * BLOCK_SIZE_N, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
        acc = tl.dot(a, w.T, acc)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    row_ok = slots < num_slots
    acc *= tl.load(topk_weights_ptr + slots, mask=row_ok, other=0.0)[:, None]  # the routed weight, once
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))
