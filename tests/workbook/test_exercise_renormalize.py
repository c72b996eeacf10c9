"""Exercise 01 (renormalize_kernel): the notebook's solution passes; the notebook's stub and typical wrong
kernels get NOT YET with their diagnosis, and FAIL when strict."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def unmasked(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0))


@triton.jit
def store_unmasked(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0))


@triton.jit
def stride_is_top_k(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * top_k + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def out_with_weights_stride(
    topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr
):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * weights_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def not_normalised(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w, mask=j < top_k)


@triton.jit
def by_max(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.max(w, axis=0), mask=j < top_k)


@triton.jit
def softmaxed(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=float("-inf"))
    e = tl.exp(w - tl.max(w, axis=0))
    tl.store(out_ptr + t * out_row_stride + j, e / tl.sum(e, axis=0), mask=j < top_k)


@triton.jit
def token_zero_only(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def row_zero_only(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(1)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def float16_weights(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0).to(tl.float16)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def other_one(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=1.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def shape_error(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K) + tl.arange(0, 2 * BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


def test_solution_passes():
    verdict = exercises.check_renormalize(
        notebook_kernel("01_moe_in_pytorch", "renormalize_kernel_solution"), strict=True
    )
    assert verdict.passed and str(verdict).startswith("PASS renormalize_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (
            unmasked,
            [
                "load(s) outside the 222 elements (in gaps its strides skip, or around it) of topk_weights_ptr",
                "not a power of two",
                "j < top_k",
                "other=0.0",
            ],
        ),
        (store_unmasked, ["store(s) past the 222 elements of out_ptr", "j < top_k"]),
        (stride_is_top_k, ["topk_weights_ptr", "Wrong stride", "t * weights_row_stride (= 8 here", "not at t * top_k"]),
        (out_with_weights_stride, ["store(s) past the 222 elements of out_ptr", "Wrong stride", "out_row_stride"]),
        (not_normalised, ["not normalised", "sum of its row"]),
        (by_max, ["largest weight", "sum"]),
        (softmaxed, ["softmax"]),
        (token_zero_only, ["token 0", "tl.program_id(0)"]),
        (row_zero_only, ["only row 0 was written", "token 0", "t = tl.program_id(0)"]),
        (float16_weights, ["float16 rounding", "Keep them float32"]),
        (other_one, ["added 2 to each row's sum", "other=0.0"]),
        (shape_error, ["raised", "8 and 16"]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_renormalize, kernel, says, "renormalize_kernel", capsys)


def test_the_notebook_stub_is_not_yet(capsys):
    verdict = exercises.check_renormalize(notebook_kernel("01_moe_in_pytorch", "renormalize_kernel"))
    assert verdict.status == "NOT YET" and "stores nothing" in verdict.message
    assert capsys.readouterr().out.startswith("NOT YET renormalize_kernel: ")
