"""Benchmarks on a GPU: moe-lab's GEMMs (pointer and TMA paths) against peers run in the same process.

For each model preset and token count T it times, as the median of CUDA-graph replays with L2 flushed
before each (`moe_lab.timing.graph_ms`; for both GEMMs together and for the layer, the least of ROUNDS such medians):
  - the up GEMM, the down GEMM and both together, for moe-lab pointer, moe-lab TMA and torch._grouped_mm;
    moe-lab's up GEMM is the one the layer runs: with its SwiGLU epilogue where the config fuses it
    (`GemmConfig.fuse_swiglu`), else the GEMM alone (the activation is then timed with the layer);
  - the whole layer: moe-lab `fused_moe` (align, activation and reduce included), torch._grouped_mm with
    the glue it needs (sort, gather, activation, scatter, reduce), and a per-expert PyTorch loop;
checks each against the float32 reference, and reports TFLOP/s, weight TB/s and % of the roofline set by
ceilings measured in the same run (device copy bandwidth, 8192^3 bf16 matmul).
Routing is uniform: each token picks k distinct experts at random, with softmax weights over its k logits,
so every implementation sees the same, typical expert load. Refuses to run under the interpreter.
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

from .activation import silu_and_mul
from .align import moe_align
from .configs import MoEConfig
from .grouped_matmul import grouped_matmul
from .layer import fused_moe
from .presets import MoEPreset, get_preset
from .reference import fused_moe_reference, relative_error
from .routing import uniform_routing
from .runtime import require_gpu_timing
from .timing import gemm_costs, graph_ms, measure_ceilings, median_ms
from .tuned import default_config

DEFAULT_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
DEFAULT_TOKENS = (1, 8, 64, 512, 4096, 16384)
ROUNDS = 3  # rounds of replays for the compared figures (both GEMMs, the layer), same for every implementation


def _sort_by_expert(topk_ids, num_experts):
    """Slots in expert order (stable) and the cumulative row ends per expert, as torch._grouped_mm takes them."""
    flat = topk_ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
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
        a = F.silu(gu[:, : two_i // 2]) * gu[:, two_i // 2:]
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


def bench_point(preset: MoEPreset, num_tokens: int, ceilings, *, dtype=torch.bfloat16,
                config: Optional[MoEConfig] = None, peers: bool = True, seed: int = 0) -> List[dict]:
    """Time every implementation at one (preset, T). Returns one row per implementation."""
    hs, w1, w2, _ = preset.build(num_tokens, dtype=dtype, device="cuda", seed=seed)
    tw, ti = uniform_routing(num_tokens, preset.num_experts, preset.top_k, seed=seed + 1)
    cfg = config or default_config(num_tokens, preset.num_experts, preset.top_k, preset.hidden_size,
                                   preset.intermediate_size, dtype)
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    experts_used = int(torch.unique(ti).numel())
    up_cost, down_cost = gemm_costs(preset, num_tokens, experts_used, hs.element_size())
    routing = moe_align(ti, preset.num_experts, cfg.block_size_m)
    base = dict(model=preset.name, T=num_tokens, E=preset.num_experts, top_k=preset.top_k, H=preset.hidden_size,
                I=preset.intermediate_size, dtype=str(dtype).replace("torch.", ""), experts_used=experts_used,
                roofline_gemms_ms=up_cost.roofline_ms(ceilings) + down_cost.roofline_ms(ceilings))
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
            fused = cfg.up.swiglu_epilogue
            gate_up = grouped_matmul(hs, w1, routing, cfg.up, gather_a=True, use_tma=use_tma, swiglu=fused)
            act = gate_up if fused else silu_and_mul(gate_up, routing=routing)
            out_k = torch.empty(num_tokens * preset.top_k, preset.hidden_size, dtype=dtype, device="cuda")
            up = lambda: grouped_matmul(hs, w1, routing, cfg.up, gather_a=True, out=gate_up, use_tma=use_tma,  # noqa: E731
                                        swiglu=fused)
            down = lambda: grouped_matmul(act, w2, routing, cfg.down, gather_a=False, scatter=True,  # noqa: E731
                                          topk_weights=tw, out=out_k, use_tma=use_tma)
            out = fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma)
            err = relative_error(out, ref)

            def both():
                up()
                down()
            row(impl, graph_ms(up), graph_ms(down), graph_ms(both, rounds=ROUNDS),
                graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=use_tma), rounds=ROUNDS), err,
                config=dict(up=cfg.up.to_dict(), down=cfg.down.to_dict()), swiglu_epilogue=fused)
        except (ValueError, RuntimeError) as exc:  # e.g. TMA refused on this device
            row(impl, None, None, None, None, None, error=str(exc))
    if peers and hasattr(torch, "_grouped_mm"):
        try:
            gemms, layer = _grouped_mm_peer(hs, w1, w2, tw, ti)
            row("torch._grouped_mm", None, None, graph_ms(gemms, rounds=ROUNDS), graph_ms(layer, rounds=ROUNDS),
                relative_error(layer(), ref))
        except RuntimeError as exc:
            row("torch._grouped_mm", None, None, None, None, None, error=str(exc)[:200])
    if peers and preset.num_experts * max(1, num_tokens // 4096) <= 256:
        loop = _loop_peer(hs, w1, w2, tw, ti)
        # It asks the host for each expert's rows, so it cannot be captured: timed eagerly.
        row("torch per-expert loop", None, None, None, median_ms(loop, rep_ms=50), relative_error(loop(), ref))
    del hs, w1, w2, ref
    torch.cuda.empty_cache()
    return rows


def environment() -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=now.date().isoformat(), time=now.strftime("%H:%M UTC"),
                capability=".".join(map(str, torch.cuda.get_device_capability())))


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows: List[dict]) -> None:
    print(f"{'model':<15} {'T':>6} {'impl':<22} {'up ms':>8} {'down ms':>8} {'gemms ms':>9} {'layer ms':>9} "
          f"{'TFLOP/s':>8} {'TB/s':>6} {'%roof':>6} {'rel err':>8}")
    for r in rows:
        print(f"{r['model']:<15} {r['T']:>6} {r['impl']:<22} {fmt(r['up_ms'], '8.3f')} {fmt(r['down_ms'], '8.3f')} "
              f"{fmt(r['gemms_ms'], '9.3f')} {fmt(r['layer_ms'], '9.3f')} {fmt(r.get('gemms_tflops'), '8.1f')} "
              f"{fmt(r.get('gemms_tbps'), '6.2f')} {fmt(r.get('pct_roofline'), '6.1f')} {fmt(r['rel_err'], '8.1e')}"
              + (f"  ERROR {r['error'][:60]}" if r.get("error") else ""), flush=True)


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


def run(models=DEFAULT_MODELS, tokens=DEFAULT_TOKENS, *, dtype=torch.bfloat16, out_dir: Optional[str] = None,
        peers: bool = True, tag: str = "bench") -> dict:
    """Run the benchmark, print the table, and write JSON and CSV to `out_dir` (if given)."""
    require_gpu_timing("moe-lab bench")
    env = environment()
    ceilings = measure_ceilings()
    print(f"{env['device']} (sm_{env['capability'].replace('.', '')}), torch {env['torch']}, triton {env['triton']}, "
          f"{env['date']}")
    print(f"ceilings: copy {ceilings['copy_tbps']:.2f} TB/s, read {ceilings['read_tbps']:.2f} TB/s, "
          f"bf16 matmul {ceilings['bf16_matmul_tflops']:.0f} TFLOP/s")
    rows: List[dict] = []
    result = dict(environment=env, ceilings=ceilings, rows=rows)
    for name in models:
        preset = get_preset(name)
        for num_tokens in tokens:
            point = bench_point(preset, num_tokens, ceilings, dtype=dtype, peers=peers)
            print_table(point)
            rows += point
            if out_dir:  # after every point: a stopped run keeps what it measured
                _write(result, out_dir, tag, env)
    if out_dir:
        print(f"wrote {_write(result, out_dir, tag, env)}.json and .csv")
    return result
