"""Token-to-expert alignment: the schedule the grouped matmul reads.

`moe_align` turns `topk_ids` [T, k] into an `AlignedRouting`: the flat (token, k) slots sorted by expert
(stable: slot order inside each expert), each expert's run padded to a multiple of BLOCK_SIZE_M with the
sentinel T*k, and the expert of every M-block. Every M-block holds the rows of exactly one expert, so
block b's rows are `sorted_token_ids[b*BLOCK_SIZE_M : (b+1)*BLOCK_SIZE_M]`, it belongs to expert
`expert_ids[b]`, and in any buffer laid out in this padded order (the intermediate activations) its first
row is b*BLOCK_SIZE_M: that is what lets the down projection read its rows through a tensor descriptor
without a box ever spanning two experts.

Nothing here asks the host for a size: buffers are sized by the tight bound
    (u + (T*k - u) // BLOCK_SIZE_M) * BLOCK_SIZE_M,   u = min(E, T*k)   (see `max_num_tokens_padded`),
and blocks past `num_tokens_post_padded` are tagged -1, so the layer can be captured in a CUDA graph.
The layout follows vLLM's `moe_align_block_size` (vllm-project/vllm, fused_moe); the kernels are three
launches (count, prefix, scatter), or one for few slots (`align_in_one_program`), see
`moe_lab/_kernels/align.py`. A single token needs no sort: `slot_order_routing` gives the layer its
schedule without a launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from ._ints import cdiv, next_power_of_2
from ._kernels.align import align_in_registers_kernel, count_kernel, prefix_kernel, scatter_kernel
from ._launch import LaunchSite, launch
from ._validate import (
    INDEX_DTYPES,
    check_kernel_device,
    check_positive_int,
    check_power_of_two,
    check_same_device,
    check_tensor,
    type_name,
)
from .runtime import interpreter_serialized, keeps_buffers

CHUNK = 128  # slots per program in count/scatter; the stable rank costs CHUNK^2 compares
MAX_EXPERTS = 4096  # the block map holds one row of all experts per program
BLOCKS_PER_PROGRAM = 16  # M-blocks per program in the block map
# Few slots (decode) take one program that works in registers (`align_in_registers_kernel`): one launch instead of
# three. Its comparisons cost slots x (slots + M-blocks), so it runs up to ONE_PROGRAM_MAX_SLOTS slots where the
# schedule's bound on M-blocks (`max_num_tokens_padded` / BLOCK_SIZE_M) is at most ONE_PROGRAM_MAX_M_BLOCKS: past
# those, three launches measured faster (docs/experiments.md, "Align in registers").
ONE_PROGRAM_MAX_SLOTS = 128
ONE_PROGRAM_MAX_M_BLOCKS = 64
ONE_PROGRAM_MAX_EXPERTS = 512
# Warps of that program at every size: fewer were no faster at few slots and slower at many (same paragraph).
ONE_PROGRAM_NUM_WARPS = 4


@dataclass(frozen=True)
class AlignedRouting:
    """The expert-sorted, block-padded schedule. All tensors int32, on the device of `topk_ids`.
    (A slot-order schedule, `expert_sorted` False, differs as said there.)

    counts:                 [E] tokens (slots) routed to each expert; None in slot order (below).
    sorted_token_ids:       [max_num_tokens_padded] flat slot ids t*k + j grouped by expert; padding = T*k.
    expert_ids:             [max_num_m_blocks] expert of each M-block; -1 for blocks past the end.
    num_tokens_post_padded: [1] rows in use: sum over experts of counts rounded up to BLOCK_SIZE_M.
    block_size_m, num_tokens (T), top_k, num_experts: the sizes it was built for.
    expert_sorted:          (property) False for the slot-order schedule of one token (`slot_order_routing`),
                            the one schedule without counts: M-block j is slot j alone (sorted_token_ids
                            in slot order, num_tokens_post_padded k * BLOCK_SIZE_M), expert_ids is
                            topk_ids' own flat view, ids outside [0, E) included (the GEMMs skip such blocks).
    """

    counts: Optional[torch.Tensor]
    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_size_m: int
    num_tokens: int
    top_k: int
    num_experts: int

    @property
    def expert_sorted(self) -> bool:
        return self.counts is not None

    def __repr__(self) -> str:
        # The sizes, not the tensors' values: printing them would read the device (a sync) and fill the screen.
        return (
            f"AlignedRouting(num_tokens={self.num_tokens}, top_k={self.top_k}, num_experts={self.num_experts}, "
            f"block_size_m={self.block_size_m}, max_num_tokens_padded={self.max_num_tokens_padded}, "
            f"max_num_m_blocks={self.max_num_m_blocks}, expert_sorted={self.expert_sorted}, "
            f"device={self.sorted_token_ids.device})"
        )

    @property
    def num_slots(self) -> int:
        """T*k: the number of (token, k) slots, which is also the padding sentinel."""
        return self.num_tokens * self.top_k

    @property
    def max_num_tokens_padded(self) -> int:
        return self.sorted_token_ids.numel()

    @property
    def max_num_m_blocks(self) -> int:
        return self.expert_ids.numel()


def check_routing(routing) -> None:
    """Raise TypeError / ValueError unless `routing` is an AlignedRouting with 1-D int32/int64 schedule tensors
    (num_tokens_post_padded of one entry) and int sizes: one built by hand is read as `moe_align`'s is."""
    if not isinstance(routing, AlignedRouting):
        raise TypeError(f"routing must be an AlignedRouting (from moe_align), got {type(routing).__name__}")
    ids, experts, used = routing.sorted_token_ids, routing.expert_ids, routing.num_tokens_post_padded
    if (  # moe_align's, at each GEMM of a layer: a few attribute reads; the messages below only where one is off
        type(ids) is type(experts) is type(used) is torch.Tensor
        and ids.dtype in INDEX_DTYPES
        and experts.dtype in INDEX_DTYPES
        and used.dtype in INDEX_DTYPES
        and ids.dim() == experts.dim() == 1
        and used.shape == (1,)
        and type(routing.block_size_m) is type(routing.num_tokens) is type(routing.top_k) is int
        and type(routing.num_experts) is int
    ):
        return
    for name, layout in (
        ("sorted_token_ids", "[max_num_tokens_padded]"),
        ("expert_ids", "[max_num_m_blocks]"),
        ("num_tokens_post_padded", "[1]"),
    ):
        shape = (1,) if name == "num_tokens_post_padded" else None
        check_tensor(f"routing.{name}", getattr(routing, name), ndim=1, dtypes=INDEX_DTYPES, shape=shape, layout=layout)
    for name in ("block_size_m", "num_tokens", "top_k", "num_experts"):
        value = getattr(routing, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"routing.{name} must be an int, got {type_name(value)}")


def max_num_tokens_padded(num_slots: int, num_experts: int, block_size_m: int) -> int:
    """The most padded rows any routing of `num_slots` slots over `num_experts` experts can need.

    An expert with c slots takes 1 + (c-1)//BLOCK_SIZE_M blocks, so u used experts take at most
    u + (num_slots-u)//BLOCK_SIZE_M blocks, largest at u = min(E, num_slots)."""
    used = min(num_experts, num_slots)
    return (used + (num_slots - used) // block_size_m) * block_size_m


def align_in_one_program(num_slots: int, num_experts: int, block_size_m: int) -> bool:
    """Whether `moe_align` runs as one program (`align_in_registers_kernel`) rather than three launches."""
    return (
        0 < num_slots <= ONE_PROGRAM_MAX_SLOTS
        and num_experts <= ONE_PROGRAM_MAX_EXPERTS
        and max_num_tokens_padded(num_slots, num_experts, block_size_m) // block_size_m <= ONE_PROGRAM_MAX_M_BLOCKS
    )


def check_align_args(topk_ids, num_experts, block_size_m, expert_map) -> Tuple[int, int]:
    """The checks of `moe_align`'s arguments (also run by `moe_align_reference` and `slot_order_routing`);
    returns (num_experts, block_size_m) as Python ints (numpy integers are taken too)."""
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, layout="[T, k]")
    num_experts = check_positive_int("num_experts", num_experts)
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts must be <= {MAX_EXPERTS}, got {num_experts}")
    block_size_m = check_power_of_two("block_size_m", block_size_m, minimum=1)
    if block_size_m > 256:
        raise ValueError(f"block_size_m must be <= 256, got {block_size_m}")
    if expert_map is not None:
        check_tensor("expert_map", expert_map, ndim=1, dtypes=INDEX_DTYPES, layout="[E_global]")
    check_same_device(topk_ids=topk_ids, expert_map=expert_map)
    return num_experts, block_size_m


@interpreter_serialized
def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_size_m: int, *, expert_map: Optional[torch.Tensor] = None
) -> AlignedRouting:
    """Sort (token, k) slots by expert and pad each expert to a multiple of `block_size_m`.

    Args:
        topk_ids: [T, k] int32/int64 expert of each slot, values in [0, E) (or [0, E_global) with
            `expert_map`). Values outside are dropped (counted nowhere), never read or written out of bounds.
        num_experts: E, the experts this call computes (local experts with `expert_map`), 1 to 4096.
        block_size_m: BLOCK_SIZE_M of the grouped matmul that reads the result, a power of two from 1 to
            256 (a GemmConfig's is at least 16).
        expert_map: optional [E_global] int: global expert -> local index, -1 for experts not here
            (expert parallelism); such slots are left out. Its values are taken as given (reading them would
            cost a synchronization): ids past its end and entries outside [-1, E) drop their slots, repeated
            entries put two global experts in one; `fused_moe` refuses such maps where it reads them.
    Returns:
        AlignedRouting (see its docstring). No device-to-host synchronization.
    Raises:
        TypeError / ValueError naming the argument for a wrong type, dtype, rank or value.

    Example: two tokens, top_k = 2, three experts, blocks of 4 rows (a GemmConfig needs at least 16; 4
    keeps the example short). The slots are token*top_k + j: slot 0 (token 0) and slot 2 (token 1) chose
    expert 1, slot 1 expert 0, slot 3 expert 2. Each expert's slots come out in slot order, padded to a
    whole block with the sentinel T*k = 4; each block names its expert:

    >>> import torch, moe_lab
    >>> topk_ids = torch.tensor([[1, 0], [1, 2]], dtype=torch.int32, device=moe_lab.runtime.default_device())
    >>> r = moe_lab.moe_align(topk_ids, num_experts=3, block_size_m=4)
    >>> r.sorted_token_ids.tolist()
    [1, 4, 4, 4, 0, 2, 4, 4, 3, 4, 4, 4]
    >>> r.expert_ids.tolist(), r.num_tokens_post_padded.item(), r.counts.tolist()
    ([0, 1, 2], 12, [1, 2, 1])
    """
    num_experts, block_size_m = check_align_args(topk_ids, num_experts, block_size_m, expert_map)
    check_kernel_device(topk_ids=topk_ids, expert_map=expert_map)
    return run_align(topk_ids, num_experts, block_size_m, expert_map)


def run_align(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size_m: int,
    expert_map: Optional[torch.Tensor] = None,
    site: Optional[LaunchSite] = None,
    buffers: Optional[tuple] = None,
) -> AlignedRouting:
    """`moe_align` on arguments already checked (as `check_align_args` checks them; `fused_moe` checks its
    inputs once): no check here. `site`: where a cached layer plan keeps the compiled kernels
    (`moe_lab._launch`), or None. `buffers`: what `align_buffers` returned for these sizes (a kept plan's
    workspace, written again), or None: new ones."""
    num_tokens, top_k = topk_ids.shape
    num_slots = num_tokens * top_k
    padded_len = max_num_tokens_padded(num_slots, num_experts, block_size_m)
    num_m_blocks = padded_len // block_size_m
    one_program = align_in_one_program(num_slots, num_experts, block_size_m)
    num_chunks = cdiv(num_slots, CHUNK)
    if buffers is None:
        buffers = align_buffers(topk_ids.device, num_slots, num_experts, block_size_m)
    sorted_token_ids, expert_ids, counts, num_tokens_post_padded = buffers[:4]

    flat_ids = topk_ids.contiguous()  # read flat, by slot
    num_ids = expert_map.numel() if expert_map is not None else num_experts
    num_bins = next_power_of_2(num_experts + 1)  # bin E collects padding lanes and dropped slots
    has_map = expert_map is not None

    emap = expert_map.contiguous() if has_map else flat_ids  # a placeholder pointer when there is no map
    result = AlignedRouting(
        counts, sorted_token_ids, expert_ids, num_tokens_post_padded, block_size_m, num_tokens, top_k, num_experts
    )
    if one_program:
        slots = next_power_of_2(num_slots)
        launch(
            align_in_registers_kernel,
            (1,),
            (flat_ids, emap, counts, num_tokens_post_padded, sorted_token_ids, expert_ids)
            + (num_slots, num_ids, num_experts, num_m_blocks),
            dict(
                HAS_EXPERT_MAP=has_map,
                SLOTS=slots,
                SLOTS_PER_STEP=min(slots, 32),
                NUM_BINS=num_bins,
                BLOCK_SIZE_M=block_size_m,
                BLOCKS_PER_STEP=max(1, min(slots, 32, 4096 // block_size_m)),
                num_warps=ONE_PROGRAM_NUM_WARPS,
            ),
            site,
        )
        return result
    chunk_counts, chunk_offsets, expert_start = buffers[4:]  # the counts and offsets [chunks, E], row-major
    if num_chunks:
        launch(
            count_kernel,
            (num_chunks,),
            (flat_ids, emap, chunk_counts, num_slots, num_ids, num_experts),
            dict(HAS_EXPERT_MAP=has_map, CHUNK=CHUNK, NUM_BINS=num_bins),
            site,
        )
    launch(
        prefix_kernel,
        (1,),
        (chunk_counts, chunk_offsets, counts, expert_start, num_tokens_post_padded, num_chunks, num_experts),
        dict(BLOCK_SIZE_M=block_size_m, NUM_BINS=num_bins, CHUNK_TILE=max(1, 8192 // num_bins)),
        site,
    )
    grid = num_chunks + cdiv(num_m_blocks, BLOCKS_PER_PROGRAM)
    if grid:
        launch(
            scatter_kernel,
            (grid,),
            (flat_ids, emap, chunk_offsets, counts, expert_start, num_tokens_post_padded, sorted_token_ids)
            + (expert_ids, num_slots, num_ids, num_experts, num_chunks, num_m_blocks),
            dict(
                HAS_EXPERT_MAP=has_map,
                CHUNK=CHUNK,
                NUM_BINS=num_bins,
                BLOCK_SIZE_M=block_size_m,
                BLOCKS_PER_PROGRAM=BLOCKS_PER_PROGRAM,
            ),
            site,
        )
    return result


def align_buffers(device: torch.device, num_slots: int, num_experts: int, block_size_m: int) -> tuple:
    """New buffers for `run_align` of num_slots slots: sorted_token_ids, expert_ids, counts,
    num_tokens_post_padded, and where it takes three launches their own (per-chunk counts and offsets,
    each expert's first row). None of them needs to be zero: the align writes every element it reads."""
    padded_len = max_num_tokens_padded(num_slots, num_experts, block_size_m)
    sizes = [padded_len, padded_len // block_size_m, num_experts, 1]
    if not align_in_one_program(num_slots, num_experts, block_size_m):
        sizes += [max(cdiv(num_slots, CHUNK), 1) * num_experts] * 2 + [num_experts]
    return _int32_buffers(device, sizes)


def _int32_buffers(device: torch.device, sizes) -> tuple:
    """New int32 buffers of these sizes, made as views of one allocation (one allocation costs the host less
    than several), each starting at a multiple of 128 bytes."""
    padded = [-(-size // 32) * 32 for size in sizes]
    views = torch.empty(sum(padded), dtype=torch.int32, device=device).split(padded)
    return tuple(view[:size] for view, size in zip(views, sizes))


class _SlotOrderRows(NamedTuple):
    """The id-independent part of a slot-order schedule."""

    sorted_token_ids: torch.Tensor  # [k * BLOCK_SIZE_M]: slot j at row j * BLOCK_SIZE_M, padding k elsewhere
    num_tokens_post_padded: torch.Tensor  # [1]: k * BLOCK_SIZE_M


# Built once per (device, k, BLOCK_SIZE_M) and kept: the rows do not depend on the ids.
_SLOT_ORDER_ROWS: Dict[tuple, _SlotOrderRows] = {}


def slot_order_applies(shape, stride, dtype: torch.dtype, has_expert_map: bool) -> bool:
    """Whether topk_ids of this shape, strides and dtype take the slot-order schedule (`slot_order_routing`):
    int32 or int64 [1, k], contiguous, without expert_map."""
    return (
        len(shape) == 2
        and shape[0] == 1
        and dtype in (torch.int32, torch.int64)
        and (shape[1] <= 1 or stride[1] == 1)
        and not has_expert_map
    )


def slot_order_routing(
    topk_ids: torch.Tensor, num_experts: int, block_size_m: int, *, expert_map: Optional[torch.Tensor] = None
) -> Optional[AlignedRouting]:
    """The schedule of a single token without an align launch, or None where it does not apply.

    M-block j is slot j (row j * BLOCK_SIZE_M, the rest padding) and its expert is topk_ids[0, j], read by
    the GEMMs straight from topk_ids (`expert_ids` is topk_ids' flat view): a correct schedule for any
    ids. Ids outside [0, E) are skipped by the GEMMs, as the align drops them; a repeated expert's
    weights are read once per slot. From top-k routing a token's k experts are distinct, so the align's
    schedule holds the same blocks, one row each, in expert order: the GEMMs compute the same tiles and
    sums (bit for bit), and the layer saves the align's launch (docs/experiments.md, "One token in slot
    order").
    A skipped block's rows are not padding (they name their slot) but nothing writes them: the unfused
    activation and the FP8 quantization read them as they are, and nothing reads what they make of them.

    Applies to int32 or int64 topk_ids [1, k], contiguous, without expert_map (a map needs the align's lookup;
    `slot_order_applies`); int64 ids (torch.topk's, transformers') compile the GEMMs once more for the
    ids' pointer type. The rows are made
    on the device with no host sync; while a CUDA graph is being captured they cannot be made, so a first
    call then returns None (the layer takes the align).
    """
    if not (
        isinstance(topk_ids, torch.Tensor)
        and slot_order_applies(topk_ids.shape, topk_ids.stride(), topk_ids.dtype, expert_map is not None)
    ):
        return None
    num_experts, block_size_m = check_align_args(topk_ids, num_experts, block_size_m, expert_map)
    return run_slot_order(topk_ids, num_experts, block_size_m)


def run_slot_order(topk_ids: torch.Tensor, num_experts: int, block_size_m: int) -> Optional[AlignedRouting]:
    """`slot_order_routing` on arguments already checked, where `slot_order_applies`: no check here. None
    where the rows were never made and cannot be kept now: while a CUDA graph is being captured, or inside
    `moe_lab.runtime.keeping_no_buffers()`."""
    top_k, device = topk_ids.shape[1], topk_ids.device
    key = (device, top_k, block_size_m)
    rows = _SLOT_ORDER_ROWS.get(key)
    if rows is None:
        if not keeps_buffers():
            return None
        if device.type == "cuda":
            with torch.cuda.device(device):
                if torch.cuda.is_current_stream_capturing():
                    return None
        i32 = dict(dtype=torch.int32, device=device)
        sorted_token_ids = torch.full((top_k, block_size_m), top_k, **i32)
        sorted_token_ids[:, 0] = torch.arange(top_k, **i32)
        rows = _SLOT_ORDER_ROWS[key] = _SlotOrderRows(
            sorted_token_ids.reshape(-1), torch.full((1,), top_k * block_size_m, **i32)
        )
    return AlignedRouting(
        None,
        rows.sorted_token_ids,
        topk_ids.reshape(-1),
        rows.num_tokens_post_padded,
        block_size_m,
        1,
        top_k,
        num_experts,
    )
