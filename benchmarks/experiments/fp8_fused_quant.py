"""Experiment: the SwiGLU output quantized to float8 in the up GEMM's epilogue vs by a separate kernel (H200).

FP8 block-scaled [128, 128] layers, CUDA-graph medians, L2 flushed: the heuristic's configs (up GEMM
BLOCK_SIZE_N 64 or 128: its epilogue cannot hold a 128-column group, so a kernel quantizes a float32
buffer), against the same configs with the up GEMM's BLOCK_SIZE_N = 256 (128 output columns per program:
quantized in the epilogue). Usage: python benchmarks/experiments/fp8_fused_quant.py [OUT.json]
"""
import json
import sys
from dataclasses import replace

import torch
import triton

from moe_lab import fused_moe, quantize_weights_fp8
from moe_lab.configs import MoEConfig
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

POINTS = {"qwen3-30b-a3b": (1, 64, 4096), "deepseek-v3": (64, 4096), "mixtral-8x7b": (64, 4096)}
BLOCK = (128, 128)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    rows = []
    for model, tokens in POINTS.items():
        p = get_preset(model)
        e, h, i = p.num_experts, p.hidden_size, p.intermediate_size
        w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5, BLOCK)
        w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5, BLOCK)
        scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=BLOCK)
        for t in tokens:
            hs = torch.randn(t, h, device="cuda").bfloat16()
            tw, ti = uniform_routing(t, e, p.top_k, seed=1)
            cfg = default_config(t, e, p.top_k, h, i, torch.float8_e4m3fn)
            wide = MoEConfig(replace(cfg.up, BLOCK_SIZE_N=256, num_warps=8 if cfg.up.BLOCK_SIZE_M >= 64 else 4),
                             cfg.down)
            r = dict(model=model, T=t)
            for name, c in (("apart", cfg), ("fused", wide)):
                r[f"{name}_ms"] = graph_ms(lambda: fused_moe(hs, w1_q, w2_q, tw, ti, config=c, **scales), rounds=3)
            a, b = fused_moe(hs, w1_q, w2_q, tw, ti, config=cfg, **scales), fused_moe(hs, w1_q, w2_q, tw, ti, config=wide, **scales)
            r["max_abs_diff"] = float((a.float() - b.float()).abs().max())
            rows.append(r)
            print(f"{model:<15} {t:>6} apart {r['apart_ms']:.4f} fused {r['fused_ms']:.4f} "
                  f"ratio {r['fused_ms'] / r['apart_ms']:.3f} maxdiff {r['max_abs_diff']:.1e}", flush=True)
            if out:
                with open(out, "w") as fh:
                    json.dump(dict(environment=env, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
