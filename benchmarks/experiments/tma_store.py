"""Experiment: the up GEMM's output tile stored through a tensor descriptor (`LaunchPlan.c_tma`), and a
sweep of decode configs the tuner does not offer (H200, bf16).

1. TMA store. The up GEMM writes sorted rows [rows, I] of whole M-blocks: its epilogue can hand each tile to
   the TMA unit (registers -> shared memory -> one asynchronous bulk copy) instead of storing it from
   registers by pointer. For every point, the shipped up config with `grouped_matmul.TMA_STORE` on and off,
   timed alternately (CUDA-graph medians, L2 flushed, least of 3 rounds each, twice), outputs compared bit
   for bit on the valid rows. The down GEMM scatters its rows to their slots: no TMA store on Hopper.
2. Decode configs: at the three decode points that trail the best peer (Mixtral-8x7B and Qwen3-30B-A3B at
   T = 8, Qwen3 at T = 64), each GEMM's shipped config against 8 warps, one stage more or less, and
   BLOCK_SIZE_K = 512 (the tuner's decode candidates are 4-warp tiles of K <= 256).
Usage: python benchmarks/experiments/tma_store.py [OUT.json]
"""
import concurrent.futures
import json
import multiprocessing
import sys
from dataclasses import replace

import torch
import triton

import moe_lab.tune as tune
from moe_lab.configs import GemmConfig
from moe_lab.presets import get_preset
from moe_lab.timing import graph_ms
from moe_lab.tuned import choose_config

gm = sys.modules["moe_lab.grouped_matmul"]
MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
STORE_POINTS = [(m, t) for m in MODELS for t in (1, 8, 64, 512, 4096, 16384)]
DECODE_POINTS = (("mixtral-8x7b", 8), ("qwen3-30b-a3b", 8), ("qwen3-30b-a3b", 64))


def shipped(model, t):
    p = get_preset(model)
    return choose_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, torch.bfloat16).config


def decode_variants(c: GemmConfig):
    out = {"shipped": c, "8 warps": replace(c, num_warps=8),
           "stages -1": replace(c, num_stages=c.num_stages - 1), "stages +1": replace(c, num_stages=c.num_stages + 1)}
    for n in (32, 64):
        for w in (4, 8):
            out[f"16x{n}x512 w{w}"] = replace(c, BLOCK_SIZE_N=n, BLOCK_SIZE_K=512, num_warps=w, num_stages=3)
    out["16x128x256 w8"] = replace(c, BLOCK_SIZE_N=128, BLOCK_SIZE_K=256, num_warps=8, num_stages=3)
    return out


def _compile_both(model, ups, downs):
    """Worker: compile each config with the TMA store on and off (Triton's on-disk cache is shared)."""
    done = 0
    for flag in (True, False):
        gm.TMA_STORE = flag
        done += tune._compile_configs(model, "bfloat16", ups, downs)
    return done


def precompile():
    jobs = {}
    for model, t in STORE_POINTS:
        jobs.setdefault(model, (set(), set()))[0].add(shipped(model, t).up)
    for model, t in DECODE_POINTS:
        ups, downs = jobs[model]
        ups.update(decode_variants(shipped(model, t).up).values())
        downs.update(decode_variants(shipped(model, t).down).values())
    tasks = []
    for model, (ups, downs) in jobs.items():
        ups, downs = sorted(ups, key=str), sorted(downs, key=str)
        for part in range(8):
            u, d = [c.to_dict() for c in ups[part::8]], [c.to_dict() for c in downs[part::8]]
            if u or d:
                tasks.append((model, u, d))
    with concurrent.futures.ProcessPoolExecutor(12, mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_compile_both, *zip(*tasks)))


def store_point(model, t):
    p = get_preset(model)
    problem = tune._Problem(p, t, torch.bfloat16)
    cfg = shipped(model, t).up
    routing, _, act, _ = problem.buffers(cfg.BLOCK_SIZE_M)
    valid = routing.sorted_token_ids < routing.num_slots
    rep = 20 if t * p.top_k / p.num_experts <= 512 else 60
    ms, bits = {True: [], False: []}, {}
    for _ in range(2):
        for flag in (True, False):
            gm.TMA_STORE = flag
            fn = problem.up(cfg)
            act.fill_(float("nan"))
            fn()
            bits[flag] = act[valid].clone()
            ms[flag].append(graph_ms(fn, rep_ms=rep, rounds=3))
    gm.TMA_STORE = True
    plan = gm.grouped_matmul(problem.hs, problem.w1, routing, cfg, gather_a=True, swiglu=True, out=act,
                             use_tma=cfg.tma, return_plan=True)[1]
    on, off = min(ms[True]), min(ms[False])
    row = dict(model=model, T=t, config=str(cfg), c_tma=plan.c_tma, stages=plan.config.num_stages,
               tma_store_ms=ms[True], pointer_store_ms=ms[False], ratio=on / off,
               bitwise=bool(torch.equal(bits[True], bits[False])), nan_in_valid=bool(bits[True].isnan().any()))
    print(f"{model:<15} {t:>6} up  TMA store {on:.4f}  pointer store {off:.4f} ms  = {on / off:.3f}x  "
          f"(runs {['%.4f' % x for x in ms[True]]} / {['%.4f' % x for x in ms[False]]})  c_tma={plan.c_tma} "
          f"stages={plan.config.num_stages} bitwise={row['bitwise']} nan={row['nan_in_valid']}  {cfg}", flush=True)
    del problem
    torch.cuda.empty_cache()
    return row


def decode_point(model, t):
    p = get_preset(model)
    problem = tune._Problem(p, t, torch.bfloat16)
    row = dict(model=model, T=t)
    for gemm, launch in (("up", problem.up), ("down", problem.down)):
        vs = decode_variants(getattr(shipped(model, t), gemm))
        timed = {}
        for name, c in vs.items():
            try:
                timed[name] = graph_ms(launch(c), rep_ms=20, rounds=3)
            except Exception as exc:  # noqa: BLE001 - registers, shared memory
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
        timed["shipped"] = min(timed["shipped"], graph_ms(launch(vs["shipped"]), rep_ms=20, rounds=3))
        base = timed["shipped"]
        row[gemm] = dict(ms=timed, configs={n: str(c) for n, c in vs.items()})
        print(f"{model:<15} {t:>6} {gemm:<4} " + "  ".join(f"{n} {v * 1e3:.1f}us ({v / base:.3f}x)"
                                                       for n, v in timed.items()), flush=True)
    del problem
    torch.cuda.empty_cache()
    return row


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env, flush=True)
    print("compiled", precompile(), "kernels ahead", flush=True)
    rows = dict(store=[store_point(m, t) for m, t in STORE_POINTS],
                decode=[decode_point(m, t) for m, t in DECODE_POINTS])
    if path:
        with open(path, "w") as f:
            json.dump(dict(env, **rows), f, indent=1)


if __name__ == "__main__":
    main()
