"""Exercise 08 (persistent_copy_kernel): the notebook's solution passes; the stub and typical wrong tile
walks get NOT YET with their diagnosis, and FAIL with strict=True."""

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def _walk(
    x_ptr,
    out_ptr,
    num_rows_ptr,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    START: tl.constexpr = 1,
    STEP: tl.constexpr = 1,
    COUNT: tl.constexpr = 0,
    MASK: tl.constexpr = True,
    ONE_WORKER: tl.constexpr = False,
    SWAP: tl.constexpr = False,
):
    """The solution, with switches that each make one typical mistake: START 0 starts every program at tile 0;
    STEP 0 steps by 1, 2 by one more than the grid (tiles skipped); COUNT 1 takes the tile count from the
    buffer's 128 rows instead of num_rows_ptr, 2 walks no loop (one tile per program), 3 writes 80 rows in,
    4 stops one tile early, 5 counts rows instead of M-blocks; MASK False drops the column mask; ONE_WORKER makes
    program 0 copy every tile; SWAP swaps // and % in the tile's (m, n)."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if COUNT == 1:
        num_tiles = (128 // BLOCK_M) * num_pid_n
    elif COUNT == 3:
        num_tiles = (80 // BLOCK_M) * num_pid_n
    elif COUNT == 5:
        num_tiles = tl.load(num_rows_ptr) * num_pid_n
    else:
        num_tiles = (tl.load(num_rows_ptr) // BLOCK_M) * num_pid_n
    if COUNT == 4:
        num_tiles -= 1
    if COUNT == 2:
        num_tiles = tl.minimum(num_tiles, tl.program_id(0) + 1)
    if STEP == 1:
        step = tl.num_programs(0)
    elif STEP == 2:
        step = tl.num_programs(0) + 1
    else:
        step = 1
    if ONE_WORKER:
        step = 1
        if tl.program_id(0) > 0:
            num_tiles = 0
    for tile in tl.range(tl.program_id(0) if START else 0, num_tiles, step):
        m, n = tile // num_pid_n, tile % num_pid_n
        if SWAP:
            m, n = tile % num_pid_n, tile // num_pid_n
        rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs = rows[:, None] * N + cols[None, :]
        if MASK:
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=cols[None, :] < N), mask=cols[None, :] < N)
        else:
            tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def right(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N)


@triton.jit
def every_program_from_tile_zero(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, START=0)


@triton.jit
def step_by_one(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, STEP=0)


@triton.jit
def step_past_the_grid(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, STEP=2)


@triton.jit
def count_from_buffer(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, COUNT=1)


@triton.jit
def one_tile_each(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, COUNT=2)


@triton.jit
def eighty_rows_written_in(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, COUNT=3)


@triton.jit
def one_tile_short(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, COUNT=4)


@triton.jit
def program_zero_does_all(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, ONE_WORKER=True)


@triton.jit
def blocks_swapped(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_N, BLOCK_M)


@triton.jit
def never_ends(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile = tl.program_id(0)
    while tile >= 0:
        tl.store(out_ptr + tl.arange(0, BLOCK_N), tl.load(x_ptr + tl.arange(0, BLOCK_N)))


@triton.jit
def unmasked(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, MASK=False)


def test_the_notebook_solution_and_the_switch_kernel_pass():
    assert exercises.check_persistent_copy(
        notebook_kernel("08_persistent_and_fused", "persistent_copy_kernel_solution"), strict=True
    ).passed
    verdict = exercises.check_persistent_copy(right, strict=True)
    assert verdict.passed and "two launches" in verdict.message


def test_the_notebook_stub_is_not_yet(capsys):
    assert_not_yet(
        exercises.check_persistent_copy,
        notebook_kernel("08_persistent_and_fused", "persistent_copy_kernel"),
        ["stores nothing"],
        "persistent_copy_kernel",
        capsys,
    )


@triton.jit
def zeroes_its_input(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    tl.store(
        x_ptr + rows[:, None] * N + cols[None, :], tl.zeros((BLOCK_M, BLOCK_N), tl.float32), mask=cols[None, :] < N
    )


@triton.jit
def static_range_loop(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = (tl.load(num_rows_ptr) // BLOCK_M) * num_pid_n
    for tile in tl.static_range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        rows = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs = rows[:, None] * N + cols[None, :]
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=cols[None, :] < N), mask=cols[None, :] < N)


@triton.jit
def tile_index_swapped(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, SWAP=True)


@triton.jit
def count_in_rows(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _walk(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N, COUNT=5)


def test_wrong_walks_are_named(capsys):
    for kernel, words in (
        (every_program_from_tile_zero, ["stored more than once", "tl.program_id(0)"]),
        (step_by_one, ["stored more than once", "tl.num_programs(0)"]),
        (
            eighty_rows_written_in,
            ["with num_rows = 96", "sizes written into the kernel", "never copied: the loop stops early"],
        ),
        (one_tile_short, ["tiles 14 .. 14 of 15 were never copied", "stops early"]),
        (program_zero_does_all, ["did not share the tiles", "[15, 0, 0]"]),
        (blocks_swapped, ["with num_rows = 96", "BLOCK_M and BLOCK_N swapped"]),
        (step_past_the_grid, ["tiles [3, 7, 11] of 15 were never copied", "tl.num_programs(0)"]),
        (count_from_buffer, ["rows 80 .. 127 were written", "tl.load(num_rows_ptr)"]),
        (one_tile_each, ["only tiles 0 .. 2 were copied"]),
        (unmasked, ["next row", "cols < N"]),
        (tile_index_swapped, ["which its walk (tiles p, p + P, ...) does not reach", "swapped"]),
        (count_in_rows, ["The tiles reach past the buffer", "tl.load(num_rows_ptr) // BLOCK_M"]),
        (zeroes_its_input, ["every tile was copied once, but the kernel also stores into x_ptr"]),
        (static_range_loop, ["bounds of tl.static_range must be tl.constexpr", "tl.program_id(...)", "tl.range"]),
    ):
        assert_not_yet(exercises.check_persistent_copy, kernel, words, "persistent_copy_kernel", capsys)


def test_a_loop_that_never_ends_is_stopped(monkeypatch, capsys):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 3.0)
    assert_not_yet(
        exercises.check_persistent_copy,
        never_ends,
        ["a loop that never ends", "in program ("],
        "persistent_copy_kernel",
        capsys,
    )
