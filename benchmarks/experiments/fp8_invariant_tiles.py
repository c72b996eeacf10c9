"""Experiment: what FP8 batch invariance would cost. The FP8 layer is batch invariant on an H200 when every
tile of every T runs one kind of MMA (`fp8_batch_invariance.py`): 64-row tiles without tail tiles (wgmma), or
16/32-row tiles (mma.sync). Times the FP8 layer (CUDA-graph medians, L2 flushed) with the tuned configs and
with each one-kind choice, where it departs from the tuned one. Usage: python benchmarks/experiments/fp8_invariant_tiles.py
"""
from dataclasses import replace

import torch

from moe_lab import fused_moe, get_preset, quantize_weights_fp8
from moe_lab.configs import MoEConfig
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for model in ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"):
    p = get_preset(model)
    e, h, i = p.num_experts, p.hidden_size, p.intermediate_size
    w1, s1 = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5, (128, 128))
    w2, s2 = quantize_weights_fp8(torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5, (128, 128))
    for t in (1, 8, 64, 512, 4096):
        hs = torch.randn(t, h, device="cuda").bfloat16()
        tw, ti = uniform_routing(t, e, p.top_k, seed=1)
        tuned = default_config(t, e, p.top_k, h, i, torch.float8_e4m3fn)
        wgmma = MoEConfig(*(replace(g, BLOCK_SIZE_M=64, tail_tiles=False) for g in (tuned.up, tuned.down)))
        mma = MoEConfig(*(replace(g, BLOCK_SIZE_M=min(g.BLOCK_SIZE_M, 32)) for g in (tuned.up, tuned.down)))
        line = f"{model:<15} {t:>5}"
        base = None
        for name, cfg in (("tuned", tuned), ("64 rows, no tail", wgmma), ("<= 32 rows", mma)):
            ms = graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, w1_scale=s1, w2_scale=s2,
                                            block_shape=(128, 128)), rep_ms=40)
            base = base or ms
            line += f"  {name} {ms:.4f} ({ms / base:.2f})"
        print(line, flush=True)
