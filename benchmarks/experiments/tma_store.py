"""Experiment: the up GEMM's output tile stored through a tensor descriptor (`LaunchPlan.c_tma`), and a
sweep of decode configs the tuner does not offer (H200, bf16).

1. TMA store. The up GEMM writes sorted rows [rows, I] of whole M-blocks: its epilogue can hand each tile to
   the TMA unit (registers -> shared memory -> one asynchronous bulk copy) instead of storing it from
   registers by pointer. For every point, the shipped up config with `grouped_matmul.TMA_STORE` on and off,
   timed alternately (CUDA-graph medians, L2 flushed, least of 3 rounds each, twice), outputs compared bit
   for bit on the valid rows. The down GEMM scatters its rows to their slots: no TMA store on Hopper.
2. Decode configs: at the three decode points that trail the best peer (Mixtral-8x7B and Qwen3-30B-A3B at
   T = 8, Qwen3 at T = 64), each GEMM's shipped config against 8 warps, one stage more or less, and
   8-warp tiles (the tuner's decode candidates have 4 warps).
3. Persistent: the TMA store was 1.03 to 1.26x slower in the per-tile kernel in part 1 (a program waits for its
   bulk copy before it ends), so the plan now takes it in the persistent kernel alone. At the prefill points,
   the up GEMM's shipped config, the persistent kernel with the TMA store and without it (same tiles and
   stages; 3 stages where the shipped per-tile config folds tails), timed in turn three times (least of 3
   rounds each), after a minute of warm-up on the matmul.
Usage: python benchmarks/experiments/tma_store.py [OUT.json] [store] [decode] [persistent]  (default: all three)
"""
import concurrent.futures
import json
import multiprocessing
import sys
from dataclasses import replace

import torch
import triton

import moe_lab.tools.tune as tune
from moe_lab.configs import GemmConfig
from moe_lab.presets import get_preset
from moe_lab.tools.timing import graph_ms
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
           "stages -1": replace(c, num_stages=max(1, c.num_stages - 1)), "stages +1": replace(c, num_stages=c.num_stages + 1)}
    for n, k in ((32, 256), (64, 256), (128, 128), (128, 256)):
        out[f"16x{n}x{k} w8"] = replace(c, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, num_warps=8, num_stages=3)
    return out


def _compile_both(model, ups, downs):
    """Worker: compile each config with the TMA store on and off (Triton's on-disk cache is shared)."""
    done = 0
    for flag in (True, False):
        gm.TMA_STORE = flag
        done += tune._compile_configs(model, "bfloat16", ups, downs)
    return done


def precompile(parts):
    jobs = {m: (set(), set()) for m in MODELS}
    for model, t in STORE_POINTS if "store" in parts else ():
        jobs[model][0].add(shipped(model, t).up)
    for model, t in DECODE_POINTS if "decode" in parts else ():
        ups, downs = jobs[model]
        ups.update(decode_variants(shipped(model, t).up).values())
        downs.update(decode_variants(shipped(model, t).down).values())
    for model, t in PERSISTENT_POINTS if "persistent" in parts else ():
        jobs[model][0].update(persistent_variants(shipped(model, t).up).values())
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


PERSISTENT_POINTS = [(m, t) for m in MODELS for t in (4096, 16384)] + [("mixtral-8x7b", 512)]


def persistent_variants(c: GemmConfig):
    p = replace(c, persistent=True, fold_tail_rows=0, num_stages=3 if c.fold_tail_rows else c.num_stages)
    return {"shipped": c, "persistent, TMA store": p, "persistent, pointer store": p}


def persistent_point(model, t):
    p = get_preset(model)
    problem = tune._Problem(p, t, torch.bfloat16)
    vs = persistent_variants(shipped(model, t).up)
    routing, _, act, _ = problem.buffers(vs["shipped"].BLOCK_SIZE_M)
    valid = routing.sorted_token_ids < routing.num_slots
    ms, bits = {n: [] for n in vs}, {}
    for _ in range(3):
        for name, c in vs.items():
            gm.TMA_STORE = name != "persistent, pointer store"
            fn = problem.up(c)
            act.fill_(float("nan"))
            fn()
            bits[name] = act[valid].clone()
            ms[name].append(graph_ms(fn, rep_ms=60, rounds=3))
    gm.TMA_STORE = True
    best = {n: min(v) for n, v in ms.items()}
    same = {n: bool(torch.equal(b, bits["shipped"])) for n, b in bits.items()}
    print(f"{model:<15} {t:>6} up  " + "  ".join(f"{n} {best[n]:.4f} ({best[n] / best['shipped']:.3f}x; runs "
                                                 f"{' '.join('%.4f' % x for x in ms[n])})" for n in vs)
          + f"  bitwise = shipped: {same}", flush=True)
    row = dict(model=model, T=t, ms=ms, bitwise_shipped=same, configs={n: str(c) for n, c in vs.items()})
    del problem
    torch.cuda.empty_cache()
    return row


def warm_up(seconds=60):
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    end = torch.cuda.Event(enable_timing=True)
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            x @ x
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            return


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env, flush=True)
    parts = [a for a in sys.argv[1:] if not a.endswith(".json")] or ["store", "decode", "persistent"]
    print("compiled", precompile(parts), "kernels ahead", flush=True)
    rows = {}
    if "store" in parts:
        rows["store"] = [store_point(m, t) for m, t in STORE_POINTS]
    if "decode" in parts:
        rows["decode"] = [decode_point(m, t) for m, t in DECODE_POINTS]
    if "persistent" in parts:
        warm_up()
        rows["persistent"] = [persistent_point(m, t) for m, t in PERSISTENT_POINTS]
    if path:
        with open(path, "w") as f:
            json.dump(dict(env, **rows), f, indent=1)


if __name__ == "__main__":
    main()
