"""Exercise 07 (matmul_kernel, a K loop with num_stages): the notebook's solution passes; the stub and
typical wrong kernels get NOT YET with their diagnosis, and FAIL with strict=True."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def _matmul(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    K_MASK: tl.constexpr = True,
    MASK_AHEAD: tl.constexpr = False,
    ADVANCE: tl.constexpr = 1,
    A_STRIDE: tl.constexpr = True,
    B_STRIDE: tl.constexpr = True,
    LOOP_IN_COLUMNS: tl.constexpr = False,
    DOT_BA: tl.constexpr = False,
    OVERWRITE: tl.constexpr = False,
    FP16: tl.constexpr = 0,
):
    """Notebook 07's matmul_kernel_solution (test_solution_passes grades the notebook's own), with switches
    that each make one typical mistake (ADVANCE: 0 never; 1 after the dot, right; 2 before the loads. FP16: 0
    none, right; 1 a float16 accumulator; 2 float16 block products)."""
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    if FP16 == 1:
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float16)
    else:
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    a_step = BLOCK_SIZE_K * stride_ak if A_STRIDE else BLOCK_SIZE_K
    b_step = BLOCK_SIZE_K * stride_bk if B_STRIDE else BLOCK_SIZE_K
    if LOOP_IN_COLUMNS:
        end = K
        step = BLOCK_SIZE_K
    else:
        end = tl.cdiv(K, BLOCK_SIZE_K)
        step = 1
    for k in tl.range(0, end, step, num_stages=NUM_STAGES):
        if ADVANCE == 2:
            a_ptrs += a_step
            b_ptrs += b_step
        if MASK_AHEAD:
            k_left = K - (k + 1) * BLOCK_SIZE_K
        else:
            k_left = K - k * BLOCK_SIZE_K
        if K_MASK:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        else:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        if DOT_BA:
            product = tl.dot(b, a)
        elif FP16 == 1:
            product = tl.dot(a, b, out_dtype=tl.float16)
        elif FP16 == 2:
            product = tl.dot(a, b).to(tl.float16)
        else:
            product = tl.dot(a, b)
        if OVERWRITE:
            accumulator = product
        else:
            accumulator += product
        if ADVANCE == 1:
            a_ptrs += a_step
            b_ptrs += b_step
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, accumulator, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def no_k_mask(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        K_MASK=False,
    )


@triton.jit
def not_advanced(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        ADVANCE=0,
    )


@triton.jit
def overwritten(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        OVERWRITE=True,
    )


@triton.jit
def fp16_accumulator(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        FP16=1,
    )


@triton.jit
def fp16_block_products(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        FP16=2,
    )


@triton.jit
def mask_one_block_ahead(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        MASK_AHEAD=True,
    )


@triton.jit
def advanced_before_load(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        ADVANCE=2,
        MASK_AHEAD=True,
    )


@triton.jit
def advanced_before_load_own_mask(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        ADVANCE=2,
    )


@triton.jit
def a_stride_dropped(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        A_STRIDE=False,
        B_STRIDE=False,
    )


@triton.jit
def b_stride_dropped(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        B_STRIDE=False,
    )


@triton.jit
def loop_in_columns(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        LOOP_IN_COLUMNS=True,
    )


@triton.jit
def dot_b_a(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    _matmul(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        NUM_STAGES,
        DOT_BA=True,
    )


def test_solution_passes():
    kernel = notebook_kernel("07_performance", "matmul_kernel_solution")
    verdict = exercises.check_pipelined_matmul(kernel, strict=True)
    assert verdict.passed and str(verdict).startswith("PASS matmul_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (no_k_mask, ["past the", "no K mask on the last block", "offs_k[None, :] < K - k * BLOCK_SIZE_K"]),
        (not_advanced, ["every step read the first K block", "not advanced", "BLOCK_SIZE_K * stride_ak"]),
        (overwritten, ["only the last K block counts", "overwritten", "accumulator += tl.dot(a, b)"]),
        (fp16_accumulator, ["float16 rounding", "tl.float32"]),
        (fp16_block_products, ["float16 rounding", "without converting"]),
        (mask_one_block_ahead, ["off-by-one block offset", "next one"]),
        (advanced_before_load, ["off-by-one block offset", "first K block is missing"]),
        (advanced_before_load_own_mask, ["even when K is a multiple of BLOCK_SIZE_K", "off-by-one block offset"]),
        (
            a_stride_dropped,
            ["a_ptrs moved by BLOCK_SIZE_K elements", "column-major", "stride_ak = 64", "BLOCK_SIZE_K * stride_ak"],
        ),
        (b_stride_dropped, ["B row-major", "b_ptrs moved by BLOCK_SIZE_K elements", "BLOCK_SIZE_K * stride_bk"]),
        (
            loop_in_columns,
            ["only the first K block counts", "tl.range(0, K, BLOCK_SIZE_K)", "tl.cdiv(K, BLOCK_SIZE_K)"],
        ),
        (dot_b_a, ["tl.dot(b, a)", "swapped", "tl.dot(a, b)"]),
        (notebook_kernel("07_performance", "matmul_kernel"), ["C is all zeros", "tl.dot(a, b)"]),
    ],
    ids=[
        "no_k_mask",
        "not_advanced",
        "overwritten",
        "fp16_accumulator",
        "fp16_block_products",
        "mask_one_block_ahead",
        "advanced_before_load",
        "advanced_before_load_own_mask",
        "a_stride_dropped",
        "b_stride_dropped",
        "loop_in_columns",
        "dot_b_a",
        "notebook_stub",
    ],
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_pipelined_matmul, kernel, says, "matmul_kernel", capsys)
