"""Experiment: programmatic dependent launch (PDL) for the layer's kernels (H200, bf16, shipped configs).

With PDL (`MOE_LAB_PDL=1`, `moe_lab.capability.pdl_support`) each kernel is launched with Triton's
launch_pdl and its programs first wait for the kernel before (`griddepcontrol.wait`), so the next launch
is under way while the previous kernel finishes. The layer's down GEMM may also read its (older) routing
before that wait and pull its weight rows into L2 (`grouped_matmul(..., prefetch_weights=True)`), so its
weight reads start while the up GEMM finishes. For each model and T, CUDA-graph medians with L2 flushed
(least of 3 rounds; the modes timed twice in turn, the least kept) of the whole layer (`fused_moe`) and of
its GEMM pair (up with the SwiGLU epilogue, then down, as `moe-lab bench` times them), in three modes:
"off" (no PDL), "pdl" (PDL, no prefetch), "prefetch" (PDL and the down GEMM's prefetch), and whether the
layer's output is bitwise the same in all three.
Usage: python benchmarks/experiments/pdl.py [OUT.json] [model ...]
"""
import json
import os
import sys

import torch
import triton

import moe_lab.bench as bench
import moe_lab.layer as layer
from moe_lab import fused_moe, moe_align
from moe_lab.capability import pdl_support
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096)
MODES = ("off", "pdl", "prefetch")
REAL_GROUPED_MATMUL = layer.grouped_matmul


def without_prefetch(*args, **kwargs):
    kwargs["prefetch_weights"] = False
    return REAL_GROUPED_MATMUL(*args, **kwargs)


def set_mode(mode):
    os.environ["MOE_LAB_PDL"] = "0" if mode == "off" else "1"
    assert bool(pdl_support()) == (mode != "off"), pdl_support().reason
    gm = REAL_GROUPED_MATMUL if mode == "prefetch" else without_prefetch
    layer.grouped_matmul = bench.grouped_matmul = gm


def point(model, t):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(t, device="cuda")
    tw, ti = uniform_routing(t, p.num_experts, p.top_k, seed=1)
    cfg = default_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    row = dict(model=model, T=t)
    outs = {}
    for mode in MODES + MODES:
        set_mode(mode)
        up, down = bench._layer_gemms(hs, w1, w2, tw, routing, cfg)
        outs[mode] = fused_moe(hs, w1, w2, tw, ti, config=cfg)
        for name, fn in (("layer", lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg)), ("pair", bench._both(up, down))):
            ms = graph_ms(fn, rounds=3)
            row[f"{name}_{mode}"] = min(ms, row.get(f"{name}_{mode}", ms))
    row["bitwise"] = all(torch.equal(outs[m], outs["off"]) for m in MODES)
    del hs, w1, w2
    torch.cuda.empty_cache()
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    print(f"{'model':<15} {'T':>6}  " + " ".join(f"{'layer ' + m:>14}" for m in MODES) + "  "
          + " ".join(f"{'pair ' + m:>14}" for m in MODES) + "   layer/pair off prefetch  bitwise")
    rows = []
    for model in models:
        for t in TOKENS:
            r = point(model, t)
            rows.append(r)
            print(f"{model:<15} {t:>6}  " + " ".join(f"{r['layer_' + m]:14.4f}" for m in MODES) + "  "
                  + " ".join(f"{r['pair_' + m]:14.4f}" for m in MODES)
                  + f"   {r['layer_off'] / r['pair_off']:6.3f} {r['layer_prefetch'] / r['pair_prefetch']:6.3f}  {r['bitwise']}",
                  flush=True)
            if out:
                with open(out, "w") as f:
                    json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
