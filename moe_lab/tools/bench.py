"""Benchmarks on a GPU: moe-lab's GEMMs (pointer and TMA paths) against peers run in the same process.

For each model preset and token count T it times, as the median of CUDA-graph replays with L2 flushed
before each (`moe_lab.tools.timing.graph_ms`; for both GEMMs together and for the layer,
the least of ROUNDS such medians):
  - the up GEMM, the down GEMM and both together, for moe-lab pointer, moe-lab TMA and torch._grouped_mm;
    moe-lab's up GEMM is the one the layer runs: with its SwiGLU epilogue where the config fuses it
    (`GemmConfig.fuse_swiglu`), else the GEMM alone (the activation is then timed with the layer); on
    `moe_align`'s schedule, also at T = 1, where the layer runs the same blocks in slot order;
  - the whole layer: moe-lab `fused_moe` (align, activation and reduce included), torch._grouped_mm with
    the glue it needs (sort, gather, activation, scatter, reduce), and a per-expert PyTorch loop;
checks each against the float32 reference, and reports TFLOP/s, weight TB/s and % of the roofline set by
ceilings measured in the same run (device copy bandwidth, 8192^3 bf16 matmul).
Routing is uniform: each token picks k distinct experts at random, with softmax weights over its k logits,
so every implementation sees the same, typical expert load. Refuses to run under the interpreter.

With dtype=torch.float8_e4m3fn (`moe-lab bench --dtype fp8`) each point times moe-lab's FP8 layer (weights
quantized from the bf16 ones with one float32 scale per [128, 128] block, activations per token per 128
channels) against moe-lab's bf16 layer on the same weights and routing (`bench_point_fp8`), and the results
go to an `fp8/` folder under the output folder (results of other dtypes but bf16 likewise to `<dtype>/`),
so that readers of the newest bf16 results (`moe_lab.workbook.viz.performance.load_results`) never pick them up.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
from typing import List, Optional

import torch
import torch.nn.functional as F
import triton

from ..activation import silu_and_mul
from ..align import moe_align
from ..configs import MoEConfig
from ..gemm import grouped_matmul
from ..layer import fused_moe
from ..presets import MAIN_MODELS, SWEEP_TOKENS, MoEPreset, get_preset
from ..quantize import FP8_DTYPE, quantize_activations_fp8
from ..reference import fused_moe_reference, relative_error
from ..routing import uniform_routing
from ..runtime import require_gpu_timing
from ..tuned import choose_config, default_config
from .timing import check_timed_tokens, folder_write_problem, gemm_costs, graph_ms, measure_ceilings, median_ms

DEFAULT_MODELS, DEFAULT_TOKENS = MAIN_MODELS, SWEEP_TOKENS
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", FP8_DTYPE: "fp8"}
ROUNDS = 3  # rounds of replays for the compared figures (both GEMMs, the layer), same for every implementation


def _sort_by_expert(topk_ids, num_experts):
    """Slots in expert order (stable) and the cumulative row ends per expert, as torch._grouped_mm takes them."""
    flat = topk_ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32)
    )
    return flat.argsort(stable=True), counts.cumsum(0, dtype=torch.int32)


def _grouped_mm_peer(hs, w1, w2, tw, ti):
    """torch._grouped_mm on the same routing: returns (gemms_fn, layer_fn)."""
    num_tokens, top_k = ti.shape
    num_experts, two_i, _ = w1.shape
    w1_t, w2_t = w1.transpose(1, 2), w2.transpose(1, 2)
    order, offs = _sort_by_expert(ti, num_experts)
    x_sorted = hs[order // top_k]
    act = F.silu(torch._grouped_mm(x_sorted, w1_t, offs=offs)[:, : two_i // 2])

    def gemms():
        gu = torch._grouped_mm(x_sorted, w1_t, offs=offs)
        return torch._grouped_mm(act, w2_t, offs=offs), gu

    def layer():
        order_, offs_ = _sort_by_expert(ti, num_experts)  # the sort is part of the layer's glue
        gu = torch._grouped_mm(hs[order_ // top_k], w1_t, offs=offs_)
        a = F.silu(gu[:, : two_i // 2]) * gu[:, two_i // 2 :]
        y = torch._grouped_mm(a, w2_t, offs=offs_) * tw.reshape(-1)[order_, None].to(a.dtype)
        out_k = torch.empty_like(y)
        out_k[order_] = y
        return out_k.view(num_tokens, top_k, -1).sum(1)

    return gemms, layer


def _loop_peer(hs, w1, w2, tw, ti):
    inter = w2.shape[-1]

    def layer():
        out = torch.zeros_like(hs, dtype=torch.float32)
        for e in range(w1.shape[0]):
            tok, slot = torch.where(ti == e)
            x = hs[tok]
            gu = x @ w1[e].T
            y = (F.silu(gu[:, :inter]) * gu[:, inter:]) @ w2[e].T
            out.index_add_(0, tok, y.float() * tw[tok, slot, None])
        return out.to(hs.dtype)

    return layer


def _layer_gemms(hs, w1, w2, tw, routing, cfg: MoEConfig, *, use_tma="auto", scales: Optional[dict] = None):
    """(up, down): the layer's two GEMMs as `fused_moe` launches them, each a callable of no arguments that
    writes into buffers made (and filled once) here. The up GEMM carries the SwiGLU epilogue where the
    config fuses it, else the activation runs here once and is not timed. With FP8 `scales` (from
    `MoEPreset.quantize_fp8`), hs and the activation are quantized here once, per token per block_k channels
    as the layer does it: the callables time the GEMMs alone (the quantization is in the layer's time)."""
    fused = cfg.up.swiglu_epilogue
    up_kw, down_kw, x = {}, {}, hs
    if scales is not None:
        group = scales["block_shape"][1]
        x, a1_scale = quantize_activations_fp8(hs, group_size=group)
        up_kw = dict(
            a_scale=a1_scale, w_scale=scales["w1_scale"], block_shape=scales["block_shape"], out_dtype=torch.float32
        )  # the layer keeps the SwiGLU output in float32 until quantized
    gate_up = grouped_matmul(x, w1, routing, cfg.up, gather_a=True, use_tma=use_tma, swiglu=fused, **up_kw)
    act = gate_up if fused else silu_and_mul(gate_up, routing=routing)
    if scales is not None:
        act, a2_scale = quantize_activations_fp8(act, group_size=group, num_rows=routing.num_tokens_post_padded)
        down_kw = dict(a_scale=a2_scale, w_scale=scales["w2_scale"], block_shape=scales["block_shape"])
    out_k = torch.empty(routing.num_slots, w2.shape[1], dtype=hs.dtype, device=hs.device)

    def up():
        grouped_matmul(x, w1, routing, cfg.up, gather_a=True, out=gate_up, use_tma=use_tma, swiglu=fused, **up_kw)

    def down():
        grouped_matmul(
            act,
            w2,
            routing,
            cfg.down,
            gather_a=False,
            scatter=True,
            topk_weights=tw,
            out=out_k,
            use_tma=use_tma,
            **down_kw,
        )

    return up, down


def _both(up, down):
    def both():
        up()
        down()

    return both


def bench_point(
    preset: MoEPreset,
    num_tokens: int,
    ceilings,
    *,
    dtype=torch.bfloat16,
    config: Optional[MoEConfig] = None,
    peers: bool = True,
    seed: int = 0,
) -> List[dict]:
    """Time every implementation at one (preset, T). Returns one row per implementation."""
    hs, w1, w2, _ = preset.build(num_tokens, dtype=dtype, device="cuda", seed=seed)
    tw, ti = uniform_routing(num_tokens, preset.num_experts, preset.top_k, seed=seed + 1)
    cfg = config or default_config(
        num_tokens, preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size, dtype
    )
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    experts_used = int(torch.unique(ti).numel())
    up_cost, down_cost = gemm_costs(preset, num_tokens, experts_used, hs.element_size())
    routing = moe_align(ti, preset.num_experts, cfg.block_size_m)
    base = dict(
        model=preset.name,
        T=num_tokens,
        E=preset.num_experts,
        top_k=preset.top_k,
        H=preset.hidden_size,
        I=preset.intermediate_size,
        dtype=str(dtype).replace("torch.", ""),
        experts_used=experts_used,
        roofline_gemms_ms=up_cost.roofline_ms(ceilings) + down_cost.roofline_ms(ceilings),
    )
    rows = []

    def row(impl, up_ms, down_ms, gemms_ms, layer_ms, err, **extra):
        r = dict(base, impl=impl, up_ms=up_ms, down_ms=down_ms, gemms_ms=gemms_ms, layer_ms=layer_ms, rel_err=err)
        if gemms_ms:
            r["gemms_tflops"] = (up_cost.flops + down_cost.flops) / gemms_ms / 1e9
            r["gemms_tbps"] = (up_cost.bytes + down_cost.bytes) / gemms_ms / 1e9
            r["pct_roofline"] = 100 * r["roofline_gemms_ms"] / gemms_ms
        r.update(extra)
        rows.append(r)

    # Both paths run the same config, so the difference is the load path alone.
    for impl, use_tma in (("moe-lab pointer", False), ("moe-lab tma", True)):
        try:
            up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg, use_tma=use_tma)
            out = fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma)
            err = relative_error(out, ref)
            row(
                impl,
                graph_ms(up),
                graph_ms(down),
                graph_ms(_both(up, down), rounds=ROUNDS),
                graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma), rounds=ROUNDS),
                err,
                config=dict(up=cfg.up.to_dict(), down=cfg.down.to_dict()),
                swiglu_epilogue=cfg.up.swiglu_epilogue,
            )
        except (ValueError, RuntimeError) as exc:  # e.g. TMA refused on this device
            row(impl, None, None, None, None, None, error=str(exc))
    if peers and hasattr(torch, "_grouped_mm"):
        try:
            gemms, layer = _grouped_mm_peer(hs, w1, w2, tw, ti)
            row(
                "torch._grouped_mm",
                None,
                None,
                graph_ms(gemms, rounds=ROUNDS),
                graph_ms(layer, rounds=ROUNDS),
                relative_error(layer(), ref),
            )
        except RuntimeError as exc:
            row("torch._grouped_mm", None, None, None, None, None, error=str(exc)[:200])
    if peers and preset.num_experts * max(1, num_tokens // 4096) <= 256:
        loop = _loop_peer(hs, w1, w2, tw, ti)
        # It asks the host for each expert's rows, so it cannot be captured: timed eagerly.
        row("torch per-expert loop", None, None, None, median_ms(loop, rep_ms=50), relative_error(loop(), ref))
    del hs, w1, w2, ref
    torch.cuda.empty_cache()
    return rows


def bench_point_fp8(preset: MoEPreset, num_tokens: int, ceilings, *, block_shape=None, seed: int = 0) -> List[dict]:
    """moe-lab FP8 against moe-lab bf16 at one (preset, T), in the same run: the same bf16 weights, and
    their FP8 form (`preset.quantize_fp8`: float8_e4m3fn, one float32 scale per `block_shape` block, default
    the preset's `weight_block_size` or [128, 128]; bf16 activations quantized per token per block_k
    channels by the layer); each layer with its default config and load paths (use_tma="auto").
    Returns two rows, impl "moe-lab bf16" and "moe-lab fp8", with the bf16 bench's times (up, down, both
    GEMMs, layer; ms), TFLOP/s and TB/s (bytes at the row's weight itemsize: 2 or 1). The fp8 row adds
    speedup_gemms and speedup_layer (bf16 time / fp8 time), rel_err against the float32 reference on its own
    dequantized operands (the kernels' error) and quant_err against the float32 reference on the bf16 weights
    (what FP8 itself costs); pct_roofline is left out of it (no FP8 matmul ceiling is measured)."""
    hs, w1, w2, _ = preset.build(num_tokens, dtype=torch.bfloat16, device="cuda", seed=seed)
    tw, ti = uniform_routing(num_tokens, preset.num_experts, preset.top_k, seed=seed + 1)
    w1_fp8, w2_fp8, scales = preset.quantize_fp8(w1, w2, block_shape)
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    experts_used = int(torch.unique(ti).numel())
    base = dict(
        model=preset.name,
        T=num_tokens,
        E=preset.num_experts,
        top_k=preset.top_k,
        H=preset.hidden_size,
        I=preset.intermediate_size,
        experts_used=experts_used,
        activations="bfloat16",
    )
    rows = []
    for impl, (a, b), kw in (("moe-lab bf16", (w1, w2), {}), ("moe-lab fp8", (w1_fp8, w2_fp8), scales)):
        r = dict(
            base,
            impl=impl,
            dtype=str(a.dtype).replace("torch.", ""),
            block_shape=list(scales["block_shape"]) if kw else None,
        )
        try:
            choice = choose_config(
                num_tokens, preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size, a.dtype
            )
            cfg = choice.config
            up, down = _layer_gemms(
                hs, a, b, tw, moe_align(ti, preset.num_experts, cfg.block_size_m), cfg, scales=kw or None
            )
            out = fused_moe(hs, a, b, tw, ti, config=cfg, **kw)
            up_cost, down_cost = gemm_costs(preset, num_tokens, experts_used, a.element_size())
            r.update(
                up_ms=graph_ms(up),
                down_ms=graph_ms(down),
                gemms_ms=graph_ms(_both(up, down), rounds=ROUNDS),
                layer_ms=graph_ms(lambda: fused_moe(hs, a, b, tw, ti, config=cfg, **kw), rounds=ROUNDS),
                config=dict(up=cfg.up.to_dict(), down=cfg.down.to_dict()),
                config_source=choice.source,
            )
            r["gemms_tflops"] = (up_cost.flops + down_cost.flops) / r["gemms_ms"] / 1e9
            r["gemms_tbps"] = (up_cost.bytes + down_cost.bytes) / r["gemms_ms"] / 1e9
            if kw:
                r["rel_err"] = relative_error(out, fused_moe_reference(hs, a, b, tw, ti, **kw))
                r["quant_err"] = relative_error(out, ref)
                bf16 = rows[0]
                if bf16.get("gemms_ms"):
                    r["speedup_gemms"] = bf16["gemms_ms"] / r["gemms_ms"]
                    r["speedup_layer"] = bf16["layer_ms"] / r["layer_ms"]
            else:
                r["rel_err"] = relative_error(out, ref)
                r["roofline_gemms_ms"] = up_cost.roofline_ms(ceilings) + down_cost.roofline_ms(ceilings)
                r["pct_roofline"] = 100 * r["roofline_gemms_ms"] / r["gemms_ms"]
        except (ValueError, RuntimeError) as exc:  # e.g. a config this device cannot launch
            r["error"] = str(exc)
        rows.append(r)
    del hs, w1, w2, w1_fp8, w2_fp8, ref
    torch.cuda.empty_cache()
    return rows


def environment() -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        date=now.date().isoformat(),
        time=now.strftime("%H:%M UTC"),
        capability=".".join(map(str, torch.cuda.get_device_capability())),
    )


def fmt(x, spec):
    """x formatted by spec, or "-" as wide for None."""
    return "-".rjust(int(spec.split(".")[0])) if x is None else format(x, spec)


def print_table(rows: List[dict]) -> None:
    """One line per row; FP8 rows (`bench_point_fp8`) add the speedups over bf16 and the quantization error."""
    fp8 = any(r["impl"] in ("moe-lab bf16", "moe-lab fp8") for r in rows)
    print(
        f"{'model':<15} {'T':>6} {'impl':<22} {'up ms':>8} {'down ms':>8} {'gemms ms':>9} {'layer ms':>9} "
        f"{'TFLOP/s':>8} {'TB/s':>6} {'%roof':>6} {'rel err':>8}"
        + (f" {'x gemms':>7} {'x layer':>7} {'quant err':>9}" if fp8 else "")
    )
    for r in rows:
        print(
            f"{r['model']:<15} {r['T']:>6} {r['impl']:<22} {fmt(r.get('up_ms'), '8.3f')} "
            f"{fmt(r.get('down_ms'), '8.3f')} {fmt(r.get('gemms_ms'), '9.3f')} {fmt(r.get('layer_ms'), '9.3f')} "
            f"{fmt(r.get('gemms_tflops'), '8.1f')} {fmt(r.get('gemms_tbps'), '6.2f')} "
            f"{fmt(r.get('pct_roofline'), '6.1f')} {fmt(r.get('rel_err'), '8.1e')}"
            + (
                f" {fmt(r.get('speedup_gemms'), '7.2f')} {fmt(r.get('speedup_layer'), '7.2f')} "
                f"{fmt(r.get('quant_err'), '9.1e')}"
                if fp8
                else ""
            )
            + (f"  ERROR {r['error'][:60]}" if r.get("error") else ""),
            flush=True,
        )


def _write(result: dict, out_dir: str, tag: str, env: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{tag}-{env['device'].replace(' ', '_')}-{env['date']}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    rows = result["rows"]
    keys = sorted({k for r in rows for k in r if k != "config"})
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return stem


def results_place(out_dir: str, tag: str, dtype) -> tuple:
    """(folder, tag) for results of `dtype`: bf16 ones as they always were (`out_dir`, `tag`), the others in
    a folder of their own with the dtype in the tag (`out_dir/fp8`, `tag-fp8`), out of the way of readers
    that take the newest `out_dir/*.json` as bf16 results (`moe_lab.workbook.viz.performance.load_results`)."""
    if dtype == torch.bfloat16:
        return out_dir, tag
    name = DTYPE_NAMES[dtype]
    return os.path.join(out_dir, name), f"{tag}-{name}"


def check_out_dir(out_dir: str, dtype=torch.bfloat16, name: str = "out_dir") -> str:
    """The folder `run` writes results of `dtype` to under `out_dir` (`results_place`), made now if missing.
    Raises ValueError, before any timing, where it cannot be: an empty name, a file, a folder that cannot be
    made or written. `name` names `out_dir` in the message ("--out")."""
    if not isinstance(out_dir, str) or not out_dir:
        raise ValueError(f"{name} must be a folder name, got {out_dir!r}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"{name} {out_dir} is a file; give a folder (the results are files in it)")
    folder, _ = results_place(out_dir, "", dtype)
    problem = folder_write_problem(folder)
    if problem:
        raise ValueError(f"{name} {out_dir}: cannot make or write the folder {folder} ({problem})")
    return folder


def run(
    models=DEFAULT_MODELS,
    tokens=DEFAULT_TOKENS,
    *,
    dtype=torch.bfloat16,
    out_dir: Optional[str] = None,
    peers: bool = True,
    tag: str = "bench",
) -> dict:
    """Run the benchmark, print the table, and write JSON and CSV to `out_dir` (if not None; results of a dtype
    other than bf16 to a folder of their own in it, see `results_place`). dtype=torch.float8_e4m3fn runs
    `bench_point_fp8` (moe-lab FP8 against moe-lab bf16; no peers) at each point, else `bench_point`.
    Raises ValueError before timing for a T below 1 or an `out_dir` it cannot write (`check_out_dir`)."""
    require_gpu_timing("moe-lab bench")
    fp8 = dtype == FP8_DTYPE
    if fp8:
        from ..capability import fp8_support

        support = fp8_support("cuda")
        if not support:
            raise RuntimeError(f"moe-lab bench --dtype fp8 refused: FP8 kernels cannot run here: {support.reason}")
    tokens = check_timed_tokens(tokens)
    if out_dir is not None:
        check_out_dir(out_dir, dtype)
        out_dir, tag = results_place(out_dir, tag, dtype)
    env = environment()
    ceilings = measure_ceilings()
    print(
        f"{env['device']} (sm_{env['capability'].replace('.', '')}), torch {env['torch']}, triton {env['triton']}, "
        f"{env['date']}"
    )
    print(
        f"ceilings: copy {ceilings['copy_tbps']:.2f} TB/s, read {ceilings['read_tbps']:.2f} TB/s, "
        f"bf16 matmul {ceilings['bf16_matmul_tflops']:.0f} TFLOP/s"
    )
    rows: List[dict] = []
    result = dict(environment=env, ceilings=ceilings, dtype=DTYPE_NAMES.get(dtype, str(dtype)), rows=rows)
    for name in models:
        preset = get_preset(name)
        for num_tokens in tokens:
            point = (
                bench_point_fp8(preset, num_tokens, ceilings)
                if fp8
                else bench_point(preset, num_tokens, ceilings, dtype=dtype, peers=peers)
            )
            print_table(point)
            rows += point
            if out_dir is not None:  # after every point: a stopped run keeps what it measured
                _write(result, out_dir, tag, env)
    if out_dir is not None:
        print(f"wrote {_write(result, out_dir, tag, env)}.json and .csv")
    return result
