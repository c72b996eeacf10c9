"""Pictures of tensor descriptors: the box a descriptor load copies, its out-of-bounds zero fill, the 3-D
box over expert weights, and how M-tiles meet expert boundaries in the sorted rows.

Every plot function returns a matplotlib `Figure` and takes an optional `ax` to draw into. Widget
builders (ipywidgets, imported only when called) redraw on release (`continuous_update=False`) and draw
their default state at once.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import matplotlib.patches as mpatches
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..._validate import check_positive_int, is_bool, type_name
from ._common import as_list, check_choice, check_drawable, check_has_data, figure_and_ax, int_list, show_figure

INSIDE = "#4C72B0"  # box part inside the tensor: copied from global memory
OUTSIDE = "#DD8452"  # box part outside the tensor: zero-filled on load, dropped on store
PADDING = "#BBBBBB"  # padding rows of the expert-sorted layout
CROSSING = "#C44E52"  # a tile that spans two experts

# What the pictures draw at most (one matplotlib artist per element or tile: past these a call runs for
# minutes). Timed: each limit draws in about 1-2 seconds; the notebooks' calls and the widgets' ranges
# stay far below them.
MAX_VIEW_SIDE = 1024  # rows or columns of plot_descriptor_box's view (tensor and boxes): one grid line each
MAX_BOX_CELLS = 1024  # elements of all boxes together: one patch each (a 32 x 32 box)
MAX_EXPERT_PANELS = 256  # plot_expert_weights_box's panels
MAX_EXPERT_TILES = 512  # plot_expert_tiles' tiles (an outline and a label each) and experts (a label each)
MAX_EXPERT_ROWS = 2**20  # plot_expert_tiles' rows (one array entry each)


def box_overlap(shape: Sequence[int], block_shape: Sequence[int], offsets: Sequence[int]) -> Tuple[int, int]:
    """Elements of a descriptor box that fall inside / outside a tensor.

    Args:
        shape: the descriptor's shape, any rank (elements).
        block_shape: the box (block shape), same rank.
        offsets: the box's first element in each dimension (may be negative or past the end).
    Returns:
        (inside, outside) element counts; `outside` elements load as zero.
    Raises:
        TypeError unless the three are sequences of ints (not a str); ValueError unless they have one rank,
        shape holds sizes >= 0 and block_shape sizes >= 1.
    """
    shape = int_list("shape", shape, 0, what="sizes")
    block_shape = int_list("block_shape", block_shape, 1, what="sizes")
    offsets = int_list("offsets", offsets, None)
    if not len(shape) == len(block_shape) == len(offsets):
        raise ValueError(
            f"shape, block_shape and offsets must have one rank, got {len(shape)}, {len(block_shape)} and "
            f"{len(offsets)} entries"
        )
    inside = 1
    for size, block, off in zip(shape, block_shape, offsets):
        inside *= max(0, min(off + block, size) - max(off, 0))
    total = int(np.prod(block_shape))
    return inside, total - inside


def _box_values(values, bm: int, bn: int) -> np.ndarray:
    """`values` (an array, tensor or nested list) as a [bm, bn] numpy array of numbers (TypeError / ValueError
    otherwise: each is written in a cell with "{v:g}", which a str or None would fail halfway through)."""
    if hasattr(values, "detach"):
        check_has_data("values", values)
        values = values.detach().cpu()
    try:
        vals = np.asarray(values)
    except ValueError:  # ragged rows
        raise ValueError(f"values must be [BLOCK_M, BLOCK_N] = [{bm}, {bn}] numbers, got ragged rows") from None
    if vals.shape != (bm, bn):
        raise ValueError(
            f"values must be [BLOCK_M, BLOCK_N] = [{bm}, {bn}] (what the first box loaded), got shape "
            f"{tuple(vals.shape)}"
        )
    if vals.dtype.kind not in "biuf":  # b: bools print as 0/1 like a loaded mask
        raise TypeError(f"values must hold numbers (what the first box loaded), got dtype {vals.dtype}")
    return vals


def plot_descriptor_box(
    shape: Tuple[int, int],
    block_shape: Tuple[int, int],
    offsets: Sequence[Tuple[int, int]] = ((0, 0),),
    *,
    values=None,
    title: Optional[str] = None,
    ax=None,
) -> Figure:
    """A 2-D tensor as a grid of elements with one or more descriptor boxes drawn over it.

    Args:
        shape: (rows, cols) of the tensor the descriptor describes (its `shape`), in elements.
        block_shape: (BLOCK_M, BLOCK_N), the descriptor's block shape.
        offsets: list of (row, col) box origins, as passed to `desc.load([row, col])`.
        values: optional [BLOCK_M, BLOCK_N] array/tensor: what the first box loaded; its values are
            written in the box cells (zeros where the box is out of bounds).
        title: optional title; the default names shape, block and out-of-bounds count.
        ax: optional matplotlib Axes to draw into.
    Returns:
        The Figure. The tensor is grey, in-bounds box parts blue, out-of-bounds parts orange (hatched).
    Raises:
        TypeError unless shape, block_shape and each offset are sequences of 2 ints (not a str) and offsets a
        sequence of them; ValueError for a shape size < 0, a block size < 1, no offsets, or values that are
        not [BLOCK_M, BLOCK_N]; TypeError for values that are not numbers, ValueError for values on the meta
        device; ValueError ("too large to draw") for a view (tensor and boxes) over MAX_VIEW_SIDE rows or
        columns, or boxes of more than MAX_BOX_CELLS elements in all; TypeError for an ax that is not a
        matplotlib Axes.
    """
    rows, cols = shape = tuple(int_list("shape", shape, 0, what="2 ints (rows, cols)", length=2))
    bm, bn = block_shape = tuple(int_list("block_shape", block_shape, 1, what="2 ints (BLOCK_M, BLOCK_N)", length=2))
    offsets = [
        tuple(int_list(f"offsets[{i}]", o, None, what="2 ints (row, col)", length=2))
        for i, o in enumerate(as_list("offsets", offsets, "(row, col) box origins"))
    ]
    if not offsets:
        raise ValueError("offsets must hold at least one (row, col) box origin, got none")
    check_drawable("shape", max(rows, cols), MAX_VIEW_SIDE, "rows or columns (one grid line each)")
    check_drawable("block_shape", len(offsets) * bm * bn, MAX_BOX_CELLS, "box elements (offsets x BLOCK_M x BLOCK_N)")
    lo_r = min([0] + [r for r, _ in offsets])
    lo_c = min([0] + [c for _, c in offsets])
    hi_r = max([rows] + [r + bm for r, _ in offsets])
    hi_c = max([cols] + [c + bn for _, c in offsets])
    width = hi_c - lo_c
    height = hi_r - lo_r
    # boxes far from the tensor: a view too wide to draw (matplotlib's transforms fail on huge offsets)
    check_drawable("offsets", max(width, height), MAX_VIEW_SIDE, "rows or columns of the view (tensor and boxes)")
    if values is not None:  # checked before drawing: a smaller array would fail halfway through the cells
        vals = _box_values(values, bm, bn)
    fig, ax = figure_and_ax(ax, (min(11, 1.2 + 0.32 * width), min(8, 1.0 + 0.32 * height)))
    ax.add_patch(mpatches.Rectangle((0, 0), cols, rows, facecolor="#EEEEEE", edgecolor="black", lw=1.5))
    for r in range(rows + 1):
        ax.plot([0, cols], [r, r], color="#CCCCCC", lw=0.5)
    for c in range(cols + 1):
        ax.plot([c, c], [0, rows], color="#CCCCCC", lw=0.5)
    total_out = 0
    for i, (r0, c0) in enumerate(offsets):
        for r in range(r0, r0 + bm):
            for c in range(c0, c0 + bn):
                inside = 0 <= r < rows and 0 <= c < cols
                ax.add_patch(
                    mpatches.Rectangle(
                        (c, r),
                        1,
                        1,
                        facecolor=INSIDE if inside else OUTSIDE,
                        alpha=0.55,
                        hatch=None if inside else "//",
                        lw=0,
                    )
                )
        ax.add_patch(mpatches.Rectangle((c0, r0), bn, bm, fill=False, edgecolor="black", lw=2))
        if len(offsets) > 1:
            ax.text(c0 + bn / 2, r0 + bm / 2, f"box {i}\n[{r0}, {c0}]", ha="center", va="center", fontsize=8)
        total_out += box_overlap(shape, block_shape, (r0, c0))[1]
    if values is not None:
        r0, c0 = offsets[0]
        for i in range(bm):
            for j in range(bn):
                v = vals[i, j]
                ax.text(
                    c0 + j + 0.5,
                    r0 + i + 0.5,
                    f"{v:g}",
                    ha="center",
                    va="center",
                    fontsize=6 if abs(v) >= 100 else 7,
                    color="black",
                )
    ax.set_xlim(lo_c - 0.5, hi_c + 0.5)
    ax.set_ylim(hi_r + 0.5, lo_r - 0.5)
    ax.set_aspect("equal")
    ax.set_xlabel("column (elements, last dimension: stride 1)")
    ax.set_ylabel("row")
    ax.legend(
        handles=[
            mpatches.Patch(color="#EEEEEE", label=f"tensor {rows}x{cols}"),
            mpatches.Patch(color=INSIDE, alpha=0.55, label="box inside: copied"),
            mpatches.Patch(facecolor=OUTSIDE, alpha=0.55, hatch="//", label="box outside: loads as 0"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    ax.set_title(
        title
        or f"descriptor shape {list(shape)}, block shape {list(block_shape)}: {total_out} element(s) out of bounds",
        fontsize=9,
    )
    return fig


def plot_expert_weights_box(
    num_experts: int, n: int, k: int, block_shape: Tuple[int, int, int], offsets: Tuple[int, int, int], *, ax=None
) -> Figure:
    """A 3-D descriptor over expert weights w [E, N, K]: one panel per expert, the box in one of them.

    Args:
        num_experts, n, k: the weight tensor's shape [E, N, K] (elements).
        block_shape: (1, BLOCK_SIZE_N, BLOCK_SIZE_K); the leading 1 keeps a box inside one expert.
        offsets: (expert, n0, k0) as passed to `w_desc.load([expert, n0, k0])`.
        ax: optional Axes; the panels are laid out side by side in it.
    Returns:
        The Figure.
    Raises:
        TypeError / ValueError unless num_experts, n and k are ints >= 1, block_shape 3 ints >= 1 and offsets
        3 ints (sequences, not a str); ValueError ("too large to draw") for more than MAX_EXPERT_PANELS
        experts, and for an n0 / k0 that puts the box more than one panel size away from w[e].
    """
    num_experts = check_positive_int("num_experts", num_experts)
    n, k = check_positive_int("n", n), check_positive_int("k", k)
    be, bn, bk = int_list("block_shape", block_shape, 1, what="3 ints (1, BLOCK_SIZE_N, BLOCK_SIZE_K)", length=3)
    e0, n0, k0 = int_list("offsets", offsets, None, what="3 ints (expert, n0, k0)", length=3)
    check_drawable("num_experts", num_experts, MAX_EXPERT_PANELS, "experts (one panel each)")
    for name, off, block, size in (("offsets[1] (n0)", n0, bn, n), ("offsets[2] (k0)", k0, bk, k)):
        if off + block <= -size or off >= 2 * size:  # far off: nothing to see, and a view matplotlib can't scale
            raise ValueError(
                f"{name} must put the box within one panel size of w[e], in ({-size - block}, {2 * size}), got {off}"
            )
    fig, ax = figure_and_ax(ax, (min(12, 1.5 + num_experts * (k / max(n, k)) * 2.2), 3.4))
    gap = max(1, k // 4)
    for e in range(num_experts):
        x0 = e * (k + gap)
        ax.add_patch(mpatches.Rectangle((x0, 0), k, n, facecolor="#EEEEEE", edgecolor="black", lw=1))
        ax.text(x0 + k / 2, -0.6, f"w[{e}]", ha="center", va="bottom", fontsize=9)
        if e0 <= e < e0 + be:
            in_n = max(0, min(n0 + bn, n) - max(n0, 0))
            in_k = max(0, min(k0 + bk, k) - max(k0, 0))
            ax.add_patch(mpatches.Rectangle((x0 + k0, n0), bk, bn, facecolor=OUTSIDE, alpha=0.4, hatch="//", lw=0))
            ax.add_patch(mpatches.Rectangle((x0 + max(k0, 0), max(n0, 0)), in_k, in_n, facecolor=INSIDE, lw=0))
            ax.add_patch(mpatches.Rectangle((x0 + k0, n0), bk, bn, fill=False, edgecolor="black", lw=2))
    ax.legend(
        handles=[
            mpatches.Patch(color=INSIDE, label="box inside w[e]: copied"),
            mpatches.Patch(facecolor=OUTSIDE, alpha=0.4, hatch="//", label="past N: loads as 0"),
        ],
        loc="lower right",
        fontsize=7,
    )
    ax.set_xlim(-gap / 2, num_experts * (k + gap))
    ax.set_ylim(max(n, n0 + bn) + 0.5, -max(2.0, n / 10))
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_ylabel("N (rows of one expert)")
    ax.set_xlabel("K within each expert (stride 1)")
    ax.set_title(f"w [E={num_experts}, N={n}, K={k}], block [{be}, {bn}, {bk}] at [{e0}, {n0}, {k0}]", fontsize=9)
    return fig


def _check_counts(counts) -> list:
    """`counts` (a list, tuple, array or 1-D tensor of rows per expert) as a list of ints >= 0."""
    return int_list("counts", counts, 0, what="ints (rows per expert, [E])")


def sorted_row_experts(counts: Sequence[int], block_size_m: int, *, packed: bool = False) -> np.ndarray:
    """The expert of every row of the expert-sorted layout, -1 for padding rows.

    Args:
        counts: [E] rows (token slots) routed to each expert.
        block_size_m: BLOCK_SIZE_M; with packed=False each expert is padded to a multiple of it.
        packed: no padding between experts (the layout `torch._grouped_mm` reads); the last tile is
            padded to BLOCK_SIZE_M.
    Returns:
        int array of length = rows in use, rounded up to BLOCK_SIZE_M.
    Raises:
        TypeError / ValueError unless counts is a sequence of ints >= 0, block_size_m an int >= 1 and packed
        a bool.
    """
    counts = _check_counts(counts)
    block_size_m = check_positive_int("block_size_m", block_size_m)
    if not is_bool(packed) or getattr(packed, "ndim", 0) != 0:
        raise TypeError(f"packed must be True or False, got {type_name(packed)}")
    rows = []
    for e, c in enumerate(counts):
        rows += [e] * int(c)
        if not packed:
            rows += [-1] * ((-int(c)) % block_size_m)
    rows += [-1] * ((-len(rows)) % block_size_m)
    return np.array(rows, dtype=np.int64)


def crossing_tiles(counts: Sequence[int], block_size_m: int, *, packed: bool = False):
    """Indices of the M-tiles whose rows belong to more than one expert (padding rows ignored). Raises
    TypeError / ValueError as `sorted_row_experts`."""
    rows = sorted_row_experts(counts, block_size_m, packed=packed)
    tiles = rows.reshape(-1, block_size_m)
    return [i for i, t in enumerate(tiles) if len(set(t[t >= 0].tolist())) > 1]


def _check_expert_tiles_drawable(counts: list, block_size_m: int) -> None:
    """ValueError ("too large to draw") for more experts, tiles or rows than `plot_expert_tiles` draws, counted
    before any row is made (the padded layout: it holds the most rows and tiles of the two)."""
    check_drawable("counts", len(counts), MAX_EXPERT_TILES, "experts (a label each)")
    tiles = sum(-(-c // block_size_m) for c in counts)
    check_drawable("counts", tiles * block_size_m, MAX_EXPERT_ROWS, f"rows at BLOCK_SIZE_M = {block_size_m}")
    check_drawable("counts", tiles, MAX_EXPERT_TILES, f"tiles at BLOCK_SIZE_M = {block_size_m} (a box each)")


def plot_expert_tiles(counts: Sequence[int], block_size_m: int, *, packed: bool = False, ax=None) -> Figure:
    """The expert-sorted rows as a strip coloured by expert, with the M-tiles (descriptor boxes of
    BLOCK_SIZE_M rows) outlined. Tiles spanning two experts are outlined in red.

    Args:
        counts: [E] rows routed to each expert (e.g. `AlignedRouting.counts`).
        block_size_m: BLOCK_SIZE_M, the rows of one tile / one descriptor box.
        packed: False: moe-lab's layout (each expert padded to BLOCK_SIZE_M, grey rows are padding);
            True: experts packed back to back, so tiles can span a boundary.
        ax: optional Axes.
    Returns:
        The Figure.
    Raises:
        TypeError / ValueError as `sorted_row_experts`; ValueError ("too large to draw") for more than
        MAX_EXPERT_TILES experts or tiles, or MAX_EXPERT_ROWS rows; TypeError for an ax that is not an Axes.
    """
    counts = _check_counts(counts)  # a list: an iterator given is read once
    _check_expert_tiles_drawable(counts, check_positive_int("block_size_m", block_size_m))
    rows = sorted_row_experts(counts, block_size_m, packed=packed)
    num_experts = len(counts)
    fig, ax = figure_and_ax(ax, (10, 1.9))
    palette = ["#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#DA8BC3", "#8C8C8C", "#937860"]
    colors = [PADDING] + [palette[e % len(palette)] for e in range(num_experts)]
    ax.imshow(
        (rows + 1)[None, :],
        aspect="auto",
        cmap=ListedColormap(colors),
        vmin=-0.5,
        vmax=num_experts + 0.5,
        interpolation="nearest",
        extent=(0, len(rows), 1, 0),
    )
    bad = set(crossing_tiles(counts, block_size_m, packed=packed))
    for t in range(len(rows) // block_size_m):
        cross = t in bad
        ax.add_patch(
            mpatches.Rectangle(
                (t * block_size_m, 0),
                block_size_m,
                1,
                fill=False,
                edgecolor=CROSSING if cross else "black",
                lw=3 if cross else 1.2,
            )
        )
        ax.text(
            (t + 0.5) * block_size_m,
            1.25,
            f"tile {t}" + (" spans 2 experts" if cross else ""),
            ha="center",
            va="top",
            fontsize=7,
            color=CROSSING if cross else "black",
        )
    start = 0
    for e, c in enumerate(counts):
        if c:
            ax.text(start + c / 2, 0.5, f"e{e}: {c}", ha="center", va="center", fontsize=8, color="white")
        start += c if packed else c + (-c) % block_size_m
    ax.set_yticks([])
    ax.set_ylim(1.6, 0)
    ax.set_xlabel("row of the expert-sorted layout")
    pad = int((rows < 0).sum())
    layout = "packed (no padding between experts)" if packed else f"padded per expert to BLOCK_SIZE_M={block_size_m}"
    ax.set_title(f"{layout}: {len(rows)} rows, {pad} padding rows, {len(bad)} tile(s) span two experts", fontsize=9)
    return fig


def box_widget(shape: Tuple[int, int] = (12, 20), block_shape: Tuple[int, int] = (8, 8), *, itemsize: int = 4):
    """Move a descriptor box over a tensor and see which part is copied and which is zero-filled.

    Args:
        shape: (rows, cols) of the tensor, in elements.
        block_shape: initial (BLOCK_M, BLOCK_N); the dropdowns offer powers of two.
        itemsize: bytes per element; the column slider steps by 16 bytes (the alignment a descriptor
            offset in the last dimension needs).
    Returns:
        ipywidgets.VBox (sliders, a text line, an Output with the figure); `.figure` is the current
        Figure and `.summary` the HTML line, for tests.
    Raises:
        TypeError / ValueError unless shape is 2 ints >= 0 (as `plot_descriptor_box`), itemsize an int >= 1,
        and block_shape 2 ints among the dropdowns' choices: BLOCK_M in [2, 4, 8, 16], BLOCK_N in those of
        4, 8, 16, 32 that span 16 bytes or more; ValueError ("too large to draw") for a shape whose view,
        at the sliders' far ends, passes MAX_VIEW_SIDE rows or columns.
    """
    import ipywidgets as widgets

    shape = tuple(int_list("shape", shape, 0, what="2 ints (rows, cols)", length=2))
    first_bm, first_bn = int_list("block_shape", block_shape, 1, what="2 ints (BLOCK_M, BLOCK_N)", length=2)
    itemsize = check_positive_int("itemsize", itemsize)
    bm_options = [2, 4, 8, 16]
    bn_options = [o for o in (4, 8, 16, 32) if o * itemsize >= 16]
    check_choice("block_shape[0] (BLOCK_M)", first_bm, bm_options)
    check_choice(f"block_shape[1] (BLOCK_N, with itemsize {itemsize})", first_bn, bn_options)
    step = max(1, 16 // itemsize)
    rows, cols = shape
    # the view at the sliders' far ends (offsets -8 .. rows + 4 and -2 steps .. cols + 1 step, the largest box)
    reach = max(rows + 4 + max(bm_options) + 8, cols + step + max(bn_options) + 2 * step)
    check_drawable("shape", reach, MAX_VIEW_SIDE, "rows or columns of the view the sliders reach")
    row = widgets.IntSlider(value=0, min=-8, max=rows + 4, description="row offset", continuous_update=False)
    col = widgets.IntSlider(
        value=0, min=-step * 2, max=cols + step, step=step, description="col offset", continuous_update=False
    )
    bm = widgets.Dropdown(options=bm_options, value=first_bm, description="BLOCK_M")
    bn = widgets.Dropdown(options=bn_options, value=first_bn, description="BLOCK_N")
    summary = widgets.HTML()
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([row, col]), widgets.HBox([bm, bn]), summary, out])

    def draw(_=None):
        fig = plot_descriptor_box(shape, (bm.value, bn.value), [(row.value, col.value)])
        inside, outside = box_overlap(shape, (bm.value, bn.value), (row.value, col.value))
        summary.value = (
            f"box [{bm.value}, {bn.value}] at [{row.value}, {col.value}]: {inside} element(s) "
            f"copied, {outside} zero-filled (column step {step} elements = 16 bytes)"
        )
        box.figure = fig
        show_figure(out, fig)

    for w in (row, col, bm, bn):
        w.observe(draw, names="value")
    draw()
    box.summary = summary
    return box


def expert_tiles_widget(counts: Sequence[int] = (5, 0, 13, 3, 9), block_size_m: int = 4):
    """Switch between the padded and the packed expert-sorted layout and change BLOCK_SIZE_M.

    Args:
        counts: [E] rows per expert.
        block_size_m: initial BLOCK_SIZE_M, one of the dropdown's 2, 4, 8, 16.
    Returns:
        ipywidgets.VBox; `.figure` is the current Figure and `.summary` the HTML line, for tests.
    Raises:
        TypeError / ValueError unless counts is a sequence of ints >= 0 (as `sorted_row_experts`) and
        block_size_m one of the dropdown's choices; ValueError ("too large to draw") for counts that
        `plot_expert_tiles` cannot draw at BLOCK_SIZE_M = 2.
    """
    import ipywidgets as widgets

    counts = _check_counts(counts)  # a list: read at every redraw
    check_choice("block_size_m", block_size_m, [2, 4, 8, 16])
    _check_expert_tiles_drawable(counts, 2)  # the dropdown's smallest BLOCK_SIZE_M draws the most tiles
    bsm = widgets.Dropdown(options=[2, 4, 8, 16], value=block_size_m, description="BLOCK_SIZE_M")
    layout = widgets.ToggleButtons(options=["padded", "packed"], value="padded", description="layout")
    summary = widgets.HTML()
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([bsm, layout]), summary, out])

    def draw(_=None):
        packed = layout.value == "packed"
        fig = plot_expert_tiles(counts, bsm.value, packed=packed)
        rows = sorted_row_experts(counts, bsm.value, packed=packed)
        summary.value = (
            f"{layout.value}: {len(rows)} rows for {sum(counts)} routed slots "
            f"({int((rows < 0).sum())} padding rows), "
            f"{len(crossing_tiles(counts, bsm.value, packed=packed))} tile(s) span two experts"
        )
        box.figure = fig
        show_figure(out, fig)

    bsm.observe(draw, names="value")
    layout.observe(draw, names="value")
    draw()
    box.summary = summary
    return box
