"""Experiment: per-tensor FP8 scales with the sum kept in the MMA ("fast accumulation").

With per-tensor or per-channel scales nothing changes along K, yet the kernel adds each K step's product
to a float32 sum (Hopper's FP8 MMA keeps fewer accumulator bits, DeepSeek-V3 §3.3.2), so its K loop has
the block-scaled one's structure: a wait for each step's product and a second float32 tile in registers
(64 x 128 tiles). cuBLAS's per-tensor FP8 GEMM runs 1.42 to 1.77x faster than its bf16 one on the prefill
shapes (`fp8_ceilings.py`), moe-lab's 1.24 to 1.46x. Here the per-tensor pairs run with the MMA
accumulating over all of K (`moe_lab.grouped_matmul.FP8_OUTER_FAST_ACCUM`, off by default:
the layer's error grows past 1e-2, see the `layer` run), on the shipped FP8 tiles and on
the shipped bf16 tiles (as shipped, and with BLOCK_SIZE_K 128), against the per-step sums: time, and the
difference of the outputs from the per-step sums' (relative Frobenius; those are float32 sums of exact
products): the up GEMM's per slot, and the layer's down GEMM output (which also carries the up GEMM's
differences through the float8 rounding of its input).
With "layer": at every T of the benchmark, the per-tensor pair as shipped before (the FP8 table's configs,
per-step sums) and now (`choose_config(..., fp8_sums_in_mma=True)`, sums in the MMA), against the bf16
pair; and for T <= 4096 the whole `fused_moe` with per-tensor and with per-channel weight scales (per-token
activations), sums in the MMA, against the float32 reference on the dequantized weights and quantized
activations.
Usage: python benchmarks/experiments/fp8_fast_accum.py OUT.json [layer]
"""
import os
import sys
from dataclasses import replace

import torch

import moe_lab.grouped_matmul  # noqa: F401 (the module: the package attribute is the function)
from moe_lab import grouped_matmul, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.configs import MoEConfig
from moe_lab.presets import get_preset
from moe_lab.quantize import FP8_DTYPE, quantize_activations_fp8
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_decode_anatomy import write_results  # noqa: E402

gm = sys.modules["moe_lab.grouped_matmul"]
MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")


def outer_pair(hs, w1, w2, tw, ti, num_experts, cfg):
    """(up, down, routing, up output, down output): the per-tensor FP8 GEMMs (all scales one)."""
    routing = moe_align(ti, num_experts, cfg.block_size_m)
    one, per_expert = torch.ones(1, device=hs.device), torch.ones(w1.shape[0], device=hs.device)
    x, a1 = quantize_activations_fp8(hs, scale=one)
    fused = cfg.up.swiglu_epilogue
    up_kw = dict(gather_a=True, swiglu=fused, a_scale=a1, w_scale=per_expert)
    act = grouped_matmul(x, w1, routing, cfg.up, out_dtype=torch.float32, **up_kw)
    act_q, a2 = quantize_activations_fp8(act, scale=one)
    out_k = torch.empty(routing.num_slots, w2.shape[1], dtype=hs.dtype, device=hs.device)

    def up():
        grouped_matmul(x, w1, routing, cfg.up, out=act, **up_kw)

    def down():
        grouped_matmul(act_q, w2, routing, cfg.down, gather_a=False, scatter=True, topk_weights=tw, out=out_k,
                       a_scale=a2, w_scale=per_expert)
    return up, down, routing, act, out_k


def per_slot(act, routing):
    """The up GEMM's sorted-order rows as [slots, I] (padding rows dropped)."""
    ids = routing.sorted_token_ids[:act.shape[0]].long()
    valid = ids < routing.num_slots
    out = torch.full((routing.num_slots, act.shape[1]), float("nan"), device=act.device)
    out[ids[valid]] = act[valid]
    return out


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def point(model, num_tokens):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    w1_q, w2_q, _ = p.quantize_fp8(w1, w2)
    shape = (num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
    cfg16 = choose_config(*shape).config
    cfg8 = choose_config(*shape, FP8_DTYPE).config
    row = dict(model=model, T=num_tokens)
    up16, down16 = _layer_gemms(hs, w1, w2, tw, moe_align(ti, p.num_experts, cfg16.block_size_m), cfg16)
    row["bf16 pair"] = min(graph_ms(_both(up16, down16), rounds=3) for _ in range(2))
    del w1, w2
    wide = MoEConfig(up=replace(cfg16.up, BLOCK_SIZE_K=128), down=replace(cfg16.down, BLOCK_SIZE_K=128))
    variants = {"per-step fp8 tiles": (cfg8, False), "fast fp8 tiles": (cfg8, True),
                "fast bf16 tiles k128": (wide, True), "fast bf16 tiles": (cfg16, True)}
    base_up = base_down = None
    for name, (cfg, fast) in variants.items():
        gm.FP8_OUTER_FAST_ACCUM = fast
        try:
            up, down, routing, act, out_k = outer_pair(hs, w1_q, w2_q, tw, ti, p.num_experts, cfg)
            row[f"{name} pair"] = min(graph_ms(_both(up, down), rounds=3) for _ in range(2))
            up()
            down()
            slots = per_slot(act, routing)
            if base_up is None:
                base_up, base_down = slots, out_k.clone()
            row[f"{name} up diff"] = rel(slots, base_up)
            row[f"{name} out diff"] = rel(out_k, base_down)
            row[f"{name} speedup"] = row["bf16 pair"] / row[f"{name} pair"]
        except Exception as exc:
            row[f"{name} error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            gm.FP8_OUTER_FAST_ACCUM = False
    row["configs"] = dict(fp8=cfg8.up.to_dict(), bf16=cfg16.up.to_dict())
    return row


def layer_point(model, num_tokens):
    from moe_lab import fused_moe, fused_moe_reference, quantize_weights_fp8, relative_error
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    shape = (num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
    cfg16 = choose_config(*shape).config
    row = dict(model=model, T=num_tokens)
    up16, down16 = _layer_gemms(hs, w1, w2, tw, moe_align(ti, p.num_experts, cfg16.block_size_m), cfg16)
    row["bf16 pair"] = min(graph_ms(_both(up16, down16), rounds=3) for _ in range(2))
    (w1_q, w1_s), (w2_q, w2_s) = (quantize_weights_fp8(w, None) for w in (w1, w2))
    if num_tokens <= 4096:  # the layer with its sums in the MMA (the 2026-12-02 run's default)
        gm.FP8_OUTER_FAST_ACCUM = True
        for name, per_channel in (("tensor", False), ("channel", True)):
            (c1, s1), (c2, s2) = (quantize_weights_fp8(w, None, per_channel=per_channel) for w in (w1, w2))
            out = fused_moe(hs, c1, c2, tw, ti, w1_scale=s1, w2_scale=s2)
            row[f"err {name}"] = relative_error(out, fused_moe_reference(hs, c1, c2, tw, ti, w1_scale=s1, w2_scale=s2))
            del c1, c2
            torch.cuda.empty_cache()
    del w1, w2
    before = choose_config(*shape, FP8_DTYPE).config
    now = choose_config(*shape, FP8_DTYPE, fp8_sums_in_mma=True)
    row["now source"] = now.source
    for name, cfg, fast in (("before", before, False), ("now", now.config, True)):
        gm.FP8_OUTER_FAST_ACCUM = fast
        up, down, *_ = outer_pair(hs, w1_q, w2_q, tw, ti, p.num_experts, cfg)
        row[f"{name} pair"] = min(graph_ms(_both(up, down), rounds=3) for _ in range(2))
        row[f"{name} speedup"] = row["bf16 pair"] / row[f"{name} pair"]
    gm.FP8_OUTER_FAST_ACCUM = False
    return row


def main_layer():
    rows = []
    for model in MODELS:
        for t in (1, 8, 64, 512, 4096, 16384):
            r = layer_point(model, t)
            rows.append(r)
            errs = "  ".join(f"err {k} {r[f'err {k}']:.1e}" for k in ("tensor", "channel") if f"err {k}" in r)
            print(f"{model:<15} T={t:<5} bf16 {r['bf16 pair']:.4f}  per-tensor before {r['before pair']:.4f} "
                  f"({r['before speedup']:.2f}x)  now {r['now pair']:.4f} ({r['now speedup']:.2f}x)  {errs}", flush=True)
    write_results(sys.argv[1], rows)


def main():
    if sys.argv[2:] == ["layer"]:
        return main_layer()
    rows = []
    for model in MODELS:
        for t in (4096, 16384):
            r = point(model, t)
            rows.append(r)
            print(f"{model:<15} T={t:<5} bf16 pair {r['bf16 pair']:.3f} ms", flush=True)
            for name in ("per-step fp8 tiles", "fast fp8 tiles", "fast bf16 tiles k128", "fast bf16 tiles"):
                if f"{name} error" in r:
                    print(f"    {name:<22} {r[f'{name} error']}", flush=True)
                    continue
                print(f"    {name:<22} {r[f'{name} pair']:.3f} ms  {r[f'{name} speedup']:.2f}x over bf16   up diff "
                      f"{r[f'{name} up diff']:.1e}  out diff {r[f'{name} out diff']:.1e}", flush=True)
    write_results(sys.argv[1], rows)


if __name__ == "__main__":
    main()
