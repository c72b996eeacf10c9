"""Exercise 06 (topk_reduce_kernel): the notebook's solution passes; the stub and typical wrong kernels get
NOT YET with their diagnosis, and FAIL with strict=True."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def _reduce(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    WEIGHTS: tl.constexpr = 0,
    SLOT_MAJOR: tl.constexpr = False,
    H_MASK: tl.constexpr = True,
    W_STRIDE_TOP_K: tl.constexpr = False,
    Y_STRIDE_H: tl.constexpr = False,
    OUT_STRIDE_Y: tl.constexpr = False,
    OVERWRITE: tl.constexpr = False,
    INT32: tl.constexpr = False,
):
    """The solution, with switches that each make one typical mistake (WEIGHTS: 0 slot j's, right; 1 none,
    a plain sum; 2 slot TOP_K - 1 - j's; 3 slot (j + 1) % TOP_K's; INT32: the token index left int32)."""
    t = tl.program_id(0) if INT32 else tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        if SLOT_MAJOR:
            y_row = j * tl.num_programs(0) + t
        else:
            y_row = t * TOP_K + j
        y_ptrs = y_ptr + y_row * (H if Y_STRIDE_H else stride_y_row) + offs_h
        if H_MASK:
            row = tl.load(y_ptrs, mask=offs_h < H, other=0.0)
        else:
            row = tl.load(y_ptrs)
        w_ptrs = topk_weights_ptr + t * (TOP_K if W_STRIDE_TOP_K else stride_w_token)
        if WEIGHTS == 0:
            row = tl.load(w_ptrs + j) * row
        elif WEIGHTS == 2:
            row = tl.load(w_ptrs + (TOP_K - 1 - j)) * row
        elif WEIGHTS == 3:
            row = tl.load(w_ptrs + (j + 1) % TOP_K) * row
        if OVERWRITE:
            acc = row
        else:
            acc += row
    out_ptrs = out_ptr + t * (stride_y_row if OUT_STRIDE_Y else stride_out_row) + offs_h
    if H_MASK:
        tl.store(out_ptrs, acc, mask=offs_h < H)
    else:
        tl.store(out_ptrs, acc)


@triton.jit
def plain_sum(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row, TOP_K, BLOCK_H, WEIGHTS=1
    )


@triton.jit
def reversed_weights(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row, TOP_K, BLOCK_H, WEIGHTS=2
    )


@triton.jit
def rotated_weights(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row, TOP_K, BLOCK_H, WEIGHTS=3
    )


@triton.jit
def slot_major(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr,
        topk_weights_ptr,
        out_ptr,
        H,
        stride_y_row,
        stride_w_token,
        stride_out_row,
        TOP_K,
        BLOCK_H,
        SLOT_MAJOR=True,
    )


@triton.jit
def no_h_mask(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row, TOP_K, BLOCK_H, H_MASK=False
    )


@triton.jit
def weights_stride_top_k(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr,
        topk_weights_ptr,
        out_ptr,
        H,
        stride_y_row,
        stride_w_token,
        stride_out_row,
        TOP_K,
        BLOCK_H,
        W_STRIDE_TOP_K=True,
    )


@triton.jit
def y_stride_h(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr,
        topk_weights_ptr,
        out_ptr,
        H,
        stride_y_row,
        stride_w_token,
        stride_out_row,
        TOP_K,
        BLOCK_H,
        Y_STRIDE_H=True,
    )


@triton.jit
def out_stride_y(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr,
        topk_weights_ptr,
        out_ptr,
        H,
        stride_y_row,
        stride_w_token,
        stride_out_row,
        TOP_K,
        BLOCK_H,
        OUT_STRIDE_Y=True,
    )


@triton.jit
def int32_rows(
    y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    _reduce(
        y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row, TOP_K, BLOCK_H, INT32=True
    )


@triton.jit
def acc_overwritten(
    y_ptr,
    topk_weights_ptr,
    out_ptr,
    H,
    stride_y_row,
    stride_w_token,
    stride_out_row,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    _reduce(
        y_ptr,
        topk_weights_ptr,
        out_ptr,
        H,
        stride_y_row,
        stride_w_token,
        stride_out_row,
        TOP_K,
        BLOCK_H,
        OVERWRITE=True,
    )


def test_solution_passes():
    kernel = notebook_kernel("06_fused_moe_layer", "topk_reduce_kernel_solution")
    verdict = exercises.check_topk_reduce(kernel, strict=True)
    assert verdict.passed and str(verdict).startswith("PASS topk_reduce_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (plain_sum, ["weights are not applied", "plain sum"]),
        (reversed_weights, ["reversed", "topk_weights[t, j]"]),
        (rotated_weights, ["paired with the wrong slots", "topk_weights[t, j]"]),
        (slot_major, ["row j * T + t", "t * TOP_K + j"]),
        (no_h_mask, ["past the", "not a multiple of BLOCK_H", "offs_h < H"]),
        (weights_stride_top_k, ["topk_weights_ptr", "wrong stride", "stride_w_token = 8", "not TOP_K = 6"]),
        (y_stride_h, ["y_ptr", "wrong stride", "stride_y_row (here 224, not H = 200"]),
        (
            out_stride_y,
            ["store(s) past the", "wrong stride for out", "stride_out_row = 200", "not t * stride_y_row (= 224"],
        ),
        (acc_overwritten, ["only the last slot counts", "overwritten", "acc += w * row"]),
        (int32_rows, ["computed in int32", "2^32 wrapped around", "tl.program_id(0).to(tl.int64)"]),
        (notebook_kernel("06_fused_moe_layer", "topk_reduce_kernel"), ["stores nothing"]),
    ],
    ids=[
        "plain_sum",
        "reversed_weights",
        "rotated_weights",
        "slot_major",
        "no_h_mask",
        "weights_stride_top_k",
        "y_stride_h",
        "out_stride_y",
        "acc_overwritten",
        "int32_rows",
        "notebook_stub",
    ],
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_topk_reduce, kernel, says, "topk_reduce_kernel", capsys)
