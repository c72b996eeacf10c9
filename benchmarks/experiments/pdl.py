"""Experiment: programmatic dependent launch (PDL) for the layer's kernels (H200, bf16, shipped configs).

With PDL (`moe_lab.capability.pdl_support`) each kernel is launched with Triton's launch_pdl and its
programs first wait for the kernel before (`griddepcontrol.wait`), so the next launch is under way while
the previous kernel finishes. For each model and T, CUDA-graph medians with L2 flushed (least of 3 rounds,
off and on timed twice in alternating order, the least kept) of the whole layer (`fused_moe`) and of its
GEMM pair (up with the SwiGLU epilogue, then down, as `moe-lab bench` times them), with MOE_LAB_PDL=0 and
with PDL on, and whether the layer's output is bitwise the same.
Usage: python benchmarks/experiments/pdl.py [OUT.json] [model ...]
"""
import json
import os
import sys

import torch
import triton

from moe_lab import fused_moe, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.capability import pdl_support
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)


def set_pdl(on: bool):
    os.environ["MOE_LAB_PDL"] = "1" if on else "0"
    assert bool(pdl_support()) == on, pdl_support().reason


def point(model, t):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(t, device="cuda")
    tw, ti = uniform_routing(t, p.num_experts, p.top_k, seed=1)
    cfg = default_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg)
    calls = dict(layer=lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg), pair=_both(up, down))
    row = dict(model=model, T=t)
    outs = {}
    for on in (False, True, False, True):
        set_pdl(on)
        tag = "on" if on else "off"
        outs[tag] = fused_moe(hs, w1, w2, tw, ti, config=cfg)
        for name, fn in calls.items():
            ms = graph_ms(fn, rounds=3)
            row[f"{name}_{tag}"] = min(ms, row.get(f"{name}_{tag}", ms))
    row["bitwise"] = bool(torch.equal(outs["on"], outs["off"]))
    del hs, w1, w2
    torch.cuda.empty_cache()
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    print(f"{'model':<15} {'T':>6}  {'layer off':>9} {'on':>8} {'x':>6}   {'pair off':>9} {'on':>8} {'x':>6}   "
          f"layer/pair off  on  bitwise")
    rows = []
    for model in models:
        for t in TOKENS:
            r = point(model, t)
            rows.append(r)
            print(f"{model:<15} {t:>6}  {r['layer_off']:9.4f} {r['layer_on']:8.4f} {r['layer_off'] / r['layer_on']:6.3f}"
                  f"   {r['pair_off']:9.4f} {r['pair_on']:8.4f} {r['pair_off'] / r['pair_on']:6.3f}"
                  f"   {r['layer_off'] / r['pair_off']:6.3f} {r['layer_on'] / r['pair_on']:6.3f}  {r['bitwise']}",
                  flush=True)
            if out:
                with open(out, "w") as f:
                    json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
