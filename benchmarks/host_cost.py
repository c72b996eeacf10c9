"""Host time against GPU time of one `fused_moe` call, at decode sizes, on a CUDA GPU.

    python benchmarks/host_cost.py --out host_cost.json [--models ...] [--tokens 1 8 64] [--profile prof.txt]

For each model preset (full size, bfloat16) and token count T it measures, in milliseconds per call:
  - host_ms: the wall time of the Python call (`time.perf_counter` around `fused_moe`), the GPU idle before each
    call (`torch.cuda.synchronize()` outside the timed region), so the time is the host's alone: checks, planning
    and enqueueing the kernels (a kept call's program, `moe_lab._launch.Program`); the least of --passes medians
    of --calls calls, taken in passes over all points (a busy host slows a stretch of time, not one point);
  - host_no_program_ms: host_ms without replaying a kept call's launches (`moe_lab._launch.Program.of` made to
    make none): every call walks the plan's stages and launches through the handles; in the same passes,
    alternating with host_ms; absent where the package has no programs;
  the other columns, one point after another:
  - host_busy_ms: host_ms while the GPU is busy with the calls before it (bursts of 16 calls back to back, each
    timed alone, the first of a burst left out; the least of 5 medians): what each call of an eager decode loop
    costs the host, its launches queued behind running kernels rather than onto an idle GPU;
  - host_triton_launch_ms: host_ms (here the least of 3 medians of --calls / 3 calls) with every launch through
    Triton's launcher (`JITFunction.run`), the plan cache on: no compiled handle is kept
    (`moe_lab._launch._is_compiled` made to say no); absent where the package has no handles;
  - host_uncached_ms: the same with the layer-plan cache off (`moe_lab.plan.layer_plan_cache(False)`): every
    call checks its weights and plans its stages again, and launches through Triton's launcher; absent where
    the package has no such switch;
  - gpu_ms: the median of CUDA-graph replays of the call, L2 flushed before each (`moe_lab.tools.timing.graph_ms`):
    the GPU's time without any host cost;
  - eager_ms: calls back to back without synchronizing, total time / calls: what an engine that does not
    capture graphs sees, about max(host_ms, gpu_ms);
  - host_no_launch_ms: host_ms with the launches left out (`JITFunction.run` made a no-op, so that no handle
    is kept, nor a program): the host time of walking the plan's stages and PyTorch's allocations;
    host_no_program_ms less this is the cost of the launches through the handles.
Writes the rows as JSON to --out and as a markdown table beside it (same name, .md); prints the table.
With --profile, also writes the cProfile statistics (sorted by own time) of 200 calls at every point to
that file. Needs a CUDA GPU; takes about a minute on an H200.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from moe_lab import fused_moe, get_preset  # noqa: E402
from moe_lab.routing import uniform_routing  # noqa: E402
from moe_lab.runtime import require_gpu_timing  # noqa: E402
from moe_lab.tools.bench import environment  # noqa: E402
from moe_lab.tools.timing import graph_ms  # noqa: E402

try:
    from moe_lab.plan import clear_layer_plans, layer_plan_cache
except ImportError:  # a moe-lab without the cache: no uncached column
    clear_layer_plans = layer_plan_cache = None
try:
    from moe_lab import _launch
except ImportError:  # a moe-lab without compiled handles: no column for Triton's launcher
    _launch = None

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
TOKENS = (1, 8, 64)


def host_ms(call, calls: int, rounds: int = 3) -> float:
    """Wall time (ms) of `call()`, the GPU idle before each: the least of `rounds` medians of `calls // rounds`
    calls (a busy host slows whole rounds; the least median is the call's own cost)."""
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(max(1, calls // rounds)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    torch.cuda.synchronize()
    return 1e3 * min(medians)


def host_busy_ms(call, rounds: int = 5, burst: int = 16) -> float:
    """Wall time (ms) of `call()` while the GPU works through the calls before it: bursts of `burst` calls back to
    back (their launches queue up), each call timed alone, the first of a burst (onto an idle GPU) left out; the
    least of `rounds` medians."""
    medians = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        times = []
        for _ in range(burst):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times[1:]))
    torch.cuda.synchronize()
    return 1e3 * min(medians)


def eager_ms(call, calls: int) -> float:
    """Wall time (ms) per call of `calls` calls back to back, synchronized at the ends only."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / calls


@contextlib.contextmanager
def fresh_plans():
    """Plans made afresh in the block and after it (a kept plan keeps the compiled handles it took)."""
    if clear_layer_plans is not None:
        clear_layer_plans()
    try:
        yield
    finally:
        if clear_layer_plans is not None:
            clear_layer_plans()


@contextlib.contextmanager
def no_launches():
    """The launches left out: every `kernel[grid](...)` returns at once (and returns no compiled kernel, so
    no plan made in the block keeps a handle)."""
    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    JITFunction.run = lambda self, *args, **kwargs: None
    try:
        with fresh_plans():
            yield
    finally:
        JITFunction.run = run


@contextlib.contextmanager
def no_programs():
    """Calls of a kept plan walk its stages: no program recorded."""
    of = _launch.Program.of
    _launch.Program.of = lambda *args, **kwargs: None
    try:
        with fresh_plans():
            yield
    finally:
        _launch.Program.of = of


@contextlib.contextmanager
def triton_launcher():
    """Every launch through Triton's launcher, the plan cache on: no compiled handle kept."""
    is_compiled = _launch._is_compiled
    _launch._is_compiled = lambda result: False
    try:
        with fresh_plans():
            yield
    finally:
        _launch._is_compiled = is_compiled


def profile(call, calls: int, path: str, title: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    with open(path, "a") as f:
        f.write(f"===== {title}, {calls} calls\n{text.getvalue()}\n")


def layer_call(name: str, num_tokens: int, weights: dict):
    """The row of a point and a call of `fused_moe` at it; `weights`: the model presets' weights, by name, made
    here on first use and shared by the model's points."""
    preset = get_preset(name)
    e, h, i, k = preset.num_experts, preset.hidden_size, preset.intermediate_size, preset.top_k
    if name not in weights:
        # The values do not change the host's work: weights drawn in place, no float32 copy of 20 GB.
        weights[name] = (
            torch.empty(e, 2 * i, h, device="cuda", dtype=torch.bfloat16).normal_(0, h**-0.5),
            torch.empty(e, h, i, device="cuda", dtype=torch.bfloat16).normal_(0, i**-0.5),
        )
    w1, w2 = weights[name]
    hs = torch.randn(num_tokens, h, device="cuda").to(torch.bfloat16)
    tw, ti = uniform_routing(num_tokens, e, k)

    def call():
        return fused_moe(hs, w1, w2, tw, ti)

    return dict(model=name, T=num_tokens, E=e, top_k=k, H=h, I=i), call


def point(row: dict, call, calls: int, profile_path=None) -> None:
    """Every column but host_ms and host_no_program_ms (`host_passes`), into `row`."""
    call()  # compile, and keep the compiled handles
    call()
    row["host_busy_ms"] = host_busy_ms(call)
    if _launch is not None:
        with triton_launcher():
            call()
            row["host_triton_launch_ms"] = host_ms(call, calls)
        call()  # the handles again
    if layer_plan_cache is not None:
        with layer_plan_cache(False):
            call()
            row["host_uncached_ms"] = host_ms(call, calls)
    row["gpu_ms"] = graph_ms(call, rounds=3)
    row["eager_ms"] = eager_ms(call, calls)
    with no_launches():
        call()
        row["host_no_launch_ms"] = host_ms(call, calls)
    call()  # the handles again
    if profile_path:
        profile(call, 200, profile_path, f"{row['model']}, T = {row['T']}")


def host_passes(points, calls: int, passes: int) -> None:
    """host_ms and host_no_program_ms of every point, into its row: `passes` passes over all points, each
    taking one median of `calls` calls per point and column (without programs, then with them); the least
    median of each. A busy host slows a stretch of time, not a point: spread over passes, each point meets
    it in few of them."""
    for _ in range(passes):
        for row, call in points:
            if _launch is not None and hasattr(_launch, "Program"):
                with no_programs():
                    call()
                    call()
                    without = host_ms(call, calls, rounds=1)
                row["host_no_program_ms"] = min(without, row.get("host_no_program_ms", without))
            call()
            call()  # (its workspace, and the program recorded)
            with_programs = host_ms(call, calls, rounds=1)
            row["host_ms"] = min(with_programs, row.get("host_ms", with_programs))


def markdown(rows, env) -> str:
    lines = [
        f"Host time and GPU time of one `fused_moe` call, bf16, ms per call: {env['device']}, torch {env['torch']}, "
        f"Triton {env['triton']}, {env['date']}.",
        "",
        "| model | T | host | host, GPU busy | host, no program | host, Triton's launcher | host, no plan cache "
        "| host, no launch | GPU (graph replay) | eager | host / GPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        no_program = f"{r['host_no_program_ms']:.3f}" if "host_no_program_ms" in r else "-"
        triton_launch = f"{r['host_triton_launch_ms']:.3f}" if "host_triton_launch_ms" in r else "-"
        uncached = f"{r['host_uncached_ms']:.3f}" if "host_uncached_ms" in r else "-"
        lines.append(
            f"| {r['model']} | {r['T']} | {r['host_ms']:.3f} | {r['host_busy_ms']:.3f} | {no_program} | "
            f"{triton_launch} | {uncached} | "
            f"{r['host_no_launch_ms']:.3f} | {r['gpu_ms']:.3f} | {r['eager_ms']:.3f} | "
            f"{r['host_ms'] / r['gpu_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file; the markdown table goes beside it (.md)")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--calls", type=int, default=300, help="timed calls per figure (default 300)")
    parser.add_argument("--passes", type=int, default=5, help="passes over all points for host_ms (default 5)")
    parser.add_argument("--profile", help="write cProfile statistics of every point to this file")
    args = parser.parse_args(argv)
    require_gpu_timing("benchmarks/host_cost.py")
    if args.profile:
        open(args.profile, "w").close()
    env = environment()
    weights, points = {}, []
    for name in args.models:
        for num_tokens in args.tokens:
            points.append(layer_call(name, num_tokens, weights))
            point(*points[-1], args.calls, args.profile)
    host_passes(points, args.calls, args.passes)
    rows = [row for row, _ in points]
    for row in rows:
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(environment=env, rows=rows), f, indent=1)
    table = markdown(rows, env)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
