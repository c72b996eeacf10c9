"""Top-k reduce: out[t, :] = sum over j of out_k[t*k + j, :] for the slots routed to an expert computed
here (skipped slots were never written, so they are never read)."""
import triton
import triton.language as tl

from .common import round_to_bf16_grid


@triton.jit
def topk_reduce_kernel(out_k_ptr, topk_ids_ptr, expert_map_ptr, out_ptr, hidden, num_ids, num_experts,
                       stride_km, stride_ids_t, stride_ids_k, stride_om,
                       TOP_K: tl.constexpr, HAS_EXPERT_MAP: tl.constexpr, EMULATE_BF16: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < hidden
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        expert = tl.load(topk_ids_ptr + token * stride_ids_t + j * stride_ids_k)
        routed = (expert >= 0) & (expert < num_ids)  # checked before any narrowing or map lookup
        if HAS_EXPERT_MAP:
            expert = tl.load(expert_map_ptr + tl.where(routed, expert, 0), mask=routed, other=-1)
        computed = routed & (expert >= 0) & (expert < num_experts)
        # A masked load, not a branch: the k row loads are in flight together (a branch per slot made each
        # wait for the sum before it). A slot not computed here reads no column and adds -0.0, which
        # leaves any sum as it is. (The mask is a comparison of columns: Triton 3.9's interpreter cannot
        # load with a mask made by `&` of a tensor and a loaded scalar.)
        row = out_k_ptr + (token * TOP_K + j) * stride_km
        acc += tl.load(row + cols, mask=cols < tl.where(computed, hidden, 0), other=-0.0).to(tl.float32)
    if EMULATE_BF16:
        acc = round_to_bf16_grid(acc)
    tl.store(out_ptr + token * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)
