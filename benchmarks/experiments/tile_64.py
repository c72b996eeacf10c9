"""Experiment: 64-row tiles where the tuner offers only 128-row ones (H200, bf16).

`moe_lab.tools.tune.candidates` offers BLOCK_SIZE_M = 128 only from 48 rows per expert up, so at Qwen3-30B-A3B
T = 4096 (256 rows per expert) and DeepSeek-V3 T = 4096 (128) an expert's last M-block is often mostly
padding, and the persistent kernel (which the table chose there) runs no tail tiles. 64-row tiles halve
the padding but read each weight tile twice as often per row. For each point, each GEMM as the layer
runs it (`moe_lab.tools.tune._Problem`: the up GEMM with its SwiGLU epilogue), CUDA-graph medians (L2 flushed)
of the shipped config and of 64-row candidates, per tile and persistent. Writes JSON to argv[1].
Usage: python benchmarks/experiments/tile_64.py [OUT.json]
"""
import itertools
import json
import sys

import torch
import triton

import moe_lab.tools.tune as tune
from moe_lab.configs import GemmConfig
from moe_lab.presets import get_preset
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config

POINTS = (("qwen3-30b-a3b", 4096), ("deepseek-v3", 4096), ("qwen3-30b-a3b", 16384), ("deepseek-v3", 16384),
          ("mixtral-8x7b", 4096))
SHAPES = ((64, 256, 64, 4), (64, 256, 64, 8), (64, 128, 64, 4), (64, 128, 128, 4))


def candidates_64():
    out = []
    for (m, n, k, w), s, persistent in itertools.product(SHAPES, (3, 4), (False, True)):
        out.append(GemmConfig(m, n, k, 8, w, s, True, tail_tiles=True, persistent=persistent))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env, flush=True)
    cands = candidates_64()
    tune.candidates = lambda *a, **k: {64: (cands, cands)}  # what precompile compiles
    print("compiled", tune.precompile(list(POINTS)), "kernels ahead", flush=True)
    rows = []
    for model, t in POINTS:
        p = get_preset(model)
        shipped = choose_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, torch.bfloat16).config
        problem = tune._Problem(p, t, torch.bfloat16)
        row = dict(model=model, T=t, shipped=dict(up=shipped.up.to_dict(), down=shipped.down.to_dict()))
        for gemm, launch in (("up", problem.up), ("down", problem.down)):
            base = graph_ms(launch(getattr(shipped, gemm)), rep_ms=60, rounds=3)
            timed = []
            for c in cands:
                try:
                    timed.append((graph_ms(launch(c), rep_ms=60, rounds=3), c))
                except Exception as exc:  # noqa: BLE001 - too many registers, shared memory
                    print(f"  skipped {c}: {type(exc).__name__}")
            best_ms, best = min(timed, key=lambda x: x[0])
            again = graph_ms(launch(getattr(shipped, gemm)), rep_ms=60, rounds=3)
            row[gemm] = dict(shipped_ms=min(base, again), best64_ms=best_ms, best64=best.to_dict(),
                             all64=[(ms, str(c)) for ms, c in sorted(timed, key=lambda x: x[0])[:5]])
            print(f"{model:<15} {t:>6} {gemm:<4} shipped {min(base, again):.3f} ms (runs {base:.3f}, {again:.3f}); "
                  f"best 64-row {best_ms:.3f} ms = {best_ms / min(base, again):.3f}x  {best}", flush=True)
        row["pair_ratio"] = (row["up"]["best64_ms"] + row["down"]["best64_ms"]) / (
            row["up"]["shipped_ms"] + row["down"]["shipped_ms"])
        print(f"{model:<15} {t:>6} pair: best 64-row / shipped = {row['pair_ratio']:.3f}", flush=True)
        rows.append(row)
        del problem
        torch.cuda.empty_cache()
    if path:
        with open(path, "w") as f:
            json.dump(dict(env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
