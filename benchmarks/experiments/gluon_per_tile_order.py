# Run on an sm_90 GPU from the repository root; docs/experiments.md on main, "Tile order with one program per tile".
"""The Gluon SwiGLU up GEMM (one program per tile for large experts) at GROUP_SIZE_M 1..16: time and bits."""
import sys, time, torch
from moe_lab import get_preset, quantize_weights_fp8
from moe_lab.align import moe_align
from moe_lab.configs import GemmConfig
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
from moe_lab.quantize import quantize_activations_fp8
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms

POINTS = [("deepseek-v3", 16384), ("deepseek-v3", 4096), ("mixtral-8x7b", 16384), ("mixtral-8x7b", 4096)]
GROUPS = [1, 2, 4, 8, 16]
with torch.inference_mode():
    for model in dict(POINTS):
        p = get_preset(model)
        e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
        g = torch.Generator(device="cuda").manual_seed(1)
        w1, s1 = quantize_weights_fp8(((torch.rand(e, 2 * i, h, device="cuda", generator=g) - .5) * h**-.5).bfloat16())
        for m, t in POINTS:
            if m != model:
                continue
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            tw, ids = uniform_routing(t, e, k, seed=t, device="cuda")
            routing = moe_align(ids, e, 128)
            x_q, x_s = quantize_activations_fp8(x, group_size=128)
            rows = routing.max_num_tokens_padded
            outs, best = {}, {}
            _, plan = grouped_matmul_fp8_gluon(x_q, w1, routing, gather_a=True, a_scale=x_s, w_scale=s1,
                                               activation="silu", out=torch.empty(rows, i, device="cuda").to(torch.float8_e4m3fn),
                                               out_scale=torch.empty(rows, i // 128, device="cuda"), return_plan=True)
            base = plan.config
            for G in GROUPS:
                cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=G,
                                 num_warps=base.num_warps, num_stages=base.num_stages)
                act = torch.full((rows, i), float("nan"), device="cuda").to(torch.float8_e4m3fn)
                act_s = torch.full((rows, i // 128), float("nan"), device="cuda")
                fn = lambda cfg=cfg, act=act, act_s=act_s: grouped_matmul_fp8_gluon(
                    x_q, w1, routing, cfg, gather_a=True, a_scale=x_s, w_scale=s1, activation="silu", out=act,
                    out_scale=act_s)
                fn()
                outs[G] = (act.view(torch.uint8).clone(), act_s.clone())
                best[G] = fn
            times = {G: float("inf") for G in GROUPS}
            for r in range(4):
                for G in (GROUPS if r % 2 == 0 else GROUPS[::-1]):
                    times[G] = min(times[G], graph_ms(best[G], rep_ms=60))
            flops = 2 * t * k * 2 * i * h
            ref = outs[base.GROUP_SIZE_M]
            line = " ".join(f"G={G} {times[G]:.3f}ms {flops / times[G] / 1e9:.0f}TF{'' if torch.equal(outs[G][0], ref[0]) else ' DIFF'}"
                            for G in GROUPS)
            print(f"{model} T={t} grid {plan.grid} default G={base.GROUP_SIZE_M} stages={base.num_stages}: {line}", flush=True)
        del w1, s1
        torch.cuda.empty_cache()
