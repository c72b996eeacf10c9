"""Shared helpers of the plot functions."""

from __future__ import annotations

from typing import Optional

from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure


def figure_and_ax(ax: Optional[Axes], figsize) -> tuple[Figure, Axes]:
    """A new Figure (made outside pyplot, so Jupyter shows it exactly once) or the Figure of `ax`."""
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def expert_colors(num_experts: int) -> ListedColormap:
    """One color per expert (tab20, repeating past 20 experts)."""
    from matplotlib import colormaps

    base = colormaps["tab20"].colors
    return ListedColormap([base[e % len(base)] for e in range(max(num_experts, 1))])


def show_figure(output, figure: Figure) -> None:
    """Make an ipywidgets `Output` show `figure` in place of what it showed before.

    The same under ipywidgets 7.7 and 8: one `with output:` block clears (wait=True: the old picture stays
    until the new one arrives) and displays. The figure goes out as an image even in a kernel where no
    `%matplotlib inline` has run (no image formatter for Figures there, only the text repr): then as a PNG
    drawn here, with the same settings as the inline backend. So the widget state a notebook stores holds
    the picture, and static viewers (GitHub, nbviewer, nbconvert) draw it.
    """
    from IPython import get_ipython
    from IPython.display import clear_output, display

    shell = get_ipython()
    with output:
        clear_output(wait=True)
        if shell is None:  # plain Python: nothing to draw into (display prints the repr)
            display(figure)
            return
        data, metadata = shell.display_formatter.format(figure)
        if not any(key.startswith("image/") for key in data):
            from IPython.core.pylabtools import print_figure

            data = {
                "image/png": print_figure(figure, "png", base64=True),
                "text/plain": data.get("text/plain", repr(figure)),
            }
            metadata = {}
        display(data, metadata=metadata, raw=True)


def require_expert_sorted(routing, what: str) -> None:
    """Raise ValueError for a slot-order schedule (`moe_lab.align.slot_order_routing`, what `fused_moe`
    runs at T = 1): the pictures count experts' rows and padding, which only the align's schedule has.
    Raise TypeError / ValueError first for anything but an AlignedRouting (`moe_lab.align.check_routing`)."""
    from ...align import check_routing

    check_routing(routing)
    if not getattr(routing, "expert_sorted", True):
        raise ValueError(
            f"{what} draws the align's expert-sorted schedule; this routing is a single token's "
            "slot order (fused_moe at T = 1): build one with moe_lab.moe_align(topk_ids, E, "
            "block_size_m)"
        )
