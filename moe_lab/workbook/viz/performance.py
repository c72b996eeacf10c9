"""Performance pictures: FLOPs and bytes of a layer, the roofline, committed benchmark results, and a
block-size widget that times live on a GPU (and refuses under the interpreter).

Committed results are the JSON files `moe-lab bench` writes to benchmarks/results/ (schema: `environment`,
`ceilings` {copy_tbps, read_tbps, bf16_matmul_tflops}, `rows` with model, T, impl, up_ms, down_ms, gemms_ms,
layer_ms, gemms_tflops, gemms_tbps, pct_roofline, rel_err). Every picture says its units and that the data
is committed, not measured here.

The `num_stages` sweep of notebook 07 lives here too: the shared memory a software-pipelined K loop holds
(`pipeline_shared_memory`), each tile's arithmetic intensity, and live times of a matmul kernel on a GPU
(`stage_sweep`, which never times under the interpreter).
"""

from __future__ import annotations

import glob
import json
import math
import numbers
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from ..._validate import check_positive_int, is_bool, type_name
from ...presets import MoEPreset, get_preset
from ._common import as_list, check_choice, figure_and_ax, int_list, show_figure

IMPLS = ("moe-lab pointer", "moe-lab tma", "torch._grouped_mm")
IMPL_STYLE = {
    "moe-lab pointer": ("#4C72B0", "o"),
    "moe-lab tma": ("#DD8452", "s"),
    "torch._grouped_mm": ("#55A868", "^"),
    "torch per-expert loop": ("#8C8C8C", "x"),
}
METRIC_LABEL = {
    "up_ms": "up GEMM time (ms)",
    "down_ms": "down GEMM time (ms)",
    "gemms_ms": "up + down GEMM time (ms)",
    "layer_ms": "whole layer time (ms)",
}


def results_dir() -> str:
    """benchmarks/results/ of the repository this package sits in."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # moe_lab/
    return os.path.join(os.path.dirname(package), "benchmarks", "results")


def committed_result(*parts: str) -> str:
    """The path of a committed result under benchmarks/results/ (`parts`, e.g. "studies", "x.json"). Raises
    FileNotFoundError saying what to do where it is not there: a copy of moe-lab installed without the repository
    (pip from a git address) has no benchmarks/ beside it."""
    path = os.path.join(results_dir(), *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{os.path.join('benchmarks', 'results', *parts)} is not beside this moe-lab ({results_dir()} "
            f"{'holds no such file' if os.path.isdir(results_dir()) else 'is missing'}): the committed H200 results "
            "come with the repository, not with a pip install. Clone it, `pip install --no-deps -e <clone>` and "
            "restart the kernel (a clone's setup cell installs nothing while this copy is installed; docs/hosted.md)"
        )
    return path


def load_results(path: Optional[str] = None) -> dict:
    """Load committed benchmark results.

    Args:
        path: a results JSON file, or None for the newest benchmarks/results/*.json of the repository
            (newest by the `environment.date` inside, then its `time` where recorded, then by file name).
    Returns:
        dict with `environment` (device, torch, triton, date, ...), `ceilings` (copy_tbps and read_tbps
        in TB/s, bf16_matmul_tflops in TFLOP/s, measured in the same run), `rows` (one dict per model, T
        and implementation; times in ms) and `path` (the file read).
    Raises:
        TypeError for a path that is not a str or os.PathLike; FileNotFoundError if no results file exists;
        ValueError naming the file if it is not valid JSON, holds no JSON object, or lacks `environment`
        and `ceilings` (objects) or `rows` (a list).
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike naming a results JSON file, or None, got {type_name(path)}")
    if path is None:
        files = glob.glob(os.path.join(committed_result(), "*.json"))
        if not files:
            raise FileNotFoundError(f"no benchmark results (*.json) in {results_dir()}")

        def key(f):
            try:
                with open(f) as fh:
                    env = json.load(fh).get("environment", {})
            except (OSError, ValueError):
                env = {}
            return (env.get("date", ""), env.get("time", ""), os.path.basename(f))

        path = max(files, key=key)
    with open(path) as fh:
        try:
            data = json.load(fh)
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{path} is not valid JSON (a benchmark results file is expected): {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object (benchmark results), got a JSON {type(data).__name__}")
    kinds = dict(environment=dict, ceilings=dict, rows=list)
    wrong = [f"{key} ({kind.__name__})" for key, kind in kinds.items() if not isinstance(data.get(key), kind)]
    if wrong:
        raise ValueError(f"{path} is not a benchmark results file: it lacks {', '.join(wrong)}")
    data["path"] = path
    return data


def describe_results(results: dict) -> str:
    """One line naming where committed results come from: device, software, date, ceilings."""
    env, c = results["environment"], results["ceilings"]
    return (
        f"committed data from {os.path.basename(results['path'])}: {env['device']} (sm_"
        f"{env.get('capability', '?').replace('.', '')}), torch {env['torch']}, triton {env['triton']}, "
        f"{env['date']}; ceilings measured in that run: copy {c['copy_tbps']:.2f} TB/s, "
        f"bf16 matmul {c['bf16_matmul_tflops']:.0f} TFLOP/s"
    )


def select_rows(
    results: dict, model: Optional[str] = None, impl: Optional[str] = None, num_tokens: Optional[int] = None
) -> List[dict]:
    """Rows of `results` matching model, impl and T (None = any), sorted by T."""
    rows = [
        r
        for r in results["rows"]
        if (model is None or r["model"] == model)
        and (impl is None or r["impl"] == impl)
        and (num_tokens is None or r["T"] == num_tokens)
    ]
    return sorted(rows, key=lambda r: r["T"])


def check_token_count(value, name: str = "T") -> int:
    """`value` if it is a whole token count (an int >= 1; numpy integers too). Raises TypeError for
    anything else (12.5, True, "64": a bool is not a count) and ValueError below 1, each naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} (the token count) must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} (the token count) must be >= 1, got {value}")
    return int(value)


def expected_experts_used(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Expected number of distinct experts hit by T tokens routed uniformly at random, k each.
    Raises TypeError / ValueError unless num_experts is an int >= 1, top_k an int in [1, num_experts] and
    num_tokens an int >= 0."""
    num_experts = check_positive_int("num_experts", num_experts)
    top_k = check_positive_int("top_k", top_k)
    if top_k > num_experts:  # each token's k experts are distinct
        raise ValueError(f"top_k must be <= num_experts = {num_experts}, got {top_k}")
    num_tokens = check_positive_int("num_tokens", num_tokens, minimum=0)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def layer_cost(
    preset: MoEPreset, num_tokens: int, *, itemsize: int = 2, experts_used: Optional[float] = None
) -> Dict[str, float]:
    """FLOPs and fewest bytes of the two GEMMs of one layer call (the benchmark's cost model).

    Args:
        preset: the layer's shape: a MoEPreset, or a preset's name such as "mixtral-8x7b" (looked up
            with `moe_lab.get_preset`).
        num_tokens: T.
        itemsize: bytes per element (2 for bf16).
        experts_used: distinct experts hit; default: the expectation under uniform routing.
    Returns:
        dict: flops (FLOP), bytes (B: weights of the experts used, tokens read, outputs written),
        intensity (FLOP/B), flops_per_token, bytes_per_token, experts_used.
    Raises:
        TypeError for a preset that is neither a MoEPreset nor a str, ValueError for an unknown name;
        TypeError / ValueError for a T or itemsize that is not an int >= 1, or experts_used that is not a
        real number in (0, min(E, T * top_k)].
    """
    from ...tools.timing import gemm_costs

    if isinstance(preset, str):
        preset = get_preset(preset)
    elif not isinstance(preset, MoEPreset):
        raise TypeError(f"preset must be a MoEPreset or a preset's name (str), got {type_name(preset)}")
    num_tokens = check_token_count(num_tokens)
    itemsize = check_positive_int("itemsize", itemsize)
    if experts_used is None:
        experts_used = expected_experts_used(preset.num_experts, preset.top_k, num_tokens)
    elif is_bool(experts_used) or not isinstance(experts_used, numbers.Real):
        raise TypeError(f"experts_used must be a real number, got {type_name(experts_used)}")
    else:
        experts_used = float(experts_used)
        most = min(preset.num_experts, num_tokens * preset.top_k)
        if not 0 < experts_used <= most:  # NaN fails too
            raise ValueError(f"experts_used must be in (0, min(E, T * top_k)] = (0, {most}], got {experts_used}")
    up, down = gemm_costs(preset, num_tokens, experts_used, itemsize)
    flops, total = up.flops + down.flops, up.bytes + down.bytes
    return dict(
        flops=flops,
        bytes=total,
        intensity=flops / total,
        flops_per_token=flops / num_tokens,
        bytes_per_token=total / num_tokens,
        experts_used=experts_used,
    )


def cost_table(models: Sequence[str], tokens: Sequence[int], *, itemsize: int = 2) -> str:
    """A text table of FLOP/token, bytes/token and arithmetic intensity for each model and T.
    Raises TypeError unless models and tokens are sequences (not a str), and as `layer_cost` (a T that is
    not an int >= 1, an unknown model)."""
    models = as_list("models", models, "preset names")
    tokens = [check_token_count(t) for t in as_list("tokens", tokens, "token counts")]
    lines = [f"{'model':<18} {'T':>6} {'experts hit':>11} {'MFLOP/token':>12} {'MB/token':>10} {'FLOP/B':>8}"]
    for name in models:
        p = get_preset(name)
        for t in tokens:
            c = layer_cost(p, t, itemsize=itemsize)
            lines.append(
                f"{name:<18} {t:>6} {c['experts_used']:>11.1f} {c['flops_per_token'] / 1e6:>12.1f} "
                f"{c['bytes_per_token'] / 1e6:>10.3f} {c['intensity']:>8.1f}"
            )
    return "\n".join(lines)


def _check_ceilings(ceilings) -> tuple:
    """(copy_tbps, bf16_matmul_tflops) of `ceilings`, each a positive finite number (the roofline's two lines
    on log axes: a missing one would raise a KeyError, a NaN or 0 draw nothing)."""
    keys = ("copy_tbps", "bf16_matmul_tflops")
    if not isinstance(ceilings, dict):
        raise TypeError(
            f"ceilings must be a dict with {', '.join(keys)} (load_results()['ceilings']), got {type_name(ceilings)}"
        )
    values = []
    for key in keys:
        if key not in ceilings:
            raise ValueError(f"ceilings must hold {key} (load_results()['ceilings']), got keys {sorted(ceilings)}")
        value = ceilings[key]
        if is_bool(value) or not isinstance(value, numbers.Real):
            raise TypeError(f"ceilings[{key!r}] must be a number, got {type_name(value)}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"ceilings[{key!r}] must be a positive finite number, got {value}")
        values.append(float(value))
    return tuple(values)


def plot_roofline(
    ceilings: Dict[str, float],
    *,
    results: Optional[dict] = None,
    presets: Sequence[str] = (),
    tokens: Sequence[int] = (1, 64, 4096),
    impls: Sequence[str] = ("moe-lab pointer", "moe-lab tma", "torch._grouped_mm"),
    ax=None,
) -> Figure:
    """The roofline: attainable TFLOP/s against arithmetic intensity (FLOP/byte), log-log.

    Args:
        ceilings: {"copy_tbps": TB/s, "bf16_matmul_tflops": TFLOP/s}, e.g. `load_results()["ceilings"]`.
        results: optional committed results; their GEMM rows are drawn as measured points (intensity =
            gemms_tflops / gemms_tbps, height = gemms_tflops).
        presets: model names whose intensity (at each of `tokens`) is marked on the x axis.
        tokens: token counts T for the preset marks (ints >= 1).
        impls: which implementations of `results` to draw.
        ax: optional Axes.
    Returns:
        The Figure.
    Raises:
        TypeError unless presets, tokens and impls are sequences (not a str); TypeError / ValueError for a
        token count that is not an int >= 1; TypeError / ValueError unless ceilings is a dict holding
        copy_tbps and bf16_matmul_tflops as positive finite numbers; TypeError for an ax that is not an Axes.
    """
    presets = as_list("presets", presets, "preset names")
    tokens = [check_token_count(t) for t in as_list("tokens", tokens, "token counts")]
    impls = as_list("impls", impls, "implementation names")
    bw, peak = _check_ceilings(ceilings)
    fig, ax = figure_and_ax(ax, (8, 5))
    x = np.logspace(-0.5, 4, 200)
    ax.plot(x, np.minimum(peak, x * bw), color="black", lw=2, label="roofline (measured ceilings)")
    ridge = peak / bw
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge * 1.08, peak * 0.03, f"ridge {ridge:.0f} FLOP/B", fontsize=8, color="grey", rotation=90)
    ax.text(1.0, bw * 1.0 * 1.4, f"memory: {bw:.2f} TB/s", fontsize=8, rotation=32)
    ax.text(x[-1] / 1.05, peak * 1.12, f"bf16 matmul: {peak:.0f} TFLOP/s", fontsize=8, ha="right")
    if results is not None:
        models = list(dict.fromkeys(r["model"] for r in results["rows"]))
        model_marker = dict(zip(models, ["o", "s", "^", "D", "v", "P"]))
        for impl in impls:
            color = IMPL_STYLE.get(impl, ("black", "."))[0]
            for model in models:
                pts = [
                    (r["gemms_tflops"] / r["gemms_tbps"], r["gemms_tflops"])
                    for r in select_rows(results, model, impl)
                    if r.get("gemms_tflops") and r.get("gemms_tbps")
                ]
                if pts:
                    xs, ys = zip(*pts)
                    ax.scatter(xs, ys, color=color, marker=model_marker[model], s=30, alpha=0.8)
        for impl in impls:  # legend: colour = implementation, marker = model
            ax.scatter([], [], color=IMPL_STYLE.get(impl, ("black", "."))[0], marker="o", label=impl)
        for model in models:
            ax.scatter([], [], color="grey", marker=model_marker[model], label=model)
        env = results["environment"]
        ax.set_title(
            f"Roofline, {env['device']} (committed data, {env['date']}): points = up+down GEMMs per model and T",
            fontsize=9,
        )
    else:
        ax.set_title("Roofline from measured ceilings", fontsize=9)
    marks = ["|", "2", "x", "+", "1"]
    for j, name in enumerate(presets):
        p = get_preset(name)
        for t in tokens:
            ai = layer_cost(p, t)["intensity"]
            ax.scatter(
                [ai],
                [min(peak, ai * bw)],
                marker=marks[j % len(marks)],
                s=90,
                color="purple",
                label=f"{name} (T in {list(tokens)})" if t == tokens[0] else None,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of weights + activations)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(0.1, peak * 2)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return fig


def plot_time_vs_tokens(
    results: dict,
    model: str,
    *,
    metric: str = "gemms_ms",
    impls: Sequence[str] = IMPLS,
    show_roofline: bool = True,
    ax=None,
) -> Figure:
    """Time against token count T for one model, one line per implementation (committed data), log-log.

    Args:
        results: committed results from `load_results`.
        model: preset name, e.g. "qwen3-30b-a3b".
        metric: "up_ms", "down_ms", "gemms_ms" or "layer_ms" (milliseconds, median with L2 flushed).
        impls: implementations to draw.
        show_roofline: also draw the roofline bound of the two GEMMs (only for gemms_ms).
        ax: optional Axes.
    Returns:
        The Figure.
    Raises:
        ValueError for a metric not among the four above (another draws nothing) or no impls; TypeError for
        impls that are not a sequence (a str).
    """
    check_choice("metric", metric, list(METRIC_LABEL))
    impls = as_list("impls", impls, "implementation names")
    if not impls:
        raise ValueError("impls must name at least one implementation, got none")
    fig, ax = figure_and_ax(ax, (6, 4))
    for impl in impls:
        rows = [r for r in select_rows(results, model, impl) if r.get(metric)]
        if rows:
            color, marker = IMPL_STYLE.get(impl, ("black", "."))
            ax.plot([r["T"] for r in rows], [r[metric] for r in rows], marker=marker, color=color, label=impl)
    if show_roofline and metric == "gemms_ms":
        rows = select_rows(results, model, impls[0])
        ax.plot(
            [r["T"] for r in rows],
            [r["roofline_gemms_ms"] for r in rows],
            ls="--",
            color="black",
            lw=1,
            label="roofline bound",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T")
    ax.set_ylabel(METRIC_LABEL.get(metric, metric))
    ax.set_title(f"{model} on {results['environment']['device']} (committed data)", fontsize=9)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8)
    return fig


def plot_time_grid(
    results: dict, *, metric: str = "gemms_ms", models: Optional[Sequence[str]] = None, impls: Sequence[str] = IMPLS
) -> Figure:
    """`plot_time_vs_tokens` for every model of `results` (or of `models`), side by side. Returns the
    Figure. Raises TypeError for models that are not a sequence (a str), and as `plot_time_vs_tokens`."""
    check_choice("metric", metric, list(METRIC_LABEL))  # before the Figure is made
    models = as_list("models", models, "model names") if models is not None else None
    models = list(models or dict.fromkeys(r["model"] for r in results["rows"]))
    fig = Figure(figsize=(4.6 * len(models), 3.8), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        plot_time_vs_tokens(results, model, metric=metric, impls=impls, ax=ax)
        ax.set_title(model, fontsize=9)
    fig.suptitle(
        f"{METRIC_LABEL.get(metric, metric)} vs T, {results['environment']['device']}, committed data "
        f"({results['environment']['date']}); lower is better",
        fontsize=10,
    )
    return fig


def compare_table(
    results: dict,
    *,
    base: str = "moe-lab pointer",
    other: str = "moe-lab tma",
    metrics: Sequence[str] = ("up_ms", "down_ms", "gemms_ms"),
    models=None,
) -> str:
    """Text table of `other` against `base` for each model and T: times in ms (median, L2 flushed) and
    speedup = base time / other time for each metric (> 1 means `other` is faster). Raises TypeError for
    metrics or models that are not a sequence (a str: its characters would be read as metrics)."""
    metrics = as_list("metrics", metrics, "metric names")
    models = as_list("models", models, "model names") if models is not None else None
    models = list(models or dict.fromkeys(r["model"] for r in results["rows"]))
    short = {m: m.replace("_ms", "") for m in metrics}
    lines = [
        f"A = {base}, B = {other}; times in ms; B/A speedup = time A / time B (> 1: B faster)",
        f"{'model':<15} {'T':>6} "
        + " ".join(f"{short[m] + ' A':>10} {short[m] + ' B':>10} {'speedup':>7}" for m in metrics),
    ]
    for model in models:
        for ra in select_rows(results, model, base):
            rb = select_rows(results, model, other, ra["T"])
            if not rb:
                continue
            cells = []
            for m in metrics:
                a_ms, b_ms = ra.get(m), rb[0].get(m)
                sp = f"{a_ms / b_ms:>6.2f}x" if a_ms and b_ms else f"{'-':>7}"
                cells.append(f"{a_ms if a_ms else float('nan'):>10.4f} {b_ms if b_ms else float('nan'):>10.4f} {sp}")
            lines.append(f"{model:<15} {ra['T']:>6} " + " ".join(cells))
    return "\n".join(lines)


def time_layer(preset: MoEPreset, num_tokens: int, config, *, use_tma="auto", seed: int = 0) -> float:
    """Median time in ms of one `fused_moe` call on a GPU (bf16, L2 flushed before each run).

    Args:
        preset: the layer's shape (full size on a GPU).
        num_tokens: T.
        config: a GemmConfig / MoEConfig / dict accepted by `fused_moe`.
        use_tma: passed to `fused_moe`.
    Returns:
        milliseconds.
    Raises:
        RuntimeError under the interpreter or without a GPU (timings there mean nothing).
    """
    from ...runtime import require_gpu_timing

    num_tokens = check_token_count(num_tokens)
    require_gpu_timing("time_layer")
    import torch

    from ...layer import fused_moe
    from ...tools.timing import median_ms

    hs, w1, w2, (tw, ti) = preset.build(num_tokens, dtype=torch.bfloat16, device="cuda", seed=seed)
    fused_moe(hs, w1, w2, tw, ti, config=config, use_tma=use_tma)  # compile outside the timed runs
    return median_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=config, use_tma=use_tma))


def plot_bars(entries: Sequence[tuple], *, title: str, unit: str = "ms", ax=None) -> Figure:
    """Horizontal bars: entries are (label, value) pairs, value in `unit`. Returns the Figure. Raises
    TypeError unless entries is a sequence of (label, number) pairs, ValueError for a value that is not
    finite (matplotlib cannot set the axis to it), TypeError for an ax that is not a matplotlib Axes."""
    entries = as_list("entries", entries, "(label, value) pairs")
    for i, entry in enumerate(entries):
        value = entry[1] if isinstance(entry, (tuple, list)) and len(entry) == 2 else None
        if is_bool(value) or not isinstance(value, numbers.Real):
            raise TypeError(f"entries[{i}] must be a (label, value) pair with a number value, got {entry!r}")
        if not math.isfinite(value):
            raise ValueError(f"entries[{i}] must have a finite value, got {entry!r}")
    fig, ax = figure_and_ax(ax, (7, 0.45 * len(entries) + 1.2))
    labels = [e[0] for e in entries]
    values = [e[1] for e in entries]
    ax.barh(range(len(values)), values, color=["#DD8452" if "live" in l else "#4C72B0" for l in labels])
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3f} {unit}", va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.35 if values else 1)
    ax.set_xlabel(f"time ({unit}), lower is better")
    ax.set_title(title, fontsize=9)
    return fig


def block_size_widget(model: str = "qwen3-30b-a3b", num_tokens: int = 512, *, results: Optional[dict] = None):
    """Choose BLOCK_SIZE_M/N/K for a layer and time `fused_moe` with them, live, on a GPU.

    Under the interpreter (or with no GPU) it refuses to time, says why, and shows the committed results
    for the same model and T instead, labelled as committed data.

    Args:
        model: preset name (full size; only timed on a GPU).
        num_tokens: T, an int >= 1 (TypeError / ValueError otherwise); on the interpreter the committed
            rows of that T are shown.
        results: committed results (default: `load_results()`).
    Returns:
        ipywidgets.VBox; `.figure` is the current Figure, `.summary` the HTML line, `.timings` a list of
        (label, ms) for the live runs so far.
    Raises:
        ValueError for a model not in `moe_lab.PRESETS` (the dropdown's choices).
    """
    import ipywidgets as widgets

    from ...configs import GemmConfig
    from ...presets import PRESETS
    from ...runtime import require_gpu_timing

    num_tokens = check_token_count(num_tokens)
    check_choice("model", model, list(PRESETS))  # the dropdown would raise a TraitError naming neither
    results = results if results is not None else load_results()
    name = widgets.Dropdown(options=list(PRESETS), value=model, description="model")
    tokens = widgets.Dropdown(
        options=sorted({r["T"] for r in results["rows"]} | {num_tokens}), value=num_tokens, description="T"
    )
    bm = widgets.Dropdown(options=[16, 32, 64, 128], value=64, description="BLOCK_SIZE_M")
    bn = widgets.Dropdown(options=[32, 64, 128, 256], value=128, description="BLOCK_SIZE_N")
    bk = widgets.Dropdown(options=[32, 64, 128], value=64, description="BLOCK_SIZE_K")
    summary = widgets.HTML()
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([name, tokens]), widgets.HBox([bm, bn, bk]), summary, out])
    box.timings = []

    def draw(_=None):
        cfg = GemmConfig(bm.value, bn.value, bk.value, 8, 8 if bm.value * bn.value >= 128 * 128 else 4, 3)
        label = f"M{bm.value} N{bn.value} K{bk.value}"
        committed = [
            (f"{r['impl']} (committed, H200)", r["layer_ms"])
            for r in select_rows(results, name.value, num_tokens=tokens.value)
            if r.get("layer_ms")
        ]
        try:
            require_gpu_timing("live block-size timing")
        except RuntimeError as exc:
            summary.value = (
                f"<b>Not timing {label}:</b> {exc}<br>Shown instead: committed whole-layer times "
                f"for {name.value}, T={tokens.value} ({describe_results(results)})."
            )
            fig = plot_bars(
                committed or [("no committed row for this T", 0.0)],
                title=f"{name.value}, T={tokens.value}: committed whole-layer times (not measured here)",
            )
        else:
            try:
                ms = time_layer(get_preset(name.value), tokens.value, cfg)
                box.timings.append((f"{name.value} T={tokens.value} {label} (live)", ms))
                summary.value = (
                    f"{label}: fused_moe {ms:.3f} ms (median, L2 flushed, bf16) on this GPU; "
                    "bars below compare with the committed H200 times of the default configs."
                )
            except Exception as exc:  # e.g. shared memory OutOfResources for a large block
                summary.value = f"{label} failed on this GPU: {type(exc).__name__}: {str(exc)[:200]}"
            live = [t for t in box.timings if t[0].startswith(f"{name.value} T={tokens.value} ")]
            fig = plot_bars(
                [(t[0].split(" ", 2)[2], t[1]) for t in live] + committed,
                title=f"{name.value}, T={tokens.value}: live configs vs committed whole-layer times",
            )
        box.figure = fig
        show_figure(out, fig)

    for w in (name, tokens, bm, bn, bk):
        w.observe(draw, names="value")
    draw()
    box.summary = summary
    return box


# --- the num_stages sweep (notebook 07) -------------------------------------------------------------------

H200_SHARED_MEMORY_BYTES = 232448  # 227 KiB per block (opt-in), what an H200 reports (moe_lab.tools.compile_only)


def _sizes(**sizes) -> list:
    """The named tile sizes as ints >= 1 (`check_positive_int`), in order."""
    return [check_positive_int(name, value) for name, value in sizes.items()]


def pipeline_shared_memory(block_m: int, block_n: int, block_k: int, num_stages: int, itemsize: int = 2) -> int:
    """Bytes of shared memory a software-pipelined K loop holds: one A tile (block_m x block_k) and one B
    tile (block_k x block_n) per stage, `itemsize` bytes each: (BM*BK + BK*BN) * itemsize * stages. (The
    launcher's `GemmConfig.shared_memory_bytes` is the same estimate for num_stages >= 2.)
    Raises TypeError / ValueError for an argument that is not an int >= 1."""
    block_m, block_n, block_k, num_stages, itemsize = _sizes(
        block_m=block_m, block_n=block_n, block_k=block_k, num_stages=num_stages, itemsize=itemsize
    )
    return (block_m * block_k + block_k * block_n) * itemsize * num_stages


def tile_intensity(block_m: int, block_n: int, block_k: int, itemsize: int = 2) -> float:
    """FLOP per byte loaded in one K step of one tile: 2*BM*BN*BK / ((BM*BK + BK*BN) * itemsize), which is
    2*BM*BN / ((BM + BN) * itemsize): larger tiles reuse each loaded byte more often. BLOCK_K drops out.
    Raises TypeError / ValueError for an argument that is not an int >= 1."""
    block_m, block_n, block_k, itemsize = _sizes(block_m=block_m, block_n=block_n, block_k=block_k, itemsize=itemsize)
    return 2 * block_m * block_n * block_k / ((block_m * block_k + block_k * block_n) * itemsize)


def _default_shared_memory_limit() -> int:
    from ...runtime import default_device

    if default_device().type == "cuda":
        from ...capability import shared_memory_limit

        return shared_memory_limit()
    return H200_SHARED_MEMORY_BYTES


def time_matmul(
    kernel, a, b, c, block_m: int, block_n: int, block_k: int, num_stages: int, num_warps: Optional[int] = None
) -> float:
    """Median time in ms of one launch of a matmul kernel with notebook 07's signature (`matmul_kernel(a_ptr,
    b_ptr, c_ptr, M, N, K, strides..., BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, NUM_STAGES)`), C = A @ B,
    L2 flushed before each run. num_warps: default 8 for tiles of 128 x 128 or more, else 4. Raises
    RuntimeError under the interpreter or without a GPU (timings there mean nothing), and whatever the
    launch raises (e.g. triton's OutOfResources when the stages do not fit in shared memory)."""
    from ...runtime import require_gpu_timing
    from ...tools.timing import median_ms

    require_gpu_timing("time_matmul")
    import triton

    (m, k), n = a.shape, b.shape[1]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    warps = num_warps or (8 if block_m * block_n >= 128 * 128 else 4)

    def launch():
        kernel[grid](
            a,
            b,
            c,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            BLOCK_SIZE_M=block_m,
            BLOCK_SIZE_N=block_n,
            BLOCK_SIZE_K=block_k,
            NUM_STAGES=num_stages,
            num_warps=warps,
        )

    launch()  # compile outside the timed runs
    return median_ms(launch)


def stage_sweep(
    blocks: Sequence[tuple],
    stages: Sequence[int],
    *,
    kernel=None,
    size: int = 4096,
    itemsize: int = 2,
    limit: Optional[int] = None,
) -> List[dict]:
    """The cost model of each (block shape, num_stages), and with `kernel` its measured time on a GPU.

    Args:
        blocks: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K) triples.
        stages: num_stages values.
        kernel: None (cost model only: works anywhere), or a matmul kernel with notebook 07's signature,
            timed on float16 A [size, size] and B [size, size] (a transposed view, like the exercise's),
            float32 C. Timing raises RuntimeError under the interpreter or without a GPU.
        size: M = N = K of the timed matmul.
        itemsize: bytes per A/B element of the cost model (2: float16 / bf16).
        limit: shared memory bytes per block; default this GPU's, or an H200's 227 KiB where kernels do
            not run on a GPU.
    Returns:
        one dict per (block, stages): block_m, block_n, block_k, num_stages, itemsize, smem_bytes, limit, fits,
        intensity (FLOP/B per K step), and when timed ms and tflops (None where the launch failed, with
        its error in `error`).
    Raises:
        TypeError unless blocks and stages are sequences (not a str); TypeError / ValueError unless each
        block is 3 ints >= 1, each stage count, size, itemsize and limit (if given) an int >= 1.
    """
    blocks = [
        int_list(f"blocks[{i}]", b, 1, what="3 ints (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)", length=3)
        for i, b in enumerate(as_list("blocks", blocks, "(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K) triples"))
    ]
    stages = int_list("stages", stages, 1, what="num_stages values")
    size = check_positive_int("size", size)
    itemsize = check_positive_int("itemsize", itemsize)
    if limit is not None:
        limit = check_positive_int("limit", limit)
    limit = limit if limit is not None else _default_shared_memory_limit()
    operands = None
    if kernel is not None:
        from ...runtime import require_gpu_timing

        require_gpu_timing("stage_sweep")
        import torch

        operands = (
            torch.randn(size, size, device="cuda", dtype=torch.float16),
            torch.randn(size, size, device="cuda", dtype=torch.float16).T,
            torch.empty(size, size, device="cuda", dtype=torch.float32),
        )
    rows = []
    for bm, bn, bk in blocks:
        for s in stages:
            smem = pipeline_shared_memory(bm, bn, bk, s, itemsize)
            row = dict(
                block_m=bm,
                block_n=bn,
                block_k=bk,
                num_stages=s,
                itemsize=itemsize,
                smem_bytes=smem,
                limit=limit,
                fits=smem <= limit,
                intensity=tile_intensity(bm, bn, bk, itemsize),
            )
            if operands is not None:
                try:
                    row["ms"] = time_matmul(kernel, *operands, bm, bn, bk, s)
                    row["tflops"] = 2 * size**3 / row["ms"] / 1e9
                except Exception as exc:  # noqa: BLE001 - e.g. OutOfResources: the stages do not fit
                    row.update(ms=None, tflops=None, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            rows.append(row)
    return rows


def stage_sweep_table(rows: Sequence[dict]) -> str:
    """A text table of `stage_sweep` rows: shared memory (KiB) against the limit, intensity, and the
    measured time and TFLOP/s where the rows were timed."""
    timed = any("ms" in r for r in rows)
    limit = rows[0]["limit"] if rows else H200_SHARED_MEMORY_BYTES
    head = (
        f"{'BLOCK_M':>7} {'BLOCK_N':>7} {'BLOCK_K':>7} {'stages':>6} {'smem KiB':>9} "
        f"{'fits ' + format(limit / 1024, 'g') + ' KiB':>13} {'FLOP/B':>7}"
    )
    lines = [head + (f" {'ms':>8} {'TFLOP/s':>8}" if timed else "")]
    for r in rows:
        line = (
            f"{r['block_m']:>7} {r['block_n']:>7} {r['block_k']:>7} {r['num_stages']:>6} "
            f"{r['smem_bytes'] / 1024:>9.0f} {'yes' if r['fits'] else 'NO':>13} {r['intensity']:>7.1f}"
        )
        if timed:
            line += f" {r['ms']:>8.3f} {r['tflops']:>8.0f}" if r.get("ms") else f"  failed: {r.get('error', '')}"
        lines.append(line)
    return "\n".join(lines)


def plot_stage_sweep(rows: Sequence[dict], *, title: str = "") -> Figure:
    """Shared memory against num_stages for each block shape, with the per-block limit; a second panel
    with the measured TFLOP/s when the rows were timed. Returns the Figure."""
    shapes = list(dict.fromkeys((r["block_m"], r["block_n"], r["block_k"]) for r in rows))
    timed = any(r.get("tflops") for r in rows)
    fig = Figure(figsize=(13 if timed else 8.5, 4), layout="constrained")
    axes = fig.subplots(1, 2 if timed else 1, squeeze=False)[0]
    limit = rows[0]["limit"] if rows else H200_SHARED_MEMORY_BYTES
    for shape in shapes:
        mine = [r for r in rows if (r["block_m"], r["block_n"], r["block_k"]) == shape]
        label = f"{shape[0]}x{shape[1]}x{shape[2]} ({mine[0]['intensity']:.0f} FLOP/B)"
        (line,) = axes[0].plot(
            [r["num_stages"] for r in mine], [r["smem_bytes"] / 1024 for r in mine], marker="o", label=label
        )
        if timed:
            pts = [(r["num_stages"], r["tflops"]) for r in mine if r.get("tflops")]
            if pts:
                axes[1].plot(*zip(*pts), marker="o", color=line.get_color(), label=label)
    top = max([r["smem_bytes"] for r in rows] + [limit]) / 1024 * 1.08
    axes[0].axhspan(limit / 1024, top, color="#C44E52", alpha=0.08)
    axes[0].axhline(limit / 1024, color="black", ls="--", lw=1)
    axes[0].text(
        min(r["num_stages"] for r in rows) if rows else 1,
        limit / 1024 * 1.03,
        f"limit {limit / 1024:g} KiB per block: above it the kernel does not launch",
        fontsize=8,
    )
    axes[0].set_ylim(0, top)
    axes[0].set_xticks(sorted({r["num_stages"] for r in rows}))
    axes[0].set_xlabel("num_stages")
    axes[0].set_ylabel("shared memory of the A and B tiles (KiB)")
    itemsize = rows[0].get("itemsize", 2) if rows else 2
    axes[0].set_title(f"cost model: (BM*BK + BK*BN) * {itemsize} bytes * num_stages", fontsize=9)
    axes[-1].legend(
        *axes[0].get_legend_handles_labels(),
        fontsize=8,
        title="BLOCK M x N x K (tile intensity)",
        title_fontsize=8,
        loc="center left",
        bbox_to_anchor=(1.01, 0.5),
    )
    axes[0].grid(True, alpha=0.2)
    if timed:
        axes[1].set_xticks(sorted({r["num_stages"] for r in rows}))
        axes[1].set_xlabel("num_stages")
        axes[1].set_ylabel("TFLOP/s (measured here, median, L2 flushed)")
        axes[1].set_title("measured live on this GPU; missing points failed to launch", fontsize=9)
        axes[1].grid(True, alpha=0.2)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
