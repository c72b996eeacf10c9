"""Experiment: FP8 w8a8 (block-scaled [128, 128], DeepSeek-V3's format) against moe-lab's own bf16, on an H200.

For each model and T: CUDA-graph medians, L2 flushed, of
  - bf16 pair:   up GEMM (SwiGLU epilogue) + down GEMM with the shipped bf16 config;
  - fp8 pair:    the same two GEMMs on float8_e4m3fn operands with block scales, for each candidate config
                 (`candidates`), the best BLOCK_SIZE_M (shared by both) kept;
  - quant:       the two activation quantizations (hidden states, per token per 128 channels; the SwiGLU
                 output, rows in use only);
  - layers:      fused_moe in bf16 and in fp8 (the best fp8 configs), least of 3 medians;
  - errors:      fp8 layer vs the dequantized float32 reference (the kernels' error) and vs the bf16 float32
                 reference (quantization's error).
Writes JSON to argv[1] (default: stdout only). Usage: python benchmarks/experiments/fp8.py [OUT.json] [model ...]
"""
import json
import sys
from dataclasses import replace

import torch
import triton

from moe_lab import (fused_moe, fused_moe_reference, grouped_matmul, moe_align, quantize_activations_fp8,
                     quantize_weights_fp8, relative_error)
from moe_lab.configs import GemmConfig, MoEConfig
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)
BLOCK = (128, 128)


def quantize_per_expert(w):
    """quantize_weights_fp8 one expert at a time: float32 temporaries of one expert, not of all."""
    parts = [quantize_weights_fp8(w[e:e + 1], BLOCK) for e in range(w.shape[0])]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def candidates(num_tokens, bf16: GemmConfig, fp8: GemmConfig):
    """fp8 configs to try for one GEMM: the heuristic's, bf16's with BLOCK_SIZE_K = 128, each with one more
    stage and persistent switched; at prefill also tiles that hold two float32 tiles (the sum and one K
    step's product) in registers without spilling."""
    base = [fp8, replace(bf16, BLOCK_SIZE_K=128)]
    if num_tokens >= 512:
        base += [GemmConfig(64, 128, 128, 8, 4, 3), GemmConfig(128, 128, 128, 8, 8, 3),
                 GemmConfig(64, 256, 128, 8, 8, 3)]
    seen, out = set(), []
    for c in base:
        for change in ({}, dict(num_stages=c.num_stages + 1), dict(persistent=not c.persistent)):
            v = replace(c, **change)
            if v not in seen:
                seen.add(v)
                out.append(v)
    return out


def timed(fn):
    """graph_ms of fn, or None where the config does not run."""
    try:
        return graph_ms(fn)
    except (ValueError, RuntimeError, triton.runtime.errors.OutOfResources):
        torch.cuda.synchronize()
        return None


def point(model, num_tokens, weights):
    p = get_preset(model)
    if weights.get("model") != model:  # one set of weights per model, quantized once
        weights.clear()
        _, w1, w2, _ = p.build(1, device="cuda")
        weights.update(model=model, bf16=(w1, w2), w1=quantize_per_expert(w1), w2=quantize_per_expert(w2))
    w1, w2 = weights["bf16"]
    (w1_q, w1_s), (w2_q, w2_s) = weights["w1"], weights["w2"]
    hs = torch.randn(num_tokens, p.hidden_size, device="cuda").bfloat16()
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    shape = (num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
    cfg = default_config(*shape, torch.bfloat16)
    cfg8 = default_config(*shape, torch.float8_e4m3fn)
    r = dict(model=model, T=num_tokens)

    routing = moe_align(ti, p.num_experts, cfg.block_size_m)
    act = grouped_matmul(hs, w1, routing, cfg.up, gather_a=True, swiglu=True, use_tma=cfg.up.tma)
    out_k = torch.empty(num_tokens * p.top_k, p.hidden_size, dtype=hs.dtype, device="cuda")
    r["bf16_up_ms"] = graph_ms(lambda: grouped_matmul(hs, w1, routing, cfg.up, gather_a=True, swiglu=True, out=act,
                                                      use_tma=cfg.up.tma))
    r["bf16_down_ms"] = graph_ms(lambda: grouped_matmul(act, w2, routing, cfg.down, gather_a=False, scatter=True,
                                                        topk_weights=tw, out=out_k, use_tma=cfg.down.tma))

    x_q, x_s = quantize_activations_fp8(hs, group_size=BLOCK[1])
    r["quant_in_ms"] = graph_ms(lambda: quantize_activations_fp8(hs, group_size=BLOCK[1]))
    tried = {}  # BLOCK_SIZE_M -> (up ms, up config, down ms, down config)
    ups, downs = candidates(num_tokens, cfg.up, cfg8.up), candidates(num_tokens, cfg.down, cfg8.down)
    for bm in sorted({c.BLOCK_SIZE_M for c in ups + downs}):
        routing8 = moe_align(ti, p.num_experts, bm)
        up_times = []
        for c in (c for c in ups if c.BLOCK_SIZE_M == bm):
            act8 = torch.empty(routing8.max_num_tokens_padded, p.intermediate_size, device="cuda")
            up_times.append((timed(lambda: grouped_matmul(
                x_q, w1_q, routing8, c, gather_a=True, swiglu=True, a_scale=x_s, w_scale=w1_s, block_shape=BLOCK,
                out=act8, use_tma=c.tma)), c))
        act8 = torch.randn(routing8.max_num_tokens_padded, p.intermediate_size, device="cuda")
        a_q, a_s = quantize_activations_fp8(act8, group_size=BLOCK[1], num_rows=routing8.num_tokens_post_padded)
        down_times = [(timed(lambda: grouped_matmul(
            a_q, w2_q, routing8, c, gather_a=False, scatter=True, topk_weights=tw, out=out_k, a_scale=a_s,
            w_scale=w2_s, block_shape=BLOCK, use_tma=c.tma)), c) for c in downs if c.BLOCK_SIZE_M == bm]
        up_times = [t for t in up_times if t[0] is not None]
        down_times = [t for t in down_times if t[0] is not None]
        if up_times and down_times:
            tried[bm] = min(up_times, key=lambda t: t[0]) + min(down_times, key=lambda t: t[0])
        if bm == cfg8.block_size_m:
            r["quant_act_ms"] = graph_ms(lambda: quantize_activations_fp8(
                act8, group_size=BLOCK[1], num_rows=routing8.num_tokens_post_padded))
    bm = min(tried, key=lambda b: tried[b][0] + tried[b][2])
    r["fp8_up_ms"], up_best, r["fp8_down_ms"], down_best = tried[bm]
    r["fp8_up_config"], r["fp8_down_config"] = up_best.to_dict(), down_best.to_dict()
    r["fp8_by_block_size_m"] = {b: (t[0], t[2]) for b, t in tried.items()}
    r["bf16_pair_ms"] = r["bf16_up_ms"] + r["bf16_down_ms"]
    r["fp8_pair_ms"] = r["fp8_up_ms"] + r["fp8_down_ms"]
    r["speedup"] = r["bf16_pair_ms"] / r["fp8_pair_ms"]

    best8 = MoEConfig(up_best, down_best)
    scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=BLOCK)
    r["bf16_layer_ms"] = graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg), rounds=3)
    r["fp8_layer_ms"] = graph_ms(lambda: fused_moe(hs, w1_q, w2_q, tw, ti, config=best8, **scales), rounds=3)
    if num_tokens <= 512:  # the float32 references dequantize every expert: kept to the smaller points
        out8 = fused_moe(hs, w1_q, w2_q, tw, ti, config=best8, **scales)
        r["fp8_kernel_err"] = relative_error(out8, fused_moe_reference(hs, w1_q, w2_q, tw, ti, **scales))
        ref = fused_moe_reference(hs, w1, w2, tw, ti)
        r["fp8_vs_bf16_ref_err"] = relative_error(out8, ref)
        r["bf16_err"] = relative_error(fused_moe(hs, w1, w2, tw, ti, config=cfg), ref)
    del hs
    torch.cuda.empty_cache()
    return r


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    models = [a for a in sys.argv[1:] if not a.endswith(".json")] or MODELS
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    print(f"{'model':<15} {'T':>6} {'bf16 pair':>9} {'fp8 pair':>9} {'speedup':>7} {'q in':>7} {'q act':>7} "
          f"{'bf16 lay':>9} {'fp8 lay':>9} {'err k':>8} {'err q':>8} {'err bf16':>8}")
    rows, weights = [], {}
    for model in models:
        for t in TOKENS:
            r = point(model, t, weights)
            rows.append(r)
            errs = " ".join(f"{r[k]:8.1e}" if k in r else "       -" for k in
                            ("fp8_kernel_err", "fp8_vs_bf16_ref_err", "bf16_err"))
            print(f"{model:<15} {t:>6} {r['bf16_pair_ms']:9.3f} {r['fp8_pair_ms']:9.3f} {r['speedup']:7.2f} "
                  f"{r['quant_in_ms']:7.4f} {r['quant_act_ms']:7.4f} {r['bf16_layer_ms']:9.3f} "
                  f"{r['fp8_layer_ms']:9.3f} {errs}", flush=True)
            if out:
                with open(out, "w") as f:
                    json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
