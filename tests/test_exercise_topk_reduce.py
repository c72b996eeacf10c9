"""Exercise 06 (topk_reduce_kernel): the notebook's solution passes; the stub and typical wrong kernels get
NOT YET with their diagnosis, and FAIL with strict=True."""
import pytest
import triton
import triton.language as tl

from moe_lab import exercises
from tests.notebook_source import notebook_kernel


@triton.jit
def plain_sum(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
              TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def reversed_weights(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                     TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + (TOP_K - 1 - j))
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def rotated_weights(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + (j + 1) % TOP_K)
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def slot_major(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
               TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    num_tokens = tl.num_programs(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc += weight * tl.load(y_ptr + (j * num_tokens + t) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def no_h_mask(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
              TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc)


@triton.jit
def weights_stride_top_k(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                         TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * TOP_K + j)
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def y_stride_h(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
               TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * H + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def out_stride_y(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                 TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc += weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_y_row + offs_h, acc, mask=offs_h < H)


@triton.jit
def acc_overwritten(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        weight = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc = weight * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < H, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < H)


def test_solution_passes():
    kernel = notebook_kernel("06_fused_moe_layer", "topk_reduce_kernel_solution")
    verdict = exercises.check_topk_reduce(kernel, strict=True)
    assert verdict.passed and str(verdict).startswith("PASS topk_reduce_kernel:")


@pytest.mark.parametrize("kernel, says", [
    (plain_sum, ["weights are not applied", "plain sum"]),
    (reversed_weights, ["reversed", "topk_weights[t, j]"]),
    (rotated_weights, ["paired with the wrong slots", "topk_weights[t, j]"]),
    (slot_major, ["row j * T + t", "t * TOP_K + j"]),
    (no_h_mask, ["past the", "not a multiple of BLOCK_H", "offs_h < H"]),
    (weights_stride_top_k, ["topk_weights_ptr", "wrong stride", "stride_w_token = 8", "not TOP_K = 6"]),
    (y_stride_h, ["y_ptr", "wrong stride", "stride_y_row (here 224, not H = 200"]),
    (out_stride_y, ["store(s) past the", "wrong stride for out", "stride_out_row = 200",
                    "not t * stride_y_row (= 224"]),
    (acc_overwritten, ["only the last slot counts", "overwritten", "acc += w * row"]),
    (notebook_kernel("06_fused_moe_layer", "topk_reduce_kernel"), ["stores nothing"]),
], ids=["plain_sum", "reversed_weights", "rotated_weights", "slot_major", "no_h_mask", "weights_stride_top_k",
        "y_stride_h", "out_stride_y", "acc_overwritten", "notebook_stub"])
def test_wrong_kernels_are_named(kernel, says, capsys):
    verdict = exercises.check_topk_reduce(kernel)
    assert verdict.status == "NOT YET"
    for text in says:
        assert text in verdict.message, verdict.message
    assert capsys.readouterr().out.startswith("NOT YET topk_reduce_kernel: ")
    with pytest.raises(AssertionError, match="^FAIL topk_reduce_kernel: "):
        exercises.check_topk_reduce(kernel, strict=True)
