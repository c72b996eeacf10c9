"""Pictures of the grouped matmul's launch grid: which program computes which (M-block, N-block) tile.

The grid is 1-D: program `pid` computes tile (pid_m, pid_n) with GROUP_SIZE_M ordering, exactly as
`moe_lab/_kernels/grouped_matmul.py` does: programs walk down GROUP_SIZE_M M-blocks of one N column
before moving to the next column, so neighbouring programs reuse the same weight tiles while they are in L2.

    order = tile_order(num_m_blocks, num_n_blocks, GROUP_SIZE_M)     # [M-blocks, N-blocks] program ids
    fig = plot_tile_map(routing, n=N, block_size_n=64, group_size_m=4)
    tiles_explorer(topk_ids, num_experts=E, n=N, k=K)                 # BLOCK_SIZE_M/N/K, GROUP_SIZE_M
    tiles_snapshot(topk_ids, E, n=N, k=K, **first_state)              # the widget's picture, without a widget
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch
import triton
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from mpl_toolkits.axes_grid1 import make_axes_locatable

from ..._validate import check_positive_int
from ...align import AlignedRouting, max_num_tokens_padded, moe_align
from ...plan import tile_of_program
from ._common import (
    check_choice,
    check_drawable,
    expert_colors,
    figure_and_ax,
    int_list,
    require_expert_sorted,
    show_figure,
)

# What plot_tile_map draws at most: a Python step per tile, a tick per N-block and a line per group. Timed:
# the largest allowed draws in about 5 s; notebook 03's widget at full size (mixtral, T = 1024,
# BLOCK_SIZE_M = BLOCK_SIZE_N = 16) reaches 136 x 1792 tiles.
MAX_MAP_TILES = 2**18
MAX_MAP_BLOCKS = 2048  # M-blocks or N-blocks
MAX_MAP_LABELS = 4096  # a text per tile, where there are at most max_labels tiles


def _check_map_drawable(num_m: int, num_n: int, m_name: str) -> None:
    """ValueError ("too large to draw") for a tile map of more M-blocks, N-blocks or tiles than plot_tile_map
    draws; `m_name` names the argument the M-blocks come from."""
    check_drawable(m_name, num_m, MAX_MAP_BLOCKS, "M-blocks")
    check_drawable("n", num_n, MAX_MAP_BLOCKS, "N-blocks (cdiv(n, block_size_n))")
    check_drawable("n", num_m * num_n, MAX_MAP_TILES, f"tiles ({num_m} M-blocks x {num_n} N-blocks)")


def program_tile(pid: int, num_m_blocks: int, num_n_blocks: int, group_size_m: int) -> tuple[int, int]:
    """(pid_m, pid_n) of program `pid` under GROUP_SIZE_M ordering (the kernel's own arithmetic,
    `moe_lab.plan.tile_of_program`). Raises TypeError / ValueError for counts that are not ints >= 0, a
    group_size_m < 1 or a pid outside [0, num_m_blocks * num_n_blocks)."""
    num_m_blocks, num_n_blocks, group_size_m = _check_grid(num_m_blocks, num_n_blocks, group_size_m)
    pid = check_positive_int("pid", pid, minimum=0)
    if pid >= num_m_blocks * num_n_blocks:
        raise ValueError(
            f"pid must be in [0, {num_m_blocks * num_n_blocks}) (num_m_blocks * num_n_blocks = "
            f"{num_m_blocks} * {num_n_blocks}), got {pid}"
        )
    return tile_of_program(pid, num_m_blocks, num_n_blocks, group_size_m)


def _check_grid(num_m_blocks, num_n_blocks, group_size_m) -> tuple[int, int, int]:
    """The grid's sizes as ints: block counts >= 0, group_size_m >= 1 (TypeError / ValueError otherwise)."""
    return (
        check_positive_int("num_m_blocks", num_m_blocks, minimum=0),
        check_positive_int("num_n_blocks", num_n_blocks, minimum=0),
        check_positive_int("group_size_m", group_size_m),
    )


def tile_order(num_m_blocks: int, num_n_blocks: int, group_size_m: int) -> np.ndarray:
    """Program id of every tile. Returns [num_m_blocks, num_n_blocks] int64; each id appears once.
    Raises TypeError / ValueError for block counts that are not ints >= 0 or a group_size_m < 1."""
    num_m_blocks, num_n_blocks, group_size_m = _check_grid(num_m_blocks, num_n_blocks, group_size_m)
    order = np.full((num_m_blocks, num_n_blocks), -1, dtype=np.int64)
    for pid in range(num_m_blocks * num_n_blocks):
        order[tile_of_program(pid, num_m_blocks, num_n_blocks, group_size_m)] = pid
    return order


def tile_report(routing: AlignedRouting, n: int, k: int, block_size_n: int, block_size_k: int) -> str:
    """One line: programs launched, programs with work, K steps per program, rows per program. Raises
    TypeError for a routing that is not an AlignedRouting, ValueError for a slot-order routing, and
    TypeError / ValueError for n, k not ints >= 0 or block sizes not ints >= 1."""
    require_expert_sorted(routing, "tile_report")
    n, k = check_positive_int("n", n, minimum=0), check_positive_int("k", k, minimum=0)
    block_size_n = check_positive_int("block_size_n", block_size_n)
    block_size_k = check_positive_int("block_size_k", block_size_k)
    num_n_blocks = triton.cdiv(n, block_size_n)
    launched = routing.max_num_m_blocks * num_n_blocks
    used_blocks = int((routing.expert_ids >= 0).sum().item())
    working = used_blocks * num_n_blocks
    return (
        f"grid = {routing.max_num_m_blocks} M-blocks x {num_n_blocks} N-blocks = {launched} programs; "
        f"{working} compute a tile, {launched - working} exit at once (expert_ids = -1); each runs "
        f"{triton.cdiv(k, block_size_k)} K step(s) of BLOCK_SIZE_K={block_size_k}"
    )


def plot_tile_map(
    routing: AlignedRouting,
    n: int,
    block_size_n: int,
    group_size_m: int,
    ax: Optional[Axes] = None,
    title: Optional[str] = None,
    max_labels: int = 400,
) -> Figure:
    """The output tiles of one grouped matmul, colored by launch order, with the expert of each M-block.

    Rows are M-blocks (BLOCK_SIZE_M = routing.block_size_m rows of one expert each), columns are N-blocks.
    A cell's color and number give the program id that computes it (lower = launched earlier); a strip on
    the left gives each M-block's expert (`expert_ids`); blocks tagged -1 are grey with an "x": their
    programs exit without work.

    Args:
        routing: an AlignedRouting. n: N, the output columns (2I for the up projection, H for down).
        block_size_n: BLOCK_SIZE_N. group_size_m: GROUP_SIZE_M.
        ax: draw here instead of on a new Figure. max_labels: the most tiles that get a number.
    Returns:
        The matplotlib Figure.
    Raises:
        TypeError for a routing that is not an AlignedRouting; ValueError for a slot-order routing
        (`moe_lab.align.slot_order_routing`); TypeError / ValueError for an n < 0, a block_size_n < 1, a
        group_size_m < 1 or a max_labels < 0; ValueError ("too large to draw") for more than MAX_MAP_BLOCKS
        M-blocks or N-blocks, MAX_MAP_TILES tiles or (max_labels) MAX_MAP_LABELS labelled tiles; TypeError
        for an ax that is not a matplotlib Axes.
    """
    require_expert_sorted(routing, "plot_tile_map")
    n, block_size_n = check_positive_int("n", n, minimum=0), check_positive_int("block_size_n", block_size_n)
    max_labels = check_positive_int("max_labels", max_labels, minimum=0)
    num_m = routing.max_num_m_blocks
    num_n = triton.cdiv(n, block_size_n)
    _check_map_drawable(num_m, num_n, "routing")
    labelled = num_m * num_n <= max_labels  # a number in each tile
    if labelled:
        check_drawable("max_labels", num_m * num_n, MAX_MAP_LABELS, "tile labels")
    order = tile_order(num_m, num_n, group_size_m).astype(float)
    block_experts = routing.expert_ids.cpu().numpy()
    idle = block_experts < 0
    fig, ax = figure_and_ax(ax, (min(12, 2.5 + 0.5 * num_n), min(9, 1.5 + 0.3 * num_m)))
    shown = np.where(idle[:, None], np.nan, order)
    cmap = ListedColormap(["white"]) if num_m * num_n == 0 else None
    image = ax.imshow(
        shown, cmap=cmap or "viridis", aspect="auto", interpolation="nearest", vmin=0, vmax=max(order.size - 1, 1)
    )
    ax.set_facecolor((0.85, 0.85, 0.85))
    if labelled:
        for (i, j), pid in np.ndenumerate(order):
            ax.text(
                j,
                i,
                "x" if idle[i] else str(int(pid)),
                ha="center",
                va="center",
                fontsize=7,
                color="grey" if idle[i] else ("white" if pid < 0.6 * order.size else "black"),
            )
    for g in range(0, num_m + 1, group_size_m):
        ax.axhline(g - 0.5, color="red", linewidth=1.2)
    ax.set_xlabel(f"N-block (BLOCK_SIZE_N = {block_size_n}, N = {n})")
    ax.set_xticks(range(num_n))
    ax.set_yticks(range(num_m) if num_m <= 40 else [])
    ax.set_title(title or f"program id per tile, GROUP_SIZE_M = {group_size_m} (red lines: groups)", fontsize=9)
    fig.colorbar(image, ax=ax, label="launch order (program id)")

    strip = make_axes_locatable(ax).append_axes("left", size=0.3, pad=0.45)
    colors = expert_colors(routing.num_experts)
    strip_cmap = ListedColormap([(0.85, 0.85, 0.85)] + list(colors.colors))
    strip.imshow(
        (block_experts + 1)[:, None],
        cmap=strip_cmap,
        vmin=0,
        vmax=routing.num_experts,
        aspect="auto",
        interpolation="nearest",
    )
    if num_m <= 40:
        for i, e in enumerate(block_experts):
            strip.text(0, i, "-" if e < 0 else str(e), ha="center", va="center", fontsize=7)
    strip.set_xticks([0], ["expert"])
    strip.set_yticks([])
    strip.set_ylabel(f"M-block (BLOCK_SIZE_M = {routing.block_size_m}) and its expert")
    return fig


def _tiles_view(
    routing: AlignedRouting, n: int, k: int, block_size_n: int, block_size_k: int, group_size_m: int
) -> tuple[Figure, str]:
    """The picture and the grid report `tiles_explorer` shows for one state."""
    return (
        plot_tile_map(routing, n, block_size_n, group_size_m),
        tile_report(routing, n, k, block_size_n, block_size_k),
    )


def tiles_snapshot(
    topk_ids: torch.Tensor,
    num_experts: int,
    n: int,
    k: int,
    *,
    block_size_m: int,
    block_size_n: int,
    block_size_k: int,
    group_size_m: int,
    align: Callable[..., AlignedRouting] = moe_align,
) -> Figure:
    """What `tiles_explorer` shows for one state, without a widget: the static copy below a widget cell.

    Takes the widget's arguments (pass the same ones, e.g. from one dict, so the copy shows the widget's
    first state); prints the grid report the widget shows above its picture and returns the tile map.
    """
    figure, report = _tiles_view(
        align(topk_ids, num_experts, block_size_m), n, k, block_size_n, block_size_k, group_size_m
    )
    print(report)
    return figure


def tiles_explorer(
    topk_ids: torch.Tensor,
    num_experts: int,
    n: int,
    k: int,
    *,
    block_sizes: Sequence[int] = (16, 32, 64, 128),
    group_sizes: Sequence[int] = (1, 2, 4, 8),
    block_size_m: int = 16,
    block_size_n: int = 32,
    block_size_k: int = 32,
    group_size_m: int = 4,
    align: Callable[..., AlignedRouting] = moe_align,
):
    """A widget: BLOCK_SIZE_M/N/K and GROUP_SIZE_M sliders redraw the tile map and report the grid.

    Args:
        topk_ids: [T, k] int32 routing to schedule. num_experts: E. n, k: the GEMM's N and K.
        block_sizes, group_sizes: the choices offered; the other arguments are the first state
            (`tiles_snapshot` with the same arguments draws it without a widget).
        align: the function that builds the schedule, `moe_align` by default.
    Returns:
        ipywidgets.VBox with attributes `controls` (dict of SelectionSliders by name), `output`,
        `summary` (ipywidgets.HTML with the program count), `figure` and `routing`.
    Raises:
        TypeError unless block_sizes and group_sizes are sequences of ints (not a str); ValueError for one
        that is empty, or a first state not among its slider's choices (block_size_m/n/k in block_sizes,
        group_size_m in group_sizes); ValueError ("too large to draw") where the sliders' smallest block
        size would give a map `plot_tile_map` refuses; and as `tiles_snapshot` for the rest.
    """
    import ipywidgets as widgets

    block_sizes = int_list("block_sizes", block_sizes, 1)
    group_sizes = int_list("group_sizes", group_sizes, 1)
    # the sliders would raise a TraitError naming neither the argument nor the choices
    for name, value, options in (
        ("block_size_m", block_size_m, block_sizes),
        ("block_size_n", block_size_n, block_sizes),
        ("block_size_k", block_size_k, block_sizes),
        ("group_size_m", group_size_m, group_sizes),
    ):
        check_choice(name, value, options)
    if isinstance(topk_ids, torch.Tensor):  # else align raises for it; the widget's largest map, checked now
        smallest = min(block_sizes)
        slots = topk_ids.numel()
        num_experts = check_positive_int("num_experts", num_experts)
        num_m = max_num_tokens_padded(slots, num_experts, smallest) // smallest
        _check_map_drawable(num_m, triton.cdiv(check_positive_int("n", n, minimum=0), smallest), "topk_ids")

    def slider(name, options, value):
        return widgets.SelectionSlider(
            options=list(options),
            value=value,
            description=name,
            continuous_update=False,
            style={"description_width": "initial"},
        )

    controls = {
        "BLOCK_SIZE_M": slider("BLOCK_SIZE_M", block_sizes, block_size_m),
        "BLOCK_SIZE_N": slider("BLOCK_SIZE_N", block_sizes, block_size_n),
        "BLOCK_SIZE_K": slider("BLOCK_SIZE_K", block_sizes, block_size_k),
        "GROUP_SIZE_M": slider("GROUP_SIZE_M", group_sizes, group_size_m),
    }
    output = widgets.Output()
    summary = widgets.HTML()
    box = widgets.VBox(
        [widgets.HBox(list(controls.values())[:2]), widgets.HBox(list(controls.values())[2:]), summary, output]
    )
    box.controls, box.output, box.summary = controls, output, summary
    cache = {}

    def redraw(_change=None):
        bm = controls["BLOCK_SIZE_M"].value
        if bm not in cache:
            cache[bm] = align(topk_ids, num_experts, bm)
        box.routing = cache[bm]
        bn, bk, g = controls["BLOCK_SIZE_N"].value, controls["BLOCK_SIZE_K"].value, controls["GROUP_SIZE_M"].value
        box.figure, report = _tiles_view(box.routing, n, k, bn, bk, g)
        summary.value = f"<code>{report}</code>"
        show_figure(output, box.figure)

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    return box
