"""`moe-lab tune`: search launch configs of the two grouped GEMMs per model shape and token count.

For each preset and T it times (CUDA-graph replays, L2 flushed before each, median) the up and the down
GEMM over a candidate set that depends on the expected rows per expert (T*k/E): BLOCK_SIZE_M shared by
both GEMMs, then BLOCK_SIZE_N/K, GROUP_SIZE_M, num_warps, num_stages, the load path (TMA or pointer),
tail tiles on or off, from 64 rows per expert on the persistent kernel or one program per tile (with
128-row tiles also folded tails of 64 rows, `GemmConfig.fold_tail_rows`). The up GEMM is timed as the
layer runs it: with its SwiGLU epilogue (`GemmConfig.fuse_swiglu`). That switch is not tuned per point: a
token's output would then round differently alone and in a batch (see the README's batch invariance).
Candidates whose pipeline
would not fit the device's shared memory (read from the device) are pruned; any that still fail to
compile are skipped. Kernels are compiled ahead in parallel worker processes (Triton's on-disk cache is
shared), so the search costs timing, not compiling. The heuristic default is timed too, so the table
shows how far it is from tuned. Results go to moe_lab/configs/<device>__triton-<version>.json, with the
device's compute capability (see `moe_lab.tuned`). GPU only. With dtype float8_e4m3fn (`--dtype fp8`):
FP8 weights with [128, 128] block scales, the up GEMM timed with the quantization of its output, candidates
of BLOCK_SIZE_K = 128 (one scale block per K step) and at decode also 256 (two blocks, one dot each); their
entries have keys of their own (`...,float8_e4m3fn`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import multiprocessing
import os
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import triton

from ..activation import silu_and_mul
from ..align import moe_align
from ..capability import shared_memory_limit
from ..configs import GemmConfig, MoEConfig
from ..gemm import FP8_DTYPE, grouped_matmul
from ..layer import Fp8Weights
from ..presets import SWEEP_TOKENS, get_preset
from ..quantize import quantize_activations_fp8, quantize_weights_fp8
from ..routing import uniform_routing
from ..runtime import require_gpu_timing
from ..tuned import FORMAT_VERSION, config_path, default_config, shape_key
from .timing import check_timed_tokens, folder_write_problem, graph_ms

DEFAULT_TOKENS = SWEEP_TOKENS
FP8_BLOCK = (128, 128)  # DeepSeek-V3's weight blocks: what FP8 configs are tuned for
Candidates = Dict[int, Tuple[List[GemmConfig], List[GemmConfig]]]


def candidates(rows_per_expert: float, itemsize: int, smem_limit: int) -> Candidates:
    """(up, down) candidate configs by BLOCK_SIZE_M for a shape with this many rows per expert.
    Block shapes (M, N, K, num_warps) are the ones that won somewhere on an H200; tiles of 128 x 256 want
    8 warps (the fp32 accumulator alone is 256 registers per thread with 4)."""
    if rows_per_expert <= 8:  # decode: stream the weights, many small-M programs
        shapes = [(16, n, k, 4) for n, k in ((32, 256), (64, 128), (64, 256), (128, 128))]
        space = dict(G=[1], S=[3, 4, 5], T=[True, False], tail=[True])
    elif rows_per_expert <= 48:
        shapes = [(m, n, k, 4) for m in (16, 32, 64) for n, k in ((64, 128), (128, 64), (128, 128), (64, 256))]
        space = dict(G=[1], S=[3, 4], T=[True], tail=[True, False])
    elif rows_per_expert <= 512:
        shapes = [(128, 128, 64, 4), (128, 128, 64, 8), (128, 256, 64, 8), (128, 128, 128, 4), (128, 128, 128, 8)]
        space = dict(G=[8], S=[3, 4], T=[True], tail=[True, False], persistent=[False, True])
    else:  # prefill: matrix-bound, large tiles
        shapes = [(128, 256, 64, 8), (128, 128, 128, 8), (256, 128, 64, 8)]
        space = dict(G=[8, 16], S=[3, 4], T=[True], tail=[True, False], persistent=[False, True])
    if itemsize == 1:  # float8, block-scaled: a dot per 128-channel scale block; two float32 tiles in
        # registers (the sum and one step's product), so no 128 x 256 tiles (docs/experiments.md).
        # BLOCK_SIZE_N = 256 gives the up GEMM 128 output columns, one activation group, which its epilogue
        # quantizes itself (no quantization launch): the tuner weighs that against the narrower tiles.
        # At decode also steps of two scale blocks (BLOCK_SIZE_K = 256, one dot each): a step of one block
        # loads 128-byte rows, half what a bf16 step of 64 channels does.
        if rows_per_expert <= 8:
            shapes = [(16, n, k, 4) for n in (32, 64, 128, 256) for k in (128, 256)]
        elif rows_per_expert <= 48:
            shapes = (
                [(m, n, 128, 4) for m in (16, 32, 64) for n in (64, 128)]
                + [(16, 256, 128, 4), (32, 256, 128, 4)]
                + [(m, n, 256, 4) for m in (16, 32) for n in (64, 128)]
            )
        else:
            shapes = [(64, 128, 128, 4), (64, 256, 128, 8), (128, 128, 128, 8), (64, 64, 128, 4)]
    out: Candidates = {}
    for (m, n, k, w), g, s, t, tail, persistent in itertools.product(
        shapes, space["G"], space["S"], space["T"], space["tail"], space.get("persistent", [False])
    ):
        if (m == 16 or persistent) and not tail:  # no tail tiles below 16 rows or in the persistent kernel:
            continue  # the same kernel either way
        # Folded tails of half a 128-row block, one program per tile, float operands (a second float32 tile
        # of 64 rows): where experts' last blocks are often small, as at 128 rows per expert.
        folds = [0, 64] if m == 128 and rows_per_expert > 48 and tail and not persistent and itemsize > 1 else [0]
        for fold in folds:
            cfg = GemmConfig(m, n, k, g, w, s, t, tail_tiles=tail, persistent=persistent, fold_tail_rows=fold)
            if cfg.shared_memory_bytes(itemsize) <= smem_limit:
                ups, downs = out.setdefault(m, ([], []))
                ups.append(cfg)
                downs.append(cfg)
    return out


def _time(fn, rep_ms: int) -> Optional[float]:
    try:
        return graph_ms(fn, rep_ms=rep_ms)
    except (RuntimeError, ValueError, triton.runtime.errors.OutOfResources) as exc:  # e.g. too many registers
        print(f"    skipped a config: {type(exc).__name__}: {str(exc)[:100]}")
        return None


class _Problem:
    """One (preset, T) on the GPU: inputs, and the up/down GEMM launches for a config."""

    def __init__(self, preset, num_tokens: int, dtype, num_experts: Optional[int] = None):
        e = num_experts or preset.num_experts
        self.top_k, self.h, self.i = preset.top_k, preset.hidden_size, preset.intermediate_size
        self.fp8 = dtype == FP8_DTYPE  # float8 weights with [128, 128] block scales, bf16 hidden states
        float_dtype = torch.bfloat16 if self.fp8 else dtype
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.hs = torch.randn(num_tokens, self.h, generator=gen, device="cuda").to(float_dtype)
        w1 = (torch.rand(e, 2 * self.i, self.h, generator=gen, device="cuda") - 0.5).to(float_dtype) * self.h**-0.5
        w2 = (torch.rand(e, self.h, self.i, generator=gen, device="cuda") - 0.5).to(float_dtype) * self.i**-0.5
        if self.fp8:
            (self.w1, w1_scale), (self.w2, w2_scale) = (quantize_weights_fp8(w, FP8_BLOCK) for w in (w1, w2))
            self.scales = Fp8Weights(w1_scale, w2_scale, FP8_BLOCK, None, None)
            self.x, self.x_scale = quantize_activations_fp8(self.hs, group_size=FP8_BLOCK[1])
        else:
            self.w1, self.w2, self.x = w1, w2, self.hs
        # A routing sample of its own: configs must not be fitted to the one the benchmark times.
        self.tw, self.ti = uniform_routing(num_tokens, e, self.top_k, seed=7)
        self.e = e
        self.out_k = torch.empty(num_tokens * self.top_k, self.h, dtype=float_dtype, device="cuda")
        self._buffers = {}

    def buffers(self, block_m: int):
        if block_m not in self._buffers:
            routing = moe_align(self.ti, self.e, block_m)
            if self.fp8:  # the up GEMM's float32 output, and a float8 input for the down GEMM
                act = torch.randn(routing.max_num_tokens_padded, self.i, device="cuda")
                self._buffers[block_m] = routing, None, act, quantize_activations_fp8(act, group_size=FP8_BLOCK[1])
            else:
                gate_up = grouped_matmul(self.hs, self.w1, routing, GemmConfig(block_m, 64, 64, 1, 4, 3), gather_a=True)
                self._buffers[block_m] = routing, gate_up, silu_and_mul(gate_up, routing=routing), None
        return self._buffers[block_m]

    def up(self, cfg: GemmConfig):
        """The up projection as the layer runs it with `cfg`: fused, or the GEMM and then the activation;
        in FP8 with the quantization of its output for the down GEMM (in its epilogue, or a kernel after)."""
        routing, gate_up, act, _ = self.buffers(cfg.BLOCK_SIZE_M)
        if self.fp8:
            scales = dict(a_scale=self.x_scale, w_scale=self.scales.w1_scale, block_shape=FP8_BLOCK)
            if self.scales.quantized_by_epilogue(cfg):
                return lambda: grouped_matmul(
                    self.x,
                    self.w1,
                    routing,
                    cfg,
                    gather_a=True,
                    swiglu=True,
                    out_dtype=FP8_DTYPE,
                    use_tma=cfg.tma,
                    **scales,
                )

            def up_then_quantize():
                grouped_matmul(
                    self.x,
                    self.w1,
                    routing,
                    cfg,
                    gather_a=True,
                    swiglu=cfg.swiglu_epilogue,
                    out=act,
                    use_tma=cfg.tma,
                    **scales,
                )
                quantize_activations_fp8(act, group_size=FP8_BLOCK[1], num_rows=routing.num_tokens_post_padded)

            return up_then_quantize
        if cfg.swiglu_epilogue:
            return lambda: grouped_matmul(
                self.hs, self.w1, routing, cfg, gather_a=True, swiglu=True, out=act, use_tma=cfg.tma
            )

        def unfused():
            grouped_matmul(self.hs, self.w1, routing, cfg, gather_a=True, out=gate_up, use_tma=cfg.tma)
            silu_and_mul(gate_up, routing=routing, out=act)

        return unfused

    def down(self, cfg: GemmConfig):
        routing, _, act, act_fp8 = self.buffers(cfg.BLOCK_SIZE_M)
        if self.fp8:
            (act, act_scale), scales = act_fp8, dict(w_scale=self.scales.w2_scale, block_shape=FP8_BLOCK)
            scales["a_scale"] = act_scale
        else:
            scales = {}
        return lambda: grouped_matmul(
            act,
            self.w2,
            routing,
            cfg,
            gather_a=False,
            scatter=True,
            topk_weights=self.tw,
            out=self.out_k,
            use_tma=cfg.tma,
            **scales,
        )


def tune_point(preset, num_tokens: int, dtype=torch.bfloat16, smem_limit: Optional[int] = None) -> dict:
    """Best MoEConfig for one (preset, T), with its time and the heuristic default's time (ms)."""
    smem_limit = smem_limit or shared_memory_limit()
    problem = _Problem(preset, num_tokens, dtype)
    e, k = preset.num_experts, preset.top_k
    rep_ms = 20 if num_tokens * k / e <= 512 else 60  # several replays even of a 15 ms GEMM
    heuristic = default_config(num_tokens, e, k, preset.hidden_size, preset.intermediate_size, dtype, tuned=False)
    best = None
    space = candidates(num_tokens * k / e, dtype.itemsize, smem_limit)
    ups, downs = space.setdefault(heuristic.block_size_m, ([], []))
    ups.append(heuristic.up)  # never worse than the heuristic
    downs.append(heuristic.down)
    # The heuristic is timed in the same pass as the candidates: timed apart, on a cooler GPU, it once
    # measured 7 % faster than the very same config in the loop.
    timed = {"up": {}, "down": {}}
    for block_m, (up_cfgs, down_cfgs) in space.items():
        for gemm, cfgs, launch in (("up", up_cfgs, problem.up), ("down", down_cfgs, problem.down)):
            for c in dict.fromkeys(cfgs):  # each config once, in order
                if (t := _time(launch(c), rep_ms)) is not None:
                    timed[gemm][c] = t
        ups = [(t, c) for c, t in timed["up"].items() if c.BLOCK_SIZE_M == block_m]
        downs = [(t, c) for c, t in timed["down"].items() if c.BLOCK_SIZE_M == block_m]
        if ups and downs:
            (t_up, up), (t_down, down) = min(ups, key=lambda x: x[0]), min(downs, key=lambda x: x[0])
            if best is None or t_up + t_down < best["ms"]:
                best = dict(ms=t_up + t_down, up_ms=t_up, down_ms=t_down, config=MoEConfig(up, down))
    del problem
    torch.cuda.empty_cache()
    heuristic_ms = timed["up"].get(heuristic.up, float("nan")) + timed["down"].get(heuristic.down, float("nan"))
    return dict(best, heuristic_ms=heuristic_ms, heuristic=heuristic)


def _compile_configs(model: str, dtype_name: str, up_cfgs: List[dict], down_cfgs: List[dict]) -> int:
    """Worker process: launch each config once on a small problem of the model's shape, which compiles
    it into Triton's on-disk cache. Returns how many compiled."""
    preset, dtype = get_preset(model), getattr(torch, dtype_name)
    problem = _Problem(preset, 64, dtype, num_experts=preset.top_k)
    done = 0
    for cfgs, launch in ((up_cfgs, problem.up), (down_cfgs, problem.down)):
        for c in cfgs:
            try:
                launch(GemmConfig(**c))()
                done += 1
            except Exception:  # noqa: BLE001 - the timing pass reports configs that fail
                pass
    torch.cuda.synchronize()
    return done


def precompile(points: List[Tuple[str, int]], dtype=torch.bfloat16, workers: Optional[int] = None) -> int:
    """Compile every candidate of `points` in parallel processes. Kernels are specialized on shapes only
    through divisibility, so a small problem with the model's N and K compiles what the real one runs."""
    smem = shared_memory_limit()
    jobs = {}
    for model, num_tokens in points:
        preset = get_preset(model)
        space = candidates(num_tokens * preset.top_k / preset.num_experts, dtype.itemsize, smem)
        ups, downs = jobs.setdefault(model, ({}, {}))
        for up_cfgs, down_cfgs in space.values():
            ups.update({c: None for c in up_cfgs})
            downs.update({c: None for c in down_cfgs})
    workers = workers or max(1, min(16, (os.cpu_count() or 2) - 1))
    tasks = []
    for model, (ups, downs) in jobs.items():
        for part in range(workers):
            u = [c.to_dict() for c in list(ups)[part::workers]]
            d = [c.to_dict() for c in list(downs)[part::workers]]
            if u or d:
                tasks.append((model, str(dtype).replace("torch.", ""), u, d))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return sum(pool.map(_compile_configs, *zip(*tasks)))


def open_table(path: str, device: str, version: str, name: str = "path") -> dict:
    """The table that `run` tunes into and writes at `path`: the file's own where it exists (points tuned
    again replace their entries, the others stay), else a new one for `device` and Triton `version`.
    Raises ValueError, before any tuning, where `path` cannot be that table: empty, a directory, a folder
    that cannot be made or written, a file that is not a tuned table (JSON with "shapes") of this format,
    or a table of another device or Triton version (its fields would then say that device or version while
    its entries are this one's timings: give another file). `name` names `path` in the message ("--out")."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{name} must be a JSON file name, got {path!r}")
    if os.path.isdir(path):
        raise ValueError(f"{name} {path} is a directory; give a .json file, e.g. {os.path.join(path, 'my-table.json')}")
    folder = os.path.dirname(os.path.abspath(path))
    problem = folder_write_problem(folder)
    if problem:
        raise ValueError(f"{name} {path}: cannot write a file in {folder} ({problem})")
    if not os.path.exists(path):
        return {"device": device, "triton": version, "shapes": {}}
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{name} {path} exists and is not a tuned table ({type(exc).__name__}: {exc})") from None
    if not isinstance(table, dict) or not isinstance(table.get("shapes"), dict):
        raise ValueError(f'{name} {path} exists and is not a tuned table (JSON without a "shapes" object)')
    if table.get("format", 1) != FORMAT_VERSION:
        raise ValueError(
            f"{name} {path} is a table of format {table.get('format')!r}; this moe-lab writes format "
            f"{FORMAT_VERSION}: give another file"
        )
    theirs, ours = (table.get("device"), table.get("triton")), (device, version)
    if None in theirs:
        raise ValueError(f'{name} {path} is a table without its "device" and "triton" fields: give another file')
    if theirs != ours:
        raise ValueError(
            f"{name} {path} is the table of {theirs[0]} with Triton {theirs[1]}; this is {device} with Triton "
            f"{version}: a table holds the timings of one device and Triton version, so give another file"
        )
    if not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path} exists and is not writable")
    return table


def run(models: Iterable[str], tokens: Iterable[int], *, dtype=torch.bfloat16, path: Optional[str] = None) -> str:
    """Tune every (model, T), merge into the device's JSON table (or `path`'s) and write it. Returns the path.
    Raises ValueError before tuning where `path` cannot be written or is another table (`open_table`)."""
    require_gpu_timing("moe-lab tune")

    device, version = torch.cuda.get_device_name(), triton.__version__
    tokens = check_timed_tokens(tokens)
    path = path if path is not None else config_path(device, version)
    table = open_table(path, device, version)
    # The compute capability lets devices of the same architecture fall back to this table (moe_lab.tuned);
    # null on ROCm/HIP, whose numbers are not CUDA capabilities (those tables match by device name only).
    capability = None if getattr(torch.version, "hip", None) else list(torch.cuda.get_device_capability())
    table["capability"] = capability
    table["format"] = FORMAT_VERSION
    smem = shared_memory_limit()
    points = [(m, t) for m in models for t in tokens]
    print(f"tuning {len(points)} points on {device} (shared memory per program: {smem} bytes)")
    print(f"compiled {precompile(points, dtype)} kernels ahead, in parallel", flush=True)
    for done, (model, num_tokens) in enumerate(points, 1):
        preset = get_preset(model)
        r = tune_point(preset, num_tokens, dtype, smem)
        key = shape_key(preset.num_experts, preset.top_k, preset.hidden_size, preset.intermediate_size, dtype)
        table["shapes"].setdefault(key, {})[str(num_tokens)] = {
            "up": r["config"].up.to_dict(),
            "down": r["config"].down.to_dict(),
            "ms": round(r["ms"], 4),
            "heuristic_ms": round(r["heuristic_ms"], 4),
        }
        print(
            f"[{done}/{len(points)}] {model:<18} T={num_tokens:<6}"
            f" tuned {r['ms']:.3f} ms (up {r['up_ms']:.3f}, down {r['down_ms']:.3f})"
            f"  heuristic {r['heuristic_ms']:.3f} ms ({r['heuristic_ms'] / r['ms']:.2f}x)  "
            f"up={r['config'].up}  down={r['config'].down}",
            flush=True,
        )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:  # after every point: a stopped run keeps what it found
            json.dump(table, f, indent=1, sort_keys=True)
    return path
