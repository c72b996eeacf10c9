"""Pictures of notebook 08: the tile schedule of a persistent grouped GEMM over its programs, the gate and
up rows one program of the SwiGLU epilogue reads, the committed H200 timings of per-tile against
persistent launches, and where prefill GEMM time goes (padding, against cuBLAS).

`tile_schedule` computes which program takes which tile (plain data, with the kernels' GROUP_SIZE_M
arithmetic, `moe_lab.workbook.viz.tiles.program_tile`; easy to test);
the plot functions return a matplotlib `Figure` and take an optional `ax`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional, Sequence

import matplotlib.patches as mpatches
from matplotlib.figure import Figure

from ..._validate import check_int, check_positive_int
from ._common import check_drawable, expert_colors, figure_and_ax, int_list
from .tiles import program_tile

# What plot_tile_schedule draws at most (a box and a label per tile, a tick per program). Timed: each limit
# draws in about a second; notebook 08 draws 8 tiles over 4 programs.
MAX_SCHEDULE_TILES = 256
MAX_SCHEDULE_PROGRAMS = 256

PERSISTENT_EXPERIMENT = "persistent-H200-2026-11-30.json"
PREFILL_ANATOMY = "prefill_anatomy-H200-2026-12-01.json"
FOLD_TAILS = "fold_tails-H200-2026-12-02.json"


@dataclass(frozen=True)
class ScheduledTile:
    """Tile number `tile` (M-block `pid_m`, N-tile `pid_n`) is the `step`-th tile program `program` takes."""

    tile: int
    program: int
    step: int
    pid_m: int
    pid_n: int


def tile_schedule(
    num_used_blocks: int, num_pid_n: int, num_programs: int, group_size_m: int = 1
) -> List[ScheduledTile]:
    """Every tile of the M-blocks in use, with the program that takes it in a persistent launch: program p
    takes tiles p, p + num_programs, ... (`grouped_matmul_persistent_kernel`).

    Args:
        num_used_blocks: M-blocks in use, num_tokens_post_padded // BLOCK_SIZE_M.
        num_pid_n: N-tiles per M-block, cdiv(N, BLOCK_SIZE_N).
        num_programs: the grid (one program per SM on a GPU: 132 on an H200).
        group_size_m: GROUP_SIZE_M.
    Returns:
        List of ScheduledTile in tile order.
    Raises:
        TypeError for a count that is not an int (numpy ints and 0-d integer tensors are; floats and bools
        are not); ValueError for one below 1 (num_used_blocks below 0).
    """
    num_used_blocks = check_positive_int("num_used_blocks", num_used_blocks, minimum=0)
    num_pid_n = check_positive_int("num_pid_n", num_pid_n)
    num_programs = check_positive_int("num_programs", num_programs)
    group_size_m = check_positive_int("group_size_m", group_size_m)
    return [
        ScheduledTile(
            t, t % num_programs, t // num_programs, *program_tile(t, num_used_blocks, num_pid_n, group_size_m)
        )
        for t in range(num_used_blocks * num_pid_n)
    ]


def plot_tile_schedule(
    expert_ids: Sequence[int],
    num_used_blocks: int,
    num_pid_n: int,
    num_programs: int,
    group_size_m: int = 1,
    *,
    ax=None,
) -> Figure:
    """The persistent schedule as a grid: one column per program (an SM), one row per step; each tile is
    labelled with its (M-block, N-tile) and coloured by the expert of its M-block.

    Args:
        expert_ids: the expert of each M-block (`AlignedRouting.expert_ids`), at least num_used_blocks long.
        num_used_blocks, num_pid_n, num_programs, group_size_m: as in `tile_schedule`.
        ax: optional Axes.
    Returns:
        The Figure.
    Raises:
        TypeError / ValueError as `tile_schedule`; TypeError unless expert_ids is a sequence of ints (not a
        str: int("3") would read its characters as experts, nor floats: int() would truncate them);
        ValueError for fewer than num_used_blocks of them, or one below 0 among those; ValueError ("too large
        to draw") for more than MAX_SCHEDULE_TILES tiles or MAX_SCHEDULE_PROGRAMS programs; TypeError for an
        ax that is not a matplotlib Axes.
    """
    num_used_blocks = check_positive_int("num_used_blocks", num_used_blocks, minimum=0)
    num_pid_n = check_positive_int("num_pid_n", num_pid_n)
    num_programs = check_positive_int("num_programs", num_programs)
    # counted before tile_schedule lists the tiles
    check_drawable(
        "num_used_blocks", num_used_blocks * num_pid_n, MAX_SCHEDULE_TILES, "tiles (num_used_blocks x num_pid_n)"
    )
    check_drawable("num_programs", num_programs, MAX_SCHEDULE_PROGRAMS, "programs (a column each)")
    tiles = tile_schedule(num_used_blocks, num_pid_n, num_programs, group_size_m)
    experts = int_list("expert_ids", expert_ids, -1, what="ints (the expert of each M-block)")[:num_used_blocks]
    if len(experts) < num_used_blocks:
        raise ValueError(f"expert_ids has {len(experts)} entries, fewer than num_used_blocks = {num_used_blocks}")
    if any(e < 0 for e in experts):
        raise ValueError(
            f"expert_ids of the blocks in use must be >= 0 (an aligned schedule tags only blocks past "
            f"them -1), got {experts}"
        )
    steps = max((t.step for t in tiles), default=-1) + 1
    fig, ax = figure_and_ax(ax, (min(2 + 1.1 * num_programs, 12), 0.9 + 0.45 * max(steps, 1)))
    colors = expert_colors(max(experts, default=0) + 1)
    for t in tiles:
        ax.add_patch(
            mpatches.Rectangle(
                (t.program, t.step), 0.94, 0.9, facecolor=colors(experts[t.pid_m]), edgecolor="black", lw=0.8
            )
        )
        ax.text(
            t.program + 0.47,
            t.step + 0.45,
            f"tile {t.tile}\n(m{t.pid_m}, n{t.pid_n})",
            ha="center",
            va="center",
            fontsize=7,
        )
    ax.set_xlim(-0.1, num_programs)
    ax.set_ylim(max(steps, 1), -0.1)
    ax.set_xticks([p + 0.47 for p in range(num_programs)], [f"program {p}" for p in range(num_programs)], fontsize=8)
    ax.set_yticks([s + 0.45 for s in range(steps)], [f"step {s}" for s in range(steps)], fontsize=8)
    ax.set_title(
        f"{len(tiles)} tiles ({num_used_blocks} M-blocks x {num_pid_n} N-tiles) over {num_programs} "
        "programs; colour = expert of the M-block",
        fontsize=9,
    )
    return fig


def plot_swiglu_rows(inter: int, block_size_n: int, pid_n: int, *, ax=None) -> Figure:
    """The 2I rows of one expert's w1 = [gate; up], and the rows program `pid_n` of the up GEMM with the
    SwiGLU epilogue reads: BLOCK_SIZE_N/2 gate rows from pid_n * BLOCK_SIZE_N/2 and the up rows I further
    down, as one [2, BLOCK_SIZE_N/2, BLOCK_SIZE_K] box of w1 viewed [E, 2, I, H]. Rows past I in a half are
    out of the box's bounds (zero-filled).

    Raises TypeError for sizes that are not ints (numpy ints and 0-d integer tensors are); ValueError for
    inter below 1, a BLOCK_SIZE_N the epilogue does not run with (a power of two from 32 to 256), or a pid_n
    past the last N-tile; TypeError for an ax that is not a matplotlib Axes."""
    inter, block_size_n, pid_n = (
        check_int("inter", inter),
        check_int("block_size_n", block_size_n),
        check_int("pid_n", pid_n),
    )
    half = block_size_n // 2
    if inter < 1 or block_size_n not in (32, 64, 128, 256):
        raise ValueError(
            f"need inter >= 1 and a block_size_n of 32, 64, 128 or 256 (the SwiGLU epilogue halves it "
            f"into tiles of at least 16), got {inter} and {block_size_n}"
        )
    if not 0 <= pid_n < -(-inter // half):
        raise ValueError(f"pid_n must be in [0, {-(-inter // half)}) for I = {inter} in steps of {half}, got {pid_n}")
    fig, ax = figure_and_ax(ax, (9, 2.2))
    for start, name, color in ((0, "gate rows 0 .. I-1", "#8172B2"), (inter, "up rows I .. 2I-1", "#55A868")):
        ax.add_patch(mpatches.Rectangle((start, 0), inter, 1, facecolor=color, alpha=0.35, edgecolor="black"))
        ax.text(start + inter / 2, 1.15, name, ha="center", va="bottom", fontsize=8)
    lo = pid_n * half
    for start in (lo, inter + lo):
        width = min(half, inter - lo)
        ax.add_patch(mpatches.Rectangle((start, 0), width, 1, facecolor="#C44E52", edgecolor="black"))
        if width < half:  # the part of the box past the half: zero-filled by the TMA unit
            ax.add_patch(
                mpatches.Rectangle((start + width, 0), half - width, 1, fill=False, hatch="//", edgecolor="#C44E52")
            )
    ax.set_xlim(0, 2 * inter)
    ax.set_ylim(1.6, -0.2)
    ax.set_yticks([])
    ax.set_xlabel("row of w1[e] (each row is H long)")
    ax.set_title(
        f"program pid_n = {pid_n}: gate rows {lo} .. {lo + half - 1} and up rows {inter + lo} .. "
        f"{inter + lo + half - 1} (red), one tile of BLOCK_SIZE_N = {block_size_n} rows; it writes "
        f"act columns {lo} .. {min(lo + half, inter) - 1}",
        fontsize=9,
    )
    return fig


def load_persistent_experiment(path: Optional[str] = None) -> dict:
    """The committed H200 timings of per-tile against persistent launches
    (the JSON file `PERSISTENT_EXPERIMENT`; docs/experiments.md, "Persistent grouped GEMM"):
    {"environment": {...}, "rows": [{"model", "T", "gemm", "tile", "persistent", "no_flatten", "ws", ...}]}."""
    if path is None:
        from .performance import committed_result

        path = committed_result("studies", PERSISTENT_EXPERIMENT)
    with open(path) as f:
        return json.load(f)


def plot_persistent_speedup(data: dict, *, ax=None) -> Figure:
    """Per-tile time / persistent time of each GEMM in `data` (from `load_persistent_experiment`), the up
    and the down GEMM side by side for each model and T: above 1 the persistent kernel is faster."""

    def timed(value) -> bool:  # a time in ms; the experiment stores an error text for a variant that failed
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("data must be the experiment's dict with a list of rows (load_persistent_experiment())")
    rows = [
        r
        for r in data["rows"]
        if isinstance(r, dict)
        and timed(r.get("tile"))
        and timed(r.get("persistent"))
        and isinstance(r.get("model"), str)
        and r.get("gemm") in ("up", "down")
    ]
    points = list(dict.fromkeys((r["model"], r["T"]) for r in rows))
    fig, ax = figure_and_ax(ax, (10, 3.2))
    ratios = []
    for gemm, shift, color in (("up", -0.2, "#4C72B0"), ("down", 0.2, "#DD8452")):
        xs, ys = [], []
        for i, point in enumerate(points):
            for r in rows:
                if (r["model"], r["T"]) == point and r["gemm"] == gemm:
                    xs.append(i + shift)
                    ys.append(r["tile"] / r["persistent"])
        ax.bar(xs, ys, width=0.38, color=color, label=f"{gemm} GEMM")
        ratios += ys
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(points)), [f"{m.split('-')[0]}\nT={t}" for m, t in points], fontsize=8)
    ax.set_ylim(min(0.75, min(ratios, default=1) - 0.05), max(1.15, max(ratios, default=1) + 0.05))
    ax.set_ylabel("per-tile ms / persistent ms")
    ax.legend(fontsize=8, loc="upper left")
    env = data.get("environment", {})
    ax.set_title(
        f"persistent vs one program per tile, same config ({env.get('device', '?')}, Triton "
        f"{env.get('triton', '?')}; committed)",
        fontsize=9,
    )
    return fig


def load_prefill_anatomy(path: Optional[str] = None) -> dict:
    """The committed H200 measurement of where prefill GEMM time goes
    (the JSON file `PREFILL_ANATOMY`; docs/experiments.md, "Where prefill time goes"): {"environment": {...}, "rows":
    [{"model", "T", "gemm", "tflops_uniform", "tflops_balanced", "tflops_bmm", "blocks": {"uniform", "balanced"},
    ...}]}, TFLOP/s counting real rows only: the benchmark's routing (padded M-blocks), a routing with exactly T*k/E
    rows per expert (no padding), and cuBLAS's batched matmul on that padding-free problem."""
    if path is None:
        from .performance import committed_result

        path = committed_result("studies", PREFILL_ANATOMY)
    with open(path) as f:
        return json.load(f)


def plot_prefill_anatomy(data: dict, *, ax=None) -> Figure:
    """TFLOP/s of each GEMM in `data` (from `load_prefill_anatomy`) three ways side by side: moe-lab on the
    benchmark's routing, moe-lab without padding, cuBLAS bmm without padding."""
    kinds = (
        ("tflops_uniform", "moe-lab, benchmark routing (padded blocks)", "#4C72B0"),
        ("tflops_balanced", "moe-lab, T*k/E rows per expert (no padding)", "#55A868"),
        ("tflops_bmm", "cuBLAS bmm, no padding", "#8C8C8C"),
    )
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("data must be the experiment's dict with a list of rows (load_prefill_anatomy())")
    rows = [
        r
        for r in data["rows"]
        if isinstance(r, dict)
        and all(isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) for key, _, _ in kinds)
    ]
    fig, ax = figure_and_ax(ax, (11, 3.8))
    for j, (key, label, color) in enumerate(kinds):
        ax.bar(
            [i + (j - 1) * 0.27 for i in range(len(rows))], [r[key] for r in rows], width=0.27, color=color, label=label
        )
    ax.set_xticks(
        range(len(rows)),
        [f"{str(r.get('model', '?')).split('-')[0]} {r.get('gemm', '?')}\nT={r.get('T', '?')}" for r in rows],
        fontsize=7,
    )
    ax.set_ylabel("TFLOP/s (real rows)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    env = data.get("environment", {})
    ax.set_title(
        f"where prefill GEMM time goes ({env.get('device', '?')}, Triton {env.get('triton', '?')}; committed)",
        fontsize=9,
    )
    return fig


def load_fold_tails(path: Optional[str] = None) -> dict:
    """The committed H200 measurement of folded tails (the JSON file `FOLD_TAILS`; docs/experiments.md,
    "Folded tails"): {"device", "torch", "triton", "rows": [{"model", "T",
    "up": {"ms": {variant: ms}, "bitwise_per_tile": {...}}, "down": {...}}]}; variants "shipped", "per tile",
    "fold 32 s3", "fold 32 s4", "fold 64 s3", "fold 64 s4" (folded rows, pipeline stages)."""
    if path is None:
        from .performance import committed_result

        path = committed_result("studies", FOLD_TAILS)
    with open(path) as f:
        return json.load(f)


def plot_fold_tails(data: dict, *, ax=None) -> Figure:
    """Each GEMM's time in `data` (from `load_fold_tails`) over the shipped config's: one program per tile,
    and per tile with 64 folded rows (the faster of 3 and 4 stages). Below 1 is faster."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("data must be the experiment's dict with a list of rows (load_fold_tails())")
    rows = data["rows"]
    fig, ax = figure_and_ax(ax, (12, 3.4))
    kinds = (("per tile", "one program per tile", "#8C8C8C"), ("fold 64", "per tile, 64 folded rows", "#55A868"))
    labels, values, x = [], [], 0
    for r in rows:
        for gemm in ("up", "down"):
            ms = r[gemm]["ms"]
            for j, (kind, label, color) in enumerate(kinds):
                value = min(v for name, v in ms.items() if name.startswith(kind)) / ms["shipped"]
                ax.bar(x + (j - 0.5) * 0.4, value, width=0.4, color=color, label=label if x == 0 else None)
                values.append(value)
            labels.append(f"{str(r['model']).split('-')[0]}\n{gemm}, T={r['T']}")
            x += 1
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(min(0.8, min(values, default=1) - 0.05), max(1.3, max(values, default=1) + 0.05))
    ax.set_ylabel("ms / shipped config's ms")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(
        f"folded tails against the shipped configs ({data.get('device', '?')}, Triton "
        f"{data.get('triton', '?')}; committed)",
        fontsize=9,
    )
    return fig
