"""Experiment: full-precision float32 through TMA or pointer loads (H200).

Notebook 01 timed fused_moe in float32 at Mixtral-8x7B T=4096 at 3.3 s on an H200 with the new 64x128x32
tiles and use_tma="auto", while fp32_tiles.py (pointer loads) measured 133 ms for the same tiles.
Prediction: the TMA path is the slow one (its shared-memory layout suits wgmma, not the FMA dot).
Usage: python benchmarks/experiments/fp32_tma_vs_pointer.py
"""
import os
import sys

import torch

from moe_lab import fused_moe
from moe_lab.configs import heuristic_config
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp32_tiles import median_of_3_ms  # noqa: E402

torch.set_float32_matmul_precision("highest")
for model, T in (("mixtral-8x7b", 4096), ("mixtral-8x7b", 64)):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(T, dtype=torch.float32, device="cuda")
    tw, ti = uniform_routing(T, p.num_experts, p.top_k, seed=1)
    cfg = heuristic_config(T, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, torch.float32)
    for use_tma in ("auto", True, False):
        ms = median_of_3_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma))
        print(f"{model} T={T} float32 highest, {cfg.up}, use_tma={use_tma}: {ms:.3f} ms", flush=True)
