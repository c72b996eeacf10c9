"""Exercise 02 (histogram_kernel): the notebook's solution passes; the notebook's stub and typical wrong
kernels get NOT YET with their diagnosis, and FAIL when strict."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def unmasked(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(topk_ids_ptr + offs)
    tl.atomic_add(counts_ptr + ids, 1)


@triton.jit
def atomic_unmasked(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_slots, other=0)
    tl.atomic_add(counts_ptr + ids, 1)


@triton.jit
def atomic_unmasked_other_minus_one(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_slots, other=-1)
    tl.atomic_add(counts_ptr + ids, 1)


@triton.jit
def store_not_atomic(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    old = tl.load(counts_ptr + ids, mask=mask)
    tl.store(counts_ptr + ids, old + 1, mask=mask)


@triton.jit
def store_ones(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.store(counts_ptr + ids, tl.full([BLOCK], 1, tl.int32), mask=mask)


@triton.jit
def no_expert_offset(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)  # noqa: F841 - loaded, then forgotten
    tl.atomic_add(counts_ptr + offs * 0, 1, mask=mask)


@triton.jit
def indexed_by_slot(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    tl.atomic_add(counts_ptr + offs, 1, mask=mask)


@triton.jit
def ids_plus_one(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.atomic_add(counts_ptr + ids + 1, 1, mask=mask)


@triton.jit
def first_block_only(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.atomic_add(counts_ptr + ids, 1, mask=mask)


@triton.jit
def adds_the_id(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.atomic_add(counts_ptr + ids, ids, mask=mask)


@triton.jit
def shape_error(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + tl.arange(0, 2 * BLOCK)
    mask = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=mask)
    tl.atomic_add(counts_ptr + ids, 1, mask=mask)


def test_solution_passes():
    verdict = exercises.check_expert_histogram(notebook_kernel("02_align", "histogram_kernel_solution"), strict=True)
    assert verdict.passed and str(verdict).startswith("PASS histogram_kernel:")


@triton.jit
def one_slot_at_a_time(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    """Counts right under the interpreter (programs one after another), a race between programs on a GPU."""
    start = tl.program_id(0) * BLOCK
    for i in range(BLOCK):
        if start + i < num_slots:
            e = tl.load(topk_ids_ptr + start + i)
            tl.store(counts_ptr + e, tl.load(counts_ptr + e) + 1)


@pytest.mark.parametrize(
    "kernel, says",
    [
        (one_slot_at_a_time, ["stored by more than one program", "race", "use tl.atomic_add"]),
        (
            unmasked,
            [
                "load(s) past the 270 elements of topk_ids_ptr",
                "offsets 270, 271",
                "not a multiple of BLOCK",
                "offs < num_slots",
            ],
        ),
        (atomic_unmasked, ["expert 0 got 50 counts too many", "Mask the tl.atomic_add"]),
        (
            atomic_unmasked_other_minus_one,
            [
                "atomic(s) before the first element of counts_ptr",
                "offsets -1",
                "its `other`",
                "mask the tl.atomic_add with offs < num_slots",
            ],
        ),
        (store_not_atomic, ["counts too low", "use tl.atomic_add"]),
        (store_ones, ["counts too low", "use tl.atomic_add"]),
        (no_expert_offset, ["bin 0", "counts[0] = 270", "expert id offset is missing", "counts_ptr + ids"]),
        (
            indexed_by_slot,
            ["atomic(s) past the 10 elements of counts_ptr", "counts_ptr + ids", "not at counts_ptr + offs"],
        ),
        (
            ids_plus_one,
            [
                "atomic(s) past the 10 elements of counts_ptr",
                "off by one on the expert id: counts_ptr + ids",
                "counts_ptr + 10 = E",
            ],
        ),
        (first_block_only, ["block 0", "tl.program_id(0) * BLOCK"]),
        (adds_the_id, ["add 1 for each slot"]),
        (shape_error, ["raised", "64 and 128"]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_expert_histogram, kernel, says, "histogram_kernel", capsys)


def test_the_notebook_stub_is_not_yet(capsys):
    verdict = exercises.check_expert_histogram(notebook_kernel("02_align", "histogram_kernel"))
    assert verdict.status == "NOT YET" and "every count is still 0" in verdict.message
    assert capsys.readouterr().out.startswith("NOT YET histogram_kernel: ")
