"""Pictures of notebook 09: the float8_e4m3fn number grid, FP8 scales drawn over the matrix they scale, and
the committed H200 timings of the FP8 GEMM pair against bf16.

`e4m3_binades` is plain data (every finite e4m3 value, decoded from its 256 bit patterns by torch, grouped
by binade; easy to test); the plot functions return a matplotlib `Figure` and take an optional `ax`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ..._validate import type_name
from ._common import as_list, check_drawable, check_has_data, figure_and_ax, int_list

FP8_EXPERIMENT = "fp8-H200-2026-12-01.json"
# What plot_scale_blocks draws at most: one outlined quad per scale block, one marker per mark. Timed:
# about 2 s each; notebook 09 draws 8 x 16 and 4 x 8 blocks with one mark.
MAX_SCALE_BLOCKS = 2**16
MAX_MARKS = 256
MAX_SCALE_LABELS = 1024  # annotate=True: one text per block


@dataclass(frozen=True)
class Binade:
    """The non-negative e4m3 values in [low, 2 * low) (the subnormals: (0, 2^-6)), `spacing` apart."""

    low: float
    spacing: float
    values: Tuple[float, ...]
    subnormal: bool = False


def e4m3_values() -> List[float]:
    """Every finite non-negative float8_e4m3fn value, ascending: 0, then 2^-9 .. 448 (127 values). Decoded
    by torch from the bit patterns 0x00 .. 0x7F; 0x7F (exponent and mantissa all ones) is NaN: the "fn"
    format has no infinity, and gives that code to NaN only, which is how its largest value reaches 448."""
    decoded = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return [float(v) for v in decoded[torch.isfinite(decoded)].tolist()]


def e4m3_binades() -> List[Binade]:
    """The positive e4m3 values by binade: first the 7 subnormals (2^-9 .. 7 * 2^-9, spacing 2^-9), then one
    binade per exponent, 2^-6 .. 2^8, each of 8 values spaced 2^(e-3) (the last one, [256, 448], holds 7:
    its eighth code is NaN). The spacing doubles from one binade to the next: the relative step is the
    same, 1/8 to 1/16 of the value, everywhere but among the subnormals."""
    values = [v for v in e4m3_values() if v > 0]
    sub = [v for v in values if v < 2.0**-6]
    binades = [Binade(0.0, 2.0**-9, tuple(sub), subnormal=True)]
    for exponent in range(-6, 9):
        low = 2.0**exponent
        inside = tuple(v for v in values if low <= v < 2 * low)
        binades.append(Binade(low, low / 8, inside))
    return binades


def plot_e4m3_grid(*, ax=None) -> Figure:
    """The positive e4m3 values on a linear axis from 0 to 448 (top, one tick per value: dense near zero,
    32 apart at the top) and on a log2 axis (bottom: 8 values per binade, every binade alike; the
    subnormals thin out below 2^-6). With `ax`, only the linear strip is drawn into it."""
    values = np.array([v for v in e4m3_values() if v > 0])
    if ax is not None:
        fig, top = figure_and_ax(ax, None)
        bottom = None
    else:
        fig = Figure(figsize=(10, 3.4), layout="constrained")
        top, bottom = fig.subplots(2, 1, gridspec_kw=dict(height_ratios=[1, 1]))
    top.vlines(values, 0, 1, color="#4C72B0", lw=0.8)
    top.set_xlim(0, 460)
    top.set_yticks([])
    for low, high in ((64, 128), (128, 256), (256, 448)):
        spacing = low / 8
        top.annotate(
            f"spacing {spacing:g}",
            xy=((low + high) / 2, 1.02),
            ha="center",
            va="bottom",
            fontsize=8,
            annotation_clip=False,
        )
    top.set_title("float8_e4m3fn: all 126 positive finite values (linear axis; the largest is 448)", fontsize=9, pad=16)
    if bottom is not None:
        colors = ["#999999"] + ["#4C72B0", "#DD8452"] * 8
        for binade, color in zip(e4m3_binades(), colors):
            bottom.vlines(binade.values, 0, 1, color=color, lw=1.2)
        bottom.set_xscale("log", base=2)
        bottom.set_xlim(2.0**-9.5, 2.0**9)
        bottom.set_yticks([])
        bottom.set_xlabel(
            "value (log2 axis): 8 values per binade [2^e, 2^(e+1)), spacing 2^(e-3); "
            "grey: the 7 subnormals, spacing 2^-9",
            fontsize=8,
        )
    return fig


def plot_scale_blocks(
    scale: torch.Tensor,
    shape: Sequence[int],
    block_shape: Sequence[int] = (128, 128),
    *,
    ax=None,
    title: Optional[str] = None,
    marks: Sequence[Tuple[int, int]] = (),
    annotate: Optional[bool] = None,
) -> Figure:
    """One matrix's FP8 scales drawn over the matrix: `scale` [ceil(rows/br), ceil(cols/bc)] (one expert's
    w_scale, or activations' x_scale with block_shape (1, group_size)) covers a `shape` = (rows, cols)
    matrix in blocks of `block_shape` = (br, bc); each block is coloured by its scale (log colour scale),
    with the block grid in black (edge blocks partial) and, where there are few blocks, the scale written
    in it. `marks` (row, col) are drawn as red crosses (an outlier, say).

    Raises TypeError / ValueError unless shape and block_shape are 2 ints >= 1 each (sequences, not a str;
    a float is not truncated) and marks a sequence of (row, col) int pairs inside `shape`; TypeError when
    scale is not a tensor; ValueError when it is not 2-D with exactly the blocks that cover `shape`, is on the
    meta device (no data), or holds a value that is not positive and finite; ValueError ("too large to draw")
    for more than MAX_SCALE_BLOCKS scale blocks, MAX_MARKS marks or (annotate) MAX_SCALE_LABELS labels;
    TypeError for an ax that is not an Axes."""
    rows, cols = shape = tuple(int_list("shape", shape, 1, what="2 ints (rows, cols)", length=2))
    br, bc = block_shape = tuple(int_list("block_shape", block_shape, 1, what="2 ints (br, bc)", length=2))
    marks = [
        int_list(f"marks[{i}]", m, None, what="2 ints (row, col)", length=2)
        for i, m in enumerate(as_list("marks", marks, "(row, col) pairs"))
    ]
    check_drawable("marks", len(marks), MAX_MARKS, "marks")
    for i, (r, c) in enumerate(marks):
        if not (0 <= r < rows and 0 <= c < cols):  # drawn outside the axes' limits, it would vanish silently
            raise ValueError(
                f"marks[{i}] must lie in the matrix: row in [0, {rows}), col in [0, {cols}) (shape), got ({r}, {c})"
            )
    want = (math.ceil(rows / br), math.ceil(cols / bc))
    if not isinstance(scale, torch.Tensor):
        raise TypeError(
            f"scale must be a torch.Tensor [ceil(rows/br), ceil(cols/bc)] = {list(want)}, got {type_name(scale)}"
        )
    if scale.dim() != 2 or tuple(scale.shape) != want:
        raise ValueError(
            f"scale must be [ceil(rows/br), ceil(cols/bc)] = {list(want)} for shape {tuple(shape)} in "
            f"blocks of {tuple(block_shape)}, got {tuple(scale.shape)}"
        )
    check_has_data("scale", scale)
    check_drawable("scale", want[0] * want[1], MAX_SCALE_BLOCKS, "scale blocks (shape / block_shape)")
    s = scale.detach().float().cpu().numpy()
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError("scale must hold positive finite values (a scale is amax / 448 > 0)")
    fig, ax = figure_and_ax(ax, (9, 3.0 + 2.5 * min(rows / cols, 1.5)))
    x_edges = np.minimum(np.arange(want[1] + 1) * bc, cols)
    y_edges = np.minimum(np.arange(want[0] + 1) * br, rows)
    norm = LogNorm(vmin=s.min(), vmax=max(s.max(), s.min() * 1.01))  # all scales equal: still a range
    mesh = ax.pcolormesh(x_edges, y_edges, s, cmap="viridis", norm=norm, edgecolors="black", linewidth=0.8)
    fig.colorbar(mesh, ax=ax, label="scale (amax / 448)")
    if annotate is None:
        annotate = s.size <= 60
    check_drawable("annotate", s.size if annotate else 0, MAX_SCALE_LABELS, "scale labels (one per block)")
    if annotate:
        for i in range(want[0]):
            for j in range(want[1]):
                light = mesh.norm(s[i, j]) > 0.6  # viridis turns yellow at the top: dark text there
                ax.text(
                    (x_edges[j] + x_edges[j + 1]) / 2,
                    (y_edges[i] + y_edges[i + 1]) / 2,
                    f"{s[i, j]:.2g}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if light else "white",
                )
    for r, c in marks:
        ax.plot([c], [r], marker="x", color="red", markersize=10, mew=2)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xlabel(f"column (K: {cols}), blocks of {bc}")
    if br == 1 and rows <= 32:  # one scale per row (activations): label the rows, not a coordinate
        ax.set_yticks([r + 0.5 for r in range(rows)], [str(r) for r in range(rows)])
        ax.set_ylabel("row (token)")
    else:
        ax.set_ylabel(f"row ({rows}), blocks of {br}")
    ax.set_title(
        title or f"{want[0]} x {want[1]} scales over a {rows} x {cols} matrix, one per {br} x {bc} block", fontsize=9
    )
    return fig


def load_fp8_experiment(path: Optional[str] = None) -> dict:
    """The committed H200 timings of the FP8 GEMM pair against bf16
    (the committed JSON file `FP8_EXPERIMENT`; docs/experiments.md, "FP8 w8a8"):
    {"environment": {...}, "rows": [{"model", "T", "bf16_pair_ms", "fp8_pair_ms", "speedup", ...}]}.
    Raises FileNotFoundError where the file is not there (not committed yet, or moe-lab installed as a
    copy without the repository's benchmarks/)."""
    if path is None:
        from .performance import committed_result

        path = committed_result("studies", FP8_EXPERIMENT)
    with open(path) as f:
        return json.load(f)


def plot_fp8_speedup(data: dict, *, ax=None) -> Figure:
    """bf16 GEMM-pair time / FP8 GEMM-pair time against T, one line per model, from `data`
    (`load_fp8_experiment`): above 1 FP8 is faster; the dashed line at 2 is the byte ratio, what halving the
    weight bytes can give where the weights' reading is all the time."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("data must be the experiment's dict with a list of rows (load_fp8_experiment())")

    def timed(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    rows = [
        r
        for r in data["rows"]
        if isinstance(r, dict)
        and isinstance(r.get("model"), str)
        and timed(r.get("T"))
        and timed(r.get("bf16_pair_ms"))
        and timed(r.get("fp8_pair_ms"))
    ]
    fig, ax = figure_and_ax(ax, (7, 3.4))
    for model in dict.fromkeys(r["model"] for r in rows):
        points = sorted((r["T"], r["bf16_pair_ms"] / r["fp8_pair_ms"]) for r in rows if r["model"] == model)
        ax.plot([t for t, _ in points], [s for _, s in points], marker="o", label=model)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(2.0, color="grey", lw=0.8, ls="--")
    ax.text(1, 2.02, "2x: half the weight bytes", fontsize=7, color="grey", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0.5, 2.3)
    ax.set_xlabel("tokens T")
    ax.set_ylabel("bf16 pair ms / FP8 pair ms")
    if rows:
        ax.legend(fontsize=8)
    env = data.get("environment", {})
    ax.set_title(
        f"FP8 block-scaled vs bf16, up + down GEMM ({env.get('device', '?')}, Triton "
        f"{env.get('triton', '?')}; committed)",
        fontsize=9,
    )
    return fig
