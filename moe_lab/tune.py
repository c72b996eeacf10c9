"""`moe-lab tune`: search launch configs of the two grouped GEMMs per model shape and token count.

For each preset and T it times (CUDA-graph replays, L2 flushed before each, median) the up and the down
GEMM over a candidate set that depends on the expected rows per expert (T*k/E): BLOCK_SIZE_M shared by
both GEMMs, then BLOCK_SIZE_N/K, GROUP_SIZE_M, num_warps, num_stages and the load path (TMA or pointer)
per GEMM. Candidates whose pipeline would not fit the device's shared memory (read from the device) are
pruned; any that still fail to compile are skipped. The heuristic default is timed too, so the table
shows how far it is from tuned. Results go to moe_lab/configs/<device>__triton-<version>.json (see
`moe_lab.tuned`). GPU only.
"""
from __future__ import annotations

import itertools
import json
import os
from typing import Dict, Iterable, List, Optional

import torch
import triton

from .activation import silu_and_mul
from .align import moe_align
from .bench import graph_ms
from .capability import shared_memory_limit
from .configs import GemmConfig, MoEConfig, default_config
from .grouped_matmul import grouped_matmul
from .presets import get_preset
from .runtime import require_gpu_timing
from .tuned import config_path, shape_key

DEFAULT_TOKENS = (1, 8, 64, 512, 4096, 16384)


def candidates(rows_per_expert: float, itemsize: int, smem_limit: int) -> Dict[int, List[GemmConfig]]:
    """Candidate configs by BLOCK_SIZE_M for a shape with this many rows per expert."""
    if rows_per_expert <= 8:
        space = dict(M=[16], NK=[(32, 256), (64, 128), (64, 256), (128, 128)], G=[1], W=[4], S=[3, 4, 5], T=[True, False])
    elif rows_per_expert <= 48:
        space = dict(M=[16, 32], NK=[(64, 128), (128, 64), (128, 128)], G=[1], W=[4], S=[3, 4], T=[True, False])
    elif rows_per_expert <= 512:
        space = dict(M=[64, 128], NK=[(64, 128), (128, 64), (128, 128), (256, 64)], G=[8], W=[4, 8], S=[3, 4], T=[True])
    else:
        space = dict(M=[64, 128], NK=[(128, 64), (256, 64), (128, 128)], G=[8, 16], W=[8], S=[3, 4], T=[True])
    out: Dict[int, List[GemmConfig]] = {}
    for m, (n, k), g, w, s, t in itertools.product(space["M"], space["NK"], space["G"], space["W"], space["S"], space["T"]):
        cfg = GemmConfig(m, n, k, g, w, s, t)
        if cfg.shared_memory_bytes(itemsize) <= smem_limit:
            out.setdefault(m, []).append(cfg)
    return out


def _time(fn) -> Optional[float]:
    try:
        return graph_ms(fn, rep_ms=20)
    except (RuntimeError, ValueError, triton.runtime.errors.OutOfResources) as exc:  # e.g. too many registers
        print(f"    skipped a config: {type(exc).__name__}: {str(exc)[:100]}")
        return None


def tune_point(preset, num_tokens: int, dtype=torch.bfloat16, smem_limit: Optional[int] = None) -> dict:
    """Best MoEConfig for one (preset, T), with its time and the heuristic default's time (ms)."""
    smem_limit = smem_limit or shared_memory_limit()
    hs, w1, w2, (tw, ti) = preset.build(num_tokens, dtype=dtype, device="cuda")
    e, k, h, i = preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size
    out_k = torch.empty(num_tokens * k, h, dtype=dtype, device="cuda")

    def gemm_times(up: GemmConfig, down: GemmConfig, routing, gate_up, act):
        t_up = _time(lambda: grouped_matmul(hs, w1, routing, up, gather_a=True, out=gate_up, use_tma=up.tma))
        t_down = _time(lambda: grouped_matmul(act, w2, routing, down, gather_a=False, scatter=True,
                                              topk_weights=tw, out=out_k, use_tma=down.tma))
        return t_up, t_down

    def buffers(block_m):
        routing = moe_align(ti, e, block_m)
        gate_up = grouped_matmul(hs, w1, routing, GemmConfig(block_m, 64, 64, 1, 4, 3), gather_a=True)
        return routing, gate_up, silu_and_mul(gate_up, num_rows=routing.num_tokens_post_padded)

    heuristic = default_config(num_tokens, e, k, h, i, dtype, tuned=False)
    h_up, h_down = gemm_times(heuristic.up, heuristic.down, *buffers(heuristic.block_size_m))
    best = None
    space = candidates(num_tokens * k / e, hs.element_size(), smem_limit)
    space.setdefault(heuristic.block_size_m, []).extend([heuristic.up, heuristic.down])  # never worse than it
    for block_m, cfgs in space.items():
        routing, gate_up, act = buffers(block_m)
        ups, downs = [], []
        for cfg in cfgs:
            t_up, t_down = gemm_times(cfg, cfg, routing, gate_up, act)
            if t_up is not None:
                ups.append((t_up, cfg))
            if t_down is not None:
                downs.append((t_down, cfg))
        if ups and downs:
            (t_up, up), (t_down, down) = min(ups, key=lambda x: x[0]), min(downs, key=lambda x: x[0])
            if best is None or t_up + t_down < best["ms"]:
                best = dict(ms=t_up + t_down, up_ms=t_up, down_ms=t_down, config=MoEConfig(up, down))
    del hs, w1, w2
    torch.cuda.empty_cache()
    heuristic_ms = (h_up or float("nan")) + (h_down or float("nan"))
    return dict(best, heuristic_ms=heuristic_ms, heuristic=heuristic)


def run(models: Iterable[str], tokens: Iterable[int], *, dtype=torch.bfloat16, path: Optional[str] = None) -> str:
    """Tune every (model, T), merge into the device's JSON table and write it. Returns the path."""
    require_gpu_timing("moe-lab tune")
    from tqdm.auto import tqdm
    device, version = torch.cuda.get_device_name(), triton.__version__
    path = path or config_path(device, version)
    table = {"device": device, "triton": version, "shapes": {}}
    if os.path.exists(path):
        with open(path) as f:
            table = json.load(f)
    smem = shared_memory_limit()
    points = [(m, t) for m in models for t in tokens]
    print(f"tuning {len(points)} points on {device} (shared memory per program: {smem} bytes)")
    for model, num_tokens in tqdm(points, desc="moe-lab tune"):
        preset = get_preset(model)
        r = tune_point(preset, num_tokens, dtype, smem)
        key = shape_key(preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size, dtype)
        table["shapes"].setdefault(key, {})[str(num_tokens)] = {
            "up": r["config"].up.to_dict(), "down": r["config"].down.to_dict(),
            "ms": round(r["ms"], 4), "heuristic_ms": round(r["heuristic_ms"], 4)}
        tqdm.write(f"{model:<18} T={num_tokens:<6} tuned {r['ms']:.3f} ms (up {r['up_ms']:.3f}, down {r['down_ms']:.3f})"
                   f"  heuristic {r['heuristic_ms']:.3f} ms ({r['heuristic_ms'] / r['ms']:.2f}x)  "
                   f"up={r['config'].up}  down={r['config'].down}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:  # after every point: a stopped run keeps what it found
            json.dump(table, f, indent=1, sort_keys=True)
    return path
