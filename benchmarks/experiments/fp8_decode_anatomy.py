"""Experiment: where an FP8 decode GEMM's time goes, next to the time its weight bytes take to read.

At T <= 64 each GEMM reads the used experts' weights once, so the issue's bound is 2x over bf16; the FP8
pair took 0.51 to 0.71 of the bf16 pair's time (2026-12-02). For each model and T, CUDA-graph medians
(L2 flushed, least of 3 rounds) of each GEMM (up with its SwiGLU epilogue, down) and of the pair (one graph
of both; the pairs timed alternately, the least of two):
  - bf16 / fp8: the package table's configs (fp8 with [128, 128] block scales, up with float32 output, as
    `moe-lab bench` times them);
  - fp8 outer: the fp8 config with one scale per tensor and per expert (the K loop's scale loads and
    multiplies gone; the same bytes);
  - read bf16 / read fp8: a plain read of the same weight bytes (the used experts' [N, K] slabs, as int32
    words, the fastest of READ_VARIANTS' chunkings): what reading those bytes costs, launch included, and
    so what speedup a GEMM pair that runs at a plain read's speed would get ("read speedup");
  - empty: a graph of one empty kernel (the measurement's floor).
With argv[1] = "ncu" it instead runs each of DeepSeek-V3 T = 1's GEMMs once (for ncu's kernel durations).
Usage: python benchmarks/experiments/fp8_decode_anatomy.py [OUT.json | ncu]
"""
import json
import sys

import torch
import triton
import triton.language as tl

from moe_lab import grouped_matmul, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.presets import get_preset
from moe_lab.quantize import quantize_activations_fp8
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
TOKENS = (1, 8, 64)


@triton.jit
def _read_kernel(w_ptr, experts_ptr, out_ptr, words_per_expert, WORDS: tl.constexpr, STEPS: tl.constexpr):
    expert = tl.load(experts_ptr + tl.program_id(1)).to(tl.int64)
    base = w_ptr + expert * words_per_expert + tl.program_id(0).to(tl.int64) * (WORDS * STEPS)
    acc = tl.zeros([WORDS], dtype=tl.int32)
    for s in range(STEPS):
        acc ^= tl.load(base + s * WORDS + tl.arange(0, WORDS))
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), tl.max(acc, 0))


@triton.jit
def _empty_kernel(out_ptr):
    pass


READ_VARIANTS = ((2048, 8, 4), (2048, 2, 4), (1024, 4, 4), (4096, 4, 8), (2048, 16, 8))  # words/load, loads, warps


def reader(w, experts):
    """(fastest reader of w[experts], its time in ms): a callable reading each used expert's [N, K] slab
    once, as int32 words, over READ_VARIANTS' chunkings."""
    words = w.view(torch.int32).reshape(w.shape[0], -1)
    per_expert = words.shape[1]
    best = None
    for words_per_load, steps, warps in READ_VARIANTS:
        chunk = words_per_load * steps
        if per_expert % chunk:
            continue
        grid = (per_expert // chunk, experts.numel())
        out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=w.device)

        def fn(grid=grid, out=out, words_per_load=words_per_load, steps=steps, warps=warps):
            _read_kernel[grid](words, experts, out, per_expert, WORDS=words_per_load, STEPS=steps, num_warps=warps)
        t = graph_ms(fn, rounds=3)
        if best is None or t < best[1]:
            best = (fn, t)
    return best


def write_results(path, rows, **extra):
    """The rows as JSON with the device and versions (the fp8_* experiments' output files)."""
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       **extra, rows=rows), f, indent=1)


def point_inputs(model, num_tokens):
    """(preset, hs, w1, w2, topk_weights, topk_ids, w1_q, w2_q, scales): a point's bf16 and FP8 inputs, with
    the routing of `moe-lab bench` (also used by the other fp8_* experiments)."""
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    return (p, hs, w1, w2, tw, ti, *p.quantize_fp8(w1, w2))


def point(model, num_tokens):
    p, hs, w1, w2, tw, ti, w1_q, w2_q, scales = point_inputs(model, num_tokens)
    experts = torch.unique(ti).to(torch.int32)
    cfg16 = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size).config
    cfg8 = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size,
                         torch.float8_e4m3fn).config
    routing8 = moe_align(ti, p.num_experts, cfg8.block_size_m)
    gemms = {"bf16": _layer_gemms(hs, w1, w2, tw, moe_align(ti, p.num_experts, cfg16.block_size_m), cfg16),
             "fp8": _layer_gemms(hs, w1_q, w2_q, tw, routing8, cfg8, scales=scales),
             "fp8 outer": _outer_gemms(hs, w1_q, w2_q, tw, routing8, cfg8)}
    row = dict(model=model, T=num_tokens, experts_used=int(experts.numel()))
    readers = {}
    for name, (a, b) in (("read bf16", (w1, w2)), ("read fp8", (w1_q, w2_q))):
        (up, row[f"{name} up"]), (down, row[f"{name} down"]) = reader(a, experts), reader(b, experts)
        readers[name] = (up, down)
    for name, (up, down) in gemms.items():
        row[f"{name} up"] = graph_ms(up, rounds=3)
        row[f"{name} down"] = graph_ms(down, rounds=3)
    pairs = {name: _both(up, down) for name, (up, down) in {**gemms, **readers}.items()}
    times = {name: [] for name in pairs}
    for _ in range(2):  # alternating, the least of two
        for name, fn in pairs.items():
            times[name].append(graph_ms(fn, rounds=3))
    for name, t in times.items():
        row[f"{name} pair"] = min(t)
    row["speedup"] = row["bf16 pair"] / row["fp8 pair"]
    row["read speedup"] = row["read bf16 pair"] / row["read fp8 pair"]
    mb_up, mb_down = (experts.numel() * w[0].numel() / 1e6 for w in (w1, w2))  # fp8 MB
    for name, bytes_per in (("bf16", 2), ("fp8", 1), ("read bf16", 2), ("read fp8", 1)):
        row[f"{name} pair TB/s"] = bytes_per * (mb_up + mb_down) / row[f"{name} pair"] / 1e3  # MB/ms = GB/s
    row["config fp8"] = dict(up=cfg8.up.to_dict(), down=cfg8.down.to_dict())
    return row


def _outer_gemms(hs, w1, w2, tw, routing, cfg):
    """The fp8 GEMMs as `_layer_gemms` builds them, but with one activation scale per tensor and one weight
    scale per expert (all ones): no scale loads or multiplies in the K loop."""
    one, per_expert = torch.ones(1, device=hs.device), torch.ones(w1.shape[0], device=hs.device)
    x, a1 = quantize_activations_fp8(hs, scale=one)
    fused = cfg.up.swiglu_epilogue
    act = grouped_matmul(x, w1, routing, cfg.up, gather_a=True, swiglu=fused, a_scale=a1, w_scale=per_expert,
                         out_dtype=torch.float32)
    act_q, a2 = quantize_activations_fp8(act, scale=one)
    out_k = torch.empty(routing.num_slots, w2.shape[1], dtype=hs.dtype, device=hs.device)

    def up():
        grouped_matmul(x, w1, routing, cfg.up, gather_a=True, swiglu=fused, a_scale=a1, w_scale=per_expert, out=act)

    def down():
        grouped_matmul(act_q, w2, routing, cfg.down, gather_a=False, scatter=True, topk_weights=tw, out=out_k,
                       a_scale=a2, w_scale=per_expert)
    return up, down


def run_for_ncu():
    p = get_preset("deepseek-v3")
    hs, w1, w2, _ = p.build(1, device="cuda")
    tw, ti = uniform_routing(1, p.num_experts, p.top_k, seed=1)
    w1_q, w2_q, scales = p.quantize_fp8(w1, w2)
    for w_a, w_b, kw, dtype in ((w1, w2, None, torch.bfloat16), (w1_q, w2_q, scales, torch.float8_e4m3fn)):
        cfg = choose_config(1, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, dtype).config
        up, down = _layer_gemms(hs, w_a, w_b, tw, moe_align(ti, p.num_experts, cfg.block_size_m), cfg, scales=kw)
        torch.cuda.synchronize()
        up()
        down()
        torch.cuda.synchronize()


def main():
    if sys.argv[1:] == ["ncu"]:
        return run_for_ncu()
    empty = graph_ms(lambda: _empty_kernel[(1,)](None), rounds=3)
    print(f"empty kernel graph: {empty * 1e3:.1f} us", flush=True)
    print("times in us; pair = one graph of up then down; read = a plain read of the GEMM's weight bytes", flush=True)
    rows = []
    for model in MODELS:
        for t in TOKENS:
            r = point(model, t)
            rows.append(r)
            for g in ("up", "down", "pair"):
                print(f"{model:<15} T={t:<3} {g:<4} bf16 {r[f'bf16 {g}'] * 1e3:7.1f}  fp8 {r[f'fp8 {g}'] * 1e3:7.1f}  "
                      f"fp8-outer {r[f'fp8 outer {g}'] * 1e3:7.1f}  read-bf16 {r[f'read bf16 {g}'] * 1e3:7.1f}  "
                      f"read-fp8 {r[f'read fp8 {g}'] * 1e3:7.1f}", flush=True)
            print(f"{model:<15} T={t:<3} speedup {r['speedup']:.2f}  read speedup {r['read speedup']:.2f}  pair TB/s: "
                  f"bf16 {r['bf16 pair TB/s']:.2f} fp8 {r['fp8 pair TB/s']:.2f} read {r['read bf16 pair TB/s']:.2f}"
                  f"/{r['read fp8 pair TB/s']:.2f}", flush=True)
    if len(sys.argv) > 1:
        write_results(sys.argv[1], rows, empty_graph_ms=empty)


if __name__ == "__main__":
    main()
