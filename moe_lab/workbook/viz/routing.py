"""Pictures of top-k routing: which token goes to which expert, and how evenly the experts are loaded.

fig = plot_routing_heatmap(topk_ids, num_experts, topk_weights)   # [T, E] picture
fig = plot_expert_load(topk_ids, num_experts)                     # bar chart of slots per expert
routing = skewed_routing(32, 8, 2, skew=2.0)                     # what the widget shows at those settings
routing_explorer()                                                # widget: E, top_k, skew
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..._validate import FLOAT_DTYPES, check_int, check_positive_int, check_tensor, is_bool, type_name
from ...routing import TopKRouting, topk_routing
from ._common import check_drawable, check_has_data, check_in_range, check_topk_ids, figure_and_ax, show_figure

MAX_EXPLORER_TOKENS = 8192  # the widget's heatmap rows: a larger T allocates and draws for minutes


def skewed_router_logits(num_tokens: int, num_experts: int, skew: float = 0.0, *, seed: int = 0) -> torch.Tensor:
    """Random router logits whose expert popularity falls off with the expert index.

    logits[t, e] = N(0, 1) - skew * log(1 + e): skew = 0 gives uniform routing, skew around 2 sends most
    tokens to the first few experts (a hot-expert case).
    Args:
        num_tokens: T. num_experts: E. skew: >= 0. seed: seed of the CPU generator.
    Returns:
        [T, E] float32 on the CPU.
    Raises:
        TypeError / ValueError for a T < 0, an E < 1, a skew that is not a finite number >= 0 or a seed that
        is not an int.
    """
    num_tokens = check_positive_int("num_tokens", num_tokens, minimum=0)
    seed = check_int("seed", seed)  # torch's manual_seed would raise its own error, naming no argument
    num_experts = check_positive_int("num_experts", num_experts)
    if is_bool(skew) or not isinstance(skew, (int, float, np.integer, np.floating)):
        raise TypeError(f"skew must be a number >= 0, got {type_name(skew)}")
    if not np.isfinite(skew) or skew < 0:
        raise ValueError(f"skew must be a finite number >= 0, got {skew}")
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn((num_tokens, num_experts), generator=gen)
    return noise - skew * torch.log1p(torch.arange(num_experts, dtype=torch.float32))


def skewed_routing(num_tokens: int, num_experts: int, top_k: int, skew: float = 0.0, *, seed: int = 0) -> TopKRouting:
    """The routing `routing_explorer` shows for these settings: `topk_routing` (softmax, renormalized) of
    `skewed_router_logits(num_tokens, num_experts, skew, seed=seed)`, top_k clamped to E. Draw it with
    `plot_routing(routing.topk_ids, num_experts, routing.topk_weights)` for a static copy of the widget.
    Raises TypeError / ValueError for bad arguments (as `skewed_router_logits`; top_k must be an int >= 1)."""
    top_k = check_positive_int("top_k", top_k)
    logits = skewed_router_logits(num_tokens, num_experts, skew, seed=seed)
    return topk_routing(logits, min(top_k, num_experts))


def expert_load(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Slots routed to each expert. topk_ids: [T, k] int. Returns [E] int64 on the CPU.
    Raises TypeError / ValueError unless topk_ids is an int32/int64 [T, k] tensor of experts in [0, E)."""
    num_experts = check_topk_ids(topk_ids, num_experts)
    return torch.bincount(topk_ids.reshape(-1).long().cpu(), minlength=num_experts)[:num_experts]


def plot_routing_heatmap(
    topk_ids: torch.Tensor,
    num_experts: int,
    topk_weights: Optional[torch.Tensor] = None,
    ax: Optional[Axes] = None,
    title: Optional[str] = None,
) -> Figure:
    """Token-to-expert map: cell (t, e) shows the routed weight of token t on expert e (white = not routed).

    Args:
        topk_ids: [T, k] int32/int64 experts of each token.
        num_experts: E, the number of columns.
        topk_weights: optional [T, k] float weights; without them every routed cell is 1.
        ax: draw here instead of on a new Figure.
    Returns:
        The matplotlib Figure.
    Raises:
        TypeError / ValueError unless topk_ids is an int32/int64 [T, k] tensor of experts in [0, E) and
        topk_weights (if given) a [T, k] float tensor of finite weights >= 0; ValueError for either on the
        meta device (no data); TypeError for an ax that is not a matplotlib Axes.
    """
    num_experts = check_topk_ids(topk_ids, num_experts)
    if topk_weights is not None:
        check_tensor(
            "topk_weights",
            topk_weights,
            ndim=2,
            dtypes=FLOAT_DTYPES + (torch.float64,),
            shape=tuple(topk_ids.shape),
            layout="[T, k]",
        )
        check_has_data("topk_weights", topk_weights)
        # NaN would draw as "not routed", a negative weight below the colour scale: both silently wrong
        if not bool(torch.isfinite(topk_weights).all()) or bool((topk_weights < 0).any()):
            raise ValueError("topk_weights must hold finite weights >= 0 (the routed weights), got NaN, inf or < 0")
    ids = topk_ids.long().cpu()
    num_tokens = ids.shape[0]
    weights = torch.ones(ids.shape) if topk_weights is None else topk_weights.float().cpu()
    grid = torch.full((num_tokens, num_experts), float("nan")).scatter_(1, ids, weights).numpy()
    fig, ax = figure_and_ax(ax, (6, 4))
    ax.set_facecolor("white")  # cells not routed are NaN and stay white
    image = ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0,
        vmax=max(float(np.nanmax(grid)) if np.isfinite(grid).any() else 0.0, 1e-6),
    )
    fig.colorbar(image, ax=ax, label="routed weight" if topk_weights is not None else "routed")
    ax.set_xlabel(f"expert (E = {num_experts})")
    ax.set_ylabel(f"token (T = {num_tokens})")
    ax.set_title(title or f"token → expert, top_k = {ids.shape[1] if ids.dim() == 2 else '?'}")
    return fig


def plot_expert_load(
    topk_ids: torch.Tensor, num_experts: int, ax: Optional[Axes] = None, title: Optional[str] = None
) -> Figure:
    """Bar chart of the slots each expert receives, with the mean T*k/E as a dashed line.

    Args:
        topk_ids: [T, k] int32/int64. num_experts: E. ax: draw here instead of on a new Figure.
    Returns:
        The matplotlib Figure.
    Raises:
        TypeError / ValueError as `expert_load`.
    """
    load = expert_load(topk_ids, num_experts).numpy()
    mean = topk_ids.numel() / num_experts
    fig, ax = figure_and_ax(ax, (6, 3))
    ax.bar(np.arange(num_experts), load, width=0.9, color="tab:blue")
    ax.axhline(mean, color="tab:red", linestyle="--", label=f"mean T·k/E = {mean:.1f}")
    ax.set_xlabel("expert")
    ax.set_ylabel("slots (token, k)")
    ratio = load.max() / mean if mean else 0.0
    ax.set_title(title or f"expert load: max/mean = {ratio:.2f}")
    ax.legend(loc="best", framealpha=0.9)
    return fig


def load_summary(topk_ids: torch.Tensor, num_experts: int) -> str:
    """One line: slots, busiest expert, max/mean load and idle experts. topk_ids: [T, k] int.
    Raises TypeError / ValueError as `expert_load`."""
    load = expert_load(topk_ids, num_experts)
    mean = topk_ids.numel() / num_experts
    busiest = int(load.argmax())
    idle = int((load == 0).sum())
    return (
        f"T·k = {topk_ids.numel()} slots over E = {num_experts} experts: busiest expert {busiest} gets "
        f"{int(load[busiest])} (max/mean = {float(load.max()) / mean if mean else 0.0:.2f}); {idle} expert(s) get none"
    )


def plot_routing(topk_ids: torch.Tensor, num_experts: int, topk_weights: Optional[torch.Tensor] = None) -> Figure:
    """Heatmap and load bar chart side by side, on one new Figure. Arguments (and errors) as
    `plot_routing_heatmap`."""
    num_experts = check_topk_ids(topk_ids, num_experts)  # before a Figure is made
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.2, 1])
    plot_routing_heatmap(topk_ids, num_experts, topk_weights, ax=left)
    plot_expert_load(topk_ids, num_experts, ax=right)
    return fig


def routing_explorer(num_tokens: int = 32, num_experts: int = 8, top_k: int = 2, skew: float = 0.0, *, seed: int = 0):
    """A widget: sliders for E, top_k and routing skew redraw the heatmap and the load chart.

    Routing is `skewed_routing` (softmax, renormalized, on `skewed_router_logits`); a static copy of the
    first picture is `plot_routing` of `skewed_routing` with the same arguments.
    Returns:
        ipywidgets.VBox with attributes `controls` (dict of the sliders), `output` (ipywidgets.Output),
        `summary` (ipywidgets.HTML), `figure` (the Figure now shown) and `routing` (the TopKRouting).
    Raises:
        TypeError / ValueError for a first value outside its slider's range (num_experts an int in [2, 64],
        top_k an int in [1, 8], skew a number in [0, 3]), and as `skewed_routing` (num_tokens an int >= 0,
        seed an int); ValueError for a num_tokens above MAX_EXPLORER_TOKENS (too large to draw).
        As `skewed_routing`, a top_k above E routes to all E experts.
    """
    import ipywidgets as widgets

    num_tokens = check_positive_int("num_tokens", num_tokens, minimum=0)
    check_drawable("num_tokens", num_tokens, MAX_EXPLORER_TOKENS, "tokens (heatmap rows)")
    seed = check_int("seed", seed)

    # the sliders would clamp a value outside their range (and cast a float to int) without a word
    num_experts = check_in_range("num_experts", num_experts, 2, 64)
    top_k = check_in_range("top_k", top_k, 1, 8)
    skew = check_in_range("skew", skew, 0.0, 3.0, integer=False)
    sliders = {
        "num_experts": widgets.IntSlider(value=num_experts, min=2, max=64, description="E", continuous_update=False),
        "top_k": widgets.IntSlider(value=top_k, min=1, max=8, description="top_k", continuous_update=False),
        "skew": widgets.FloatSlider(
            value=skew, min=0.0, max=3.0, step=0.25, description="skew", continuous_update=False
        ),
    }
    output = widgets.Output()
    summary = widgets.HTML()
    box = widgets.VBox([widgets.HBox(list(sliders.values())), summary, output])
    box.controls, box.output, box.summary = sliders, output, summary

    def redraw(_change=None):
        e = sliders["num_experts"].value
        box.routing = skewed_routing(num_tokens, e, sliders["top_k"].value, sliders["skew"].value, seed=seed)
        box.figure = plot_routing(box.routing.topk_ids, e, box.routing.topk_weights)
        summary.value = f"<code>{load_summary(box.routing.topk_ids, e)}</code>"
        show_figure(output, box.figure)

    for slider in sliders.values():
        slider.observe(redraw, names="value")
    redraw()
    return box
