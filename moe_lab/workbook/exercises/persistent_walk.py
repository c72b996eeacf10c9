"""Notebook 08's exercise: a persistent kernel walks the tiles of the rows in use.

    persistent_copy_kernel(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr)

x and out are [MAX_ROWS, N] float32, contiguous. Only the first num_rows rows are in use, and num_rows
(a multiple of BLOCK_M, like `num_tokens_post_padded`) lives on the device, in num_rows_ptr[0]. The grid
has fewer programs than there are tiles: program p copies tiles p, p + P, ... (P programs) of the
BLOCK_M x BLOCK_N tiles of the rows in use, tile t being M-block t // cdiv(N, BLOCK_N) and N-block
t % cdiv(N, BLOCK_N). Rows past num_rows must be left as they are.

The checker launches it twice, with different sizes and program counts (so sizes written into the kernel,
or BLOCK_M and BLOCK_N swapped, show), and reads the interpreter's record of every store: which tiles each
program stored, whether a store covers exactly one tile, and whether anything past num_rows was touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import triton

from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, _close, _difference, report, stray_stores

EXERCISE = "persistent_copy_kernel"


@dataclass(frozen=True)
class Case:
    max_rows: int
    num_rows: int
    n: int
    block_m: int
    block_n: int
    programs: int

    @property
    def num_pid_n(self) -> int:
        return triton.cdiv(self.n, self.block_n)

    @property
    def num_tiles(self) -> int:
        return self.num_rows // self.block_m * self.num_pid_n

    @property
    def spill(self) -> int:
        """Columns an unmasked last N-block reaches past N: the next row's first ones."""
        return self.num_pid_n * self.block_n - self.n

    def describe(self) -> str:
        return (
            f"num_rows = {self.num_rows} of {self.max_rows}, N = {self.n}, BLOCK_M = {self.block_m}, "
            f"BLOCK_N = {self.block_n}, {self.programs} programs, {self.num_tiles} tiles"
        )


# The notebook's case first; the second has other sizes, BLOCK_M != BLOCK_N, a program count that does not
# divide the tiles, and an N for which a tile count from swapped block sizes comes out different.
CASES = (Case(128, 80, 40, 16, 16, 3), Case(160, 96, 72, 32, 16, 4))

LOOP_HINT = (
    "Loop over tiles with `for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0))`: "
    "start at this program's id, step by the number of programs"
)
COUNT_HINT = "num_tiles = (tl.load(num_rows_ptr) // BLOCK_M) * tl.cdiv(N, BLOCK_N)"
TILE_HINT = (
    "tile t covers rows m * BLOCK_M + tl.arange(0, BLOCK_M) and columns n * BLOCK_N + tl.arange(0, BLOCK_N), "
    "m = t // tl.cdiv(N, BLOCK_N), n = t % tl.cdiv(N, BLOCK_N), at offsets rows[:, None] * N + cols[None, :] "
    "(masked: cols < N)"
)
SIZES_HINT = (
    "it passes the notebook's sizes but not these: look for sizes written into the kernel (80 rows, "
    "3 programs, 15 tiles, 16) instead of num_rows, tl.num_programs(0), BLOCK_M and BLOCK_N, and for "
    "BLOCK_M and BLOCK_N swapped"
)


def _tile_of(case: Case, rows: np.ndarray, cols: np.ndarray) -> Optional[int]:
    """The tile number whose elements are exactly (rows, cols), or None."""
    m, n = int(rows.min()) // case.block_m, int(cols.min()) // case.block_n
    r, c = np.meshgrid(
        np.arange(m * case.block_m, (m + 1) * case.block_m),
        np.arange(n * case.block_n, min((n + 1) * case.block_n, case.n)),
        indexing="ij",
    )
    want = set(zip(r.ravel().tolist(), c.ravel().tolist()))
    if set(zip(rows.tolist(), cols.tolist())) != want:
        return None
    return m * case.num_pid_n + n


def _unmasked_last_block(case: Case, offsets: np.ndarray) -> bool:
    """True if `offsets` are a tile of the last N-block stored without the column mask: its BLOCK_N columns
    run past N into the first columns of the next row."""
    r0, c0 = divmod(int(offsets.min()), case.n)
    if not case.spill or c0 != (case.num_pid_n - 1) * case.block_n:
        return False
    want = (r0 + np.arange(case.block_m))[:, None] * case.n + c0 + np.arange(case.block_n)[None, :]
    return set(np.unique(offsets).tolist()) == set(want.ravel().tolist())


def _walk_problem(case: Case, run) -> Optional[str]:
    """What is wrong with which elements the kernel stored, from the interpreter's record; None if every
    tile of the rows in use was stored once, each by one store, shared evenly among the programs."""
    stores = [a for a in run.accesses if a.tensor == "out_ptr" and a.kind != "load" and a.in_bounds.any()]
    if not stores:
        elsewhere = sorted({a.tensor for a in run.accesses if a.kind != "load"})
        if elsewhere:
            return (
                f"nothing was stored into out_ptr; the kernel stored into {', '.join(elsewhere)} instead: "
                "check which pointer each tl.store writes to"
            )
        return "the kernel stores nothing: load each tile of x and tl.store it into out"
    for a in stores:
        if _unmasked_last_block(case, a.offsets[a.in_bounds]):
            return (
                f"the last N-block of a row also stored into the first {case.spill} columns of the next row: N = "
                f"{case.n} is not a multiple of BLOCK_N = {case.block_n}; mask the columns with `cols < N` "
                "(on the load and on the store)"
            )
    offsets = np.concatenate([a.offsets[a.in_bounds] for a in stores])
    past = offsets[offsets >= case.num_rows * case.n]
    if past.size:
        return (
            f"rows {case.num_rows} .. {int(past.max()) // case.n} were written, but only the first num_rows = "
            f"{case.num_rows} rows are in use (the rest must stay as they are): read the count on the device "
            f"and walk only its tiles, {COUNT_HINT}"
        )
    owners = {}
    for a in stores:
        rows, cols = a.offsets[a.in_bounds] // case.n, a.offsets[a.in_bounds] % case.n
        tile = _tile_of(case, rows, cols)
        if tile is None:
            return (
                f"a tl.store of program {a.program[0]} covers rows {int(rows.min())} .. {int(rows.max())} and "
                f"columns {int(cols.min())} .. {int(cols.max())} ({len(rows)} elements), not one tile: "
                f"{TILE_HINT}"
            )
        owners.setdefault(tile, []).append(a.program[0])
    twice = {t: p for t, p in owners.items() if len(p) > 1}
    if twice:
        t, programs = min(twice.items())
        who = (
            f"programs {sorted(set(programs))}"
            if len(set(programs)) > 1
            else f"program {programs[0]}, {len(programs)} times"
        )
        return f"{len(twice)} tile(s) were stored more than once (tile {t} by {who}). {LOOP_HINT}"
    missing = sorted(set(range(case.num_tiles)) - set(owners))
    if missing:
        done = sorted(owners)
        if done == list(range(min(case.programs, case.num_tiles))):
            return (
                f"only tiles 0 .. {done[-1]} were copied, one per program, of {case.num_tiles}: each program "
                f"must go on to its next tile (use the loop variable as the tile). {LOOP_HINT}"
            )
        if missing == list(range(missing[0], case.num_tiles)) and any(
            programs != [tile % case.programs] for tile, programs in owners.items()
        ):  # the tail is missing, but the programs stored tiles their walk does not give them: the mapping is off
            tile, programs = next((t, p) for t, p in sorted(owners.items()) if p != [t % case.programs])
            return (
                f"tiles {missing[0]} .. {case.num_tiles - 1} of {case.num_tiles} were never copied, and program "
                f"{programs[0]} stored tile {tile}, which its walk (tiles p, p + P, ...) does not reach: the tile "
                f"index maps to the wrong rows and columns (are // and % swapped?). {TILE_HINT}"
            )
        if missing == list(range(missing[0], case.num_tiles)):
            return (  # every other tile was stored once, as a whole tile: the count is short
                f"tiles {missing[0]} .. {case.num_tiles - 1} of {case.num_tiles} were never copied: the loop "
                f"stops early: {COUNT_HINT}"
            )
        return f"tiles {missing} of {case.num_tiles} were never copied. {LOOP_HINT}; {TILE_HINT}"
    per_program = np.bincount([p for ps in owners.values() for p in ps], minlength=case.programs)
    if per_program.max() - per_program.min() > 1:
        return (
            f"the programs did not share the tiles: they copied {per_program.tolist()} tiles each. A persistent "
            f"grid spreads them evenly, program p taking tiles p, p + P, .... {LOOP_HINT}"
        )
    return None


def _bounds_hint(run) -> str:
    # num_rows_ptr read as a vector (past its one element); not accesses that only land near it (other tensors')
    if any(
        o.tensor == "num_rows_ptr" and o.kind == "load" and not o.far and min(o.offsets, default=0) > 0
        for o in run.out_of_bounds
    ):
        return "num_rows_ptr holds one value: read it with `tl.load(num_rows_ptr)`"
    return f"The tiles reach past the buffer: {COUNT_HINT}; {TILE_HINT}"


def _case_problem(kernel, case: Case):
    """(problem or None, relative error) of one launch."""
    device = default_device()
    x = torch.randn(case.max_rows, case.n, device=device)
    run = run_guarded(
        kernel,
        (case.programs,),
        x_ptr=x,
        out_ptr=torch.full_like(x, float("nan")),
        num_rows_ptr=torch.tensor([case.num_rows], dtype=torch.int32, device=device),
        N=case.n,
        BLOCK_M=case.block_m,
        BLOCK_N=case.block_n,
    )
    problem = run.problem()
    if problem is not None:
        return (problem + f". {_bounds_hint(run)}" if run.out_of_bounds else problem), None
    problem = _walk_problem(case, run)
    if problem is not None:
        return problem, None
    want = torch.full_like(x, float("nan"))
    want[: case.num_rows] = x[: case.num_rows]
    got = run.tensors["out_ptr"]
    if not _close(got, want, 1e-6):
        return "every tile was stored once, but " + _difference(got, want, 1e-6), None
    problem = stray_stores(run, ("out_ptr",))
    if problem is not None:
        return "every tile was copied once, but " + problem, None
    return None, float((got[: case.num_rows] - want[: case.num_rows]).abs().max())


def check_persistent_copy(kernel, strict: bool = False) -> Verdict:
    """Grade `persistent_copy_kernel(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M, BLOCK_N)` on two launches
    (`CASES`: 3 programs over 15 tiles of 16 x 16, then 4 programs over 15 tiles of 32 x 16), `out` poisoned
    with NaN, from the stored values and the interpreter's record of every store. Names: nothing or the wrong
    tensor stored, rows past num_rows touched, a missing column mask, a store that is not one tile (offsets),
    tiles stored twice (loop start or step), one tile per program (no loop), tiles missing at the end (the
    tile count) or in between (the step), tiles not shared among the programs, wrong values, sizes written
    into the kernel (the second launch only)."""
    for i, case in enumerate(CASES):
        problem, _ = _case_problem(kernel, case)
        if problem is not None:
            if i:
                problem = f"with {case.describe()}, {SIZES_HINT}: {problem}"
            return report(EXERCISE, problem, "", strict)
    return report(
        EXERCISE,
        None,
        "every tile copied once, by programs taking turns, on two launches ("
        + "; ".join(c.describe() for c in CASES)
        + "), nothing else touched, no access out of bounds",
        strict,
    )
