"""The warp-specialized Gluon FP8 grouped GEMM pair against the Triton FP8 pair and the bf16 pair, on Hopper.

    python benchmarks/gluon_fp8.py --out DIR [--quick] [--models ...] [--tokens ...]

1. Correctness (small and ragged shapes, then the first timed shape of each model): each Gluon GEMM (up:
   token rows permuted then TMA, sorted output; down: routed weights, scattered to (token, k) slots) against
   the float32 product of the dequantized operands (relative Frobenius error < 1e-2, outputs poisoned with
   NaN first), BLOCK_SIZE_M 64 and 128; empty experts, T = 1, K = 208 (not a multiple of 128) and K = 200
   (not a multiple of 16: a ValueError expected); batch invariance: a token's output bitwise the same in a
   batch of 5 and of 300 tokens.
2. Timing, DeepSeek-V3's recipe (float8 e4m3 weights with [128, 128] block scales, activations with 1x128
   scales): per model preset (full size) and T, the GEMM pair (up [rows, 2I] plain, down scattered with
   routed weights; no activation between) as moe-lab's Triton FP8 kernels (tuned FP8 config), as the Gluon
   kernel (each variant; the up GEMM's time includes permuting its rows and scales), and as the bf16 Triton
   pair (tuned bf16 config); ceilings at the same FLOPs (2 * T * k * 3 * H * I): dense bf16 torch.matmul and
   dense FP8 torch._scaled_mm with per-tensor scales and with the same block scales (cuBLAS's block-scaled
   FP8 GEMM, CUDA >= 12.9), each [T*k, H] x [H, 2I] then [T*k, I] x [I, H]; and grouped ceilings with the
   routing's own rows per expert (packed, no padding, no permute or scatter): bf16 torch._grouped_mm and FP8
   torch._scaled_grouped_mm (CUTLASS, one scale per row of A and per column of W: cheaper than block scales).
   CUDA-graph medians with L2 flushed (`moe_lab.tools.timing.graph_ms`), the variants in a rotating order over
   two rounds, the least median kept. Each Gluon variant's output is also compared with the Triton FP8 pair's.
Prints a markdown table (ms, TFLOP/s, ratios) and writes DIR/gluon_fp8.json and DIR/gluon_fp8.md. Every
failure prints a FAIL line and the run goes on. --quick: correctness, then DeepSeek-V3 at T = 4096 only.
Needs an sm_90 GPU and a Triton with Gluon's warp_specialize (Triton 3.6.0 with torch 2.11).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import replace

import torch

from moe_lab import get_preset, grouped_matmul, moe_align, quantize_activations_fp8, quantize_weights_fp8
from moe_lab.capability import gluon_fp8_support
from moe_lab.configs import GemmConfig
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
from moe_lab.quantize import dequantize_fp8
from moe_lab.reference import relative_error
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

BLOCK = (128, 128)
FP8 = torch.float8_e4m3fn
# The Gluon variants timed: (BLOCK_SIZE_M, BLOCK_SIZE_N, stages).
VARIANTS = ((64, 128, 4), (128, 128, 4))
FAILURES: list = []


def fail(what: str, exc: BaseException) -> None:
    line = f"FAIL {what}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc) else ''}"
    print(line, flush=True)
    FAILURES.append(line)
    if os.environ.get("GLUON_BENCH_TRACE"):
        traceback.print_exc()


def gluon_config(block_m: int, block_n: int = 128, stages: int = 4) -> GemmConfig:
    return GemmConfig(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=128, num_stages=stages)


# --- operands and the float32 reference ------------------------------------------------------------------


def weights(e: int, n: int, k: int, seed: int):
    """bf16 [E, n, k] weights ~ U(-0.5, 0.5) / sqrt(k), and their float8 form with [128, 128] block scales."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = ((torch.rand(e, n, k, device="cuda", generator=gen) - 0.5) * k**-0.5).to(torch.bfloat16)
    w_q, w_s = quantize_weights_fp8(w, BLOCK)
    return w, w_q, w_s


def sorted_rows(slot_rows: torch.Tensor, routing) -> torch.Tensor:
    """[T*k, C] rows per slot -> [max_num_tokens_padded, C] in the routing's sorted order, padding rows zero."""
    ids = routing.sorted_token_ids.long()
    valid = ids < routing.num_slots
    out = slot_rows[ids.clamp(max=max(routing.num_slots - 1, 0))]
    return out * valid[:, None].to(out.dtype)


def reference(a32: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor, routing, *, gather_a: bool, scatter: bool,
              topk_weights=None):  # fmt: skip
    """float32 out of one GEMM: rows of each used M-block times its expert's dequantized weights (sorted rows, or
    scattered to slots with the routed weight). Rows of padding are NaN in the sorted layout (not compared). One
    expert's weights are dequantized at a time: all of DeepSeek-V3's w2 in float32 is 14 GiB."""
    ids = routing.sorted_token_ids.long()
    used = int(routing.num_tokens_post_padded.item())
    experts = routing.expert_ids.long().repeat_interleave(routing.block_size_m)[:used]
    rows = torch.arange(used, device=ids.device)
    valid = ids[:used] < routing.num_slots
    n = w_q.shape[1]
    out = torch.full((routing.num_slots if scatter else routing.max_num_tokens_padded, n), float("nan"), device="cuda")
    for e in experts[valid].unique().tolist():
        sel = rows[valid & (experts == e)]
        src = ids[sel] // routing.top_k if gather_a else sel
        prod = a32[src] @ dequantize_fp8(w_q[e : e + 1], w_s[e : e + 1], BLOCK)[0].T
        if scatter:
            if topk_weights is not None:
                prod = prod * topk_weights.reshape(-1)[ids[sel]][:, None]
            out[ids[sel]] = prod
        else:
            out[sel] = prod
    return out


def compare(got: torch.Tensor, want: torch.Tensor) -> float:
    keep = ~torch.isnan(want).any(1)
    if torch.isnan(got[keep]).any():
        return float("inf")  # a row the kernel should have written and did not
    return relative_error(got[keep].float(), want[keep])


def block_scaled_mm(a: torch.Tensor, w: torch.Tensor):
    """The dense ceiling with the GEMMs' own scaling (DeepSeek-V3's: 1x128 activation and [128, 128] weight
    scales), cuBLAS's block-scaled FP8 GEMM through torch._scaled_mm (CUDA >= 12.9, sm_90): a callable for
    a [M, K] @ w [N, K].T, or None (a line says why) where this torch takes none of the scale layouts that
    torch versions have asked for. The layout that runs is checked against the dequantized product."""
    a_q, a_s = quantize_activations_fp8(a, group_size=128)
    w_q, w_s = quantize_weights_fp8(w[None], BLOCK)
    w_q, w_s = w_q[0], w_s[0]  # [N, K], [N/128, K/128]
    want = dequantize_fp8(a_q, a_s, (1, 128)) @ dequantize_fp8(w_q[None], w_s[None], BLOCK)[0].T
    nb, kb = w_s.shape
    scale_a = a_s.t().contiguous().t()  # [M, K/128], M-major
    padded = torch.zeros(nb, -(-kb // 4) * 4, device=w_s.device)
    padded[:, :kb] = w_s
    wide = torch.zeros(kb, -(-nb // 4) * 4, device=w_s.device)
    wide[:, :nb] = w_s.t()
    # [K/128, N/128] row-major; the same with rows padded to a multiple of 4; [K/128 (padded to 4), N/128] N-major
    layouts = (w_s.t().contiguous(), wide[:, :nb], padded.t())
    errors = []
    for scale_b in layouts:

        def run(scale_b=scale_b):
            return torch._scaled_mm(a_q, w_q.T, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

        try:
            err = relative_error(run().float(), want)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            errors.append(f"{tuple(scale_b.shape)}/{scale_b.stride()}: {str(exc).strip().splitlines()[0][:160]}")
            continue
        if err < 1e-2:
            return run
        errors.append(f"{tuple(scale_b.shape)}/{scale_b.stride()}: error {err:.1e} against the dequantized product")
    print(f"note: no block-scaled _scaled_mm ceiling for {tuple(a.shape)} x {tuple(w.shape)}: {'; '.join(errors)}")
    return None


def grouped_ceilings(topk_ids: torch.Tensor, a_up: torch.Tensor, a_down: torch.Tensor, w1, w2) -> dict:
    """The grouped ceilings at the routing's own rows per expert: callables for the pair ([rows of expert e, H] x
    w1[e].T, then [rows, I] x w2[e].T, rows packed by expert) as bf16 torch._grouped_mm and as FP8
    torch._scaled_grouped_mm with rowwise scales (one float32 per row of A and per output column of W),
    accumulated with and without CUTLASS's fast accumulation. The FP8 result is checked against the float32
    product of its dequantized operands (relative Frobenius error < 1e-2) for the first used expert."""
    e = w1.shape[0]
    offs = torch.cumsum(torch.bincount(topk_ids.reshape(-1), minlength=e), 0).to(torch.int32)

    def rowwise(x: torch.Tensor):  # [..., rows, K] -> float8 rows and their float32 scales [..., rows]
        if x.dim() == 3:
            return quantize_weights_fp8(x, None, per_channel=True)
        q, scale = quantize_activations_fp8(x, group_size=x.shape[1])
        return q, scale.reshape(-1)

    fns = {"grouped bf16 _grouped_mm": lambda: (
        torch._grouped_mm(a_up, w1.transpose(1, 2), offs=offs, out_dtype=torch.bfloat16),
        torch._grouped_mm(a_down, w2.transpose(1, 2), offs=offs, out_dtype=torch.bfloat16),
    )}  # fmt: skip
    (qa, sa), (qb, sb), (qw1, sw1), (qw2, sw2) = (rowwise(v) for v in (a_up, a_down, w1, w2))
    first = int((offs > 0).nonzero()[0])
    lo = int(offs[first - 1]) if first else 0
    want = (qa[lo : offs[first]].float() * sa[lo : offs[first], None]) @ (qw1[first].float() * sw1[first][:, None]).T
    for fast in (False, True):

        def run(fast=fast):
            return (
                torch._scaled_grouped_mm(qa, qw1.transpose(1, 2), sa, sw1, offs=offs, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast),
                torch._scaled_grouped_mm(qb, qw2.transpose(1, 2), sb, sw2, offs=offs, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast),
            )  # fmt: skip

        err = relative_error(run()[0][lo : offs[first]].float(), want)
        if err >= 1e-2:
            raise RuntimeError(f"_scaled_grouped_mm (fast accumulation {fast}): {err:.1e} off the dequantized product")
        fns[f"grouped fp8 rowwise _scaled_grouped_mm{' fast accum' if fast else ''}"] = run
    return fns


# --- 1. correctness --------------------------------------------------------------------------------------


def check_gemms(label: str, t: int, e: int, k: int, h: int, i: int, block_m: int, experts_used=None, seed=0):
    """Both Gluon GEMMs of one shape against the float32 reference; prints a line, returns the errors."""
    torch.manual_seed(seed)
    _, w1_q, w1_s = weights(e, 2 * i, h, seed + 1)
    _, w2_q, w2_s = weights(e, h, i, seed + 2)
    tw, ti = uniform_routing(t, experts_used or e, k, seed=seed)
    routing = moe_align(ti, e, block_m)
    x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda", dtype=torch.bfloat16), group_size=128)
    cfg = gluon_config(block_m)
    up = torch.full((routing.max_num_tokens_padded, 2 * i), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s, out=up)
    want_up = reference(dequantize_fp8(x_q, x_s, (1, 128)), w1_q, w1_s, routing, gather_a=True, scatter=False)
    act = torch.randn(t * k, i, device="cuda", dtype=torch.bfloat16)
    a_q, a_s = quantize_activations_fp8(sorted_rows(act, routing), group_size=128)
    down = torch.full((t * k, h), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(
        a_q, w2_q, routing, cfg, gather_a=False, scatter=True, topk_weights=tw, a_scale=a_s, w_scale=w2_s, out=down
    )
    want_down = reference(
        dequantize_fp8(a_q, a_s, (1, 128)),
        w2_q,
        w2_s,
        routing,
        gather_a=False,
        scatter=True,
        topk_weights=tw,
    )
    errs = compare(up, want_up), compare(down, want_down)
    ok = all(err < 1e-2 for err in errs)
    print(
        f"{'ok  ' if ok else 'FAIL'} correctness {label} BLOCK_SIZE_M={block_m}: up {errs[0]:.2e}, down {errs[1]:.2e}",
        flush=True,
    )
    if not ok:
        FAILURES.append(f"correctness {label} BLOCK_SIZE_M={block_m}: {errs}")
    return errs


def batch_invariance(block_m: int, e=8, k=2, h=256, i=256) -> bool:
    """The first 5 tokens' down-GEMM outputs (up GEMM, SiLU-and-mul, quantize, down GEMM) alone and in a batch
    of 300: bitwise equal."""
    from moe_lab import silu_and_mul

    _, w1_q, w1_s = weights(e, 2 * i, h, 11)
    _, w2_q, w2_s = weights(e, h, i, 12)
    x = torch.randn(300, h, device="cuda", dtype=torch.bfloat16)
    tw, ti = uniform_routing(300, e, k, seed=3)
    cfg = gluon_config(block_m)

    def pair(t):
        routing = moe_align(ti[:t], e, block_m)
        x_q, x_s = quantize_activations_fp8(x[:t], group_size=128)
        up = grouped_matmul_fp8_gluon(x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s)
        act = silu_and_mul(up, routing=routing)
        a_q, a_s = quantize_activations_fp8(act, group_size=128)
        return grouped_matmul_fp8_gluon(
            a_q, w2_q, routing, cfg, gather_a=False, scatter=True, topk_weights=tw[:t], a_scale=a_s, w_scale=w2_s
        )

    same = torch.equal(pair(5), pair(300)[: 5 * k])
    print(
        f"{'ok  ' if same else 'FAIL'} batch invariance BLOCK_SIZE_M={block_m}: 5 tokens alone and in 300", flush=True
    )
    if not same:
        FAILURES.append(f"batch invariance BLOCK_SIZE_M={block_m}")
    return same


def correctness() -> None:
    cases = [
        ("T=1 E=8 k=2 H=256 I=128", dict(t=1, e=8, k=2, h=256, i=128)),
        ("T=37 E=16 k=4 H=384 I=256, experts 8..15 empty", dict(t=37, e=16, k=4, h=384, i=256, experts_used=8)),
        ("T=300 E=8 k=2 H=1024 I=512", dict(t=300, e=8, k=2, h=1024, i=512)),
        ("T=50 E=6 k=2 H=208 I=192 (K not a multiple of 128, N not of 128)", dict(t=50, e=6, k=2, h=208, i=192)),
    ]
    for block_m in (64, 128):
        for label, shape in cases:
            try:
                check_gemms(label, block_m=block_m, **shape)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                fail(f"correctness {label} BLOCK_SIZE_M={block_m}", exc)
        try:
            batch_invariance(block_m)
        except Exception as exc:  # noqa: BLE001
            fail(f"batch invariance BLOCK_SIZE_M={block_m}", exc)
    try:
        check_gemms("K=200", t=8, e=4, k=2, h=200, i=128, block_m=64)
        FAILURES.append("K=200 (not a multiple of 16) ran; a ValueError was expected")
        print("FAIL K=200: no ValueError", flush=True)
    except ValueError as exc:
        print(f"ok   K=200 refused: {exc}", flush=True)
    except Exception as exc:  # noqa: BLE001
        fail("K=200", exc)


# --- 2. timing -------------------------------------------------------------------------------------------


def timed(fns: dict, rounds: int = 2) -> dict:
    """Least CUDA-graph median (ms) of each callable over `rounds`, the order rotated each round."""
    best = {}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in best and best[name] is None:
                continue
            try:
                ms = graph_ms(fns[name], rep_ms=100)
                best[name] = min(ms, best.get(name) or float("inf"))
            except Exception as exc:  # noqa: BLE001
                fail(f"timing {name}", exc)
                best[name] = None
    return best


def measure(model: str, tokens, check_first: bool) -> list:
    p = get_preset(model)
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    print(f"\n{model}: E={e} k={k} H={h} I={i}; building weights", flush=True)
    w1, w1_q, w1_s = weights(e, 2 * i, h, 1)
    w2, w2_q, w2_s = weights(e, h, i, 2)
    rows_out = []
    for n_t, t in enumerate(tokens):
        tw, ti = uniform_routing(t, e, k, seed=1)
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        x_q, x_s = quantize_activations_fp8(x, group_size=128)
        act = torch.randn(t * k, i, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * t * k * 3 * h * i
        fns, outputs = {}, {}

        fp8_cfg = default_config(t, e, k, h, i, FP8)
        bf16_cfg = default_config(t, e, k, h, i, torch.bfloat16)

        def triton_pair(cfg, a, w_up, w_down, scales, dtype):
            up_cfg, down_cfg = (replace(c, tail_tiles=False) for c in (cfg.up, cfg.down))
            r = moe_align(ti, e, up_cfg.BLOCK_SIZE_M)
            r_down = r if down_cfg.BLOCK_SIZE_M == up_cfg.BLOCK_SIZE_M else moe_align(ti, e, down_cfg.BLOCK_SIZE_M)
            act_sorted = sorted_rows(act, r_down)
            if dtype == FP8:
                a_q, a_s = quantize_activations_fp8(act_sorted, group_size=128)
                up_kw = dict(a_scale=scales[0], w_scale=scales[1], block_shape=BLOCK)
                down_kw = dict(a_scale=a_s, w_scale=scales[2], block_shape=BLOCK)
                down_a = a_q
            else:
                up_kw, down_kw, down_a = {}, {}, act_sorted

            def run():
                grouped_matmul(a, w_up, r, up_cfg, gather_a=True, **up_kw)
                return grouped_matmul(
                    down_a, w_down, r_down, down_cfg, gather_a=False, scatter=True, topk_weights=tw, **down_kw
                )

            return run

        try:
            fns["triton fp8"] = triton_pair(fp8_cfg, x_q, w1_q, w2_q, (x_s, w1_s, w2_s), FP8)
            outputs["triton fp8"] = fns["triton fp8"]()
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t} triton fp8", exc)
            fns.pop("triton fp8", None)
        try:
            fns["triton bf16"] = triton_pair(bf16_cfg, x, w1, w2, None, torch.bfloat16)
            fns["triton bf16"]()
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t} triton bf16", exc)
            fns.pop("triton bf16", None)

        for block_m, block_n, stages in VARIANTS:
            name = f"gluon fp8 {block_m}x{block_n} {stages}st"
            try:
                cfg = gluon_config(block_m, block_n, stages)
                r = moe_align(ti, e, block_m)
                a_q, a_s = quantize_activations_fp8(sorted_rows(act, r), group_size=128)

                def run(r=r, cfg=cfg, a_q=a_q, a_s=a_s):
                    grouped_matmul_fp8_gluon(x_q, w1_q, r, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s)
                    return grouped_matmul_fp8_gluon(
                        a_q, w2_q, r, cfg, gather_a=False, scatter=True, topk_weights=tw, a_scale=a_s, w_scale=w2_s
                    )

                outputs[name] = run()
                torch.cuda.synchronize()
                fns[name] = run
            except Exception as exc:  # noqa: BLE001 - a compile error of one variant must not lose the rest
                fail(f"{model} T={t} {name}", exc)

        if check_first and n_t == 0:
            for block_m, _, _ in VARIANTS[:1]:
                try:
                    r = moe_align(ti, e, block_m)
                    a_q, a_s = quantize_activations_fp8(sorted_rows(act, r), group_size=128)
                    got = grouped_matmul_fp8_gluon(
                        a_q, w2_q, r, gluon_config(block_m), gather_a=False, scatter=True, topk_weights=tw,
                        a_scale=a_s, w_scale=w2_s,
                    )  # fmt: skip
                    want = reference(
                        dequantize_fp8(a_q, a_s, (1, 128)),
                        w2_q,
                        w2_s,
                        r,
                        gather_a=False,
                        scatter=True,
                        topk_weights=tw,
                    )
                    err = compare(got, want)
                    status = "ok  " if err < 1e-2 else "FAIL"
                    print(f"{status} correctness {model} T={t} down GEMM vs float32: {err:.2e}", flush=True)
                    if err >= 1e-2:
                        FAILURES.append(f"correctness {model} T={t}: {err}")
                    del want
                except Exception as exc:  # noqa: BLE001
                    fail(f"{model} T={t} reference check", exc)

        # Ceilings at the same FLOPs: dense [T*k, H] x [H, 2I] then [T*k, I] x [I, H].
        m = t * k
        try:
            da, dw1 = torch.randn(m, h, device="cuda").bfloat16(), torch.randn(2 * i, h, device="cuda").bfloat16()
            db, dw2 = torch.randn(m, i, device="cuda").bfloat16(), torch.randn(h, i, device="cuda").bfloat16()
            fns["dense bf16 matmul"] = lambda: (da @ dw1.T, db @ dw2.T)
            one = torch.ones((), device="cuda")
            qa, qw1, qb, qw2 = (v.to(FP8) for v in (da, dw1, db, dw2))
            fns["dense fp8 _scaled_mm"] = lambda: (
                torch._scaled_mm(qa, qw1.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                torch._scaled_mm(qb, qw2.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            )
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t} ceilings", exc)
        try:
            up = block_scaled_mm(da, dw1)
            down = block_scaled_mm(db, dw2)
            if up and down:
                fns["dense fp8 block-scaled _scaled_mm"] = lambda: (up(), down())
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t} block-scaled ceiling", exc)

        try:
            order = ti.reshape(-1).argsort(stable=True)
            fns.update(grouped_ceilings(ti, x[order // k], act[order], w1, w2))
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t} grouped ceilings", exc)

        ms = timed(fns)
        base = ms.get("triton fp8")
        for name, value in ms.items():
            diff = None
            if name.startswith("gluon") and "triton fp8" in outputs and name in outputs:
                diff = relative_error(outputs[name].float(), outputs["triton fp8"].float())
            rows_out.append(
                dict(
                    model=model,
                    T=t,
                    variant=name,
                    ms=value,
                    tflops=flops / value / 1e9 if value else None,
                    vs_triton_fp8=base / value if value and base else None,
                    rel_diff_vs_triton_fp8=diff,
                )
            )
            print(_row(rows_out[-1]), flush=True)
        del fns, outputs
        torch.cuda.empty_cache()
    return rows_out


HEADER = (
    "| model | T | variant | ms | TFLOP/s | Triton FP8 time / this | rel. diff vs Triton FP8 |\n"
    "|---|---|---|---|---|---|---|"
)


def _row(r: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    return (
        f"| {r['model']} | {r['T']} | {r['variant']} | {f(r['ms'], '.4f')} | {f(r['tflops'], '.0f')} | "
        f"{f(r['vs_triton_fp8'], '.3f')} | {f(r['rel_diff_vs_triton_fp8'], '.1e')} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gluon_fp8.json and gluon_fp8.md")
    ap.add_argument("--quick", action="store_true", help="correctness, then DeepSeek-V3 at T = 4096 only")
    models = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"]
    ap.add_argument("--models", nargs="+", default=models, help=f"model presets (default: {' '.join(models)})")
    ap.add_argument("--tokens", nargs="+", type=int, default=[512, 4096, 16384], help="T (default: 512 4096 16384)")
    args = ap.parse_args(argv)
    import triton  # after moe_lab, which switches Triton's interpreter on where no GPU is seen

    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    reason = gluon_fp8_support()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
    print(f"{device}, torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    if reason is not None:
        print(f"FAIL the Gluon FP8 kernel cannot run here: {reason}")
        return 1
    correctness()
    models, tokens = (["deepseek-v3"], [4096]) if args.quick else (args.models, args.tokens)
    rows = []
    for model in models:
        try:
            rows += measure(model, tokens, check_first=True)
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001
            fail(f"{model}", exc)
    table = "\n".join([HEADER] + [_row(r) for r in rows])
    print("\n" + table)
    meta = dict(device=device, torch=torch.__version__, triton=triton.__version__, failures=FAILURES)
    with open(os.path.join(args.out, "gluon_fp8.json"), "w") as fh:
        json.dump(dict(meta, rows=rows), fh, indent=1)
    with open(os.path.join(args.out, "gluon_fp8.md"), "w") as fh:
        fh.write(f"{device}, torch {torch.__version__}, triton {triton.__version__}\n\n{table}\n")
    print(f"\n{len(FAILURES)} failure(s); {time.perf_counter() - start:.0f} s; wrote {args.out}/gluon_fp8.json, .md")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
