"""Exercises of notebook 04 (copy_2d_kernel through host descriptors, copy_2d_device_kernel through
tl.make_tensor_descriptor): the notebook's solutions pass; typical wrong kernels get their diagnosis."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


# --- host descriptors ----------------------------------------------------------------------------------


@triton.jit
def block_indices(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    dst_desc.store([pid_m, pid_n], src_desc.load([pid_m, pid_n]))


@triton.jit
def swapped(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(1) * BLOCK_N
    col = tl.program_id(0) * BLOCK_M
    dst_desc.store([row, col], src_desc.load([row, col]))


@triton.jit
def load_swapped(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    dst_desc.store([row, col], src_desc.load([tl.program_id(1) * BLOCK_N, tl.program_id(0) * BLOCK_M]))


@triton.jit
def blocks_mixed_up(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_N
    col = tl.program_id(1) * BLOCK_M
    dst_desc.store([row, col], src_desc.load([row, col]))


@triton.jit
def program_axes_swapped(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(1) * BLOCK_M
    col = tl.program_id(0) * BLOCK_N
    dst_desc.store([row, col], src_desc.load([row, col]))


@triton.jit
def offsets_not_a_list(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * BLOCK_N
    dst_desc.store([row, col], src_desc.load(row, col))


@triton.jit
def tl_load_of_a_descriptor(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.store(dst_desc, tl.load(src_desc))


@triton.jit
def first_box_only(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    dst_desc.store([0, 0], src_desc.load([0, 0]))


@triton.jit
def load_only(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile = src_desc.load([tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N])  # noqa: F841


def test_solution_passes():
    kernel = notebook_kernel("04_tma_basics", "copy_2d_kernel_solution")
    verdict = exercises.check_descriptor_copy(kernel, strict=True)
    assert verdict.passed and str(verdict).startswith("PASS copy_2d_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (block_indices, ["not a multiple of 16 bytes", "pid_n * BLOCK_N, not the block index", "illegal instruction"]),
        (swapped, ["row and column offsets swapped", "pid_m * BLOCK_M"]),
        (load_swapped, ["the load's row and column offsets are swapped"]),
        (blocks_mixed_up, ["BLOCK_M and BLOCK_N mixed up", "pid_m * BLOCK_M"]),
        (program_axes_swapped, ["program axes are swapped", "(4, 3)", "row = tl.program_id(0) * BLOCK_M"]),
        (offsets_not_a_list, ["offsets go in one list", "desc.load([row, col])", "not desc.load(row, col)", "Launch:"]),
        (tl_load_of_a_descriptor, ["not a pointer", "desc.load([row, col])", "Launch:"]),
        (first_box_only, ["box at [0, 0]", "[pid_m * BLOCK_M, pid_n * BLOCK_N]"]),
        (load_only, ["stores nothing", "dst_desc.store"]),
        (notebook_kernel("04_tma_basics", "copy_2d_kernel"), ["stores nothing"]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_host_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_descriptor_copy, kernel, says, "copy_2d_kernel", capsys)


# --- descriptors made in the kernel ----------------------------------------------------------------------


@triton.jit
def padded_shape(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m_padded = tl.cdiv(M, BLOCK_M) * BLOCK_M
    n_padded = tl.cdiv(N, BLOCK_N) * BLOCK_N
    src = tl.make_tensor_descriptor(
        src_ptr, shape=[m_padded, n_padded], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    dst = tl.make_tensor_descriptor(
        dst_ptr, shape=[m_padded, n_padded], strides=[stride_dst_m, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, col], src.load([row, col]))


@triton.jit
def contiguous_assumed(
    src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, col], src.load([row, col]))


@triton.jit
def src_stride_for_dst(
    src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, col], src.load([row, col]))


@triton.jit
def strides_swapped(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[1, stride_src_m], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[1, stride_dst_m], block_shape=[BLOCK_M, BLOCK_N])
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, col], src.load([row, col]))


@triton.jit
def device_block_indices(
    src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_dst_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst.store([tl.program_id(0), tl.program_id(1)], src.load([tl.program_id(0), tl.program_id(1)]))


@triton.jit
def device_swapped(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_dst_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    row, col = tl.program_id(1) * BLOCK_N, tl.program_id(0) * BLOCK_M
    dst.store([row, col], src.load([row, col]))


def test_device_solution_passes():
    kernel = notebook_kernel("04_tma_basics", "copy_2d_device_kernel_solution")
    verdict = exercises.check_device_descriptor_copy(kernel, strict=True)
    assert verdict.passed and str(verdict).startswith("PASS copy_2d_device_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (
            padded_shape,
            [
                "load(s) outside",
                "of src_ptr",
                "store(s) past the 5040 elements of dst_ptr",
                "not the grid's padded size",
            ],
        ),
        (contiguous_assumed, ["of src_ptr", "stride_src_m = 100 elements apart, not N = 84"]),
        (src_stride_for_dst, ["store(s) past the 5040 elements of dst_ptr", "strides=[stride_dst_m, 1]"]),
        (strides_swapped, ["strides are swapped", "strides=[stride_m, 1]"]),
        (device_block_indices, ["not a multiple of 16 bytes"]),
        (device_swapped, ["row and column offsets swapped"]),
        (notebook_kernel("04_tma_basics", "copy_2d_device_kernel"), ["stores nothing"]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_device_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_device_descriptor_copy, kernel, says, "copy_2d_device_kernel", capsys)


# --- what a GPU says instead of the interpreter ------------------------------------------------------------
# (run_guarded runs a kernel under the interpreter before it goes to a GPU, so these reach the GPU only in
# a kernel whose interpreted run is clean; the hints stay the same)

GPU_ERRORS = [
    # Triton 3.6-3.9 compiling strides_swapped for sm_90 (checked without a GPU, moe_lab.tools.compile_only)
    (
        "CompilationError: at 2:10:\ndef strides_swapped(src_ptr, ...):\n    src = tl.make_tensor_descriptor(src_ptr, "
        "shape=[M, N], strides=[1, stride_src_m], block_shape=[BLOCK_M, BLOCK_N])\n          ^\nDid you forget to add "
        "@triton.jit ? (`_semantic` argument must be provided outside of JIT functions.)",
        "strides are swapped",
    ),
    # an H200 running block_indices
    ("CUDA error: an illegal instruction was encountered", "pid_n * BLOCK_N, not the block index"),
]


@pytest.mark.parametrize("error, says", GPU_ERRORS, ids=["strides swapped", "illegal instruction"])
def test_gpu_errors_get_the_same_hints(error, says):
    from moe_lab.workbook.exercises.descriptor_copy import ERROR_HINTS, error_verdict
    from moe_lab.workbook.guarded import GuardedRun

    run = GuardedRun({}, error=RuntimeError(error), checked_by="canaries")
    verdict = error_verdict("copy_2d_device_kernel", run, ERROR_HINTS, strict=False)
    assert verdict.status == "NOT YET" and says in verdict.message
