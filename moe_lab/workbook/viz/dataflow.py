"""The fused MoE layer as a diagram: each stage, the function that runs it, and the shapes it passes on.

`layer_stages` computes the stages and shapes (plain data, easy to test); `plot_dataflow` draws them;
`dataflow_widget` redraws for a chosen preset, T and BLOCK_SIZE_M.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from ..._validate import check_positive_int, check_power_of_two, type_name
from ...align import max_num_tokens_padded
from ...layer import FusedMoEInfo
from ...presets import MoEPreset, get_preset
from ._common import check_choice, check_in_range, figure_and_ax, show_figure

STAGE_COLORS = {"input": "#EEEEEE", "torch": "#CCB974", "kernel": "#4C72B0", "output": "#55A868"}


@dataclass(frozen=True)
class Stage:
    """One step of the layer: `name` (what it computes), `fn` (the moe-lab function), `out` (the tensors it
    produces, with shapes), `kind` ("input", "torch", "kernel" or "output"), `note` (load path etc.)."""

    name: str
    fn: str
    out: str
    kind: str
    note: str = ""


def layer_stages(preset: MoEPreset, num_tokens: int, block_size_m: int, info=None) -> List[Stage]:
    """The stages of `fused_moe` with the shapes of everything they pass on.

    Args:
        preset: the layer's shape (H, I, E, k); a scaled preset gives the scaled shapes.
        num_tokens: T.
        block_size_m: BLOCK_SIZE_M of both GEMMs; sets the padded row bound of the aligned schedule.
        info: optional `FusedMoEInfo` from `fused_moe(..., return_info=True)`: adds each GEMM's load path,
            and shows SiLU-and-mul inside the up GEMM where that call fused it (`GemmConfig.fuse_swiglu`).
            Without it the stages are drawn apart, as notebook 06 builds them.
    Returns:
        List of Stage, in execution order.
    Raises:
        TypeError for a preset that is not a MoEPreset or an info that is not a FusedMoEInfo (nor None);
        TypeError / ValueError for a num_tokens that is not an int >= 1 or a block_size_m that is not a power
        of two >= 1 (as `moe_align` takes).
    """
    if not isinstance(preset, MoEPreset):
        raise TypeError(f"preset must be a MoEPreset (moe_lab.get_preset(name)), got {type_name(preset)}")
    if info is not None and not isinstance(info, FusedMoEInfo):  # else an AttributeError on its fields
        raise TypeError(
            f"info must be a FusedMoEInfo (fused_moe(..., return_info=True)) or None, got {type_name(info)}"
        )
    num_tokens = check_positive_int("num_tokens", num_tokens)
    block_size_m = check_power_of_two("block_size_m", block_size_m)
    t, h, i, e, k = num_tokens, preset.hidden_size, preset.intermediate_size, preset.num_experts, preset.top_k
    rows = max_num_tokens_padded(t * k, e, block_size_m)
    blocks = rows // block_size_m
    up_note = down_note = ""
    fused = info is not None and info.up_plan is not None and info.up_plan.swiglu
    if info is not None and info.up_path is not None:
        up_note, down_note = f"load path {info.up_path.name}", f"load path {info.down_path.name}"
    return (
        [
            Stage("inputs", "", f"hidden_states [{t}, {h}]\nw1 [{e}, {2 * i}, {h}]   w2 [{e}, {h}, {i}]", "input"),
            Stage(
                "router + top-k", "topk_routing", f"topk_weights [{t}, {k}] fp32\ntopk_ids [{t}, {k}] int32", "torch"
            ),
            Stage(
                "align",
                "moe_align",
                f"sorted_token_ids [{rows}]\nexpert_ids [{blocks}]\nnum_tokens_post_padded [1]",
                "kernel",
                f"BLOCK_SIZE_M={block_size_m}; {rows} rows is the bound for T*k={t * k}",
            ),
        ]
        + (
            [
                Stage(
                    "up GEMM + SwiGLU epilogue (gather rows)",
                    "grouped_matmul(gather_a=True, swiglu=True)",
                    f"act [{rows}, {i}]",
                    "kernel",
                    up_note,
                ),
            ]
            if fused
            else [
                Stage(
                    "up GEMM (gather rows)",
                    "grouped_matmul(gather_a=True)",
                    f"gate_up [{rows}, {2 * i}]",
                    "kernel",
                    up_note,
                ),
                Stage("SiLU and mul", "silu_and_mul", f"act [{rows}, {i}]", "kernel"),
            ]
        )
        + [
            Stage(
                "down GEMM (x topk_weights, scatter)",
                "grouped_matmul(scatter=True)",
                f"out_k [{t}*{k}, {h}]",
                "kernel",
                down_note,
            ),
            Stage("sum over k", "torch.sum(dim=1)", f"out [{t}, {h}]", "output"),
        ]
    )


def plot_dataflow(preset: MoEPreset, num_tokens: int, block_size_m: int = 16, *, info=None, ax=None) -> Figure:
    """Draw the stages of one fused MoE layer top to bottom, with the tensor shapes on each arrow.

    Args:
        preset: the layer's shape (use `get_preset(name)` or a `.scaled(d)` copy).
        num_tokens: T.
        block_size_m: BLOCK_SIZE_M (sets the padded row count of the sorted layout).
        info: optional FusedMoEInfo, to print each GEMM's load path.
        ax: optional Axes.
    Returns:
        The Figure. Blue boxes are Triton kernels, tan boxes PyTorch ops.
    Raises:
        TypeError / ValueError as `layer_stages`; TypeError for an ax that is not a matplotlib Axes.
    """
    stages = layer_stages(preset, num_tokens, block_size_m, info)
    fig, ax = figure_and_ax(ax, (9, 0.95 * len(stages) + 0.6))
    n = len(stages)
    for j, s in enumerate(stages):
        y = n - 1 - j
        color = STAGE_COLORS[s.kind]
        ax.add_patch(
            FancyBboxPatch(
                (0.02, y + 0.12),
                0.36,
                0.62,
                boxstyle="round,pad=0.01",
                facecolor=color,
                alpha=0.85 if s.kind == "kernel" else 1.0,
                edgecolor="black",
            )
        )
        ax.text(
            0.2,
            y + 0.52,
            s.name,
            ha="center",
            va="center",
            fontsize=9,
            weight="bold",
            color="white" if s.kind == "kernel" else "black",
        )
        if s.fn:
            ax.text(
                0.2,
                y + 0.3,
                s.fn,
                ha="center",
                va="center",
                fontsize=7.5,
                family="monospace",
                color="white" if s.kind == "kernel" else "black",
            )
        ax.text(0.42, y + 0.43, s.out, ha="left", va="center", fontsize=8.5, family="monospace")
        if s.note:
            ax.text(0.98, y + 0.43, s.note, ha="right", va="center", fontsize=7.5, style="italic", color="#444444")
        if j < n - 1:
            ax.annotate(
                "", xy=(0.2, y - 0.26), xytext=(0.2, y + 0.12), arrowprops=dict(arrowstyle="-|>", color="black", lw=1.2)
            )
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.05, n)
    ax.axis("off")
    ax.set_title(
        f"{preset.name}: T={num_tokens}, H={preset.hidden_size}, I={preset.intermediate_size}, "
        f"E={preset.num_experts}, k={preset.top_k}, BLOCK_SIZE_M={block_size_m}",
        fontsize=10,
    )
    return fig


def dataflow_widget(preset_name: str = "mixtral-8x7b", num_tokens: int = 64, block_size_m: int = 16, *, scale: int = 1):
    """Pick a preset, T and BLOCK_SIZE_M and see the shapes that flow through the layer.

    Args:
        preset_name: initial preset name (see `moe_lab.PRESETS`).
        num_tokens: initial T.
        block_size_m: initial BLOCK_SIZE_M.
        scale: divide H and I by this (1 = the real model).
    Returns:
        ipywidgets.VBox; `.figure` is the current Figure and `.summary` the HTML line, for tests.
    Raises:
        ValueError for a preset_name not in `moe_lab.PRESETS` or a block_size_m not among the dropdown's
        16, 32, 64, 128; TypeError / ValueError for a num_tokens that is not an int in [1, 4096] (the
        slider's range) or a scale that is not an int >= 1.
    """
    import ipywidgets as widgets

    from ...presets import PRESETS

    # checked here: the dropdowns would raise a TraitError naming neither argument nor choices, the slider clamp
    check_choice("preset_name", preset_name, list(PRESETS))
    num_tokens = check_in_range("num_tokens", num_tokens, 1, 4096)
    check_choice("block_size_m", block_size_m, [16, 32, 64, 128])
    scale = check_positive_int("scale", scale)
    name = widgets.Dropdown(options=list(PRESETS), value=preset_name, description="model")
    tokens = widgets.IntSlider(value=num_tokens, min=1, max=4096, description="T", continuous_update=False)
    bsm = widgets.Dropdown(options=[16, 32, 64, 128], value=block_size_m, description="BLOCK_SIZE_M")
    summary = widgets.HTML()
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([name, tokens, bsm]), summary, out])

    def draw(_=None):
        preset = get_preset(name.value)
        preset = preset.scaled(scale) if scale > 1 else preset
        fig = plot_dataflow(preset, tokens.value, bsm.value)
        slots = tokens.value * preset.top_k
        rows = max_num_tokens_padded(slots, preset.num_experts, bsm.value)
        summary.value = (
            f"{slots} routed slots (T*k) need at most {rows} padded rows at BLOCK_SIZE_M="
            f"{bsm.value}: up to {rows - slots} padding rows ({100 * (rows - slots) / rows:.0f}% of "
            "the sorted buffer)"
        )
        box.figure = fig
        show_figure(out, fig)

    for w in (name, tokens, bsm):
        w.observe(draw, names="value")
    draw()
    box.summary = summary
    return box
