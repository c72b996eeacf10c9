"""Experiment: the lean decode layer (H200, bf16, shipped configs).

For few slots `moe_align` runs one program, `align_in_registers_kernel` (slot-by-slot comparisons in
registers: one load of the ids, no round trip through memory between the steps). For each model and T,
CUDA-graph medians (L2 flushed, least of 3 rounds) of
  - align_wN: moe_align with the register kernel at N warps (where `align_in_one_program` lets it run);
  - three:    moe_align forced to its three launches (count, prefix, scatter);
  - reduce:   topk_reduce alone;
  - pair:     the layer's GEMM pair (as `moe-lab bench` times it); layer: the whole fused_moe;
and whether the schedules and the reference agree bit for bit (also on 200 random routings with repeated
and out-of-range ids). Writes JSON to argv[1] if it ends in .json.
History (same H200 session, 2026-12-01): lean_decode-H200-2026-12-01-reduce_in_gemm.txt is this script at
commit 574c2fc, which also timed the one-program kernel this one replaced (align_one_program_kernel) and
a layer whose down GEMM summed each token's rows itself (dropped: see that file).
Usage: python benchmarks/experiments/lean_decode.py [OUT.json]
"""
import json
import sys

import torch
import triton

import moe_lab.align as align
from moe_lab import fused_moe, moe_align, moe_align_reference, topk_reduce
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

POINTS = (("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8), ("qwen3-30b-a3b", 16), ("deepseek-v3", 1),
          ("deepseek-v3", 8), ("deepseek-v3", 16), ("mixtral-8x7b", 1), ("mixtral-8x7b", 8),
          ("mixtral-8x7b", 64), ("qwen3-30b-a3b", 64))
FIELDS = ("counts", "sorted_token_ids", "expert_ids", "num_tokens_post_padded")


def same(a, b):
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def three_launches(ids, num_experts, block_size_m):
    limit, align.ONE_PROGRAM_MAX_SLOTS = align.ONE_PROGRAM_MAX_SLOTS, 0
    try:
        return moe_align(ids, num_experts, block_size_m)
    finally:
        align.ONE_PROGRAM_MAX_SLOTS = limit


def random_check(n=200):
    g = torch.Generator().manual_seed(0)
    bad = 0
    for _ in range(n):
        e = int(torch.randint(1, align.ONE_PROGRAM_MAX_EXPERTS + 1, (1,), generator=g))
        k = int(torch.randint(1, 9, (1,), generator=g))
        t = int(torch.randint(1, align.ONE_PROGRAM_MAX_SLOTS // k + 1, (1,), generator=g))
        bm = 2 ** int(torch.randint(4, 9, (1,), generator=g))
        ids = torch.randint(0, int(torch.randint(1, e + 1, (1,), generator=g)), (t, k), generator=g, dtype=torch.int32)
        ids[torch.rand(ids.shape, generator=g) < 0.1] = e + 1
        ids = ids.cuda()
        got = moe_align(ids, e, bm)
        bad += not (same(got, three_launches(ids, e, bm)) and same(got, moe_align_reference(ids, e, bm)))
    return bad


WARPS = (1, 2, 4)


def point(model, t):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(t, device="cuda")
    tw, ti = uniform_routing(t, p.num_experts, p.top_k, seed=1)
    cfg = default_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    bm, e = cfg.block_size_m, p.num_experts
    routing = moe_align(ti, e, bm)
    row = dict(model=model, T=t, slots=t * p.top_k, E=e, BLOCK_SIZE_M=bm,
               one_program=align.align_in_one_program(t * p.top_k, e, bm), shipped_warps=None)
    row["bitwise"] = same(routing, three_launches(ti, e, bm)) and same(routing, moe_align_reference(ti, e, bm))
    shipped = align.ONE_PROGRAM_NUM_WARPS
    if row["one_program"]:
        row["shipped_warps"] = shipped
        for w in WARPS:
            align.ONE_PROGRAM_NUM_WARPS = w
            row["bitwise"] &= same(moe_align(ti, e, bm), routing)
            row[f"align_w{w}_ms"] = graph_ms(lambda: moe_align(ti, e, bm), rounds=3)
        align.ONE_PROGRAM_NUM_WARPS = shipped
    row["three_ms"] = graph_ms(lambda: three_launches(ti, e, bm), rounds=3)
    up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg)
    out_k = torch.randn(t * p.top_k, p.hidden_size, device="cuda").to(hs.dtype)
    row["reduce_ms"] = graph_ms(lambda: topk_reduce(out_k, ti, e), rounds=3)
    row["pair_ms"] = graph_ms(_both(up, down), rounds=3)
    row["layer_ms"] = graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg), rounds=3)
    row["layer_over_pair"] = row["layer_ms"] / row["pair_ms"]
    return row


def us(r, key):
    return f"{1e3 * r[key]:6.1f}" if r.get(key) else f"{'-':>6}"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    rows = [point(m, t) for m, t in POINTS]
    bad = random_check()
    print(f"random routings where the register kernel differs from three launches or the reference: {bad} of 200")
    print("times in us (CUDA-graph medians, L2 flushed); align_wN: the one-program kernel at N warps")
    print(f"{'model':<15} {'T':>4} {'slots':>5} {'BM':>4} " + " ".join(f"{'w' + str(w):>6}" for w in WARPS)
          + f" {'three':>6} {'reduce':>6} {'pair':>8} {'layer':>8} {'layer/pair':>10} bitwise")
    for r in rows:
        print(f"{r['model']:<15} {r['T']:>4} {r['slots']:>5} {r['BLOCK_SIZE_M']:>4} "
              + " ".join(us(r, f"align_w{w}_ms") for w in WARPS)
              + f" {us(r, 'three_ms')} {us(r, 'reduce_ms')} {1e3 * r['pair_ms']:8.1f} {1e3 * r['layer_ms']:8.1f} "
              f"{r['layer_over_pair']:10.3f} {r['bitwise']}")
    if out:
        with open(out, "w") as f:
            json.dump(dict(env, rows=rows, random_mismatches=bad), f, indent=1)


if __name__ == "__main__":
    main()
