"""Experiment: where a prefill grouped GEMM's time goes (H200, bf16, the shipped configs).

For each model and T, each GEMM of the layer (the up GEMM with its SwiGLU epilogue, the down GEMM), CUDA-graph
medians with L2 flushed (least of 3):
  - uniform:   the benchmark's routing (k distinct experts per token, uniformly at random): padded M-blocks;
  - balanced:  every expert gets exactly T*k/E rows, a multiple of BLOCK_SIZE_M here: no padding rows;
  - K/2, 2K:   balanced, with the reduction dimension halved and doubled (H for up, I for down). A line
               through the three times splits a tile's time into a part per K step and a fixed part
               (prologue, epilogue, pipeline fill and drain), reported as the fixed share at the real K;
  - bmm:       cuBLAS on the balanced problem, torch.bmm of [E, T*k/E, K] by [E, K, N]: what the same
               per-expert GEMMs reach without a grouped schedule (the up GEMM's N is 2I, no SwiGLU);
  - mm:        cuBLAS on one dense [T*k, K] x [K, N] matmul of the same FLOPs.
TFLOP/s count real rows only. Usage: python benchmarks/experiments/prefill_anatomy.py [OUT.json] [model ...]
"""
import json
import sys

import torch
import triton

from moe_lab import grouped_matmul, moe_align
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
TOKENS = (4096, 16384)


def balanced_routing(num_tokens, num_experts, top_k):
    slots = torch.arange(num_tokens * top_k, device="cuda").view(num_tokens, top_k)
    topk_ids = (slots % num_experts).to(torch.int32)  # k distinct experts per token (k <= E)
    return torch.full((num_tokens, top_k), 1.0 / top_k, device="cuda"), topk_ids


def timed(fn):
    try:
        return graph_ms(fn, rounds=3)
    except Exception as exc:  # noqa: BLE001 - a variant that fails is a result too
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def gemm_call(gemm, cfg, t, e, k, h, i, red, routing, tw):
    """A launch of `gemm` with reduction dimension `red` (H for up, I for down)."""
    if gemm == "up":
        x = torch.randn(t, red, device="cuda").to(torch.bfloat16)
        w = (torch.rand(e, 2 * i, red, device="cuda", dtype=torch.bfloat16) - 0.5) * red ** -0.5
        out = torch.empty(routing.max_num_tokens_padded, i, dtype=torch.bfloat16, device="cuda")
        return lambda: grouped_matmul(x, w, routing, cfg, gather_a=True, swiglu=True, out=out, use_tma=cfg.tma)
    x = torch.randn(routing.max_num_tokens_padded, red, device="cuda").to(torch.bfloat16)
    w = (torch.rand(e, h, red, device="cuda", dtype=torch.bfloat16) - 0.5) * red ** -0.5
    out = torch.empty(t * k, h, dtype=torch.bfloat16, device="cuda")
    return lambda: grouped_matmul(x, w, routing, cfg, gather_a=False, scatter=True, topk_weights=tw, out=out,
                                  use_tma=cfg.tma)


def cublas(kind, e, rows, n, red):
    if kind == "bmm":
        x = torch.randn(e, rows, red, device="cuda").to(torch.bfloat16)
        w = torch.randn(e, n, red, device="cuda").to(torch.bfloat16)
        return lambda: torch.bmm(x, w.transpose(1, 2))
    x = torch.randn(e * rows, red, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, red, device="cuda").to(torch.bfloat16)
    return lambda: x @ w.T


def point(model, t):
    p = get_preset(model)
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    cfg = default_config(t, e, k, h, i, torch.bfloat16)
    bm = cfg.block_size_m
    uniform = uniform_routing(t, e, k, seed=1)
    balanced = balanced_routing(t, e, k)
    r_uni, r_bal = moe_align(uniform[1], e, bm), moe_align(balanced[1], e, bm)
    blocks = {name: int(r.num_tokens_post_padded.item()) // bm for name, r in (("uniform", r_uni), ("balanced", r_bal))}
    rows = []
    for gemm in ("up", "down"):
        c = getattr(cfg, gemm)
        red = h if gemm == "up" else i
        n = 2 * i if gemm == "up" else h
        flops = 2 * t * k * n * red
        r = dict(model=model, T=t, gemm=gemm, config=c.to_dict(), blocks=blocks)
        r["uniform"] = timed(gemm_call(gemm, c, t, e, k, h, i, red, r_uni, uniform[0]))
        for name, scale in (("balanced", 1), ("K/2", 0.5), ("2K", 2)):
            r[name] = timed(gemm_call(gemm, c, t, e, k, h, i, int(red * scale), r_bal, balanced[0]))
            torch.cuda.empty_cache()
        r["bmm"] = timed(cublas("bmm", e, t * k // e, n, red))
        r["mm"] = timed(cublas("mm", e, t * k // e, n, red))
        times = [r["K/2"], r["balanced"], r["2K"]]
        if all(isinstance(x, float) for x in times):
            ks = [0.5 * red, red, 2 * red]
            slope = sum((kk - sum(ks) / 3) * (tt - sum(times) / 3) for kk, tt in zip(ks, times)) / \
                sum((kk - sum(ks) / 3) ** 2 for kk in ks)
            r["fixed_ms"] = sum(times) / 3 - slope * sum(ks) / 3
            r["fixed_share"] = r["fixed_ms"] / r["balanced"]
        for name in ("uniform", "balanced", "bmm", "mm"):
            if isinstance(r[name], float):
                r[f"tflops_{name}"] = flops / r[name] * 1e-9
        rows.append(r)
        torch.cuda.empty_cache()
    return rows


def fmt(x, width=8, digits=3):
    return f"{x:{width}.{digits}f}" if isinstance(x, float) else f"{'error':>{width}}"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    keys = ("uniform", "balanced", "K/2", "2K", "bmm", "mm")
    print(f"{'model':<15} {'T':>6} {'gemm':<5} " + " ".join(f"{x:>8}" for x in keys)
          + "  fixed%  TF/s: uniform balanced  bmm    mm   blocks uni/bal")
    rows, errors = [], {}
    for model in models:
        for t in TOKENS:
            for r in point(model, t):
                rows.append(r)
                print(f"{model:<15} {t:>6} {r['gemm']:<5} " + " ".join(fmt(r[x]) for x in keys)
                      + f"  {fmt(100 * r.get('fixed_share', float('nan')), 5, 1)}  "
                      + " ".join(fmt(r.get(f'tflops_{x}', float('nan')), 6, 0) for x in ("uniform", "balanced", "bmm", "mm"))
                      + f"   {r['blocks']['uniform']}/{r['blocks']['balanced']}", flush=True)
                errors.update({x: r[x] for x in keys if isinstance(r[x], str)})
                if out:
                    with open(out, "w") as f:
                        json.dump(dict(environment=env, rows=rows), f, indent=1)
    for x, err in errors.items():
        print(f"{x}: {err}")


if __name__ == "__main__":
    main()
