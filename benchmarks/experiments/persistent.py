"""Experiment: the persistent grouped GEMM against one program per tile (H200).

For each model and T, each GEMM of the layer (the up GEMM with its SwiGLU epilogue, the down GEMM) with the
shipped config for that point, CUDA-graph medians with L2 flushed (least of 3), of:
  - tile:          grouped_matmul_kernel, one program per tile (as shipped);
  - persistent:    grouped_matmul_persistent_kernel, one program per SM, tile and K loops flattened;
  - no flatten:    the same without flattening (nested loops);
  - ws:            flattened with warp_specialize=True (Triton 3.6 documents it for Blackwell only);
and whether the persistent output is bitwise the per-tile one. Usage:
python benchmarks/experiments/persistent.py [OUT.json] [model ...]
"""
import importlib
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

gm = importlib.import_module("moe_lab.grouped_matmul")
MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
TOKENS = (512, 4096, 16384)


def timed(fn):
    try:
        fn()
        return graph_ms(fn, rounds=3)
    except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a result too
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def point(model, num_tokens):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    cfg = default_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    act = grouped_matmul(hs, w1, routing, cfg.up, gather_a=True, swiglu=True)
    out_k = torch.empty(num_tokens * p.top_k, p.hidden_size, dtype=hs.dtype, device="cuda")
    calls = {
        "up": lambda c: grouped_matmul(hs, w1, routing, c, gather_a=True, swiglu=True, out=act, use_tma=c.tma),
        "down": lambda c: grouped_matmul(act, w2, routing, c, gather_a=False, scatter=True, topk_weights=tw,
                                         out=out_k, use_tma=c.tma),
    }
    rows = []
    for gemm, call in calls.items():
        base = getattr(cfg, gemm)
        r = dict(model=model, T=num_tokens, gemm=gemm, config=base.to_dict())
        r["tile"] = timed(lambda: call(base))
        ref = (act if gemm == "up" else out_k).clone()
        pers = replace(base, persistent=True)
        r["persistent"] = timed(lambda: call(pers))
        got = (act if gemm == "up" else out_k)
        r["bitwise"] = bool(torch.equal(got, ref)) if gemm == "down" else None  # up: padding rows may differ
        gm.PERSISTENT_FLATTEN = False
        r["no_flatten"] = timed(lambda: call(pers))
        gm.PERSISTENT_FLATTEN = True
        gm.PERSISTENT_WARP_SPECIALIZE = True
        r["ws"] = timed(lambda: call(pers))
        gm.PERSISTENT_WARP_SPECIALIZE = False
        rows.append(r)
    del hs, w1, w2
    torch.cuda.empty_cache()
    return rows


def fmt(x):
    return f"{x:8.3f}" if isinstance(x, float) else "   error"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    keys = ("tile", "persistent", "no_flatten", "ws")
    print(f"{'model':<15} {'T':>6} {'gemm':<5} " + " ".join(f"{k:>10}" for k in keys) + "  bitwise")
    rows, errors = [], {}
    for model in models:
        for t in TOKENS:
            for r in point(model, t):
                rows.append(r)
                print(f"{model:<15} {t:>6} {r['gemm']:<5} " + " ".join(f"{fmt(r[k]):>10}" for k in keys)
                      + f"  {r['bitwise']}", flush=True)
                errors.update({k: r[k] for k in keys if isinstance(r[k], str)})
                if out:
                    with open(out, "w") as f:
                        json.dump(dict(environment=env, rows=rows), f, indent=1)
    for k, e in errors.items():
        print(f"{k}: {e}")


if __name__ == "__main__":
    main()
