"""Exercise 03 (gather_rows_kernel, the gathered A tile of the grouped GEMM): the notebook's solution
passes; the notebook's stub and typical wrong kernels get NOT YET with their mistake named."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

NOTEBOOK = "03_grouped_gemm_pointers"


@triton.jit
def _gather(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    DIVIDE: tl.constexpr = True,
    ROW_MASK: tl.constexpr = 0,
    ROW_STRIDE_K: tl.constexpr = False,
    K_MASK_LOAD: tl.constexpr = True,
    K_MASK_STORE: tl.constexpr = True,
    ADD_K0: tl.constexpr = True,
    STORE_PADDING: tl.constexpr = True,
    OUT_STRIDE_AM: tl.constexpr = False,
):
    """The solution, with switches that each make one typical mistake."""
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if DIVIDE:
        tokens = (slots // TOP_K).to(tl.int64)
    else:
        tokens = slots.to(tl.int64)
    if ROW_MASK == 0:  # slots < num_slots (right); 1: compared with T; 2: no row mask
        row_ok = slots < num_slots
    elif ROW_MASK == 1:
        row_ok = slots < num_slots // TOP_K
    else:
        row_ok = slots >= 0
    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = (k0 + offs_k) < K
        a_cols = k0 + offs_k if ADD_K0 else offs_k
        if ROW_STRIDE_K:
            a_ptrs = a_ptr + tokens[:, None] * K + a_cols[None, :] * stride_ak
        else:
            a_ptrs = a_ptr + tokens[:, None] * stride_am + a_cols[None, :] * stride_ak
        if K_MASK_LOAD:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        if OUT_STRIDE_AM:
            out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_am + (k0 + offs_k)[None, :]
        else:
            out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + (k0 + offs_k)[None, :]
        if STORE_PADDING and K_MASK_STORE:
            tl.store(out_ptrs, a, mask=k_ok[None, :])
        elif K_MASK_STORE:
            tl.store(out_ptrs, a, mask=row_ok[:, None] & k_ok[None, :])
        else:
            tl.store(out_ptrs, a)


@triton.jit
def forgot_top_k(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        DIVIDE=False,
    )


@triton.jit
def no_row_mask(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        ROW_MASK=2,
    )


@triton.jit
def forgot_top_k_and_row_mask(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        DIVIDE=False,
        ROW_MASK=2,
    )


@triton.jit
def row_mask_against_t(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        ROW_MASK=1,
    )


@triton.jit
def row_stride_k(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        ROW_STRIDE_K=True,
    )


@triton.jit
def no_k_mask(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        K_MASK_LOAD=False,
        K_MASK_STORE=False,
    )


@triton.jit
def no_k_mask_on_the_load(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        K_MASK_LOAD=False,
    )


@triton.jit
def no_k_mask_on_the_store(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        K_MASK_STORE=False,
    )


@triton.jit
def k0_left_out(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        ADD_K0=False,
    )


@triton.jit
def padding_rows_skipped(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        STORE_PADDING=False,
    )


@triton.jit
def out_rows_by_stride_am(
    a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    num_slots,
    K,
    stride_am,
    stride_ak,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    _gather(
        a_ptr,
        out_ptr,
        sorted_token_ids_ptr,
        num_slots,
        K,
        stride_am,
        stride_ak,
        stride_om,
        TOP_K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_K,
        OUT_STRIDE_AM=True,
    )


def test_solution_passes():
    verdict = exercises.check_gather_rows(notebook_kernel(NOTEBOOK, "gather_rows_kernel_solution"), strict=True)
    assert verdict.passed and str(verdict).startswith("PASS gather_rows_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (forgot_top_k, ["`// TOP_K` forgotten", "wrong token", "load(s) past the 144 elements of a_ptr"]),
        (
            no_row_mask,
            ["no row mask", "sentinel num_slots = 36", "past the 144 elements of a_ptr", "slots < num_slots"],
        ),
        (forgot_top_k_and_row_mask, ["`// TOP_K` forgotten", "and no row mask"]),
        (row_mask_against_t, ["compares the slot with T = 6", "slots < num_slots"]),
        (row_stride_k, ["wrong stride", "stride_am = 32", "not K = 24", "in gaps its strides skip"]),
        (no_k_mask, ["no K mask", "columns 24..31", "(k0 + offs_k) < K", "store(s) past the"]),
        (
            no_k_mask_on_the_load,
            ["(in gaps its strides skip, or around it) of a_ptr", "no K mask", "(k0 + offs_k) < K"],
        ),
        (no_k_mask_on_the_store, ["store(s) past the", "of out_ptr", "no K mask"]),
        (k0_left_out, ["first BLOCK_SIZE_K columns", "add k0"]),
        (padding_rows_skipped, ["padding rows left unwritten", "zeros"]),
        (
            out_rows_by_stride_am,
            [
                "store(s) past the",
                "of out_ptr",
                "wrong out stride",
                "stride_om = 24",
                "stride_am = 32 (A's row stride)",
            ],
        ),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_gather_rows, kernel, says, "gather_rows_kernel", capsys)


def test_the_notebook_stub_gets_not_yet(capsys):
    verdict = exercises.check_gather_rows(notebook_kernel(NOTEBOOK, "gather_rows_kernel"))
    assert verdict.status == "NOT YET" and "fill in tokens, row_ok, k_ok and a_ptrs" in verdict.message
    assert capsys.readouterr().out.startswith("NOT YET gather_rows_kernel: ")


def test_out_stride_is_not_taken_for_a_missing_k_mask():
    # its first stores past out's end are where a missing K mask would put them; the rest are not
    assert "no K mask" not in exercises.check_gather_rows(out_rows_by_stride_am).message
