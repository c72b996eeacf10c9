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
    """Make an ipywidgets `Output` show `figure` in place of what it showed before."""
    from IPython.display import display
    output.clear_output(wait=True)
    with output:
        display(figure)
