"""Experiment: the steps of the layer beyond its two GEMMs, and what the lean layer saves (H200).

For each model and T, with the shipped config for that point (TMA path as tuned): CUDA-graph medians,
L2 flushed, of
  - up:        the up GEMM alone, writing gate_up [rows, 2I] (what the 2026-11-30 benchmark timed);
  - act:       silu_and_mul over it;
  - fused:     the up GEMM with the SwiGLU epilogue, writing act [rows, I] (same config: BLOCK_SIZE_N
               weight rows per program, half gate, half up);
  - fused2x:   the same with BLOCK_SIZE_N doubled (a program writes as many columns as the unfused one);
  - down:      the down GEMM (scatter, routed weights);
  - align1 / align3: moe_align as shipped (one launch for few slots) and forced to three launches;
  - reduce:    topk_reduce;
  - layer fused / layer unfused: the whole fused_moe, least of 3 medians.
and the layer's relative error against the float32 reference. Writes JSON to argv[1] (default: stdout only).
Usage: python benchmarks/experiments/lean_layer.py [OUT.json] [model ...]
"""
import json
import sys
from dataclasses import replace

import torch
import triton

import moe_lab.align as align
from moe_lab import (fused_moe, fused_moe_reference, grouped_matmul, moe_align, relative_error, silu_and_mul,
                     topk_reduce)
from moe_lab.configs import MoEConfig
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)


def point(model, num_tokens):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    cfg = default_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    up_cfg, tma = cfg.up, cfg.up.tma
    gate_up = grouped_matmul(hs, w1, routing, up_cfg, gather_a=True, use_tma=tma)
    act = silu_and_mul(gate_up, routing=routing)
    r = dict(model=model, T=num_tokens, up_config=up_cfg.to_dict())
    r["up_ms"] = graph_ms(lambda: grouped_matmul(hs, w1, routing, up_cfg, gather_a=True, out=gate_up, use_tma=tma))
    r["act_ms"] = graph_ms(lambda: silu_and_mul(gate_up, routing=routing, out=act))
    r["fused_ms"] = graph_ms(lambda: grouped_matmul(hs, w1, routing, up_cfg, gather_a=True, swiglu=True, out=act,
                                                    use_tma=tma))
    wide = replace(up_cfg, BLOCK_SIZE_N=min(256, 2 * up_cfg.BLOCK_SIZE_N))
    try:
        r["fused2x_ms"] = graph_ms(lambda: grouped_matmul(hs, w1, routing, wide, gather_a=True, swiglu=True, out=act,
                                                          use_tma=tma))
    except (ValueError, RuntimeError, triton.runtime.errors.OutOfResources) as exc:
        r["fused2x_ms"], r["fused2x_error"] = None, str(exc)[:120]
    out_k = torch.empty(num_tokens * p.top_k, p.hidden_size, dtype=hs.dtype, device="cuda")
    r["down_ms"] = graph_ms(lambda: grouped_matmul(act, w2, routing, cfg.down, gather_a=False, scatter=True,
                                                   topk_weights=tw, out=out_k, use_tma=cfg.down.tma))
    r["reduce_ms"] = graph_ms(lambda: topk_reduce(out_k, ti, p.num_experts))
    r["align1_ms"] = graph_ms(lambda: moe_align(ti, p.num_experts, cfg.block_size_m))
    limit, align.ONE_PROGRAM_MAX_SLOTS = align.ONE_PROGRAM_MAX_SLOTS, 0
    r["align3_ms"] = graph_ms(lambda: moe_align(ti, p.num_experts, cfg.block_size_m))
    align.ONE_PROGRAM_MAX_SLOTS = limit
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    for name, fuse in (("fused", True), ("unfused", False)):
        c = MoEConfig(replace(cfg.up, fuse_swiglu=fuse), cfg.down)
        r[f"layer_{name}_ms"] = graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=c), rounds=3)
        r[f"layer_{name}_err"] = relative_error(fused_moe(hs, w1, w2, tw, ti, config=c), ref)
    del hs, w1, w2, ref
    torch.cuda.empty_cache()
    return r


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    print(f"{'model':<15} {'T':>6} {'up':>8} {'act':>7} {'up+act':>8} {'fused':>8} {'fused2x':>8} {'down':>8} "
          f"{'align1':>7} {'align3':>7} {'reduce':>7} {'layer f':>8} {'layer u':>8} {'f/pair':>7} {'err f':>8}")
    rows = []
    for model in models:
        for t in TOKENS:
            r = point(model, t)
            rows.append(r)
            f2 = f"{r['fused2x_ms']:8.3f}" if r["fused2x_ms"] else "       -"
            print(f"{model:<15} {t:>6} {r['up_ms']:8.3f} {r['act_ms']:7.3f} {r['up_ms'] + r['act_ms']:8.3f} "
                  f"{r['fused_ms']:8.3f} {f2} {r['down_ms']:8.3f} {r['align1_ms']:7.4f} {r['align3_ms']:7.4f} "
                  f"{r['reduce_ms']:7.4f} {r['layer_fused_ms']:8.3f} {r['layer_unfused_ms']:8.3f} "
                  f"{r['layer_fused_ms'] / (r['up_ms'] + r['down_ms']):7.3f} {r['layer_fused_err']:8.1e}", flush=True)
            if out:
                with open(out, "w") as f:
                    json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
