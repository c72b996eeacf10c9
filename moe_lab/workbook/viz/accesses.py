"""Which elements each program of a kernel loaded or stored: a picture of a guarded run's accesses."""

from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..._validate import type_name
from ._common import figure_and_ax

MAX_COLUMNS = 4096  # elements drawn; beyond the tensor's end only this many


def plot_accesses(run, tensor: str, kind: str = "store", *, ax=None, title: Optional[str] = None) -> Figure:
    """One row per program, one column per element offset of `tensor` (a parameter name of the kernel):
    a cell is colored where that program's `kind` ("load", "store" or "atomic") touched that element, in
    the program's color inside the tensor and red outside it. `run` is a `moe_lab.workbook.guarded.GuardedRun`
    (its `accesses` come from the interpreter's check). Raises TypeError for a run that is not a GuardedRun or
    a tensor that is not a str, ValueError for an unknown tensor or kind."""
    from ..guarded import GuardedRun

    if not isinstance(run, GuardedRun):
        raise TypeError(f"run must be a GuardedRun (moe_lab.workbook.guarded), got {type_name(run)}")
    if not isinstance(tensor, str):  # a list is unhashable: the lookup below would fail without naming it
        raise TypeError(f"tensor must be a parameter name (str) of {sorted(run.tensors)}, got {type_name(tensor)}")
    if tensor not in run.tensors:
        raise ValueError(f"tensor must be one of {sorted(run.tensors)}, got {tensor!r}")
    if kind not in ("load", "store", "atomic"):
        raise ValueError(f"kind must be 'load', 'store' or 'atomic', got {kind!r}")
    numel = run.tensors[tensor].numel()
    accesses = [a for a in run.accesses if a.tensor == tensor and a.kind == kind]
    programs = sorted({a.program for a in run.accesses}, key=lambda p: (p[2], p[1], p[0]))
    row = {p: i for i, p in enumerate(programs)}
    offsets = np.concatenate([a.offsets for a in accesses]) if accesses else np.zeros(0, np.int64)
    lo = int(min(0, offsets.min())) if offsets.size else 0
    hi = int(max(numel, offsets.max() + 1)) if offsets.size else numel
    hi = min(hi, max(numel, 1) + MAX_COLUMNS)
    lo = max(lo, -MAX_COLUMNS)
    image = np.full((max(len(programs), 1), max(hi - lo, 1)), np.nan)
    outside = np.zeros_like(image, dtype=bool)
    for a in accesses:
        keep = (a.offsets >= lo) & (a.offsets < hi)
        cols = a.offsets[keep] - lo
        image[row[a.program], cols] = row[a.program] % 20
        outside[row[a.program], cols[~a.in_bounds[keep]]] = True
    fig, ax = figure_and_ax(ax, (9, 0.9 + 0.32 * len(image)))
    ax.imshow(
        image,
        aspect="auto",
        interpolation="nearest",
        cmap="tab20",
        vmin=0,
        vmax=19,
        extent=(lo - 0.5, hi - 0.5, len(image) - 0.5, -0.5),
    )
    red = np.where(outside, 1.0, np.nan)
    ax.imshow(
        red,
        aspect="auto",
        interpolation="nearest",
        cmap=ListedColormap(["red"]),
        vmin=0,
        vmax=1,
        extent=(lo - 0.5, hi - 0.5, len(image) - 0.5, -0.5),
    )
    for edge in (-0.5, numel - 0.5):
        ax.axvline(edge, color="black", lw=1.2)
    ax.set_yticks(range(len(programs)), [str(p[0]) if p[1:] == (0, 0) else str(p) for p in programs])
    ax.set_ylabel("program")
    ax.set_xlabel(f"element offset in {tensor} (black lines: its {numel} elements; red: out of bounds)")
    bad = int(outside.sum())
    ax.set_title(title or f"{kind}s of {tensor} per program" + (f": {bad} out of bounds" if bad else ""))
    return fig
