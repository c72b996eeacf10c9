"""The whole block-scaled FP8 `fused_moe` layer with the Gluon GEMMs forced on against forced off, on Hopper.

    python benchmarks/fp8_layer.py --out DIR [--quick] [--models ...] [--tokens ...]

Per model preset (full size: Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3) and T (1, 8, 64, 512, 4096, 16384:
the 18 points of `moe-lab bench`), DeepSeek-V3's recipe (float8 e4m3 weights with [128, 128] block scales,
activations quantized per token per 128 channels), uniform routing: `fused_moe` with MOE_LAB_GLUON=1 (the
warp-specialized Gluon GEMMs: up GEMM with SwiGLU and the float8 quantization in its epilogue, down GEMM
scattered with routed weights) and with MOE_LAB_GLUON=0 (the Triton FP8 GEMMs), each the whole layer (quantize
the input, align, both GEMMs, top-k reduce). CUDA-graph medians with L2 flushed (`moe_lab.tools.timing.
graph_ms`), the two in alternating order over three rounds, the least median kept. Correctness of each point:
the Gluon layer's output (poisoned with NaN first) against the Triton layer's, relative Frobenius error <
1e-2, or else against the float32 layer on the same float8 operands (`fused_moe_reference`), < 1e-2, or else
no further from exact math than the Triton layer (`judge`); and FusedMoEInfo.gemm_kernel checked. The table
also says what MOE_LAB_GLUON=auto picks there (`moe_lab.plan.gluon_applies`: the Gluon GEMMs where T * top_k /
E >= GLUON_AUTO_ROWS_PER_EXPERT, or GLUON_AUTO_ROWS_PER_LARGE_EXPERT where one expert's w1 takes
GLUON_LARGE_EXPERT_W_BYTES or more).
Prints a markdown table and writes DIR/fp8_layer.json and DIR/fp8_layer.md. Every failure prints a FAIL line
and the run goes on. --quick: Mixtral-8x7B at T = 512 and DeepSeek-V3 at T = 64 and 4096 only.
Needs an sm_90 GPU and a Triton with Gluon's warp_specialize (Triton 3.6.0 with torch 2.11).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback

import torch

from moe_lab import fused_moe, get_preset, quantize_weights_fp8
from moe_lab import plan as plan_module
from moe_lab.capability import gluon_fp8_support
from moe_lab.presets import MAIN_MODELS, SWEEP_TOKENS
from moe_lab.reference import fused_moe_reference, relative_error
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms

TRITON_VERSION = importlib.metadata.version("triton")
BLOCK = (128, 128)
QUICK = {"mixtral-8x7b": [512], "deepseek-v3": [64, 4096]}
FAILURES: list = []


def fail(what: str, exc: BaseException) -> None:
    line = f"FAIL {what}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc) else ''}"
    print(line, flush=True)
    FAILURES.append(line)
    if os.environ.get("FP8_LAYER_BENCH_TRACE"):
        traceback.print_exc()


def weights(e: int, n: int, k: int, seed: int):
    """float8 [E, n, k] weights with [128, 128] block scales, from bf16 ~ U(-0.5, 0.5) / sqrt(k)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = ((torch.rand(e, n, k, device="cuda", generator=gen) - 0.5) * k**-0.5).to(torch.bfloat16)
    return quantize_weights_fp8(w, BLOCK)


def layer(setting: str, x, w1, w2, tw, ids, scales, out):
    """fused_moe with MOE_LAB_GLUON=setting (the layer plans forgotten, so the setting is read again)."""
    os.environ[plan_module.GLUON_ENV_VAR] = setting
    plan_module.clear_layer_plans()
    return fused_moe(x, w1, w2, tw, ids, out=out, return_info=True, **scales)


def timed(fns: dict, rounds: int = 3) -> dict:
    """Least CUDA-graph median (ms) of each callable over `rounds`, the order alternating each round."""
    best = {}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if name in best and best[name] is None:
                continue
            try:
                ms = graph_ms(fns[name], rep_ms=50)
                best[name] = min(ms, best.get(name) or float("inf"))
            except Exception as exc:  # noqa: BLE001
                fail(f"timing {name}", exc)
                best[name] = None
    return best


def judge(row: dict, x, w1, w2, tw, ids, scales, outs: dict) -> None:
    """Where the two layers part by 1e-2 or more: each against the float32 layer on the same float8 operands
    (`fused_moe_reference`, which quantizes each GEMM's input as the layer does), the Gluon layer's under 1e-2.
    Failing that, each against exact math on the dequantized weights (quantize_inputs=False): a layer whose
    sums round one activation to the neighbouring e4m3 value moves its row against the first reference by a
    step, and against exact math by no more than either rounding costs (docs/experiments.md, "FP8 at decode:
    which reference"); the Gluon layer must then be no further from exact math than the Triton layer, to 5 %
    (an error of its own a third the size of that distance, adding in quadrature, would exceed it)."""
    ref = fused_moe_reference(x, w1, w2, tw, ids, **scales)
    row["ref_err"] = {name: relative_error(out.float(), ref) for name, out in outs.items()}
    del ref
    ok = row["ref_err"]["gluon"] < 1e-2
    if not ok:
        exact = fused_moe_reference(x, w1, w2, tw, ids, quantize_inputs=False, **scales)
        row["exact_err"] = {name: relative_error(out.float(), exact) for name, out in outs.items()}
        del exact
        ok = row["exact_err"]["gluon"] <= 1.05 * row["exact_err"]["triton"]
    torch.cuda.empty_cache()  # the references' float32 weights
    if not ok:
        what = (
            f"correctness {row['model']} T={row['T']}: rel diff {row['rel_diff']:.2e}, {row['ref_err']}, "
            f"exact math {row['exact_err']}"
        )
        FAILURES.append(what)
        print(f"FAIL {what}", flush=True)


def measure(model: str, tokens) -> list:
    p = get_preset(model)
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    print(f"\n{model}: E={e} k={k} H={h} I={i}; building weights", flush=True)
    w1, w1_s = weights(e, 2 * i, h, 1)
    w2, w2_s = weights(e, h, i, 2)
    scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=BLOCK)
    rows = []
    for t in tokens:
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        tw, ids = uniform_routing(t, e, k, seed=t)
        row = dict(model=model, T=t, rows_per_expert=t * k / e)
        auto, why = plan_module.gluon_applies(w1, w2, BLOCK, setting="auto", rows_per_expert=t * k / e)
        row.update(auto="gluon" if auto else "triton", auto_reason=why)
        try:
            outs = {}
            for setting, name in (("1", "gluon"), ("0", "triton")):
                out = torch.full_like(x, float("nan"))
                _, info = layer(setting, x, w1, w2, tw, ids, scales, out)
                if info.gemm_kernel != name:
                    raise RuntimeError(f"MOE_LAB_GLUON={setting} ran the {info.gemm_kernel} GEMMs: {info.gemm_reason}")
                outs[name] = out
            row["rel_diff"] = relative_error(outs["gluon"].float(), outs["triton"].float())
            row["bitwise_equal"] = bool(torch.equal(outs["gluon"], outs["triton"]))
            if not row["rel_diff"] < 1e-2:  # NaN (an unwritten row) fails too
                judge(row, x, w1, w2, tw, ids, scales, outs)
            bufs = {name: torch.empty_like(x) for name in ("gluon", "triton")}
            best = timed(
                {
                    "gluon": lambda: layer("1", x, w1, w2, tw, ids, scales, bufs["gluon"]),
                    "triton": lambda: layer("0", x, w1, w2, tw, ids, scales, bufs["triton"]),
                }
            )
            row.update(gluon_ms=best["gluon"], triton_ms=best["triton"])
            if best["gluon"] and best["triton"]:
                row["speedup"] = best["triton"] / best["gluon"]
        except Exception as exc:  # noqa: BLE001
            fail(f"{model} T={t}", exc)
        print(_row(row), flush=True)
        rows.append(row)
    os.environ.pop(plan_module.GLUON_ENV_VAR, None)
    plan_module.clear_layer_plans()
    return rows


HEADER = (
    "| model | T | rows/expert | Triton FP8 layer ms | Gluon FP8 layer ms | Triton / Gluon | rel. diff | bitwise | "
    "auto picks |\n|---|---|---|---|---|---|---|---|---|"
)


def _row(r: dict) -> str:
    def f(key, fmt):
        v = r.get(key)
        return "-" if v is None else format(v, fmt)

    return (
        f"| {r['model']} | {r['T']} | {r['rows_per_expert']:g} | {f('triton_ms', '.4f')} | {f('gluon_ms', '.4f')} | "
        f"{f('speedup', '.3f')} | {f('rel_diff', '.1e')} | {r.get('bitwise_equal', '-')} | {r['auto']} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for fp8_layer.json and fp8_layer.md")
    ap.add_argument("--quick", action="store_true", help="Mixtral-8x7B at T = 512, DeepSeek-V3 at T = 64 and 4096")
    ap.add_argument("--models", nargs="+", default=list(MAIN_MODELS))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(SWEEP_TOKENS))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
    print(f"{device}, torch {torch.__version__}, triton {TRITON_VERSION}, python {platform.python_version()}")
    reason = gluon_fp8_support()
    if reason is not None:
        print(f"FAIL the Gluon FP8 kernel cannot run here: {reason}")
        return 1
    points = QUICK if args.quick else {model: args.tokens for model in args.models}
    rows = []
    with torch.inference_mode():
        for model, tokens in points.items():
            try:
                rows += measure(model, tokens)
                torch.cuda.empty_cache()  # the model's weights
            except Exception as exc:  # noqa: BLE001
                fail(f"{model}", exc)
    table = "\n".join([HEADER] + [_row(r) for r in rows])
    print("\n" + table)
    meta = dict(device=device, torch=torch.__version__, triton=TRITON_VERSION, failures=FAILURES)
    with open(os.path.join(args.out, "fp8_layer.json"), "w") as fh:
        json.dump(dict(meta, rows=rows), fh, indent=1)
    with open(os.path.join(args.out, "fp8_layer.md"), "w") as fh:
        fh.write(f"{device}, torch {torch.__version__}, triton {TRITON_VERSION}\n\n{table}\n")
    print(f"\n{len(FAILURES)} failure(s); {time.perf_counter() - start:.0f} s; wrote {args.out}/fp8_layer.json, .md")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
