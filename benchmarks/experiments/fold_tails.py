"""Experiment: folded tails (`GemmConfig.fold_tail_rows`) at prefill (H200, bf16).

With uniform routing an expert's row count is not a multiple of BLOCK_SIZE_M, so its last M-block is
mostly padding: at DeepSeek-V3 T = 4096 (128 rows per expert) about one block in three. A tail tile
(half or quarter of the rows) cuts its MMAs but reads the weight tile again; the persistent kernel runs it
whole. A folded tail is computed by the expert's block before it, in a second dot on the same weight tile.
For each point and GEMM (as the layer runs it, `moe_lab.tools.tune._Problem`): CUDA-graph medians (L2 flushed,
least of 3 rounds) of the shipped config, the same per tile, and per tile with 32 or 64 folded rows at 3
and 4 stages; the shipped config again at the end. Outputs compared bit for bit, folded against per tile.
Usage: python benchmarks/experiments/fold_tails.py [OUT.json]
"""
import json
import sys
from dataclasses import replace

import torch
import triton

import moe_lab.tools.tune as tune
from moe_lab.presets import get_preset
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config
from moe_lab.workbook.viz.align import folded_tails

POINTS = (("deepseek-v3", 4096), ("qwen3-30b-a3b", 4096), ("deepseek-v3", 16384), ("qwen3-30b-a3b", 16384),
          ("mixtral-8x7b", 4096), ("mixtral-8x7b", 16384), ("mixtral-8x7b", 512))


def variants(shipped):
    per_tile = replace(shipped, persistent=False, tail_tiles=True)
    out = {"shipped": shipped, "per tile": per_tile}
    for rows in (32, 64):
        for stages in (3, 4):
            out[f"fold {rows} s{stages}"] = replace(per_tile, fold_tail_rows=rows, num_stages=stages)
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env, flush=True)
    shipped = {}
    for model, t in POINTS:
        p = get_preset(model)
        shipped[(model, t)] = choose_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size,
                                            torch.bfloat16).config
    all_cfgs = {c for s in shipped.values() for g in (s.up, s.down) for c in variants(g).values()}
    tune.candidates = lambda *a, **k: {128: (sorted(all_cfgs, key=str), sorted(all_cfgs, key=str))}
    print("compiled", tune.precompile(list(POINTS)), "kernels ahead", flush=True)
    rows = []
    for model, t in POINTS:
        p = get_preset(model)
        problem = tune._Problem(p, t, torch.bfloat16)
        routing, _, act, _ = problem.buffers(128)
        valid = routing.sorted_token_ids < routing.num_slots
        row = dict(model=model, T=t)
        for fold in (32, 64):
            row[f"blocks, folded by {fold}"] = folded_tails(routing.counts.cpu(), 128, fold)
        print(f"{model:<15} {t:>6} blocks in use, folded by 32 / 64: {row['blocks, folded by 32']} "
              f"{row['blocks, folded by 64']}", flush=True)
        for gemm, launch in (("up", problem.up), ("down", problem.down)):
            vs = variants(getattr(shipped[(model, t)], gemm))
            timed, bits = {}, {}
            for name, c in vs.items():
                try:
                    fn = launch(c)
                    fn()
                    out = act if gemm == "up" else problem.out_k
                    bits[name] = (out[valid] if gemm == "up" else out).clone()
                    timed[name] = graph_ms(fn, rep_ms=60, rounds=3)
                except Exception as exc:  # noqa: BLE001 - registers, shared memory
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            timed["shipped"] = min(timed["shipped"], graph_ms(launch(vs["shipped"]), rep_ms=60, rounds=3))
            same = {name: bool(torch.equal(bits[name], bits["per tile"])) for name in bits}
            row[gemm] = dict(ms=timed, bitwise_per_tile=same, configs={n: str(c) for n, c in vs.items()})
            base = timed["shipped"]
            print(f"{model:<15} {t:>6} {gemm:<4} " + "  ".join(f"{n} {ms:.3f} ({ms / base:.3f}x)"
                                                           for n, ms in timed.items()), flush=True)
            print(f"{'':22} bitwise = per tile: {same}", flush=True)
        best = {g: min(row[g]["ms"].values()) for g in ("up", "down")}
        ship = sum(row[g]["ms"]["shipped"] for g in ("up", "down"))
        row["pair"] = dict(shipped=ship, best=sum(best.values()))
        print(f"{model:<15} {t:>6} pair shipped {ship:.3f} ms, best variants {sum(best.values()):.3f} ms "
              f"= {sum(best.values()) / ship:.3f}x", flush=True)
        rows.append(row)
        del problem, act, routing
        torch.cuda.empty_cache()
    if path:
        with open(path, "w") as f:
            json.dump(dict(env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
