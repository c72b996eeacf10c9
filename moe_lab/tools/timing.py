"""Timing on a GPU, and what times are measured against: the timing primitives, the ceilings and the
cost model shared by `moe-lab bench`, `moe-lab tune`, the demo and the notebooks.

- `median_ms(fn)`: median of `triton.testing.do_bench` runs, L2 flushed before each (ms).
- `graph_ms(fn)`: the same over CUDA-graph replays of `fn` (what a serving engine that captures the layer sees).
- `measure_ceilings()`: device copy and read bandwidth (TB/s) and an 8192^3 bf16 matmul (TFLOP/s).
- `gemm_costs(preset, T, experts_used, itemsize)`: FLOPs and fewest bytes of a layer's two GEMMs, and
  `GemmCost.roofline_ms(ceilings)`, the time those ceilings allow.
Each timing function raises RuntimeError under Triton's interpreter or without a CUDA GPU, with the message
`moe-lab bench` prints (`moe_lab.runtime.require_gpu_timing`): timings there would mean nothing.
Source: `triton.testing.do_bench`; CUDA graphs as in PyTorch's `torch.cuda.CUDAGraph` documentation.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
import triton

from ..presets import MoEPreset
from ..runtime import require_gpu_timing


def check_timed_tokens(tokens) -> List[int]:
    """`tokens` as a list if every T is >= 1, else ValueError (T = 0 is an empty problem: nothing to time).
    `moe-lab bench` and `moe-lab tune` check it before any GPU work."""
    tokens = list(tokens)
    if any(t < 1 for t in tokens):
        raise ValueError(f"tokens must be >= 1 (T = 0 is an empty problem: nothing to time), got {min(tokens)}")
    return tokens


def folder_write_problem(folder: str) -> Optional[str]:
    """None if a file can be written in `folder` (made if missing, as the first write would make it), else
    why not. Tried for real: `os.access` says yes to root even where nothing can be created (/proc)."""
    parent = os.path.abspath(folder)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):  # makedirs would say only "File exists"
        return f"{parent} is a file, not a folder"
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def median_ms(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median time of `fn` in milliseconds; L2 is flushed before each run. Raises RuntimeError where
    timings mean nothing (interpreter, no GPU)."""
    require_gpu_timing("median_ms")
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graph_ms(fn: Callable[[], object], rep_ms: int = 100, min_replays: int = 10, rounds: int = 1) -> float:
    """Median time (ms) of CUDA-graph replays of `fn`, L2 flushed before each replay: what a serving
    engine that captures the layer sees, without Python launch overhead. At least `min_replays` replays:
    a 30 ms layer gets only three in 100 ms, and one slow replay (a clock dip) could then set the median.
    With `rounds` > 1, the least of that many medians: a clock dip only ever makes a round slower.
    Raises RuntimeError where timings mean nothing (interpreter, no GPU)."""
    require_gpu_timing("graph_ms")
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        rep = max(rep_ms, int(min_replays * start.elapsed_time(end)) + 1)
        return min(median_ms(graph.replay, rep) for _ in range(rounds))
    finally:
        del graph


def measure_ceilings(device="cuda") -> Dict[str, float]:
    """Copy bandwidth (TB/s, bytes read + written), read-only bandwidth (TB/s) and bf16 matmul TFLOP/s.
    Raises RuntimeError where timings mean nothing (interpreter, no GPU)."""
    require_gpu_timing("measure_ceilings")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    as_f32 = src.view(torch.float32)
    read_ms = median_ms(lambda: as_f32.sum())
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: a @ b)
    del src, dst, a, b
    return {
        "copy_tbps": 2 * (1 << 30) / copy_ms / 1e9,
        "read_tbps": (1 << 30) / read_ms / 1e9,
        "bf16_matmul_tflops": 2 * 8192**3 / mm_ms / 1e9,
    }


@dataclass
class GemmCost:
    """FLOPs and fewest bytes of one grouped GEMM (weights of the experts in use, A read once, C written once)."""

    flops: float
    bytes: float  # fewest bytes: weights of the experts in use, A read once, C written once

    def roofline_ms(self, ceilings) -> float:
        return max(self.flops / ceilings["bf16_matmul_tflops"] / 1e9, self.bytes / ceilings["copy_tbps"] / 1e9)


def gemm_costs(preset: MoEPreset, num_tokens: int, experts_used: int, itemsize: int):
    """(up, down) GemmCost of one layer call with T = `num_tokens` and `experts_used` experts receiving
    tokens, at `itemsize` bytes per element. Pure arithmetic: works anywhere."""
    h, i = preset.hidden_size, preset.intermediate_size
    rows = num_tokens * preset.top_k
    up = GemmCost(2 * rows * h * 2 * i, itemsize * (experts_used * 2 * i * h + num_tokens * h + rows * 2 * i))
    down = GemmCost(2 * rows * i * h, itemsize * (experts_used * h * i + rows * i + rows * h))
    return up, down
