"""Shared helpers of the plot functions, and the argument checks the plot and widget builders share (each
error names the argument, what it got and what it expects)."""

from __future__ import annotations

import numbers
from typing import Optional

import torch
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..._validate import INDEX_DTYPES, check_int, check_positive_int, check_tensor, described, is_bool, type_name


def as_list(name: str, values, what: str) -> list:
    """`values` (a list, tuple, range, numpy array, 1-D tensor or other iterable) as a list. Raises TypeError
    for a str or bytes (iterating one gives its characters), a dict or set (keys, or no order), and for a
    scalar or 0-d array/tensor (no items), naming `name` and saying it expects a sequence of `what`."""
    zero_dim = getattr(values, "ndim", 1) == 0  # a 0-d tensor or array has __iter__ but no items
    if isinstance(values, (str, bytes, dict, set)) or zero_dim or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of {what}, got {type_name(values)}")
    return list(values)


def int_list(
    name: str, values, minimum: Optional[int] = 0, *, what: str = "ints", length: Optional[int] = None
) -> list:
    """`values` (as `as_list`) as a list of Python ints >= minimum (None: any int, e.g. offsets), each checked by
    `check_positive_int` and named name[i], of `length` entries where given (`what` then says how many, e.g.
    "2 ints (rows, cols)"). TypeError / ValueError naming the argument otherwise."""
    items = as_list(name, values, what)
    if length is not None and len(items) != length:
        raise ValueError(f"{name} must be a sequence of {what}, got {len(items)} entries: {values!r}")
    if minimum is None:
        return [check_int(f"{name}[{i}]", v) for i, v in enumerate(items)]
    return [check_positive_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(items)]


def check_in_range(name: str, value, low, high, *, integer: bool = True):
    """`value` if it lies in [low, high]: a widget's slider would clamp a value outside silently, and cast a
    float to int. An int (`check_positive_int`'s types) or, with integer=False, a real number (not NaN).
    TypeError / ValueError naming the argument, the value and the range otherwise."""
    if integer:
        value = check_int(name, value)  # the type; the range below, both ends in the message
    elif is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in [{low}, {high}], got {described(value)}")
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"{name} must be in [{low}, {high}] (the widget's range), got {value}")
    return value


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # an array of several elements has no single truth value
        return False


def check_choice(name: str, value, options) -> None:
    """Raise ValueError unless `value` is one of `options` (a dropdown's or selection slider's choices:
    ipywidgets would raise its TraitError, naming neither the argument nor the choices). A bool is no
    choice among numbers (True == 1)."""
    options = list(options)
    if not any(_equal(o, value) and is_bool(o) == is_bool(value) for o in options):
        raise ValueError(f"{name} must be one of {options}, got {described(value)}")


def check_drawable(name: str, count: int, limit: int, what: str) -> None:
    """Raise ValueError naming `name` when a picture would draw `count` > `limit` `what` (cells, boxes, tiles,
    programs): each is a matplotlib artist or tick, so a large count runs for minutes (or exhausts memory)
    instead of drawing. The limits are set by timing: what they allow draws in a few seconds."""
    if count > limit:
        raise ValueError(
            f"{name} is too large to draw: {count} {what}, at most {limit} (these pictures are for learning: "
            "draw a smaller case)"
        )


def check_has_data(name: str, t: torch.Tensor) -> None:
    """Raise ValueError for a tensor on the meta device (shapes only): a picture reads its values."""
    if t.is_meta:
        raise ValueError(f"{name} is on the meta device, which holds no data to draw: move it to the CPU or a GPU")


def check_topk_ids(topk_ids, num_experts, name: str = "topk_ids") -> int:
    """Raise TypeError/ValueError unless `topk_ids` (named `name`) is an int32/int64 [T, k] tensor with data of
    experts in [0, num_experts) and `num_experts` (E) an int >= 1; return E. An id outside would be dropped
    (moe_align) or drawn nowhere: the picture would be silently wrong."""
    num_experts = check_positive_int("num_experts", num_experts)
    check_tensor(name, topk_ids, ndim=2, dtypes=INDEX_DTYPES, layout="[T, k]")
    check_has_data(name, topk_ids)
    if topk_ids.numel():
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if low < 0 or high >= num_experts:
            raise ValueError(
                f"{name} must hold experts in [0, {num_experts}), got values from {low} to {high} (num_experts = "
                f"{num_experts})"
            )
    return num_experts


def figure_and_ax(ax: Optional[Axes], figsize) -> tuple[Figure, Axes]:
    """A new Figure (made outside pyplot, so Jupyter shows it exactly once) or the Figure of `ax`. Raises
    TypeError for an `ax` that is not a matplotlib Axes (it would fail later, on a drawing call)."""
    if ax is not None:
        if not isinstance(ax, Axes):
            raise TypeError(f"ax must be a matplotlib Axes (or None for a new Figure), got {type_name(ax)}")
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
