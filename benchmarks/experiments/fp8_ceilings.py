"""Experiment: how far FP8 can go at all on these shapes, to tell #15's open targets from what the H200 and
its libraries allow.

Decode (T <= 64): `fp8_decode_anatomy.py` found that a pair of plain reads of the FP8 weights is only 1.58
to 1.82x faster than of the bf16 ones at the four misses, because each launch has a fixed cost. Here the
same reads of both GEMMs' weights run as one launch ("read1"): the bound for a layer whose two GEMMs ran
as one kernel. If even that stays under 1.8x, no launch structure reaches the target there.

Prefill (T >= 4096): per-expert GEMMs of exactly T*k/E rows (no padding), the shapes of the layer's two
GEMMs, in one CUDA graph over all experts, through cuBLAS: bf16 `torch.mm`, and FP8 `F.scaled_mm` with
per-tensor, row-wise and DeepSeek-V3's block scales (1 x 128 activations, 128 x 128 weights); and in one
launch each, `torch._grouped_mm` (bf16) and `torch._scaled_grouped_mm` (FP8, row-wise). The FP8 / bf16
time ratio of each is what that library gets from FP8 on these shapes. Next to them moe-lab's own pairs
(shipped configs, the benchmark's routing): bf16, FP8 block-scaled, and FP8 with per-tensor scales (no
scaling in the K loop). Each cuBLAS FP8 result is checked against the dequantized product (error printed).
Usage: python benchmarks/experiments/fp8_ceilings.py OUT.json [decode|prefill]
"""
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_decode_anatomy import READ_VARIANTS, _outer_gemms, point_inputs, reader, write_results  # noqa: E402

from moe_lab import moe_align  # noqa: E402
from moe_lab.tools.bench import _both, _layer_gemms  # noqa: E402
from moe_lab.presets import get_preset  # noqa: E402
from moe_lab.quantize import FP8_DTYPE, dequantize_fp8, quantize_activations_fp8, quantize_weights_fp8  # noqa: E402
from moe_lab.tools.timing import graph_ms  # noqa: E402
from moe_lab.tuned import choose_config  # noqa: E402

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")


# --- decode: both GEMMs' weight reads in one launch ------------------------------------------------------

@triton.jit
def _read_two_kernel(w1_ptr, w2_ptr, experts_ptr, out_ptr, words1, words2, chunks1,
                     WORDS: tl.constexpr, STEPS: tl.constexpr):
    """Programs [0, chunks1) read a chunk of the expert's w1 slab, the rest a chunk of its w2 slab."""
    expert = tl.load(experts_ptr + tl.program_id(1)).to(tl.int64)
    chunk = tl.program_id(0)
    if chunk < chunks1:
        base = w1_ptr + expert * words1 + chunk.to(tl.int64) * (WORDS * STEPS)
    else:
        base = w2_ptr + expert * words2 + (chunk - chunks1).to(tl.int64) * (WORDS * STEPS)
    acc = tl.zeros([WORDS], dtype=tl.int32)
    for s in range(STEPS):
        acc ^= tl.load(base + s * WORDS + tl.arange(0, WORDS))
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + chunk, tl.max(acc, 0))


def one_launch_reader(w1, w2, experts):
    """The fastest time (ms) of one launch reading each used expert's w1 and w2 slabs once."""
    words1, words2 = (w.view(torch.int32).reshape(w.shape[0], -1) for w in (w1, w2))
    best = None
    for words_per_load, steps, warps in READ_VARIANTS:
        chunk = words_per_load * steps
        if words1.shape[1] % chunk or words2.shape[1] % chunk:
            continue
        chunks1 = words1.shape[1] // chunk
        grid = (chunks1 + words2.shape[1] // chunk, experts.numel())
        out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=w1.device)

        def fn(grid=grid, out=out, words_per_load=words_per_load, steps=steps, warps=warps, chunks1=chunks1):
            _read_two_kernel[grid](words1, words2, experts, out, words1.shape[1], words2.shape[1], chunks1,
                                   WORDS=words_per_load, STEPS=steps, num_warps=warps)
        t = graph_ms(fn, rounds=3)
        best = t if best is None else min(best, t)
    return best


def decode_point(model, num_tokens):
    p, hs, w1, w2, tw, ti, w1_q, w2_q, scales = point_inputs(model, num_tokens)
    experts = torch.unique(ti).to(torch.int32)
    row = dict(model=model, T=num_tokens, experts_used=int(experts.numel()))
    for name, (a, b) in (("bf16", (w1, w2)), ("fp8", (w1_q, w2_q))):
        (up, _), (down, _) = reader(a, experts), reader(b, experts)
        row[f"read2 {name}"] = min(graph_ms(_both(up, down), rounds=3) for _ in range(2))
        row[f"read1 {name}"] = one_launch_reader(a, b, experts)
    for name, dtype, (a, b), kw in (("bf16", torch.bfloat16, (w1, w2), None),
                                    ("fp8", FP8_DTYPE, (w1_q, w2_q), scales)):
        cfg = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, dtype).config
        up, down = _layer_gemms(hs, a, b, tw, moe_align(ti, p.num_experts, cfg.block_size_m), cfg, scales=kw)
        row[f"gemm pair {name}"] = min(graph_ms(_both(up, down), rounds=3) for _ in range(2))
    for kind in ("read2", "read1", "gemm pair"):
        row[f"{kind} speedup"] = row[f"{kind} bf16"] / row[f"{kind} fp8"]
    return row


# --- prefill: what cuBLAS gets from FP8 on the same per-expert shapes ----------------------------------------

def _block_scaled_mm(a_q, a_scale, w_q, w_scale):
    """cuBLAS's block-scaled FP8 GEMM, a [m, K] (1 x 128 scales [m, K/128]) @ w[N, K].T (128 x 128 scales
    [N/128, K/128]): the activation scales column-major, the weight's as [K/128, N/128]."""
    return F.scaled_mm(a_q, w_q.t(), a_scale.t().contiguous().t(), F.ScalingType.BlockWise1x128,
                       w_scale.t(), F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


def _rowwise_mm(a_q, a_scale, w_q, w_scale):
    return torch._scaled_mm(a_q, w_q.t(), scale_a=a_scale, scale_b=w_scale[None, :], out_dtype=torch.bfloat16)


def _tensorwise_mm(a_q, a_scale, w_q, w_scale):
    return torch._scaled_mm(a_q, w_q.t(), scale_a=a_scale, scale_b=w_scale, out_dtype=torch.bfloat16)


def _quantized_operands(a, w, recipe):
    """Per-expert lists (a_q, a_scale, w_q, w_scale) for one recipe; a [E, m, K], w [E, N, K] bf16. One
    expert at a time: a float32 copy of all of DeepSeek-V3's w1 would take 30 GB."""
    if recipe == "block":
        a_parts = [quantize_activations_fp8(a[e], group_size=128) for e in range(a.shape[0])]
        w_parts = [quantize_weights_fp8(w[e:e + 1], (128, 128)) for e in range(a.shape[0])]
        return ([q for q, _ in a_parts], [s for _, s in a_parts], [q[0] for q, _ in w_parts],
                [s[0] for _, s in w_parts])
    out = ([], [], [], [])
    for e in range(a.shape[0]):
        ae, we = a[e].float(), w[e].float()
        if recipe == "row":
            a_s = ae.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448  # [m, 1]
            w_s = we.abs().amax(dim=1).clamp(min=1e-10) / 448  # [N]
            w_q = (we / w_s[:, None]).clamp(-448, 448).to(FP8_DTYPE)
        else:
            a_s = ae.abs().amax().clamp(min=1e-10) / 448
            w_s = we.abs().amax().clamp(min=1e-10) / 448
            w_q = (we / w_s).clamp(-448, 448).to(FP8_DTYPE)
        for part, value in zip(out, ((ae / a_s).clamp(-448, 448).to(FP8_DTYPE), a_s, w_q, w_s)):
            part.append(value)
    return out


def cublas_gemm(a, w):
    """{recipe: (ms, error of expert 0 against its dequantized product)} for a [E, m, K] @ w[E, N, K].T,
    one cuBLAS call per expert in one graph (bf16 and the FP8 recipes), and the one-launch grouped ones."""
    out = {}
    num_experts = a.shape[0]
    outs = torch.empty(num_experts, a.shape[1], w.shape[1], dtype=torch.bfloat16, device=a.device)

    def bf16():
        for e in range(num_experts):
            torch.mm(a[e], w[e].t(), out=outs[e])
    out["bf16"] = (graph_ms(bf16, rounds=3), 0.0)
    for recipe, mm in (("tensor", _tensorwise_mm), ("row", _rowwise_mm), ("block", _block_scaled_mm)):
        try:
            a_q, a_s, w_q, w_s = _quantized_operands(a, w, recipe)
            got = mm(a_q[0], a_s[0], w_q[0], w_s[0]).float()
            if recipe == "block":
                ref = (dequantize_fp8(a_q[0], a_s[0], (1, 128)) @ dequantize_fp8(w_q[0][None], w_s[0][None], (128, 128))[0].t())
            else:
                ref = (a_q[0].float() @ w_q[0].float().t()) * (a_s[0] * w_s[0])
            err = float((got - ref).norm() / ref.norm())

            def fp8(mm=mm, a_q=a_q, a_s=a_s, w_q=w_q, w_s=w_s):
                for e in range(num_experts):
                    mm(a_q[e], a_s[e], w_q[e], w_s[e])
            out[f"fp8 {recipe}"] = (graph_ms(fp8, rounds=3), err)
        except Exception as exc:  # a recipe this torch or GPU does not take: say so, go on
            print(f"    fp8 {recipe}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    m = a.shape[1]
    offs = torch.arange(1, num_experts + 1, device=a.device, dtype=torch.int32) * m
    flat = a.reshape(-1, a.shape[2])
    try:
        out["grouped bf16"] = (graph_ms(lambda: torch._grouped_mm(flat, w.transpose(1, 2), offs=offs), rounds=3), 0.0)
        a_q, a_s, w_q, w_s = _quantized_operands(a, w, "row")
        a_q, a_s, w_q, w_s = torch.cat(a_q), torch.cat(a_s).view(-1), torch.stack(w_q), torch.stack(w_s)
        got = torch._scaled_grouped_mm(a_q, w_q.transpose(1, 2), a_s, w_s, offs=offs, out_dtype=torch.bfloat16)
        ref = (a_q[:m].float() @ w_q[0].float().t()) * a_s[:m, None] * w_s[0][None, :]
        err = float((got[:m].float() - ref).norm() / ref.norm())
        out["grouped fp8 row"] = (graph_ms(lambda: torch._scaled_grouped_mm(
            a_q, w_q.transpose(1, 2), a_s, w_s, offs=offs, out_dtype=torch.bfloat16), rounds=3), err)
    except Exception as exc:
        print(f"    grouped: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    return out


def prefill_point(model, num_tokens):
    p = get_preset(model)
    row = dict(model=model, T=num_tokens)
    m = num_tokens * p.top_k // p.num_experts
    gen = torch.Generator(device="cuda").manual_seed(0)
    for gemm, (n, k) in (("up", (2 * p.intermediate_size, p.hidden_size)), ("down", (p.hidden_size, p.intermediate_size))):
        a = torch.randn(p.num_experts, m, k, device="cuda", generator=gen).bfloat16()
        w = (torch.randn(p.num_experts, n, k, device="cuda", generator=gen) * k ** -0.5).bfloat16()
        for name, (ms, err) in cublas_gemm(a, w).items():
            row[f"cublas {name} {gemm}"] = ms
            row[f"cublas {name} {gemm} err"] = err
        del a, w
        torch.cuda.empty_cache()
    for name in [k[len("cublas "):-len(" up")] for k in row if k.startswith("cublas ") and k.endswith(" up")]:
        if f"cublas {name} down" in row:
            row[f"cublas {name} pair"] = row[f"cublas {name} up"] + row[f"cublas {name} down"]
    _, hs, w1, w2, tw, ti, w1_q, w2_q, scales = point_inputs(model, num_tokens)
    cfg16 = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size).config
    cfg8 = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, FP8_DTYPE).config
    routing8 = moe_align(ti, p.num_experts, cfg8.block_size_m)
    pairs = {"bf16": _layer_gemms(hs, w1, w2, tw, moe_align(ti, p.num_experts, cfg16.block_size_m), cfg16),
             "fp8 block": _layer_gemms(hs, w1_q, w2_q, tw, routing8, cfg8, scales=scales),
             "fp8 tensor": _outer_gemms(hs, w1_q, w2_q, tw, routing8, cfg8)}
    for name, (up, down) in pairs.items():
        row[f"moe-lab {name} pair"] = min(graph_ms(_both(up, down), rounds=3) for _ in range(2))
    flops = 2 * num_tokens * p.top_k * 3 * p.hidden_size * p.intermediate_size
    for key in [k for k in row if k.endswith(" pair")]:
        row[key.replace(" pair", " pair TFLOP/s")] = flops / row[key] / 1e9
    return row


def main():
    out_path = sys.argv[1]
    parts = sys.argv[2:] or ["decode", "prefill"]
    rows = []
    if "decode" in parts:
        for model in MODELS:
            for t in (1, 8, 64):
                r = decode_point(model, t)
                rows.append(r)
                print(f"{model:<15} T={t:<3} us: " + "  ".join(
                    f"{kind} {r[f'{kind} bf16'] * 1e3:.1f}/{r[f'{kind} fp8'] * 1e3:.1f} ({r[f'{kind} speedup']:.2f}x)"
                    for kind in ("read2", "read1", "gemm pair")), flush=True)
    if "prefill" in parts:
        for model in MODELS:
            for t in (4096, 16384):
                r = prefill_point(model, t)
                rows.append(r)
                base = r.get("cublas bf16 pair")
                print(f"{model:<15} T={t:<5} ms (TFLOP/s, over bf16 of the same library):", flush=True)
                for key in [k for k in r if k.endswith(" pair")]:
                    ref = r["moe-lab bf16 pair"] if key.startswith("moe-lab") else (
                        r["cublas grouped bf16 pair"] if "grouped" in key else base)
                    errs = "  err " + "/".join(f"{r[key.replace(' pair', g)]:.1e}" for g in (" up err", " down err")) \
                        if key.replace(" pair", " up err") in r else ""
                    print(f"    {key:<28} {r[key]:8.3f} ({r[key.replace(' pair', ' pair TFLOP/s')]:5.0f}, "
                          f"{ref / r[key]:.2f}x){errs}", flush=True)
    write_results(out_path, rows)


if __name__ == "__main__":
    main()
