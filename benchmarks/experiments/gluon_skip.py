"""Experiment (issue 34): MMA partitions pass by the 64-row halves of a tile that are all padding.

    python benchmarks/experiments/gluon_skip.py OUT      # an sm_90 GPU: bits, then times; OUT/gluon_skip.md/.json
    python benchmarks/experiments/gluon_skip.py --regs   # any machine: sm_90a compile of both, ptxas -v

"head" is the kernel of the last commit (a copy, benchmarks/experiments/gluon_fp8_head.py), "skip" the working tree's
(moe_lab/_kernels/gluon_fp8.py): with 128-row tiles, the partition whose 64 rows are all padding (an expert's
last M-block with 64 valid rows or fewer) waits for and releases each stage without wgmmas and writes nothing.
Valid rows are computed the same way, so outputs on routed rows/slots must be bitwise equal.
Times: the up GEMM (SwiGLU, float8 out), the down GEMM (scatter, routed weights) with 128-row tiles, and the
layer (fused_moe, MOE_LAB_GLUON=1 with head/skip, and =0: the Triton FP8 GEMMs); CUDA-graph medians, L2
flushed, order alternated over 4 rounds, least median kept.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import torch

from moe_lab._kernels import gluon_fp8 as shipped

_spec = importlib.util.spec_from_file_location(
    "gluon_fp8_head", os.path.join(os.path.dirname(__file__), "gluon_fp8_head.py")
)
head = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(head)
SKIP_KERNEL = shipped.fp8_grouped_matmul_ws_kernel


@contextlib.contextmanager
def variant(name):
    shipped.fp8_grouped_matmul_ws_kernel = head.fp8_grouped_matmul_ws_kernel if name == "head" else SKIP_KERNEL
    try:
        yield
    finally:
        shipped.fp8_grouped_matmul_ws_kernel = SKIP_KERNEL


def regs() -> int:
    from moe_lab import Activation, AlignedRouting
    from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
    from moe_lab.tools import compile_only

    compile_only.patch_moe_lab()

    def meta(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device="meta")

    e, rows, fp8, f32, h, i = 8, 1024, torch.float8_e4m3fn, torch.float32, 1024, 512
    failed = 0
    for name in ("head", "skip"):
        for bm in (128, 64):
            for act in ("silu", "swigluoai", None):
                routing = AlignedRouting(meta(e), meta(rows), meta(rows // bm), meta(1), bm, 256, 2, e)
                session = compile_only.Session(compile_missing=True)
                try:
                    with compile_only.fake_gpu(90, session), variant(name):
                        if act:
                            grouped_matmul_fp8_gluon(
                                meta(256, h, dtype=fp8),
                                meta(e, 2 * i, h, dtype=fp8),
                                routing,
                                gather_a=True,
                                a_scale=meta(256, h // 128, dtype=f32),
                                w_scale=meta(e, 2 * i // 128, h // 128, dtype=f32),
                                activation=Activation(act),
                                out=meta(rows, i, dtype=fp8),
                                out_scale=meta(rows, i // 128, dtype=f32),
                            )
                        else:
                            grouped_matmul_fp8_gluon(
                                meta(rows, i, dtype=fp8),
                                meta(e, h, i, dtype=fp8),
                                routing,
                                gather_a=False,
                                scatter=True,
                                topk_weights=meta(256, 2, dtype=f32),
                                a_scale=meta(rows, i // 128, dtype=f32),
                                w_scale=meta(e, h // 128, i // 128, dtype=f32),
                                out=meta(512, h, dtype=torch.bfloat16),
                            )
                except Exception as exc:  # noqa: BLE001
                    print(f"{name} BLOCK_SIZE_M={bm} {act}: compile FAILED: {type(exc).__name__}: {str(exc)[:3000]}")
                    failed += 1
                    continue
                for k in session.kernels.values():
                    if k.name != "fp8_grouped_matmul_ws_kernel":
                        continue
                    with tempfile.TemporaryDirectory() as d:
                        ptx = os.path.join(d, "k.ptx")
                        with open(ptx, "w") as f:
                            f.write(k.asm["ptx"])
                        done = subprocess.run(
                            ["ptxas", "-v", "-arch=sm_90a", ptx, "-o", os.path.join(d, "k.cubin")],
                            capture_output=True,
                            text=True,
                        )
                    info = [
                        ln.split(":", 1)[-1].strip() for ln in done.stderr.splitlines() if "spill" in ln or "Used" in ln
                    ]
                    print(f"{name:5s} BLOCK_SIZE_M={bm:3d} {act}: shared {k.metadata.shared} B; {'; '.join(info)}")
    return 1 if failed else 0


def gpu(out_dir: str) -> int:
    from moe_lab import Activation, fused_moe, get_preset, moe_align, quantize_activations_fp8, quantize_weights_fp8
    from moe_lab.configs import GemmConfig
    from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
    from moe_lab.routing import uniform_routing
    from moe_lab.tools.timing import graph_ms

    os.makedirs(out_dir, exist_ok=True)
    lines, results, failures = [], [], 0

    def say(line):
        print(line, flush=True)
        lines.append(line)

    say("| model | T | gemm | variant | ms | TFLOP/s | head time / this |")
    say("|---|---|---|---|---|---|---|")
    points = {"deepseek-v3": (2048, 4096, 16384), "qwen3-30b-a3b": (2048, 4096, 16384), "mixtral-8x7b": (4096, 16384)}
    for model, tokens in points.items():
        p = get_preset(model)
        e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
        gen = torch.Generator(device="cuda").manual_seed(1)
        w1_q, w1_s = quantize_weights_fp8(
            ((torch.rand(e, 2 * i, h, device="cuda", generator=gen) - 0.5) * h**-0.5).to(torch.bfloat16), (128, 128)
        )
        w2_q, w2_s = quantize_weights_fp8(
            ((torch.rand(e, h, i, device="cuda", generator=gen) - 0.5) * i**-0.5).to(torch.bfloat16), (128, 128)
        )
        for t in tokens:
            tw, ti = uniform_routing(t, e, k, seed=1)
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            x_q, x_s = quantize_activations_fp8(x, group_size=128)
            r = moe_align(ti, e, 128)
            counts = torch.bincount(ti.flatten().long(), minlength=e)
            padded = int(((counts + 127) // 128 * 128).sum())
            dead = int((((counts % 128) > 0) & ((counts % 128) <= 64)).sum())
            blocks = padded // 128
            say(
                f"stat {model} T={t}: padded rows / routed rows {padded / (t * k):.3f}; with 64-row halves skipped "
                f"{(padded - 64 * dead) / (t * k):.3f}; M-blocks {blocks}, with a dead half {dead}"
            )
            cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=4)
            rows = r.max_num_tokens_padded
            routed = r.sorted_token_ids[:rows] < r.num_slots
            up_out = torch.empty(rows, i, device="cuda", dtype=torch.float8_e4m3fn)
            up_scale = torch.empty(rows, i // 128, device="cuda", dtype=torch.float32)
            down_out = torch.empty(t * k, h, device="cuda", dtype=torch.bfloat16)

            def up():
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

            def down():
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

            def layer():
                return fused_moe(x, w1_q, w2_q, tw, ti, w1_scale=w1_s, w2_scale=w2_s, block_shape=[128, 128])

            got = {}
            for name in ("head", "skip"):
                up_out.view(torch.uint8).fill_(0x7F)
                up_scale.fill_(float("nan"))
                down_out.fill_(float("nan"))
                try:
                    with variant(name):
                        up()
                        if name == "head":
                            a_in, s_in = up_out.clone(), up_scale.clone()
                        down()
                        os.environ["MOE_LAB_GLUON"] = "1"
                        lay = layer()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    say(f"FAIL {model} T={t} {name}: {type(exc).__name__}: {str(exc)[:800]}")
                    failures += 1
                    continue
                got[name] = (up_out[routed].view(torch.uint8).clone(), up_scale[routed].clone(), down_out.clone(), lay)
            if len(got) == 2:
                same = [
                    torch.equal(
                        a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                        b.view(torch.uint8) if b.dtype != torch.uint8 else b,
                    )
                    if a.dtype == torch.uint8
                    else torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0))
                    for a, b in zip(got["head"], got["skip"])
                ]
                nan = [bool(v.float().isnan().any()) for v in got["skip"]]
                ok = all(same) and not any(nan)
                say(
                    f"{'ok  ' if ok else 'FAIL'} bits {model} T={t}: equal (up, up scales, down, layer) {same}; "
                    f"NaN in skip's {nan}"
                )
                failures += 0 if ok else 1
            a_in, s_in = up_out.clone(), up_scale.clone()
            flops_up = 2.0 * t * k * 2 * i * h
            fns = [
                ("up", up, flops_up, ("head", "skip")),
                ("down", down, flops_up / 2, ("head", "skip")),
                ("layer", layer, 1.5 * flops_up, ("head", "skip", "triton")),
            ]
            for gemm, fn, flops, names in fns:
                best = {}
                for rnd in range(4):
                    for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                        os.environ["MOE_LAB_GLUON"] = "0" if name == "triton" else "1"
                        try:
                            with variant(name):
                                ms = graph_ms(fn, rep_ms=100)
                            best[name] = min(ms, best.get(name, float("inf")))
                        except Exception as exc:  # noqa: BLE001
                            say(f"FAIL timing {model} T={t} {gemm} {name}: {type(exc).__name__}: {str(exc)[:300]}")
                            failures += 1
                base = best.get("head")
                for name, ms in best.items():
                    row = dict(
                        model=model,
                        T=t,
                        gemm=gemm,
                        variant=name,
                        ms=ms,
                        tflops=flops / ms / 1e9,
                        head_over_this=base / ms if base else None,
                    )
                    results.append(row)
                    say(
                        f"| {model} | {t} | {gemm} | {name} | {ms:.3f} | {row['tflops']:.0f} | "
                        f"{row['head_over_this']:.3f} |"
                    )
            os.environ["MOE_LAB_GLUON"] = "auto"
        w1_q = w2_q = None  # free before the next preset
        torch.cuda.empty_cache()
        save(out_dir, lines, results)
    say(f"{failures} failures")
    save(out_dir, lines, results)
    return 1 if failures else 0


def save(out_dir, lines, results):
    with open(os.path.join(out_dir, "gluon_skip.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    with open(os.path.join(out_dir, "gluon_skip.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if "--regs" in sys.argv:
        sys.exit(regs())
    sys.exit(gpu(sys.argv[1] if len(sys.argv) > 1 else "gluon_skip_out"))
