"""Pictures and tables of notebook 10: a schematic timeline of one program of a block-scaled FP8 GEMM (three
ways to schedule it), and the committed H200 measurements of the Gluon FP8 GEMM, step by step.

The timeline is a **schematic**, not a measurement: `timeline(schedule)` lays out, in made-up time units
(`DURATIONS`), the order of work the kernels' code implies: TMA loads, wgmmas, the scaling of each K block's
product, the epilogue. `plot_timeline` draws the three schedules one above the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ._common import as_list
from .performance import check_token_count, committed_result

# Made-up durations of one K block's work (time units of the schematic): a TMA load of a stage, its wgmma, the
# scaling of its float32 product (a multiply-add per accumulator element, on the CUDA cores), and one tile's
# epilogue (convert, store).
DURATIONS = {"load": 1.0, "mma": 1.0, "scale": 0.6, "epilogue": 2.0}
K_BLOCKS = 4  # per tile
STAGES = 3  # the ring of shared-memory stages
TILES = 2
SCHEDULES = {
    "one warpgroup": "Triton's FP8 kernel: the same warps issue the wgmma, wait for it and scale its product",
    "warp-specialized": "moe-lab's Gluon kernel: a load warp fills the ring; the MMA warpgroup scales K block k "
    "while the wgmma of k + 1 runs",
    "ping-pong": "two MMA warpgroups on two tiles take turns at the tensor cores (DeepSeek-V3's scheme; not in "
    "moe-lab's kernel)",
}
LANES = {
    "one warpgroup": ("TMA", "tensor cores", "CUDA cores"),
    "warp-specialized": ("TMA", "tensor cores", "CUDA cores"),
    "ping-pong": ("TMA", "tensor cores", "CUDA cores, warpgroup 0", "CUDA cores, warpgroup 1"),
}
COLORS = {"load": "tab:blue", "mma": "tab:green", "scale": "tab:orange", "epilogue": "tab:red"}


@dataclass(frozen=True)
class Segment:
    lane: str
    kind: str  # "load", "mma", "scale", "epilogue"
    start: float
    length: float
    label: str  # the tile and K block, e.g. "0.3"


def _loads_for(segments: List[Segment]) -> List[Segment]:
    """The TMA load of every wgmma's stage, issued as early as a ring of STAGES stages allows: load j once load
    j - 1 is issued and the wgmma of j - STAGES has released its stage."""
    load = DURATIONS["load"]
    mmas = sorted((s for s in segments if s.kind == "mma"), key=lambda s: s.start)
    out: List[Segment] = []
    for j, m in enumerate(mmas):
        start = max(
            out[-1].start + load if out else -load,
            mmas[j - STAGES].start + mmas[j - STAGES].length if j >= STAGES else -load,
        )
        out.append(Segment("TMA", "load", start, load, m.label))
    return out


def timeline(schedule: str) -> List[Segment]:
    """The segments of one schedule of SCHEDULES (TILES tiles of K_BLOCKS K blocks), times from 0."""
    mma, scale, epi = DURATIONS["mma"], DURATIONS["scale"], DURATIONS["epilogue"]
    out: List[Segment] = []
    if schedule == "one warpgroup":
        t = 0.0
        for tile in range(TILES):
            for k in range(K_BLOCKS):
                out.append(Segment("tensor cores", "mma", t, mma, f"{tile}.{k}"))
                out.append(Segment("CUDA cores", "scale", t + mma, scale, f"{tile}.{k}"))
                t += mma + scale
            out.append(Segment("CUDA cores", "epilogue", t, epi, f"{tile}"))
            t += epi
    elif schedule == "warp-specialized":
        t = 0.0
        for tile in range(TILES):
            for k in range(0, K_BLOCKS, 2):  # K blocks in pairs: both wgmmas issued, the first scaled meanwhile
                out.append(Segment("tensor cores", "mma", t, mma, f"{tile}.{k}"))
                out.append(Segment("tensor cores", "mma", t + mma, mma, f"{tile}.{k + 1}"))
                out.append(Segment("CUDA cores", "scale", t + mma, scale, f"{tile}.{k}"))
                out.append(Segment("CUDA cores", "scale", t + 2 * mma, scale, f"{tile}.{k + 1}"))
                t += 2 * mma + scale
            out.append(Segment("CUDA cores", "epilogue", t, epi, f"{tile}"))
            t += epi
    elif schedule == "ping-pong":
        ready = [0.0, 0.0]  # when each warpgroup can issue its next wgmma
        core = 0.0  # when the tensor cores are free
        for k in range(K_BLOCKS):
            for wg in (0, 1):
                start = max(ready[wg], core)
                lane = f"CUDA cores, warpgroup {wg}"
                out.append(Segment("tensor cores", "mma", start, mma, f"{wg}.{k}"))
                out.append(Segment(lane, "scale", start + mma, scale, f"{wg}.{k}"))
                core, ready[wg] = start + mma, start + mma + scale
        for wg in (0, 1):
            out.append(Segment(f"CUDA cores, warpgroup {wg}", "epilogue", ready[wg], epi, f"{wg}"))
    else:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    out += _loads_for(out)
    first = min(s.start for s in out)
    return [Segment(s.lane, s.kind, s.start - first, s.length, s.label) for s in out]


def tensor_core_busy(segments: List[Segment]) -> float:
    """The fraction of the schedule's span (first wgmma to last) in which the tensor cores run a wgmma.
    Raises ValueError for segments without a wgmma (no span)."""
    mmas = [s for s in segments if s.kind == "mma"]
    if not mmas:
        raise ValueError("segments must hold at least one wgmma (kind 'mma'), as timeline(schedule) returns")
    span = max(s.start + s.length for s in mmas) - min(s.start for s in mmas)
    return sum(s.length for s in mmas) / span


def plot_timeline(schedules=tuple(SCHEDULES)) -> Figure:
    """The schedules one above the other on one time axis, each titled with its tensor-core busy fraction.
    Raises TypeError unless schedules is a sequence of names (a str such as "ping-pong" is one name: pass
    ["ping-pong"]); ValueError for no schedules or a name not in SCHEDULES."""
    schedules = as_list("schedules", schedules, f"schedule names (of {list(SCHEDULES)})")
    if not schedules:
        raise ValueError(f"schedules must name at least one of {list(SCHEDULES)}, got none")
    drawn = [(schedule, timeline(schedule)) for schedule in schedules]  # an unknown name: before the Figure
    fig = Figure(figsize=(11, 2.0 * len(schedules) + 0.6))
    axes = fig.subplots(len(schedules), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (schedule, segments) in zip(axes, drawn):
        lanes = LANES[schedule]
        for s in segments:
            y = len(lanes) - 1 - lanes.index(s.lane)
            ax.broken_barh([(s.start, s.length)], (y - 0.4, 0.8), facecolors=COLORS[s.kind], edgecolor="white")
            if s.length >= 0.6:
                ax.text(s.start + s.length / 2, y, s.label, ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(lanes)), labels=list(reversed(lanes)), fontsize=8)
        ax.set_title(
            f"{schedule} (tensor cores busy {tensor_core_busy(segments):.0%} of the time)",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlabel("time (schematic units, not measured); labels: tile.K block")
    handles = [Patch(color=c, label=k) for k, c in COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncols=4, fontsize=8)
    fig.suptitle(
        "A schematic of one program's timeline (from the kernels' code, not a measurement)",
        x=0.01,
        ha="left",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


# --- the committed H200 measurements ---------------------------------------------------------------------

GLUON_RESULTS = os.path.join("gluon_fp8", "gluon_fp8.json")
# Each variant of the committed benchmark, in the order of the steps, with the reason it moved.
STEPS = {
    "triton bf16": "bf16 operands, twice FP8's bytes and half its tensor-core rate",
    "triton fp8": "FP8 operands; one warpgroup issues each product, waits for it and scales it, so the tensor "
    "cores idle while it scales (2 to 3 programs per SM fill part of the gap)",
    "gluon fp8 64x128 4st": "warp-specialized: a load warp keeps the ring full, one MMA warpgroup scales K block "
    "k while k + 1 multiplies; one 64-row warpgroup per program, and one program per SM",
    "gluon fp8 128x128 4st": "two MMA warpgroups (128 rows), each a partition of its own: twice the work per W "
    "box, and each releases a stage on its own, so one scales or stores while the other multiplies",
    "dense fp8 _scaled_mm": "ceiling: cuBLAS's dense FP8 GEMM of the same FLOPs (per-tensor scales, no routing)",
}


def load_gluon_results(path: Optional[str] = None) -> dict:
    """The committed H200 results of `benchmarks/gluon_fp8.py` (benchmarks/results/gluon_fp8/gluon_fp8.json)."""
    with open(path or committed_result(GLUON_RESULTS)) as f:
        return json.load(f)


def steps_table(results: dict, tokens: int = 16384) -> str:
    """One row per step of STEPS at `tokens` tokens: TFLOP/s per model, then the reason it moved.
    Raises TypeError / ValueError for tokens that are not an int >= 1, ValueError for a T the results do not
    hold (a table without a model)."""
    tokens = check_token_count(tokens, "tokens")
    rows = [r for r in results["rows"] if r["T"] == tokens]
    if not rows:
        measured = sorted({r["T"] for r in results["rows"]})
        raise ValueError(f"tokens must be one of the measured T {measured}, got {tokens}")
    models = list(dict.fromkeys(r["model"] for r in rows))
    by: Dict[tuple, dict] = {(r["model"], r["variant"]): r for r in rows}
    head = f"{'step (T = ' + str(tokens) + ')':<24}" + "".join(f"{m[:14]:>15}" for m in models)
    lines = [head + "   TFLOP/s; (Triton FP8 time / this)"]
    for variant, reason in STEPS.items():
        cells = []
        for m in models:
            r = by.get((m, variant))
            cells.append(f"{r['tflops']:>7.0f} ({r['vs_triton_fp8']:.2f})" if r else f"{'-':>15}")
        lines.append(f"{variant:<24}" + "".join(f"{c:>15}" for c in cells))
        lines.append(f"{'':<4}why: {reason}")
    return "\n".join(lines)
