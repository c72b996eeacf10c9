"""Notebook 08's exercise: a persistent kernel walks the tiles of the rows in use.

    persistent_copy_kernel(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr)

x and out are [MAX_ROWS, N] float32, contiguous. Only the first num_rows rows are in use, and num_rows
(a multiple of BLOCK_M, like `num_tokens_post_padded`) lives on the device, in num_rows_ptr[0]. The grid
is NUM_PROGRAMS programs, fewer than the tiles: program p copies tiles p, p + NUM_PROGRAMS, ... of the
BLOCK_M x BLOCK_N tiles of the rows in use, tile t being M-block t // cdiv(N, BLOCK_N) and N-block
t % cdiv(N, BLOCK_N). Rows past num_rows must be left as they are.
"""
from __future__ import annotations

import numpy as np
import torch
import triton

from ..guarded import run_guarded
from ..runtime import default_device
from ._grade import Verdict, grade, report

MAX_ROWS, NUM_ROWS, N = 128, 80, 40   # 8 M-blocks in the buffer, 5 in use; N is not a multiple of BLOCK_N
BLOCK_M, BLOCK_N = 16, 16
NUM_PROGRAMS = 3
NUM_PID_N = triton.cdiv(N, BLOCK_N)
NUM_TILES = NUM_ROWS // BLOCK_M * NUM_PID_N   # 15 tiles, 5 per program

LOOP_HINT = ("Loop over tiles with `for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0))`: "
             "start at this program's id, step by the number of programs")
MASK_HINT = f"N = {N} is not a multiple of BLOCK_N = {BLOCK_N}: mask the last N-block's columns with `cols < N`"


def _tiles_written(out: torch.Tensor) -> set:
    """Tile numbers (of the rows in use) whose every element was written (is no longer NaN)."""
    written = ~torch.isnan(out.cpu())
    tiles = set()
    for t in range(NUM_TILES):
        m, n = divmod(t, NUM_PID_N)
        if written[m * BLOCK_M:(m + 1) * BLOCK_M, n * BLOCK_N:min((n + 1) * BLOCK_N, N)].all():
            tiles.add(t)
    return tiles


SPILL = NUM_PID_N * BLOCK_N - N   # columns an unmasked last N-block reaches past N: the next row's first ones


def _stored_twice(run) -> list:
    """Element offsets of out that more than one program stored (each tile belongs to one program)."""
    owners: dict = {}
    for a in run.accesses:
        if a.tensor == "out_ptr" and a.kind != "load":
            for offset in np.unique(a.offsets[a.in_bounds]):
                owners.setdefault(int(offset), set()).add(a.program)
    return [offset for offset, programs in owners.items() if len(programs) > 1]


def check_persistent_copy(kernel, strict: bool = False) -> Verdict:
    """Grade `persistent_copy_kernel(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N)` with 3 programs over
    15 tiles (80 of 128 rows in use, N = 40 in blocks of 16), `out` poisoned with NaN. Names: tiles stored by
    several programs (each program walked every tile), only the first tile of each program (no loop), tiles
    missing (a loop that does not start at the program id or step by the number of programs), rows past
    num_rows written (the tile count taken from the buffer, not read from num_rows_ptr), a missing column
    mask."""
    device = default_device()
    x = torch.randn(MAX_ROWS, N, device=device)
    run = run_guarded(kernel, (NUM_PROGRAMS,), x_ptr=x, out_ptr=torch.full_like(x, float("nan")),
                      num_rows_ptr=torch.tensor([NUM_ROWS], dtype=torch.int32, device=device), N=N,
                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    if run.problem() is None:
        twice = _stored_twice(run)
        if twice and all(offset % N < SPILL for offset in twice):
            return report("persistent_copy_kernel", f"the last N-block of each row also stored into the first {SPILL} "
                          f"columns of the next row. {MASK_HINT}", "", strict)
        if twice:
            return report("persistent_copy_kernel", f"{len(twice)} elements of out were stored by more than one "
                          f"program: each program walked every tile. {LOOP_HINT}", "", strict)
        done = _tiles_written(run.tensors["out_ptr"])
        if done and done < set(range(NUM_TILES)):
            if done == set(range(NUM_PROGRAMS)):
                why = (f"only tiles 0 .. {NUM_PROGRAMS - 1} were copied, one per program, of {NUM_TILES}: "
                       f"each program must go on to its next tile. {LOOP_HINT}")
            else:
                why = (f"tiles {sorted(set(range(NUM_TILES)) - done)} of {NUM_TILES} were never copied. {LOOP_HINT}; "
                       "tile t is M-block t // cdiv(N, BLOCK_N) and N-block t % cdiv(N, BLOCK_N)")
            return report("persistent_copy_kernel", why, "", strict)
    want = torch.full_like(x, float("nan"))
    want[:NUM_ROWS] = x[:NUM_ROWS]
    return grade("persistent_copy_kernel", run, "out_ptr", want, tol=1e-6, strict=strict,
                 out_of_bounds_hint=MASK_HINT,
                 mistakes=[(f"rows {NUM_ROWS} .. {MAX_ROWS - 1} were written too: only the first num_rows = {NUM_ROWS} "
                            f"rows are in use. Read the count on the device, `num_rows = tl.load(num_rows_ptr)`, "
                            "and walk (num_rows // BLOCK_M) * cdiv(N, BLOCK_N) tiles", x)])
