"""Pictures of the aligned schedule: sorted_token_ids as a strip, padding, BLOCK_SIZE_M boundaries, expert_ids.

fig = plot_alignment_strip(moe_align(topk_ids, E, 16))
print(padding_report(routing))
align_explorer({"prefill": ids_prefill, "decode": ids_decode}, num_experts=E)   # BLOCK_SIZE_M widget
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..._validate import check_positive_int, type_name
from ...align import AlignedRouting, moe_align
from ._common import (
    check_choice,
    check_topk_ids,
    expert_colors,
    figure_and_ax,
    int_list,
    require_expert_sorted,
    show_figure,
)

PADDING_COLOR = (0.85, 0.85, 0.85)
INT64_MAX = 2**63 - 1


def row_experts(routing: AlignedRouting) -> np.ndarray:
    """Expert of each used row of the schedule, -1 for padding rows.

    Returns: [num_tokens_post_padded] int64 numpy array. Raises ValueError for a slot-order routing."""
    require_expert_sorted(routing, "row_experts")
    used = int(routing.num_tokens_post_padded.item())
    ids = routing.sorted_token_ids[:used].cpu().numpy()
    block_expert = routing.expert_ids.cpu().numpy()[np.arange(used) // routing.block_size_m]
    return np.where(ids < routing.num_slots, block_expert, -1)


def padding_report(routing: AlignedRouting) -> str:
    """One line: slots, rows in use after padding, padding rows and their share, M-blocks used/allocated.
    Raises ValueError for a slot-order routing."""
    require_expert_sorted(routing, "padding_report")
    used = int(routing.num_tokens_post_padded.item())
    slots = int(routing.counts.sum().item())
    pad = used - slots
    share = 100.0 * pad / used if used else 0.0
    blocks = used // routing.block_size_m
    return (
        f"BLOCK_SIZE_M={routing.block_size_m:>3}: {slots} slots -> num_tokens_post_padded = {used} rows, "
        f"{pad} padding rows ({share:.1f}% of rows wasted); {blocks} of {routing.max_num_m_blocks} "
        f"M-blocks in use"
    )


def folded_tails(counts, block_size_m: int, fold_tail_rows: int) -> tuple:
    """(M-blocks in use, how many of them folded tails leave with nothing to do) for experts with these row
    counts: an expert's last block is folded into the block before when the expert has more than one block
    and its last one holds at most `fold_tail_rows` rows (`GemmConfig.fold_tail_rows`).

    counts: [E] ints (a tensor, an array or a list), the rows routed to each expert.
    Raises TypeError / ValueError unless counts is a sequence of ints in [0, 2^63) (not a str), block_size_m an int >= 1
    and fold_tail_rows an int in [0, block_size_m) (a tail holds fewer rows than a block: a larger one is
    likely the two swapped)."""
    counts = int_list("counts", counts, 0, what="ints (rows per expert, [E])")
    for i, c in enumerate(counts):
        if c > INT64_MAX:  # a row count is an int64 at most (torch's index type)
            raise ValueError(f"counts[{i}] must be at most 2^63 - 1 (an int64 row count), got {c}")
    block_size_m = check_positive_int("block_size_m", block_size_m)
    fold_tail_rows = check_positive_int("fold_tail_rows", fold_tail_rows, minimum=0)
    if fold_tail_rows >= block_size_m:
        raise ValueError(
            f"fold_tail_rows must be in [0, block_size_m) = [0, {block_size_m}) (a tail holds fewer rows than "
            f"a block), got {fold_tail_rows}"
        )
    # Python ints: torch's int64 would overflow in c + block_size_m - 1 near the bound
    blocks = sum(-(-c // block_size_m) for c in counts)
    return blocks, sum(1 for c in counts if c > block_size_m and 0 < c % block_size_m <= fold_tail_rows)


def plot_alignment_strip(
    routing: AlignedRouting, ax: Optional[Axes] = None, title: Optional[str] = None, max_labels: int = 64
) -> Figure:
    """The used part of `sorted_token_ids` as one strip of cells.

    Each cell is a row of the schedule, colored by its expert; padding rows (the sentinel T*k) are grey
    and hatched. Thick lines mark BLOCK_SIZE_M boundaries and the expert of each M-block (`expert_ids`)
    is written above it. When there are at most `max_labels` rows the slot id is written in each cell.

    Args:
        routing: an AlignedRouting from `moe_align` (or `moe_align_reference`).
        ax: draw here instead of on a new Figure. title: overrides the default title.
        max_labels: the most rows (and blocks) that get text labels.
    Returns:
        The matplotlib Figure.
    Raises:
        TypeError / ValueError for what is not an expert-sorted AlignedRouting (as `row_experts`), or a
        max_labels that is not an int >= 0.
    """
    experts = row_experts(routing)
    max_labels = check_positive_int("max_labels", max_labels, minimum=0)
    used = experts.size
    bm = routing.block_size_m
    num_blocks = used // bm
    fig, ax = figure_and_ax(ax, (min(14, max(9, 2 + 0.3 * used)), 2.0))
    colors = expert_colors(routing.num_experts)
    cmap = ListedColormap([PADDING_COLOR] + list(colors.colors))
    ax.imshow(
        (experts + 1)[None, :],
        cmap=cmap,
        vmin=0,
        vmax=routing.num_experts,
        aspect="auto",
        interpolation="nearest",
        extent=(0, max(used, 1), 0, 1),
    )
    pad = np.flatnonzero(experts < 0)
    if 0 < pad.size <= 4096:
        ax.bar(pad + 0.5, 1, width=1, bottom=0, color="none", hatch="///", edgecolor="grey", linewidth=0)
    if used <= max_labels:
        ids = routing.sorted_token_ids[:used].cpu().tolist()
        for r, v in enumerate(ids):
            ax.text(
                r + 0.5,
                0.5,
                "pad" if v >= routing.num_slots else str(v),
                ha="center",
                va="center",
                fontsize=7 if used <= 32 else 5,
                rotation=0 if used <= 32 else 90,
            )
    for b in range(num_blocks + 1):
        ax.axvline(b * bm, color="black", linewidth=1.5 if num_blocks <= 64 else 0.5)
    if num_blocks <= max_labels:
        block_experts = routing.expert_ids[:num_blocks].cpu().tolist()
        for b, e in enumerate(block_experts):
            ax.text((b + 0.5) * bm, 1.05, f"e{e}", ha="center", va="bottom", fontsize=8)
    ax.set_xlim(0, max(used, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1.35)
    ax.set_yticks([])
    ax.set_xlabel("row of the schedule (position in sorted_token_ids)")
    ax.set_title(title or padding_report(routing), fontsize=9)
    shown = sorted(set(experts[experts >= 0].tolist()))
    if len(shown) <= 8:
        handles = [Patch(color=colors.colors[e], label=f"expert {e}") for e in shown]
        handles.append(Patch(facecolor=PADDING_COLOR, hatch="///", edgecolor="grey", label="padding (T·k)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return fig


def _check_cases(cases) -> None:
    """Raise TypeError unless `cases` is a mapping (name -> schedule), ValueError if it is empty."""
    if not isinstance(cases, Mapping):
        raise TypeError(f"cases must be a dict of name -> case (e.g. {{'prefill': ...}}), got {type_name(cases)}")
    if not cases:
        raise ValueError("cases must name at least one case, got an empty mapping")


def plot_alignment_cases(cases: Mapping[str, AlignedRouting]) -> Figure:
    """One strip per named schedule (e.g. prefill and decode), stacked on one new Figure.
    Raises TypeError unless cases is a mapping of AlignedRoutings, ValueError if it is empty (and as
    `plot_alignment_strip`)."""
    _check_cases(cases)
    fig = Figure(figsize=(12, 1.0 + 1.9 * len(cases)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(cases), 1))
    for ax, (name, routing) in zip(axes, cases.items()):
        plot_alignment_strip(routing, ax=ax, title=f"{name}: {padding_report(routing)}")
    return fig


def align_explorer(
    cases: Mapping[str, torch.Tensor],
    num_experts: int,
    block_sizes: Sequence[int] = (16, 32, 64, 128),
    value: Optional[int] = None,
    align: Callable[..., AlignedRouting] = moe_align,
):
    """A widget: pick BLOCK_SIZE_M, see each case's alignment strip and padding waste.

    Args:
        cases: name -> topk_ids [T, k] int32 (e.g. {"prefill (T=256)": ..., "decode (T=4)": ...}).
        num_experts: E. block_sizes: the choices offered. value: the first choice (default the first of
            block_sizes).
        align: the function that builds the schedule, `moe_align` by default.
    Returns:
        ipywidgets.VBox with attributes `control` (the SelectionSlider), `output` (ipywidgets.Output),
        `summary` (ipywidgets.HTML with one padding line per case), `figure` and `routings`.
    Raises:
        TypeError unless cases is a mapping and block_sizes a sequence of ints (not a str); ValueError for no
        cases, no block sizes, or a value that is not one of block_sizes; TypeError / ValueError unless
        num_experts is an int >= 1 and each case an int32/int64 [T, k] tensor (with data) of experts in
        [0, num_experts): moe_align drops an id outside, and the strip would show fewer slots than routed;
        and whatever `align` raises for the cases.
    """
    import ipywidgets as widgets

    _check_cases(cases)
    for name, ids in cases.items():
        check_topk_ids(ids, num_experts, name=f"cases[{name!r}]")
    block_sizes = int_list("block_sizes", block_sizes, 1)
    if not block_sizes:
        raise ValueError("block_sizes must offer at least one BLOCK_SIZE_M, got none")
    value = block_sizes[0] if value is None else value
    check_choice("value", value, block_sizes)  # the slider would raise a TraitError naming neither
    control = widgets.SelectionSlider(
        options=block_sizes,
        value=value,
        description="BLOCK_SIZE_M",
        continuous_update=False,
        style={"description_width": "initial"},
    )
    output = widgets.Output()
    summary = widgets.HTML()
    box = widgets.VBox([control, summary, output])
    box.control, box.output, box.summary = control, output, summary

    def redraw(_change=None):
        box.routings = {name: align(ids, num_experts, control.value) for name, ids in cases.items()}
        box.figure = plot_alignment_cases(box.routings)
        summary.value = (
            "<pre>" + "\n".join(f"{name:<18} {padding_report(r)}" for name, r in box.routings.items()) + "</pre>"
        )
        show_figure(output, box.figure)

    control.observe(redraw, names="value")
    redraw()
    return box
