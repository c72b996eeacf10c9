# Run on an sm_90 GPU from the repository root; docs/experiments.md on main, "Tile order with one program per tile".
"""The FP8 layer with the Gluon GEMMs (MOE_LAB_GLUON=1) at DeepSeek-V3 T = 4096, 8192, 16384, the SwiGLU up GEMM's
GROUP_SIZE_M forced to 1, 2, 4, 8 (monkeypatched `gluon_group_size_m`), CUDA-graph medians, alternating, 4 rounds."""
import os, sys, torch
import moe_lab.plan as P
from moe_lab import fused_moe, get_preset, quantize_weights_fp8
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms

orig = P.gluon_group_size_m
os.environ["MOE_LAB_GLUON"] = "1"
model = sys.argv[1] if len(sys.argv) > 1 else "deepseek-v3"
tokens = [int(t) for t in sys.argv[2:]] or [4096, 8192, 16384]
GROUPS = [1, 2, 4, 8]
p = get_preset(model)
e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
with torch.inference_mode():
    g = torch.Generator(device="cuda").manual_seed(1)
    w1, s1 = quantize_weights_fp8(((torch.rand(e, 2 * i, h, device="cuda", generator=g) - .5) * h**-.5).bfloat16())
    w2, s2 = quantize_weights_fp8(((torch.rand(e, h, i, device="cuda", generator=g) - .5) * i**-.5).bfloat16())
    sc = dict(w1_scale=s1, w2_scale=s2, block_shape=(128, 128))
    for t in tokens:
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        tw, ids = uniform_routing(t, e, k, seed=t, device="cuda")
        fns, outs = {}, {}
        for G in GROUPS:
            def fn(G=G, out=torch.empty_like(x)):
                P.gluon_group_size_m = lambda n_tiles, sms, swiglu: G if swiglu else orig(n_tiles, sms, swiglu)
                P.clear_layer_plans()
                try:
                    return fused_moe(x, w1, w2, tw, ids, out=out, **sc)
                finally:
                    P.gluon_group_size_m = orig
            fns[G] = fn
            outs[G] = fn().clone()
        times = {G: float("inf") for G in GROUPS}
        for r in range(4):
            for G in (GROUPS if r % 2 == 0 else GROUPS[::-1]):
                times[G] = min(times[G], graph_ms(fns[G], rep_ms=80))
        flops = 2 * t * k * 3 * i * h
        print(f"{model} T={t} ({t * k / e:g} rows/expert): " + "  ".join(
            f"G={G} {times[G]:.3f} ms {flops / times[G] / 1e9:.0f} TF x{times[1] / times[G]:.3f}"
            f"{'' if torch.equal(outs[G], outs[1]) else ' DIFF'}" for G in GROUPS), flush=True)
