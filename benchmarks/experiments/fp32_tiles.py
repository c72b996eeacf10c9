"""Experiment: which tiles suit full-precision float32 (H200).

Notebook 01 times `fused_moe` in float32 at Mixtral-8x7B T=4096: 6397 ms on 2026-11-30, against 63 ms for
the per-expert PyTorch loop. Since 2026-11-29 float32 follows torch's float32 matmul precision, "highest"
by default, so the kernel runs `tl.dot(..., input_precision="ieee")` on the CUDA cores. The heuristic
gives that the prefill tile of bf16 (128x256x64, 8 warps, 4 stages): a 128x256 float32 accumulator per
program of FMA work.
Prediction: the big tile spills registers and runs near 0.5 TFLOP/s; 64x64 or 64x128 tiles with K = 32
reach 20-40 TFLOP/s (plain float32 peak about 67), so the layer takes 100-200 ms, near the loop.
Usage: python benchmarks/experiments/fp32_tiles.py [high]   (high: TF32 dots; times the heuristic only)
"""
import sys

import torch

from moe_lab import fused_moe, fused_moe_reference
from moe_lab.configs import GemmConfig, MoEConfig, heuristic_config
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing

CANDIDATES = [GemmConfig(64, 64, 32, 4, 4, 3), GemmConfig(64, 128, 32, 4, 4, 3), GemmConfig(128, 64, 32, 4, 4, 3),
              GemmConfig(128, 128, 32, 8, 8, 3), GemmConfig(64, 64, 16, 4, 4, 4), GemmConfig(32, 64, 32, 4, 4, 3),
              GemmConfig(128, 128, 16, 8, 8, 4)]


def median_of_3_ms(fn) -> float:
    """Median of three timed calls after a warm-up (the slowest configs take seconds a call)."""
    fn()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[1]


def main():
    precision = "high" if "high" in sys.argv[1:] else "highest"
    torch.set_float32_matmul_precision(precision)
    for model, T in (("mixtral-8x7b", 4096), ("mixtral-8x7b", 64), ("qwen3-30b-a3b", 4096)):
        p = get_preset(model)
        hs, w1, w2, _ = p.build(T, dtype=torch.float32, device="cuda")
        tw, ti = uniform_routing(T, p.num_experts, p.top_k, seed=1)
        shape = (T, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, torch.float32)
        configs = [(f"heuristic ({precision})", heuristic_config(*shape))]
        if precision == "highest":
            configs += [(str(c), MoEConfig(c, c)) for c in CANDIDATES]
        for name, cfg in configs:
            if not name.startswith("heuristic") and cfg.block_size_m > 64 and T <= 64:
                continue
            ms = median_of_3_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=False))
            print(f"{model:<14} T={T:<5} {ms:9.3f} ms {p.flops(T) / ms / 1e9:7.1f} TFLOP/s  {name}", flush=True)
        loop = median_of_3_ms(lambda: fused_moe_reference(hs, w1, w2, tw, ti))
        print(f"{model:<14} T={T:<5} {loop:9.3f} ms {p.flops(T) / loop / 1e9:7.1f} TFLOP/s  per-expert PyTorch loop",
              flush=True)
        del hs, w1, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
