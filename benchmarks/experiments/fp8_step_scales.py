"""Experiment: the block-scaled FP8 K loop, before and after its weight scales became one per tile.

Before: each K step loaded a vector of weight scales, one per column of the tile (w_rows // 128), moved it
into the accumulator's layout through shared memory (a barrier per step), multiplied it by the rows'
scales into a float32 tile (64 FMUL per thread) and waited on both loads right after the step's MMA.
After (`LaunchPlan.w_scale_per_tile`): where a tile's weight rows lie in one scale block (each half's, with
the SwiGLU epilogue), one scalar per step, folded into the rows' scales (2 FMUL per thread), and every
scale loaded a step ahead. Compiled for sm_90 with Triton 3.6 (64 x 128 x 128, 4 warps, 4 stages, TMA,
N = 4096, K = 7168): 186 -> 158 registers for the down GEMM, 211 -> 176 for the up GEMM with its SwiGLU
epilogue, and no shared-memory store left in the K loop (other shapes and Tritons give other counts).

Times, in one process, the GEMM pair (CUDA-graph medians, L2 flushed, the least of 3 rounds) with the tuned
FP8 configs both ways, in alternating order, and checks that the layer's output is bitwise the same.
Usage (on a GPU): python benchmarks/experiments/fp8_step_scales.py [T ...]
"""
import dataclasses
import sys

import torch

from moe_lab import fused_moe, get_preset, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

gm = sys.modules["moe_lab.grouped_matmul"]  # the package's name grouped_matmul is the function
_plan_launch = gm._plan_launch
PER_TILE = {"on": True}


def _plan(*args, **kwargs):  # "before": the per-column loop, which the kernel keeps for other tiles
    plan = _plan_launch(*args, **kwargs)
    return plan if PER_TILE["on"] else dataclasses.replace(plan, w_scale_per_tile=False)


gm._plan_launch = _plan
tokens = [int(t) for t in sys.argv[1:]] or [1, 64, 512, 4096, 16384]
print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
print("model            T   before up/down/pair ms       after up/down/pair ms        pair speedup  bitwise", flush=True)
for model in ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"):
    preset = get_preset(model)
    e, k, h, i = preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size
    for t in tokens:
        hs, w1, w2, _ = preset.build(t, dtype=torch.bfloat16, device="cuda", seed=0)
        w1, w2, scales = preset.quantize_fp8(w1, w2)
        tw, ti = uniform_routing(t, e, k, seed=1)
        cfg = default_config(t, e, k, h, i, torch.float8_e4m3fn)
        routing = moe_align(ti, e, cfg.block_size_m)
        times = {True: [], False: []}
        outs = {}
        for on in (False, True, False, True):
            PER_TILE["on"] = on
            up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg, scales=scales)
            times[on].append((graph_ms(up), graph_ms(down), graph_ms(_both(up, down), rounds=3)))
            outs[on] = fused_moe(hs, w1, w2, tw, ti, config=cfg, **scales)
        best = {on: min(v, key=lambda r: r[2]) for on, v in times.items()}
        same = torch.equal(outs[False], outs[True])
        fmt = lambda r: f"{r[0]:8.4f} {r[1]:8.4f} {r[2]:8.4f}"
        print(f"{model:<14} {t:>5}  {fmt(best[False])}   {fmt(best[True])}   {best[False][2] / best[True][2]:6.3f}x"
              f"      {same}", flush=True)
        del hs, w1, w2, scales, outs
        torch.cuda.empty_cache()
