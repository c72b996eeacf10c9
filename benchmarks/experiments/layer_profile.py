"""Experiment: where the whole layer spends its time beyond the two GEMMs (H200).

The 2026-11-29 and 11-30 benchmarks show DeepSeek-V3 T=16384 with the TMA path ~9 ms slower as a layer
than its two GEMMs (pointer path: ~3 ms). This profiles one layer call per path and lists CUDA kernel
times. Usage: python benchmarks/experiments/layer_profile.py [model T ...]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from moe_lab import fused_moe
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config


def main(points):
    for model, T in points:
        p = get_preset(model)
        hs, w1, w2, _ = p.build(T, device="cuda")
        tw, ti = uniform_routing(T, p.num_experts, p.top_k, seed=1)
        cfg = default_config(T, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
        for use_tma in (True, False, True):  # TMA again last: is a slow layer the order (a hot GPU)?
            run = lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma)  # noqa: E731
            print(f"\n{model} T={T} use_tma={use_tma}: layer {graph_ms(run):.3f} ms (graph replay)", flush=True)
            run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60),
                  flush=True)
        del hs, w1, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = sys.argv[1:] or ["deepseek-v3", "16384", "qwen3-30b-a3b", "4096"]
    main([(args[i], int(args[i + 1])) for i in range(0, len(args), 2)])
