"""Experiment: shipped prefill configs against one-field changes, timed in turn in one process (H200, bf16).

The tuner times each candidate once, on its own routing sample, and a 5 % difference between two of them
can be the GPU's clock rather than the config (Qwen3-30B-A3B T = 16384's up GEMM: the tuner kept the
per-tile kernel, which ran 1.07x the persistent one's time side by side, `tma_store-H200-2026-12-03-persistent.txt`).
Here each GEMM of the prefill points (as the layer runs it, `moe_lab.tools.tune._Problem`) runs its shipped config
and variants that change one thing: the kernel (per tile <-> persistent; a per-tile config's folded tails
and tail tiles do not carry over), one stage more or less, GROUP_SIZE_M halved or doubled. Each variant is
timed three times in turn with the others (CUDA-graph medians, L2 flushed, least of 3 rounds each; the
least of the three is reported, with every run), after a minute of warm-up; outputs compared bit for bit
with the shipped config's (valid rows of the up GEMM, all slots of the down GEMM).
Usage: python benchmarks/experiments/config_ab.py [OUT.json]
"""
import sys
from dataclasses import replace

import torch
import triton

import moe_lab.tools.tune as tune
from moe_lab.configs import GemmConfig
from moe_lab.presets import get_preset
from moe_lab.tools.timing import graph_ms

from fp8_decode_anatomy import write_results  # noqa: E402 - beside this script
from tma_store import shipped as shipped_config, warm_up  # noqa: E402

POINTS = [(m, t) for m in ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b") for t in (4096, 16384)]
SMEM = 232448  # an H200's shared memory per program: variants that cannot fit are left out


def variants(c: GemmConfig):
    other = (replace(c, persistent=False) if c.persistent
             else replace(c, persistent=True, fold_tail_rows=0, tail_tiles=True))
    out = {"shipped": c, "per tile" if c.persistent else "persistent": other,
           "stages +1": replace(c, num_stages=c.num_stages + 1), "stages -1": replace(c, num_stages=c.num_stages - 1),
           "G / 2": replace(c, GROUP_SIZE_M=max(1, c.GROUP_SIZE_M // 2)), "G x 2": replace(c, GROUP_SIZE_M=2 * c.GROUP_SIZE_M)}
    return {n: v for n, v in out.items() if v.shared_memory_bytes(2) <= SMEM}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env, flush=True)
    shipped = {(model, t): shipped_config(model, t) for model, t in POINTS}
    all_cfgs = sorted({c for s in shipped.values() for g in (s.up, s.down) for c in variants(g).values()}, key=str)
    tune.candidates = lambda *a, **k: {128: (all_cfgs, [c for c in all_cfgs if not c.prepermute])}
    print("compiled", tune.precompile(list(POINTS)), "kernels ahead", flush=True)
    warm_up()
    rows = []
    for model, t in POINTS:
        problem = tune._Problem(get_preset(model), t, torch.bfloat16)
        routing, _, act, _ = problem.buffers(128)
        valid = routing.sorted_token_ids < routing.num_slots
        row = dict(model=model, T=t)
        for gemm, launch in (("up", problem.up), ("down", problem.down)):
            vs = variants(getattr(shipped[(model, t)], gemm))
            out = act if gemm == "up" else problem.out_k
            ms, same, ref = {n: [] for n in vs}, {}, None
            for _ in range(3):
                for name, c in vs.items():
                    fn = launch(c)
                    out.fill_(float("nan"))
                    fn()
                    got = out[valid] if gemm == "up" else out
                    ref = got.clone() if ref is None else ref
                    same[name] = bool(torch.equal(got, ref))
                    ms[name].append(graph_ms(fn, rep_ms=60, rounds=3))
            best = {n: min(v) for n, v in ms.items()}
            row[gemm] = dict(ms=ms, bitwise_shipped=same, configs={n: str(c) for n, c in vs.items()})
            print(f"{model:<15} {t:>6} {gemm:<4} " + "  ".join(
                f"{n} {best[n]:.4f} ({best[n] / best['shipped']:.3f}x: {' '.join('%.4f' % x for x in ms[n])})"
                for n in vs) + f"  bitwise = shipped: {all(same.values())}", flush=True)
        rows.append(row)
        del problem, act, routing
        torch.cuda.empty_cache()
    if path:
        write_results(path, rows)


if __name__ == "__main__":
    main()
