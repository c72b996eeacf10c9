"""Experiment: one token (T = 1) in slot order, without the align launch (H200, shipped configs).

`fused_moe` at T = 1 now takes `moe_lab.align.slot_order_routing`: M-block j is slot j, its expert read by
the GEMMs straight from topk_ids, so the layer is three launches (up GEMM, down GEMM, top-k reduce).
For each model, bf16 and FP8 (block-scaled [128, 128]), CUDA-graph medians (L2 flushed, least of 3
rounds; the two layers timed alternately, twice each) of
  - pair:    the layer's GEMM pair on moe_align's schedule (as `moe-lab bench` times it);
  - aligned: fused_moe with the align (slot order switched off);
  - slot:    fused_moe as shipped (slot order);
and whether the two layers' outputs are bitwise equal. Writes JSON to argv[1] if it ends in .json.
Usage: python benchmarks/experiments/slot_order.py [OUT.json]
"""
import json
import sys

import torch
import triton

import moe_lab.layer as layer
from moe_lab import fused_moe, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
T = 1


def aligned_layer(*args, **kw):
    slot_order, layer.slot_order_routing = layer.slot_order_routing, lambda *a, **k: None
    try:
        return fused_moe(*args, **kw)
    finally:
        layer.slot_order_routing = slot_order


def point(model, fp8):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(T, device="cuda")
    tw, ti = uniform_routing(T, p.num_experts, p.top_k, seed=1)
    kw = {}
    if fp8:
        w1, w2, kw = p.quantize_fp8(w1, w2)
    cfg = choose_config(T, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, w1.dtype).config
    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg, scales=kw or None)
    slot = fused_moe(hs, w1, w2, tw, ti, config=cfg, **kw)
    aligned = aligned_layer(hs, w1, w2, tw, ti, config=cfg, **kw)
    row = dict(model=model, T=T, dtype="fp8" if fp8 else "bf16", bitwise=torch.equal(slot, aligned),
               pair_ms=graph_ms(_both(up, down), rounds=3))
    times = dict(aligned=[], slot=[])
    for _ in range(2):
        times["aligned"].append(graph_ms(lambda: aligned_layer(hs, w1, w2, tw, ti, config=cfg, **kw), rounds=3))
        times["slot"].append(graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, **kw), rounds=3))
    row.update({f"{k}_ms": min(v) for k, v in times.items()})
    row["aligned_over_pair"] = row["aligned_ms"] / row["pair_ms"]
    row["slot_over_pair"] = row["slot_ms"] / row["pair_ms"]
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    rows = [point(m, fp8) for fp8 in (False, True) for m in MODELS]
    print("times in us (CUDA-graph medians, L2 flushed, least of 3 rounds, best of 2 alternating runs)")
    print(f"{'model':<15} {'dtype':<5} {'pair':>7} {'aligned':>8} {'slot':>7} {'aligned/pair':>12} {'slot/pair':>9} bitwise")
    for r in rows:
        print(f"{r['model']:<15} {r['dtype']:<5} {1e3 * r['pair_ms']:7.1f} {1e3 * r['aligned_ms']:8.1f} "
              f"{1e3 * r['slot_ms']:7.1f} {r['aligned_over_pair']:12.3f} {r['slot_over_pair']:9.3f} {r['bitwise']}")
    if out:
        with open(out, "w") as f:
            json.dump(dict(env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
