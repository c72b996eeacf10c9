"""Experiment: FP8 activations quantized by the GEMM as it loads them vs by a quantization kernel (H200).

FP8 block-scaled [128, 128] layers with the shipped table's configs, CUDA-graph medians, L2 flushed, least of
3 rounds: as tuned ("apart": a kernel quantizes hidden_states, another the SwiGLU output), with the up GEMM
quantizing hidden_states on load, with the down GEMM quantizing the float32 SwiGLU output on load, and both.
The outputs must be bit for bit the same. Usage: python benchmarks/experiments/fp8_quantize_on_load.py [OUT.json]
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
from moe_lab.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
TOKENS = (1, 8, 64, 512, 4096)
BLOCK = (128, 128)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    rows = []
    for model in MODELS:
        p = get_preset(model)
        e, h, i = p.num_experts, p.hidden_size, p.intermediate_size
        w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5, BLOCK)
        w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5, BLOCK)
        scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=BLOCK)
        for t in TOKENS:
            hs = torch.randn(t, h, device="cuda").bfloat16()
            tw, ti = uniform_routing(t, e, p.top_k, seed=1)
            cfg = default_config(t, e, p.top_k, h, i, torch.float8_e4m3fn)
            variants = dict(apart=cfg,
                            up=MoEConfig(replace(cfg.up, quantize_on_load=True), cfg.down),
                            down=MoEConfig(cfg.up, replace(cfg.down, quantize_on_load=True)),
                            both=MoEConfig(replace(cfg.up, quantize_on_load=True),
                                           replace(cfg.down, quantize_on_load=True)))
            r = dict(model=model, T=t, up=cfg.up.to_dict(), down=cfg.down.to_dict())
            outs = {}
            for name, c in variants.items():
                outs[name] = fused_moe(hs, w1_q, w2_q, tw, ti, config=c, **scales)
                r[f"{name}_ms"] = graph_ms(lambda c=c: fused_moe(hs, w1_q, w2_q, tw, ti, config=c, **scales), rounds=3)
            r["bitwise_same"] = all(torch.equal(outs["apart"].view(torch.int16), o.view(torch.int16))
                                    for o in outs.values())
            rows.append(r)
            print(f"{model:<15} {t:>6} apart {r['apart_ms']:.4f}  up {r['up_ms']:.4f} ({r['up_ms'] / r['apart_ms']:.3f})"
                  f"  down {r['down_ms']:.4f} ({r['down_ms'] / r['apart_ms']:.3f})  both {r['both_ms']:.4f}"
                  f" ({r['both_ms'] / r['apart_ms']:.3f})  bitwise same: {r['bitwise_same']}", flush=True)
            if out:
                with open(out, "w") as fh:
                    json.dump(dict(environment=env, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
