"""Exercise of notebook 05 (expert_tile_kernel: an expert's weight tile through a 3-D descriptor): the
notebook's solution passes; typical wrong kernels and descriptors get their diagnosis."""

import functools

import pytest
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def notebook_function(name):
    """A plain function of notebook 05, with the names its cell has in scope."""
    fn = notebook_kernel("05_grouped_gemm_tma", name)
    fn.__globals__["TensorDescriptor"] = TensorDescriptor
    return fn


def desc_3d(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N, BLOCK_SIZE_K])


def desc_2d(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w.view(-1, w.shape[2]), [BLOCK_SIZE_N, BLOCK_SIZE_K])


def desc_2d_block(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w, [BLOCK_SIZE_N, BLOCK_SIZE_K])


@triton.jit
def _tile(
    w_desc,
    expert_ids_ptr,
    out_ptr,
    N,
    stride_ob,
    stride_on,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    EXPERT: tl.constexpr = 0,
    SKIP_UNUSED: tl.constexpr = True,
    N0_IN_BLOCKS: tl.constexpr = False,
    K0_IN_BLOCKS: tl.constexpr = False,
    RESHAPE: tl.constexpr = True,
    TWO_OFFSETS: tl.constexpr = False,
):
    """The solution, with switches that each make one typical mistake (EXPERT: 0 expert_ids[pid_m], right;
    1 none, expert 0; 2 the M-block index pid_m). TWO_OFFSETS loads at [expert * N + n0, k0], right only for a
    2-D descriptor over w.view(E * N, K)."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = pid_k * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    out_ptrs = out_ptr + pid_m * stride_ob + offs_n[:, None] * stride_on + offs_k[None, :]
    if EXPERT == 1:
        expert = 0
    else:
        expert = tl.load(expert_ids_ptr + pid_m)
        if SKIP_UNUSED:
            if expert < 0:
                return
        if EXPERT == 2:
            expert = pid_m
    n0 = pid_n if N0_IN_BLOCKS else pid_n * BLOCK_SIZE_N
    k0 = pid_k if K0_IN_BLOCKS else pid_k * BLOCK_SIZE_K
    if TWO_OFFSETS:
        tl.store(out_ptrs, w_desc.load([expert * N + n0, k0]))
    elif RESHAPE:
        tl.store(out_ptrs, w_desc.load([expert, n0, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K))
    else:
        tl.store(out_ptrs, w_desc.load([expert, n0, k0]))


@triton.jit
def expert_forgotten(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, EXPERT=1)


@triton.jit
def block_as_expert(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, EXPERT=2)


@triton.jit
def n0_in_blocks(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, N0_IN_BLOCKS=True)


@triton.jit
def k0_in_blocks(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, K0_IN_BLOCKS=True)


@triton.jit
def flat_rows(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    """With desc_2d: a 2-D descriptor over w.view(E * N, K), the expert's rows start at expert * N."""
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, TWO_OFFSETS=True)


@triton.jit
def unused_not_skipped(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, SKIP_UNUSED=False)


@triton.jit
def reshape_forgotten(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, RESHAPE=False)


@triton.jit
def two_offsets(
    w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr
):
    """flat_rows' load on the 3-D descriptor."""
    _tile(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on, BLOCK_SIZE_N, BLOCK_SIZE_K, TWO_OFFSETS=True)


def test_solution_passes():
    kernel = notebook_kernel("05_grouped_gemm_tma", "expert_tile_kernel_solution")
    verdict = exercises.check_expert_tile(kernel, notebook_function("expert_weight_desc_solution"), strict=True)
    assert verdict.passed and str(verdict).startswith("PASS expert_tile_kernel:")
    assert exercises.check_expert_tile(kernel, strict=True).passed  # the checker's own descriptor


STUB = notebook_kernel("05_grouped_gemm_tma", "expert_tile_kernel")


@pytest.mark.parametrize(
    "kernel, make_desc, says",
    [
        (
            expert_forgotten,
            desc_3d,
            ["expert offset is forgotten", "expert 0", "unused M-blocks (expert_ids = -1) were written too"],
        ),
        (block_as_expert, desc_3d, ["M-block index is used as the expert"]),
        (n0_in_blocks, desc_3d, ["n0 is in block units", "pid_n * BLOCK_SIZE_N"]),
        (k0_in_blocks, desc_3d, ["not a multiple of 16 bytes", "k0 = pid_k * BLOCK_SIZE_K"]),
        (
            flat_rows,
            desc_2d,
            [
                "2-D descriptor over w.view(E * N, K)",
                "NEXT expert",
                "instead of zeros",
                "[1, BLOCK_SIZE_N, BLOCK_SIZE_K]",
            ],
        ),
        (unused_not_skipped, desc_3d, ["unused M-blocks (expert_ids = -1) were written", "return when it is -1"]),
        (reshape_forgotten, desc_3d, ["reshape it to [BLOCK_SIZE_N, BLOCK_SIZE_K]"]),
        (two_offsets, desc_3d, ["one offset per dimension", "[expert, n0, k0]"]),
        (
            notebook_kernel("05_grouped_gemm_tma", "expert_tile_kernel_solution"),
            desc_2d_block,
            ["raised AssertionError: rank mismatch", "one entry per dimension of w"],
        ),
        (STUB, notebook_function("expert_weight_desc"), ["expert_weight_desc(w, 16, 32) returned None"]),
        (STUB, desc_3d, ["stores nothing"]),
        (
            desc_3d,
            notebook_kernel("05_grouped_gemm_tma", "expert_tile_kernel_solution"),
            ["the arguments are swapped", "kernel first", "check_expert_tile(expert_tile_kernel_solution, desc_3d)"],
        ),
        (STUB, STUB, ["is a @triton.jit kernel, passed where the descriptor helper goes", "expert_weight_desc("]),
    ],
    ids=lambda v: getattr(v, "__name__", "") if callable(v) else "",
)
def test_wrong_kernels_are_named(kernel, make_desc, says, capsys):
    checker = functools.partial(exercises.check_expert_tile, make_w_desc=make_desc)
    assert_not_yet(checker, kernel, says, "expert_tile_kernel", capsys)
