"""Notebook 02's exercise: `histogram_kernel` counts the slots routed to each expert, with atomics.

    histogram_kernel(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr)

Program p reads slots p*BLOCK ... p*BLOCK + BLOCK - 1 of the flattened topk_ids and adds 1 to
counts[expert] for each of them: counts[e] = number of slots i < num_slots with topk_ids[i] == e.
"""

from __future__ import annotations

import torch
import triton

from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

NUM_TOKENS, TOP_K, NUM_EXPERTS = 45, 6, 10  # E = 10 is not a power of two
NUM_SLOTS = NUM_TOKENS * TOP_K  # 270 slots: not a multiple of BLOCK
BLOCK = 64
NUM_PROGRAMS = triton.cdiv(NUM_SLOTS, BLOCK)  # 5; the last one has 14 slots and 50 lanes past the end
SPARE_LANES = NUM_PROGRAMS * BLOCK - NUM_SLOTS
# the second launch, once the first is right: T = 20 tokens, top_k = 3 of E = 6, BLOCK = 32 (60 slots)
NUM_TOKENS2, TOP_K2, NUM_EXPERTS2, BLOCK2 = 20, 3, 6, 32

MASK_HINT = (
    f"num_slots = {NUM_SLOTS} is not a multiple of BLOCK = {BLOCK}: in the last program, lanes with "
    "offs >= num_slots are not slots (on a GPU they read garbage ids and add 1 to counts far out of "
    "bounds). Mask the last block: `offs < num_slots` on the load and on the tl.atomic_add"
)
SLOT_INDEX_HINT = (
    f"The counts have E = {NUM_EXPERTS} bins: add 1 at counts_ptr + ids, where ids are the expert ids "
    "loaded from topk_ids, not at counts_ptr + offs (the slot offsets)"
)
SPARE_LANES_HINT = (
    "The last block's lanes past num_slots added 1 at the id the masked load gave them (its "
    "`other`): mask the tl.atomic_add with offs < num_slots too"
)


UNDEFINED_IDS_HINT = (
    "The last block's lanes past num_slots added 1 at the id their masked load left undefined (no "
    "other=: on a GPU any value, here the largest int32, far outside counts): mask the tl.atomic_add with "
    "offs < num_slots too"
)


OFF_BY_ONE_HINT = (
    f"off by one on the expert id: counts_ptr + ids, not counts_ptr + ids + 1. Every atomic outside "
    f"counts is at counts_ptr + {NUM_EXPERTS} = E, one past the last bin: expert ids run 0 .. E - 1 = "
    f"{NUM_EXPERTS - 1}, and expert e's count goes in bin e"
)


def _out_of_bounds_hint(run) -> str:
    hints = []
    for o in run.out_of_bounds:
        if o.kind == "atomic" and o.far and run.undefined_lanes.get("topk_ids_ptr"):
            hints.append(UNDEFINED_IDS_HINT)  # (the nearest tensor to so far an address may be either)
        elif o.tensor == "topk_ids_ptr":
            hints.append(MASK_HINT)
        elif o.tensor == "counts_ptr":
            offsets = run.offsets(o.tensor, o.kind)
            if o.far or not offsets.size:
                hints.append(SLOT_INDEX_HINT)
            elif (offsets == NUM_EXPERTS).all():
                hints.append(OFF_BY_ONE_HINT)
            else:
                hints.append(SPARE_LANES_HINT if (offsets < 0).all() else SLOT_INDEX_HINT)
    return ". ".join(dict.fromkeys(hints)) or MASK_HINT


def _lost_counts(got: torch.Tensor, want: torch.Tensor):
    """The message for counts that are all at most right and in total too low (lanes overwriting each
    other: the exact result depends on the order of the writes, so it is recognised by this shape)."""
    g, w = got.cpu().long(), want.cpu().long()
    if bool((g >= 0).all() and (g <= w).all()) and int(g.sum()) < int(w.sum()):
        return (
            f"counts too low: {int(g.sum())} of {NUM_SLOTS} slots counted. Lanes and programs that hit "
            "the same expert overwrite each other's counts (a tl.store, or a load, +1, store): use "
            "tl.atomic_add(counts_ptr + ids, 1, mask=...), which adds every one of them"
        )
    return None


def _routing(num_tokens: int, top_k: int, num_experts: int) -> torch.Tensor:
    """topk_ids [T, top_k] int32: distinct experts per token, skewed towards low ids."""
    logits = torch.randn(num_tokens, num_experts) - torch.log1p(torch.arange(num_experts, dtype=torch.float32))
    return logits.topk(top_k, dim=-1).indices.to(torch.int32).to(default_device())


def _second_size(kernel):
    topk_ids = _routing(NUM_TOKENS2, TOP_K2, NUM_EXPERTS2)
    slots = topk_ids.numel()
    counts = torch.zeros(NUM_EXPERTS2, dtype=torch.int32, device=topk_ids.device)
    run = run_guarded(
        kernel, (triton.cdiv(slots, BLOCK2),), topk_ids_ptr=topk_ids, counts_ptr=counts, num_slots=slots, BLOCK=BLOCK2
    )
    want = torch.bincount(topk_ids.reshape(-1).long(), minlength=NUM_EXPERTS2).to(torch.int32)
    return at_other_sizes(
        diagnose(run, "counts_ptr", want, untouched=counts),
        f"num_slots = {NUM_SLOTS}, BLOCK = {BLOCK}, E = {NUM_EXPERTS}",
        f"num_slots = {slots}, BLOCK = {BLOCK2}, E = {NUM_EXPERTS2}",
        f"look for a size written into the kernel ({NUM_SLOTS}, {BLOCK}, {NUM_EXPERTS}) where num_slots and "
        "BLOCK belong",
    )


def check_expert_histogram(kernel, strict: bool = False) -> Verdict:
    """Grade `histogram_kernel(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr)`, launched with
    grid (cdiv(num_slots, BLOCK),).

    Sizes: T = 45 tokens, top_k = 6 distinct experts each of E = 10 (not a power of two), skewed
    towards low expert ids; `topk_ids` [T, 6] int32 contiguous, read flat: num_slots = 270 slots, BLOCK =
    64, so 5 programs and the last one has 14 slots. `counts` [E] int32 starts at zero (the kernel adds
    into it). Names: a missing mask (load past topk_ids; an atomic outside counts), the last block's spare
    lanes counted as expert 0 (load masked, atomic not), tl.store instead of tl.atomic_add (counts too
    low, recognised by that shape since the exact result depends on the order of the writes), every
    count in bin 0 (no expert id offset), every program counting block 0, adding the id instead of 1,
    the expert id off by one (`counts_ptr + ids + 1`: every atomic outside counts lands at E), the
    spare lanes' undefined ids (a load without other=, an atomic without mask: far outside counts). Then,
    if right, a second launch (T = 20, top_k = 3 of E = 6, BLOCK = 32) for sizes written into the kernel.
    """
    device = default_device()
    topk_ids = _routing(NUM_TOKENS, TOP_K, NUM_EXPERTS)
    flat = topk_ids.reshape(-1).long()
    counts = torch.zeros(NUM_EXPERTS, dtype=torch.int32, device=device)
    run = run_guarded(
        kernel, (NUM_PROGRAMS,), topk_ids_ptr=topk_ids, counts_ptr=counts, num_slots=NUM_SLOTS, BLOCK=BLOCK
    )
    want = torch.bincount(flat, minlength=NUM_EXPERTS).to(torch.int32)
    got = run.tensors["counts_ptr"]

    spare_as_zero = want.clone()
    spare_as_zero[0] += SPARE_LANES
    in_bin_zero = [torch.zeros_like(want) for _ in range(2)]
    in_bin_zero[0][0], in_bin_zero[1][0] = NUM_SLOTS, NUM_PROGRAMS * BLOCK
    mistakes = [
        (
            f"expert 0 got {SPARE_LANES} counts too many: the {SPARE_LANES} lanes of the last block past num_slots "
            "were counted, as expert 0 (the load's other=0). Mask the tl.atomic_add with offs < num_slots too",
            spare_as_zero,
        ),
        *[
            (
                f"every slot was counted in bin 0 (counts[0] = {int(z[0])}): the expert id offset is missing; add "
                "at counts_ptr + ids, ids being the expert ids loaded from topk_ids",
                z,
            )
            for z in in_bin_zero
        ],
        (
            f"every program counted block 0: the counts are {NUM_PROGRAMS} times those of the first {BLOCK} slots; "
            "program p's slots start at tl.program_id(0) * BLOCK",
            NUM_PROGRAMS * torch.bincount(flat[:BLOCK], minlength=NUM_EXPERTS).to(torch.int32),
        ),
        (
            "counts[e] is e times the right count: add 1 for each slot, not its expert id",
            want * torch.arange(NUM_EXPERTS, dtype=torch.int32, device=device),
        ),
    ]
    lost = _lost_counts(got, want)
    if lost:
        mistakes.append((lost, got))
    return grade(
        "histogram_kernel",
        run,
        "counts_ptr",
        want,
        strict=strict,
        untouched=counts,
        out_of_bounds_hint=_out_of_bounds_hint(run),
        mistakes=mistakes,
        then=(f"and with num_slots = {NUM_TOKENS2 * TOP_K2}, BLOCK = {BLOCK2}", lambda: _second_size(kernel)),
        nothing_written="every count is still 0: the kernel adds nothing. Load each slot's expert id "
        "and tl.atomic_add 1 at counts_ptr + that id",
        race_hint="A count that several programs add to needs an atomic: use tl.atomic_add(counts_ptr + ids, 1, "
        "mask=...), which reads, adds and writes as one step",
    )
