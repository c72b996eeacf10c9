"""The capstone's reference solution (notebook 05b) against `moe_lab.grouped_matmul`, on a CUDA GPU.

    python benchmarks/capstone.py --out DIR [--models qwen3-30b-a3b mixtral-8x7b] [--tokens 64 512 4096]

For each model preset (full size, bfloat16), token count T and projection (the up GEMM: hidden_states
gathered by pointer, w1 through a 3-D descriptor; the down GEMM: the sorted rows and w2 through descriptors,
times the routed weight, scattered to the slots) it runs the solution's kernel and `moe_lab.grouped_matmul` on
the same inputs: moe-lab with its default (tuned) config for the shape, the solution with that config's
tiles, GROUP_SIZE_M, warps and stages as launched (`moe_lab.workbook.exercises.capstone.time_against_moe_lab`).
Each time is the median of CUDA-graph replays with the L2 flushed; the solution's output is checked against
moe-lab's (relative Frobenius error below 1e-2, else the run exits 1). Prints a markdown table, writes it
and the rows as JSON to DIR (capstone-<device>.md / .json). The target: the solution within 1.5x of
moe-lab's time at every point. Needs a CUDA GPU; about a minute on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from moe_lab.runtime import require_gpu_timing  # noqa: E402
from moe_lab.tools.bench import environment  # noqa: E402
from moe_lab.workbook.exercises import capstone  # noqa: E402
from moe_lab.workbook.exercises import capstone_solution as solution  # noqa: E402

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")
TOKENS = (64, 512, 4096)
TARGET = 1.5  # the solution's time over moe-lab's
MAX_ERROR = 1e-2
KERNELS = {capstone.UP: solution.capstone_up_kernel_solution, capstone.DOWN: solution.capstone_down_kernel_solution}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for capstone-<device>.json and .md")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    args = parser.parse_args(argv)
    require_gpu_timing("benchmarks/capstone.py")
    rows = []
    for model in args.models:
        for tokens in args.tokens:
            for projection, kernel in KERNELS.items():
                t = capstone.time_against_moe_lab(kernel, projection, preset=model, num_tokens=tokens)
                rows.append(
                    dict(
                        model=model,
                        tokens=tokens,
                        gemm="up" if projection == capstone.UP else "down",
                        solution_ms=round(t.yours_ms, 5),
                        moe_lab_ms=round(t.moe_lab_ms, 5),
                        ratio=round(t.ratio, 3),
                        relative_error=float(f"{t.error:.2e}"),
                        config=t.config,
                    )
                )
                print(t.describe(), flush=True)
    lines = [
        f"The capstone's reference solution against moe_lab.grouped_matmul, bf16, {torch.cuda.get_device_name()}: "
        "medians of CUDA-graph replays (ms), L2 flushed; the same inputs and tiles; ratio = solution / moe-lab "
        f"(target < {TARGET}).",
        "",
        "| model | T | GEMM | solution ms | moe-lab ms | ratio | rel. error | tiles |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['tokens']} | {r['gemm']} | {r['solution_ms']:.4f} | {r['moe_lab_ms']:.4f} | "
        f"{r['ratio']:.2f} | {r['relative_error']:.1e} | {r['config']} |"
        for r in rows
    ]
    worst = max(r["ratio"] for r in rows)
    wrong = [r for r in rows if not r["relative_error"] < MAX_ERROR]
    lines += ["", f"Worst ratio {worst:.2f} (target < {TARGET}); {len(wrong)} point(s) with error >= {MAX_ERROR}."]
    table = "\n".join(lines)
    print("\n" + table)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"capstone-{torch.cuda.get_device_name().replace(' ', '_')}")
    with open(stem + ".json", "w") as f:
        json.dump({"environment": environment(), "target_ratio": TARGET, "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    print(f"wrote {stem}.json and {stem}.md")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
