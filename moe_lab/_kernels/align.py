"""Align kernels: from `topk_ids` to an expert-sorted, block-padded schedule in three launches (one for
few slots: `align_in_registers_kernel` computes the same schedule in one program, in registers).

1. `count_kernel`    one program per CHUNK of flat (token, k) slots: a histogram per chunk.
2. `prefix_kernel`   one program: per-expert totals, padded exclusive prefix sum over experts, and for
                     every chunk the first free position of each expert (a column-wise scan).
3. `scatter_kernel`  programs [0, num_chunks): each slot goes to its position, ranked stably inside its
                     chunk; programs after that: one tile of M-blocks each, writing `expert_ids` and the
                     sentinel into the padding rows. Every position is written exactly once.

Per-chunk counts make the order stable (slot order within each expert), so no atomics are needed and
two runs give the same `sorted_token_ids`.
"""
import triton
import triton.language as tl

from .common import local_expert


# Sizes that change with the token count are not specialized, so a new T never recompiles.
@triton.jit(do_not_specialize=["num_slots"])
def count_kernel(topk_ids_ptr, expert_map_ptr, chunk_counts_ptr, num_slots, num_ids, num_experts,
                 HAS_EXPERT_MAP: tl.constexpr, CHUNK: tl.constexpr, NUM_BINS: tl.constexpr):
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    ids, _ = local_expert(topk_ids_ptr, expert_map_ptr, offs, offs < num_slots, num_ids, num_experts, HAS_EXPERT_MAP)
    hist = tl.histogram(ids, NUM_BINS)
    bins = tl.arange(0, NUM_BINS)
    tl.store(chunk_counts_ptr + chunk * num_experts + bins, hist, mask=bins < num_experts)


@triton.jit(do_not_specialize=["num_chunks"])
def prefix_kernel(chunk_counts_ptr, chunk_offsets_ptr, counts_ptr, expert_start_ptr,
                  num_tokens_post_padded_ptr, num_chunks, num_experts,
                  BLOCK_SIZE_M: tl.constexpr, NUM_BINS: tl.constexpr, CHUNK_TILE: tl.constexpr):
    experts = tl.arange(0, NUM_BINS)
    expert_mask = experts < num_experts
    rows = tl.arange(0, CHUNK_TILE)

    total = tl.zeros([NUM_BINS], dtype=tl.int32)
    for c0 in range(0, num_chunks, CHUNK_TILE):
        m = ((c0 + rows) < num_chunks)[:, None] & expert_mask[None, :]
        tile = tl.load(chunk_counts_ptr + (c0 + rows)[:, None] * num_experts + experts[None, :], mask=m, other=0)
        total += tl.sum(tile, axis=0)

    start = _store_totals(total, experts, expert_mask, counts_ptr, expert_start_ptr, num_tokens_post_padded_ptr,
                          BLOCK_SIZE_M)

    running = start
    for c0 in range(0, num_chunks, CHUNK_TILE):
        m = ((c0 + rows) < num_chunks)[:, None] & expert_mask[None, :]
        offs = (c0 + rows)[:, None] * num_experts + experts[None, :]
        tile = tl.load(chunk_counts_ptr + offs, mask=m, other=0)
        tl.store(chunk_offsets_ptr + offs, running[None, :] + tl.cumsum(tile, axis=0) - tile, mask=m)
        running += tl.sum(tile, axis=0)


@triton.jit(do_not_specialize=["num_slots", "num_chunks", "num_m_blocks"])
def scatter_kernel(topk_ids_ptr, expert_map_ptr, chunk_offsets_ptr, counts_ptr, expert_start_ptr,
                   num_tokens_post_padded_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                   num_slots, num_ids, num_experts, num_chunks, num_m_blocks,
                   HAS_EXPERT_MAP: tl.constexpr, CHUNK: tl.constexpr, NUM_BINS: tl.constexpr,
                   BLOCK_SIZE_M: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    if pid < num_chunks:
        _scatter_chunk(pid, topk_ids_ptr, expert_map_ptr, chunk_offsets_ptr, sorted_token_ids_ptr,
                       num_slots, num_ids, num_experts, HAS_EXPERT_MAP, CHUNK)
    else:
        _block_map((pid - num_chunks) * BLOCKS_PER_PROGRAM, counts_ptr, expert_start_ptr,
                   num_tokens_post_padded_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_slots, num_experts,
                   num_m_blocks, NUM_BINS, BLOCK_SIZE_M, BLOCKS_PER_PROGRAM)


@triton.jit(do_not_specialize=["num_slots", "num_m_blocks"])
def align_in_registers_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, num_tokens_post_padded_ptr,
                              sorted_token_ids_ptr, expert_ids_ptr, num_slots, num_ids, num_experts, num_m_blocks,
                              HAS_EXPERT_MAP: tl.constexpr, SLOTS: tl.constexpr, SLOTS_PER_STEP: tl.constexpr,
                              NUM_BINS: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCKS_PER_STEP: tl.constexpr):
    """The whole schedule in one program, for few slots (decode): slot-by-slot comparisons in registers,
    with no round trip through memory between the steps and no barrier of its own. The same positions and
    block map as the three kernels, bit for bit. SLOTS is a power of two >= num_slots; the comparisons run
    against SLOTS_PER_STEP slots at a time ([SLOTS, SLOTS_PER_STEP] each, their ids loaded again: L1 hits),
    so their registers stay bounded."""
    lane = tl.arange(0, SLOTS)
    ids, keep = local_expert(topk_ids_ptr, expert_map_ptr, lane, lane < num_slots, num_ids, num_experts,
                             HAS_EXPERT_MAP)
    # For every slot i: how many slots share its expert (count), how many of those come before it (rank),
    # and where its expert's run starts: after the padded runs of all smaller expert ids (start).
    count = tl.zeros([SLOTS], dtype=tl.int32)
    rank = tl.zeros([SLOTS], dtype=tl.int32)
    start = tl.zeros([SLOTS], dtype=tl.int32)
    for j0 in tl.static_range(0, SLOTS, SLOTS_PER_STEP):
        lane_j = j0 + tl.arange(0, SLOTS_PER_STEP)
        ids_j, keep_j = local_expert(topk_ids_ptr, expert_map_ptr, lane_j, lane_j < num_slots, num_ids,
                                      num_experts, HAS_EXPERT_MAP)
        same = (ids[:, None] == ids_j[None, :]) & keep[:, None] & keep_j[None, :]
        count += tl.sum(same.to(tl.int32), axis=1)
        rank += tl.sum((same & (lane_j[None, :] < lane[:, None])).to(tl.int32), axis=1)
        # Slot j's own count and rank (the same comparisons, summed over i): the first slot of each used
        # expert carries the expert's padded run.
        count_j = tl.sum(same.to(tl.int32), axis=0)
        first_j = keep_j & (tl.sum((same & (lane[:, None] < lane_j[None, :])).to(tl.int32), axis=0) == 0)
        padded_j = tl.where(first_j, tl.cdiv(count_j, BLOCK_SIZE_M) * BLOCK_SIZE_M, 0)
        start += tl.sum(tl.where(ids_j[None, :] < ids[:, None], padded_j[None, :], 0), axis=1)
    first = keep & (rank == 0)
    padded = tl.where(first, tl.cdiv(count, BLOCK_SIZE_M) * BLOCK_SIZE_M, 0)
    total = tl.sum(padded, axis=0)

    tl.store(num_tokens_post_padded_ptr, total)
    bins = tl.arange(0, NUM_BINS)
    tl.store(counts_ptr + bins, tl.histogram(ids, NUM_BINS), mask=bins < num_experts)
    tl.store(sorted_token_ids_ptr + start + rank, lane, mask=keep)
    # The block map: a used block lies in exactly one expert's run (that of one first slot); the rows past
    # that expert's slots and every row of an unused block take the sentinel num_slots. These rows and the
    # slots' rows above are disjoint, so the stores need no ordering.
    end = start + padded                                                          # = start where not first
    for b0 in range(0, num_m_blocks, BLOCKS_PER_STEP):
        blocks = b0 + tl.arange(0, BLOCKS_PER_STEP)
        first_row = blocks * BLOCK_SIZE_M
        inside = (start[None, :] <= first_row[:, None]) & (first_row[:, None] < end[None, :])
        used = first_row < total
        block_expert = tl.sum(tl.where(inside, ids[None, :], 0), axis=1)
        filled_end = tl.sum(tl.where(inside, start[None, :] + count[None, :], 0), axis=1)
        block_mask = blocks < num_m_blocks
        tl.store(expert_ids_ptr + blocks, tl.where(used, block_expert, -1), mask=block_mask)
        rows = first_row[:, None] + tl.arange(0, BLOCK_SIZE_M)[None, :]
        is_padding = (rows >= filled_end[:, None]) | (~used[:, None])
        tl.store(sorted_token_ids_ptr + rows, tl.full(rows.shape, 0, tl.int32) + num_slots,
                 mask=block_mask[:, None] & is_padding)


@triton.jit
def _store_totals(total, experts, expert_mask, counts_ptr, expert_start_ptr, num_tokens_post_padded_ptr,
                  BLOCK_SIZE_M: tl.constexpr):
    """Store each expert's count, the first row of its padded run, and the rows in use; return the starts."""
    padded = tl.cdiv(total, BLOCK_SIZE_M) * BLOCK_SIZE_M
    start = tl.cumsum(padded, axis=0) - padded
    tl.store(counts_ptr + experts, total, mask=expert_mask)
    tl.store(expert_start_ptr + experts, start, mask=expert_mask)
    tl.store(num_tokens_post_padded_ptr, tl.sum(padded, axis=0))
    return start


@triton.jit
def _scatter_chunk(chunk, topk_ids_ptr, expert_map_ptr, chunk_offsets_ptr, sorted_token_ids_ptr,
                   num_slots, num_ids, num_experts, HAS_EXPERT_MAP: tl.constexpr, CHUNK: tl.constexpr):
    """Each slot of the chunk to its position: the chunk's first free position of its expert + its rank
    among the chunk's earlier slots of that expert (a stable order, no atomics)."""
    lane = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + lane
    ids, keep = local_expert(topk_ids_ptr, expert_map_ptr, offs, offs < num_slots, num_ids, num_experts,
                              HAS_EXPERT_MAP)
    earlier_same = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])
    rank = tl.sum(earlier_same.to(tl.int32), axis=1)
    base = tl.load(chunk_offsets_ptr + chunk * num_experts + ids, mask=keep, other=0)
    tl.store(sorted_token_ids_ptr + base + rank, offs, mask=keep)


@triton.jit
def _block_map(first_block, counts_ptr, expert_start_ptr, num_tokens_post_padded_ptr, sorted_token_ids_ptr,
               expert_ids_ptr, num_slots, num_experts, num_m_blocks, NUM_BINS: tl.constexpr,
               BLOCK_SIZE_M: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr):
    """The expert of each M-block from first_block on (-1 past the end), and the sentinel `num_slots` in
    its padding rows."""
    blocks = first_block + tl.arange(0, BLOCKS_PER_PROGRAM)
    block_mask = blocks < num_m_blocks
    first_row = blocks * BLOCK_SIZE_M
    experts = tl.arange(0, NUM_BINS)
    expert_mask = experts < num_experts
    start = tl.load(expert_start_ptr + experts, mask=expert_mask, other=0)
    count = tl.load(counts_ptr + experts, mask=expert_mask, other=0)
    end = tl.where(expert_mask, start + tl.cdiv(count, BLOCK_SIZE_M) * BLOCK_SIZE_M, 2147483647)
    # The block's expert is the number of experts whose padded range ends at or before its first row.
    block_expert = tl.sum((end[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
    used = first_row < tl.load(num_tokens_post_padded_ptr)
    tl.store(expert_ids_ptr + blocks, tl.where(used, block_expert, -1), mask=block_mask)

    safe_expert = tl.where(used, block_expert, 0)
    filled_end = tl.load(expert_start_ptr + safe_expert, mask=block_mask) \
        + tl.load(counts_ptr + safe_expert, mask=block_mask)
    rows = first_row[:, None] + tl.arange(0, BLOCK_SIZE_M)[None, :]
    is_padding = (rows >= filled_end[:, None]) | (~used[:, None])
    tl.store(sorted_token_ids_ptr + rows, tl.full(rows.shape, 0, tl.int32) + num_slots,
             mask=block_mask[:, None] & is_padding)
