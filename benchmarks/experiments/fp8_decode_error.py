"""Where the Gluon FP8 layer's extra error at decode comes from (docs/experiments.md on main, "FP8 at decode").
Run on an sm_90 GPU: python benchmarks/experiments/fp8_decode_error.py. Qwen3-30B-A3B T=1 (and T=8, Mixtral T=1), per trial:
(A) error vs the dequantized reference (act quantized from float64 sums, as fused_moe_reference does)
(B) error vs exact math on the same float8 x and weights with the intermediate NOT quantized
(C) Gluon down GEMM + reduce vs float64 of Gluon's own float8 act (the down GEMM's error alone)
(D) e4m3 code flips of Gluon's act against the float64-quantized act, out of 8 x 768."""

import os, time, torch
from moe_lab import fused_moe, get_preset, quantize_weights_fp8
from moe_lab import plan as P
from moe_lab.reference import fused_moe_reference, relative_error
from moe_lab.routing import uniform_routing
from moe_lab.quantize import dequantize_fp8, quantize_activations_fp8
from moe_lab.align import moe_align
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon

DEV = "cuda"
BLOCK = (128, 128)


def layer(setting, x, w1, w2, tw, ids, sc):
    os.environ["MOE_LAB_GLUON"] = setting
    P.clear_layer_plans()
    out = torch.full_like(x, float("nan"))
    fused_moe(x, w1, w2, tw, ids, out=out, **sc)
    return out


def main(model, t, trials):
    p = get_preset(model)
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    g = torch.Generator(device=DEV).manual_seed(1)
    w1, s1 = quantize_weights_fp8(
        ((torch.rand(e, 2 * i, h, device=DEV, generator=g) - 0.5) * h**-0.5).bfloat16(), BLOCK
    )
    g = torch.Generator(device=DEV).manual_seed(2)
    w2, s2 = quantize_weights_fp8(((torch.rand(e, h, i, device=DEV, generator=g) - 0.5) * i**-0.5).bfloat16(), BLOCK)
    sc = dict(w1_scale=s1, w2_scale=s2, block_shape=BLOCK)
    rows = []
    for s in range(trials):
        torch.manual_seed(1000 + s)
        x = torch.randn(t, h, device=DEV, dtype=torch.bfloat16)
        tw, ids = uniform_routing(t, e, k, seed=1 if s % 2 == 0 else 1000 + s, device=DEV)
        og, ot = layer("1", x, w1, w2, tw, ids, sc), layer("0", x, w1, w2, tw, ids, sc)
        ref_a = fused_moe_reference(x, w1, w2, tw, ids, dtype=torch.float64, **sc)
        x_q, x_s = quantize_activations_fp8(x, group_size=128)
        xd = dequantize_fp8(x_q, x_s, (1, 128)).double()
        routing = moe_align(ids, e, 64)
        act = torch.full((routing.max_num_tokens_padded, i), float("nan"), device=DEV).to(torch.float8_e4m3fn)
        act_s = torch.full((routing.max_num_tokens_padded, i // 128), float("nan"), device=DEV)
        grouped_matmul_fp8_gluon(
            x_q, w1, routing, gather_a=True, a_scale=x_s, w_scale=s1, activation="silu", out=act, out_scale=act_s
        )
        out_k = grouped_matmul_fp8_gluon(
            act, w2, routing, gather_a=False, scatter=True, topk_weights=tw, a_scale=act_s, w_scale=s2
        )
        sid = routing.sorted_token_ids.long()
        ref_b = torch.zeros(t, h, dtype=torch.float64, device=DEV)
        ref_c = torch.zeros(t, h, dtype=torch.float64, device=DEV)
        flips = 0
        for r in (sid < routing.num_slots).nonzero().flatten().tolist():
            slot = int(sid[r])
            tok, j = divmod(slot, k)
            ex = int(ids[tok, j])
            w1d = dequantize_fp8(w1[ex : ex + 1], s1[ex : ex + 1], BLOCK)[0].double()
            w2d = dequantize_fp8(w2[ex : ex + 1], s2[ex : ex + 1], BLOCK)[0].double()
            gu = xd[tok] @ w1d.T
            a = torch.nn.functional.silu(gu[:i]) * gu[i:]
            ref_b[tok] += float(tw[tok, j]) * (w2d @ a)
            ag = dequantize_fp8(act[r : r + 1], act_s[r : r + 1], (1, 128))[0].double()
            ref_c[tok] += float(tw[tok, j]) * (w2d @ ag)
            q, _ = quantize_activations_fp8(a[None].float(), group_size=128)
            flips += int((act[r].view(torch.uint8) != q[0].view(torch.uint8)).sum())
        own = out_k.view(t, k, h).double().sum(1)
        rows.append(
            (
                relative_error(og.double(), ref_a),
                relative_error(ot.double(), ref_a),
                relative_error(og.double(), ref_b),
                relative_error(ot.double(), ref_b),
                relative_error(own, ref_c),
                relative_error(og.double(), own),
                flips,
            )
        )
    R = torch.tensor(rows)
    names = [
        "A gluon",
        "A triton",
        "B gluon (exact act)",
        "B triton (exact act)",
        "C gluon down+sum vs own act",
        "gluon layer vs own pair",
        "D flips",
    ]
    print(f"{model} T={t}, {trials} trials: median / max")
    for n, c in zip(names, R.T):
        print(f"  {n:30s} {c.median():.3e} / {c.max():.3e}")
    worst = R[:, 0].argmax()
    print("  worst A trial:", ["%.3e" % v for v in R[worst].tolist()])
    print("  corr(A gluon, flips):", float(torch.corrcoef(torch.stack([R[:, 0], R[:, 6]]))[0, 1]))


if __name__ == "__main__":
    t0 = time.time()
    with torch.inference_mode():
        main("qwen3-30b-a3b", 1, 150)
        main("qwen3-30b-a3b", 8, 40)
        main("mixtral-8x7b", 1, 60)
    print(f"{time.time() - t0:.0f} s")
