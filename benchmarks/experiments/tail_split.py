"""Experiment: an expert's mostly-padded last M-block run as a smaller tile in a second launch (H200, bf16).

benchmarks/experiments/prefill_anatomy.py found the prefill GEMMs at cuBLAS's speed on a padding-free
routing, and 9 to 22 % slower on the benchmark's routing, where every expert's last M-block is partly
padding; the persistent kernel (the shipped config at most prefill points) runs such blocks whole. Here,
with no kernel change, the slots of each expert's last block are split off when they fill at most half of
it (r = count % BLOCK_SIZE_M in 1 .. BLOCK_SIZE_M/2) into a second schedule aligned to BLOCK_SIZE_M/2 (and,
for "split32", those with r <= BLOCK_SIZE_M/4 into a third aligned to BLOCK_SIZE_M/4). Each schedule is one
more launch of the same GEMM (the down GEMM scatters rows to their slots, so outputs meet in one buffer).
The schedules are built on the host here (an experiment); a layer would build them in the align kernels.

For each model and T, CUDA-graph medians with L2 flushed (least of 3) of the up GEMM (SwiGLU epilogue) and
the down GEMM: "base" (the shipped config, one schedule), "split64", "split32" (the launches in one graph;
the smaller tiles take the best of a few configs, chosen here by timing), and whether the down GEMM's
output is bitwise the base one. Usage: python benchmarks/experiments/tail_split.py [OUT.json] [model ...]
"""
import json
import sys
from dataclasses import replace

import torch
import triton

from moe_lab import grouped_matmul, moe_align
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
TOKENS = (4096, 16384)


def timed(fn):
    try:
        return graph_ms(fn, rounds=3)
    except Exception as exc:  # noqa: BLE001 - a variant that fails is a result too
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def split_ids(topk_ids, num_experts, block_m, limits):
    """topk_ids for each schedule: [big, tail <= limits[0], tail <= limits[1], ...] (limits decreasing);
    slots not in a schedule get id E (dropped by moe_align)."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    rem = counts % block_m
    in_tail = rank >= (counts - rem)[flat]
    r = rem[flat]
    which = torch.zeros_like(flat)  # 0: the big schedule
    for i, lim in enumerate(limits):
        which = torch.where(in_tail & (r >= 1) & (r <= lim), i + 1, which)
    out = []
    for i in range(len(limits) + 1):
        ids = torch.where(which == i, flat, num_experts).to(torch.int32)
        out.append(ids.view_as(topk_ids))
    return out


def point(model, t):
    p = get_preset(model)
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    hs, w1, w2, _ = p.build(t, device="cuda")
    tw, ti = uniform_routing(t, e, k, seed=1)
    cfg = default_config(t, e, k, h, i, torch.bfloat16)
    bm = cfg.block_size_m
    out_k = torch.full((t * k, h), float("nan"), dtype=hs.dtype, device="cuda")

    def gemms(routings, configs):
        acts = [torch.empty(r.max_num_tokens_padded, i, dtype=hs.dtype, device="cuda") for r in routings]

        def up():
            for r, c, a in zip(routings, configs, acts):
                grouped_matmul(hs, w1, r, c[0], gather_a=True, swiglu=True, out=a, use_tma=c[0].tma)

        def down():
            for r, c, a in zip(routings, configs, acts):
                grouped_matmul(a, w2, r, c[1], gather_a=False, scatter=True, topk_weights=tw, out=out_k,
                               use_tma=c[1].tma)
        return up, down

    base_up, base_down = gemms([moe_align(ti, e, bm)], [(cfg.up, cfg.down)])
    base_up()
    row = dict(model=model, T=t, config=cfg.up.to_dict(), base_up=timed(base_up), base_down=timed(base_down))
    reference = out_k.clone()

    def small_configs(m):
        shapes = [(m, 256, 64, 8), (m, 128, 64, 4), (m, 128, 128, 4)]
        return [replace(cfg.up, BLOCK_SIZE_M=mm, BLOCK_SIZE_N=n, BLOCK_SIZE_K=kk, num_warps=w, tail_tiles=False)
                for mm, n, kk, w in shapes]

    for name, limits in (("split64", [bm // 2]), ("split32", [bm // 2, bm // 4])):
        ids = split_ids(ti, e, bm, limits)
        sizes = [bm] + limits
        routings = [moe_align(x, e, s) for x, s in zip(ids, sizes)]
        row[f"{name}_blocks"] = [int(r.num_tokens_post_padded.item()) // s for r, s in zip(routings, sizes)]
        # The small schedules' configs: for each, the fastest of a few on its own.
        chosen = [(cfg.up, cfg.down)]
        for r, s in zip(routings[1:], sizes[1:]):
            best = []
            for g in ("up", "down"):
                trials = []
                for c in small_configs(s):
                    c = replace(c, persistent=getattr(cfg, g).persistent)
                    u, d = gemms([r], [(c, c)])
                    u()
                    ms = timed(u if g == "up" else d)
                    if isinstance(ms, float):
                        trials.append((ms, c))
                best.append(min(trials, key=lambda x: x[0])[1])
            chosen.append(tuple(best))
        up, down = gemms(routings, chosen)
        out_k.fill_(float("nan"))
        up()
        row[f"{name}_up"] = timed(up)
        row[f"{name}_down"] = timed(down)
        row[f"{name}_bitwise"] = bool(torch.equal(out_k, reference))
        row[f"{name}_configs"] = [[c.to_dict() for c in pair] for pair in chosen[1:]]
    del hs, w1, w2
    torch.cuda.empty_cache()
    return row


def fmt(x):
    return f"{x:8.3f}" if isinstance(x, float) else f"{'error':>8}"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    print(f"{'model':<15} {'T':>6}  {'base up':>8} {'down':>8} {'pair':>8} | {'s64 up':>8} {'down':>8} {'pair':>8} "
          f"{'x':>6} | {'s32 up':>8} {'down':>8} {'pair':>8} {'x':>6}  bitwise  blocks")
    rows = []
    for model in models:
        for t in TOKENS:
            r = point(model, t)
            rows.append(r)
            line = f"{model:<15} {t:>6}  {fmt(r['base_up'])} {fmt(r['base_down'])}"
            base = r["base_up"] + r["base_down"] if isinstance(r["base_up"], float) else None
            line += f" {fmt(base)}"
            for name in ("split64", "split32"):
                pair = r[f"{name}_up"] + r[f"{name}_down"] if isinstance(r[f"{name}_up"], float) else None
                gain = base / pair if base and pair else None
                line += f" | {fmt(r[f'{name}_up'])} {fmt(r[f'{name}_down'])} {fmt(pair)} {fmt(gain)[2:]}"
            line += f"  {r['split64_bitwise']}/{r['split32_bitwise']}  {r['split64_blocks']} {r['split32_blocks']}"
            print(line, flush=True)
            if out:
                with open(out, "w") as f:
                    json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
