"""Experiment (issue 34): where DeepSeek-V3's FP8 time goes, against ceilings of the same run.

    python benchmarks/experiments/gluon_anatomy.py OUT

DeepSeek-V3 (E=256, k=8, H=7168, I=2048) at T = 4096 and 16384, float8 [128, 128] block scales, Gluon GEMMs with
128-row tiles: the up GEMM (SwiGLU, float8 out) at GROUP_SIZE_M 1, 4, 8 (shipped), 16, 32 (the order of tiles:
how many M-blocks share each W box in L2 at once); the down GEMM; each against cuBLAS's block-scaled dense GEMM of
its own shape ([T*k, H] x [H, 2I], [T*k, I] x [I, H]); and the same FLOPs routed to 16 of the 256 experts
(T*k/16 rows each: what many small experts cost). CUDA-graph medians, L2 flushed, order rotated, 3 rounds.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.gluon_fp8 import block_scaled_mm  # noqa: E402
from moe_lab import Activation, get_preset, moe_align, quantize_activations_fp8, quantize_weights_fp8  # noqa: E402
from moe_lab.configs import GemmConfig  # noqa: E402
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon  # noqa: E402
from moe_lab.routing import uniform_routing  # noqa: E402
from moe_lab.tools.timing import graph_ms  # noqa: E402


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    p = get_preset("deepseek-v3")
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    gen = torch.Generator(device="cuda").manual_seed(1)
    w1_q, w1_s = quantize_weights_fp8(
        ((torch.rand(e, 2 * i, h, device="cuda", generator=gen) - 0.5) * h**-0.5).to(torch.bfloat16), (128, 128)
    )
    w2_q, w2_s = quantize_weights_fp8(
        ((torch.rand(e, h, i, device="cuda", generator=gen) - 0.5) * i**-0.5).to(torch.bfloat16), (128, 128)
    )
    rows_out, lines = [], []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    say("| T | what | ms | TFLOP/s |")
    say("|---|---|---|---|")
    for t in (4096, 16384):
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        x_q, x_s = quantize_activations_fp8(x, group_size=128)
        fns, flops = {}, {}
        f_up, f_down = 2.0 * t * k * 2 * i * h, 2.0 * t * k * i * h
        for used in (e, 16):
            tw, ti = uniform_routing(t, used, k, seed=1)
            r = moe_align(ti, e, 128)
            rows = r.max_num_tokens_padded
            up_out = torch.empty(rows, i, device="cuda", dtype=torch.float8_e4m3fn)
            up_scale = torch.empty(rows, i // 128, device="cuda", dtype=torch.float32)
            down_out = torch.empty(t * k, h, device="cuda", dtype=torch.bfloat16)
            for g in (1, 4, 8, 16, 32) if used == e else (8,):
                cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=4, GROUP_SIZE_M=g)

                def up(r=r, cfg=cfg, up_out=up_out, up_scale=up_scale):
                    return grouped_matmul_fp8_gluon(
                        x_q,
                        w1_q,
                        r,
                        cfg,
                        gather_a=True,
                        a_scale=x_s,
                        w_scale=w1_s,
                        activation=Activation("silu"),
                        out=up_out,
                        out_scale=up_scale,
                    )

                name = f"up GEMM, {used} experts used, GROUP_SIZE_M={g}"
                fns[name], flops[name] = up, f_up
            up()
            a_in, s_in = up_out.clone(), up_scale.clone()
            cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=4)

            def down(r=r, cfg=cfg, a_in=a_in, s_in=s_in, tw=tw, down_out=down_out):
                return grouped_matmul_fp8_gluon(
                    a_in,
                    w2_q,
                    r,
                    cfg,
                    gather_a=False,
                    scatter=True,
                    topk_weights=tw,
                    a_scale=s_in,
                    w_scale=w2_s,
                    out=down_out,
                )

            name = f"down GEMM, {used} experts used"
            fns[name], flops[name] = down, f_down
        m = t * k
        up_c = block_scaled_mm(
            torch.randn(m, h, device="cuda").bfloat16(), torch.randn(2 * i, h, device="cuda").bfloat16()
        )
        down_c = block_scaled_mm(
            torch.randn(m, i, device="cuda").bfloat16(), torch.randn(h, i, device="cuda").bfloat16()
        )
        if up_c:
            fns["dense block-scaled up shape"], flops["dense block-scaled up shape"] = up_c, f_up
        if down_c:
            fns["dense block-scaled down shape"], flops["dense block-scaled down shape"] = down_c, f_down
        best = {}
        names = list(fns)
        for rnd in range(3):
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                try:
                    best[name] = min(graph_ms(fns[name], rep_ms=100), best.get(name, float("inf")))
                except Exception as exc:  # noqa: BLE001
                    say(f"FAIL {t} {name}: {type(exc).__name__}: {str(exc)[:300]}")
        for name in names:
            if name in best:
                tf = flops[name] / best[name] / 1e9
                rows_out.append(dict(T=t, what=name, ms=best[name], tflops=tf))
                say(f"| {t} | {name} | {best[name]:.3f} | {tf:.0f} |")
        with open(os.path.join(out_dir, "anatomy.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=rows_out), f, indent=1)
        with open(os.path.join(out_dir, "anatomy.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
