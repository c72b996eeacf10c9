"""The launches a GPU run of moe_lab makes, as workloads: calls of the package's public launchers on
meta tensors at real model shapes (no memory, no values; Triton sees the dtypes, shapes, strides and
alignment of a GPU run). Each workload is (label, callable); `compile_only` turns the kernel launches in
it into compiles for the fake GPU. Identical specializations compile once, whoever launches them.

Covered (per target; sm_80 takes pointer loads, sm_90/sm_100 TMA where the tensors allow):
- bf16, the dtype of real deployments and of the tuned tables: the heuristic config
  (`default_config(..., tuned=False)`) of every preset at T = 1, 8, 64, 512, 4096, 16384, which reaches
  every rows-per-expert rule, every tile size;
- every entry of every tuned table in moe_lab/configs/*.json (up and down GemmConfigs with their
  tma / tail_tiles switches) at its shape, dtype and token bucket (FP8 entries as block-scaled
  [128, 128] layers, refused below sm_89);
- at T = 1 and 16384 (the smallest and the largest tile of the rules): bf16 with use_tma=False (pointer
  loads where TMA is available), bf16 with the activation unfused (`fuse_swiglu=False`), bf16 through the
  persistent kernel (`persistent=True`), bf16 with folded tails of half a block (`fold_tail_rows`, where
  BLOCK_SIZE_M >= 32; the tuned tables' folds are covered below too),
  fp16, fp32 at full precision (matmul precision "highest", the default:
  FMA dots, with tiles of their own) and fp32 with TF32 tensor cores ("high");
- an odd shape (H = 511: rows not 16-byte aligned so w1 goes by pointer, ragged K, N = 511), bf16 and
  fp32 at T = 1 and 4096;
- expert parallelism (expert_map) at decode and prefill, and int64 topk_ids, each preset, bf16;
- moe_align at its limits (1 and 4096 experts), silu_and_mul with and without routing,
  permute_tokens and topk_reduce on their own, each dtype;
- quantize_activations_fp8 (FP8 e4m3): per token group (128) at every preset's H and I, bf16, and at
  DeepSeek-V3's H in fp16 and fp32; per token, static and dynamic per tensor, with a num_rows bound, and a
  transposed input, bf16. Not on sm_80: Triton has no float8e4nv there ("fp8e4nv not supported"), so
  the workload checks instead that the launcher refuses (RuntimeError, as `fp8_support` says).
- FP8 w8a8 layers (`fp8_layer_workloads`): block-scaled DeepSeek-V3 at each fp8 tile rule (and by pointer,
  persistent, with the quantizing epilogue, with [64, 128] blocks), per-channel Qwen3, per-tensor Mixtral
  with static activation scales; refused below sm_89 likewise.
- the warp-specialized Gluon FP8 GEMM pair (`gluon_fp8_workloads`) at DeepSeek-V3's shape, and its up GEMM with the
  SwiGLU epilogue as `fused_moe` runs it (float8 output with its scales) and with gpt-oss's swigluoai: compiled
  for sm_90 under a Triton with Gluon's warp_specialize, refused (with `gluon_fp8_support`'s reason) elsewhere.
- expert kinds (`expert_kind_workloads`) at gpt-oss-20b's shape (E=32, k=4, H=2880, I=2880), bf16: gpt-oss's
  clamped SwiGLU on interleaved rows with both biases at T = 1, 64, 4096 (and by pointer, unfused through
  silu_and_mul, persistent, FP8 block-scaled), the other two activation names (swigluoai in halves, silu
  interleaved), and a layer with shared experts (DeepSeek-V2-Lite's: 2 of I = 1408 at H = 2048).

Cut, to keep a cold run of all four Tritons on two cores at a few minutes (compiling every rule in every
dtype tripled it; a 128x256 fp32 FMA tile alone took 20 to 50 s):
- fp16 and fp32 at the two extreme token counts only, for the presets with top_k 2 and 8 (top_k only
  sets an integer divide); the middle rules differ from them in tile size only, which bf16 covers;
- the odd shape and the int64/expert_map runs at fewer token counts (their point is masks, strides and
  index dtypes, not tiles); no fp16 odd shape (it masks and aligns like bf16).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from dataclasses import replace
from typing import Callable, List, Tuple

import torch

import moe_lab
from moe_lab import GemmConfig, MoEConfig

Workload = Tuple[str, Callable[[], object]]
META = torch.device("meta")
TOKENS = (1, 8, 64, 512, 4096, 16384)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CONFIG_DIR = os.path.join(os.path.dirname(moe_lab.__file__), "configs")


def _empty(*shape, dtype):
    return torch.empty(shape, dtype=dtype, device=META)


@contextlib.contextmanager
def matmul_precision(precision: str):
    """torch's float32 matmul precision within: the layer and the heuristic read it ("highest" means
    full-precision FMA dots, "high" TF32 tensor cores)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def heuristic(num_tokens, num_experts, top_k, hidden, inter, dtype, precision="highest") -> MoEConfig:
    """The heuristic config (no tuned table) a layer call would get, under that matmul precision."""
    with matmul_precision(precision):
        return moe_lab.default_config(num_tokens, num_experts, top_k, hidden, inter, dtype, tuned=False)


def layer_call(
    num_tokens,
    num_experts,
    top_k,
    hidden,
    inter,
    dtype,
    config,
    *,
    use_tma="auto",
    expert_map_experts=None,
    ids_dtype=torch.int32,
    precision="highest",
    layer_kwargs: Callable[[], dict] = dict,
) -> Callable[[], object]:
    """fused_moe on meta tensors of this shape. `expert_map_experts`: E_global, with E = num_experts local.
    `layer_kwargs`: makes more keyword arguments of the call (meta tensors made when it runs)."""

    def run():
        hs = _empty(num_tokens, hidden, dtype=dtype)
        w1 = _empty(num_experts, 2 * inter, hidden, dtype=dtype)
        w2 = _empty(num_experts, hidden, inter, dtype=dtype)
        weights = _empty(num_tokens, top_k, dtype=torch.float32)
        ids = _empty(num_tokens, top_k, dtype=ids_dtype)
        emap = _empty(expert_map_experts, dtype=torch.int32) if expert_map_experts else None
        with matmul_precision(precision):
            moe_lab.fused_moe(
                hs, w1, w2, weights, ids, config=config, use_tma=use_tma, expert_map=emap, **layer_kwargs()
            )

    return run


def _dedupe(workloads: List[Tuple[tuple, str, Callable]]) -> List[Workload]:
    """Drop workloads whose (shape, dtype, config, switches) repeat: they would launch the same kernels."""
    seen, out = set(), []
    for key, label, fn in workloads:
        if key not in seen:
            seen.add(key)
            out.append((label, fn))
    return out


def heuristic_workloads() -> List[Workload]:
    """bf16 (TMA where available): every preset and token count, so every rule of the heuristic. The
    rest at T = 1 and 16384, the smallest and the largest tile of the rules: bf16 with pointer loads (use_tma=False),
    fp16, and fp32 both at full precision (the
    default "highest": FMA dots, tiles of their own) and with TF32 tensor cores ("high")."""
    wl = []
    for p in moe_lab.PRESETS.values():
        shape = (p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
        for t in TOKENS:
            for dname, dtype in DTYPES.items():
                runs = [("auto", "highest")] if dtype == torch.bfloat16 else []
                if t in (TOKENS[0], TOKENS[-1]) and (dtype == torch.bfloat16 or p.top_k in (2, 8)):
                    # top_k only sets an integer divide: k = 2 and 8 stand for k = 4 beyond bf16
                    runs += {
                        torch.bfloat16: [(False, "highest")],
                        torch.float16: [("auto", "highest")],
                        torch.float32: [("auto", "highest"), ("auto", "high")],
                    }[dtype]
                for use_tma, precision in runs:
                    cfg = heuristic(t, *shape, dtype, precision)
                    label = (
                        f"heuristic {p.name} {dname} T={t}"
                        + (f" matmul precision {precision}" if dtype == torch.float32 else "")
                        + ("" if use_tma == "auto" else " use_tma=False")
                    )
                    wl.append(
                        (
                            (p.name, dname, cfg, precision, use_tma),
                            label,
                            layer_call(t, *shape, dtype, cfg, use_tma=use_tma, precision=precision),
                        )
                    )
            if t in (TOKENS[0], TOKENS[-1]):  # the up GEMM without its SwiGLU epilogue; the persistent kernel
                base = heuristic(t, *shape, torch.bfloat16)
                switches = [
                    ("fuse_swiglu=False", MoEConfig(replace(base.up, fuse_swiglu=False), base.down)),
                    ("persistent", MoEConfig(replace(base.up, persistent=True), replace(base.down, persistent=True))),
                ]
                if base.block_size_m >= 32:  # folded tails of half a block (not below 16 rows)
                    half = base.block_size_m // 2
                    switches.append(
                        (
                            f"fold_tail_rows={half}",
                            MoEConfig(replace(base.up, fold_tail_rows=half), replace(base.down, fold_tail_rows=half)),
                        )
                    )
                for switch, cfg in switches:
                    wl.append(
                        (
                            (p.name, "bfloat16", cfg),
                            f"heuristic {p.name} bfloat16 T={t} {switch}",
                            layer_call(t, *shape, torch.bfloat16, cfg),
                        )
                    )
    return _dedupe(wl)


def _failing(error: Exception) -> Callable[[], object]:
    def run():
        raise error

    return run


def tuned_workloads() -> List[Workload]:
    """Every entry of every tuned table, at its shape ("E=..,k=..,H=..,I=..,dtype") and token bucket. An
    entry that does not parse becomes a workload that fails with the reason."""
    wl = []
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json"))):
        table = os.path.basename(path)
        try:
            with open(path) as f:
                shapes = json.load(f)["shapes"]
        except (OSError, ValueError, KeyError) as exc:
            wl.append(((table,), f"tuned {table}", _failing(ValueError(f"cannot read the table: {exc!r}"))))
            continue
        for shape_key, buckets in sorted(shapes.items()):
            m = re.fullmatch(r"E=(\d+),k=(\d+),H=(\d+),I=(\d+),(\w+)", shape_key)
            for bucket, entry in sorted(buckets.items(), key=lambda kv: int(kv[0])):
                label = f"tuned {table} {shape_key} T={bucket}"
                try:
                    if not m or m.group(5) not in (*DTYPES, "float8_e4m3fn"):
                        raise ValueError(f"shape key {shape_key!r} is not 'E=..,k=..,H=..,I=..,<dtype>'")
                    e, k, h, i = map(int, m.groups()[:4])
                    cfg = MoEConfig(GemmConfig(**entry["up"]), GemmConfig(**entry["down"]))
                except (ValueError, TypeError, KeyError) as exc:
                    wl.append(((label,), label, _failing(ValueError(f"bad entry: {exc}"))))
                    continue
                if m.group(5) == "float8_e4m3fn":  # FP8 is tuned with [128, 128] block scales (moe_lab.tools.tune)
                    call = fp8_layer_call(int(bucket), e, k, h, i, cfg)
                else:
                    call = layer_call(int(bucket), e, k, h, i, DTYPES[m.group(5)], cfg)
                wl.append(((shape_key, cfg), label, call))
    return _dedupe(wl)


def odd_shape_workloads() -> List[Workload]:
    """H = 511: hidden rows are not 16-byte aligned (w1 falls back to pointer loads), K is ragged, and the
    down GEMM's N = 511 is no multiple of 16; I = 200 keeps the down GEMM's operands TMA-eligible.
    fp16 is left out: it masks and aligns like bf16."""
    wl = []
    for dname, dtype in DTYPES.items():
        for t in {"bfloat16": (1, 4096), "float16": (), "float32": (1, 4096)}[dname]:  # fp16 masks like bf16
            cfg = heuristic(t, 8, 2, 511, 200, dtype)
            wl.append(
                ((dname, cfg), f"odd E=8,k=2,H=511,I=200 {dname} T={t}", layer_call(t, 8, 2, 511, 200, dtype, cfg))
            )
    return _dedupe(wl)


def parallel_workloads() -> List[Workload]:
    """Expert parallelism and int64 topk_ids, bf16. The rank holds the preset's E experts of 2E (so the
    align kernels' bin count is the preset's, as without a map): decode and prefill BLOCK_SIZE_M."""
    wl = []
    shapes = {(p.num_experts, p.top_k, p.hidden_size, p.intermediate_size): p.name for p in moe_lab.PRESETS.values()}
    for (e, k, h, i), name in shapes.items():
        for t in (1, 4096):
            cfg = heuristic(t, e, k, h, i, torch.bfloat16)
            wl.append(
                (
                    ("ep", name, cfg),
                    f"expert_map {name} {e} of {2 * e} experts local T={t}",
                    layer_call(t, e, k, h, i, torch.bfloat16, cfg, expert_map_experts=2 * e),
                )
            )
        cfg = heuristic(1, e, k, h, i, torch.bfloat16)
        wl.append(
            (
                ("i64", name, cfg),
                f"int64 topk_ids {name} T=1",
                layer_call(1, e, k, h, i, torch.bfloat16, cfg, ids_dtype=torch.int64),
            )
        )
    return _dedupe(wl)


def kernel_workloads() -> List[Workload]:
    """Launchers called on their own, as the notebooks and other callers do."""
    wl: List[Workload] = []
    from moe_lab.align import MAX_EXPERTS

    for e, block_sizes in ((1, (16, 32, 64, 128)), (MAX_EXPERTS, (16, 128))):
        for bm in block_sizes:  # 8192 bins make the scatter kernel slow to compile: two block sizes
            wl.append(
                (
                    f"moe_align E={e} BLOCK_SIZE_M={bm}",
                    lambda e=e, bm=bm: moe_lab.moe_align(_empty(64, 2, dtype=torch.int32), e, bm),
                )
            )
    for dname, dtype in DTYPES.items():

        def activation(dtype=dtype):
            x = _empty(4096, 2 * 1024, dtype=dtype)
            moe_lab.silu_and_mul(x)

        def permute_and_reduce(dtype=dtype):
            routing = moe_lab.moe_align(_empty(512, 8, dtype=torch.int32), 128, 64)
            moe_lab.permute_tokens(_empty(512, 2048, dtype=dtype), routing)
            moe_lab.topk_reduce(_empty(512 * 8, 2048, dtype=dtype), _empty(512, 8, dtype=torch.int32), 128)

        wl.append((f"silu_and_mul {dname}", activation))
        wl.append((f"permute_tokens, topk_reduce {dname}", permute_and_reduce))
    return wl + quantize_workloads()


def _fp8_launches(launches: Callable[[], None]) -> Callable[[], object]:
    """Run `launches` where the fake GPU has FP8 (sm_89 and up); below, check the launcher refuses instead
    (Triton has no float8e4nv there: the kernel cannot compile)."""

    def run():
        if moe_lab.fp8_support():
            return launches()
        try:
            moe_lab.quantize_activations_fp8(_empty(1, 128, dtype=torch.bfloat16))
        except RuntimeError as exc:
            if "8.9" in str(exc):
                return None
            raise
        raise AssertionError("quantize_activations_fp8 launched on a GPU without FP8 (fp8_support said no)")

    return run


def quantize_workloads() -> List[Workload]:
    """FP8 activation quantization, at T = 4096 (the token count is a grid size, never a constexpr)."""
    wl: List[Workload] = []
    sizes = sorted({s for p in moe_lab.PRESETS.values() for s in (p.hidden_size, p.intermediate_size)})
    for dname, dtype in DTYPES.items():
        ks = sizes if dtype == torch.bfloat16 else [7168]  # DeepSeek-V3's H stands for the rest beyond bf16

        def per_group(dtype=dtype, ks=ks):
            for k in ks:
                moe_lab.quantize_activations_fp8(_empty(4096, k, dtype=dtype), group_size=128)

        wl.append((f"quantize_activations_fp8 {dname} group 128, K={','.join(map(str, ks))}", _fp8_launches(per_group)))

    def other_modes():
        x = _empty(4096, 7168, dtype=torch.bfloat16)
        num_rows = _empty(1, dtype=torch.int32)
        moe_lab.quantize_activations_fp8(x, group_size=None)
        moe_lab.quantize_activations_fp8(x, scale=_empty(1, dtype=torch.float32))
        moe_lab.quantize_activations_fp8(x, per_tensor=True)
        moe_lab.quantize_activations_fp8(x, num_rows=num_rows)
        moe_lab.quantize_activations_fp8(x, scale=_empty(1, dtype=torch.float32), num_rows=num_rows)
        moe_lab.quantize_activations_fp8(_empty(7168, 4096, dtype=torch.bfloat16).t())

    wl.append(
        (
            "quantize_activations_fp8 bfloat16 per token, static, per tensor, num_rows, transposed",
            _fp8_launches(other_modes),
        )
    )
    return wl


def fp8_layer_call(
    num_tokens,
    num_experts,
    top_k,
    hidden,
    inter,
    config,
    scheme="block",
    *,
    use_tma="auto",
    block_shape=(128, 128),
    layer_kwargs: Callable[[], dict] = dict,
) -> Callable[[], object]:
    """One FP8 w8a8 layer call (bf16 hidden states, float8_e4m3fn weights) with `scheme`'s scales: "block"
    (`block_shape` weight blocks, per-token-group activations), "channel" (per-channel weights, per-token
    activations) or "tensor" (per-tensor weights and static activation scales). Below sm_89 the call
    must be refused instead (RuntimeError naming compute capability 8.9)."""
    fp8, f32 = torch.float8_e4m3fn, torch.float32
    e, h, i = num_experts, hidden, inter
    if scheme == "block":
        bn, bk = block_shape
        scales = dict(
            w1_scale=_empty(e, -(-2 * i // bn), -(-h // bk), dtype=f32),
            w2_scale=_empty(e, -(-h // bn), -(-i // bk), dtype=f32),
            block_shape=block_shape,
        )
    elif scheme == "channel":
        scales = dict(w1_scale=_empty(e, 2 * i, dtype=f32), w2_scale=_empty(e, h, dtype=f32))
    else:
        scales = dict(
            w1_scale=_empty(e, dtype=f32),
            w2_scale=_empty(e, dtype=f32),
            a1_scale=_empty(1, dtype=f32),
            a2_scale=_empty(1, dtype=f32),
        )

    def run():
        call = lambda: moe_lab.fused_moe(  # noqa: E731
            _empty(num_tokens, h, dtype=torch.bfloat16),
            _empty(e, 2 * i, h, dtype=fp8),
            _empty(e, h, i, dtype=fp8),
            _empty(num_tokens, top_k, dtype=f32),
            _empty(num_tokens, top_k, dtype=torch.int32),
            use_tma=use_tma,
            config=config,
            **scales,
            **layer_kwargs(),
        )
        if moe_lab.fp8_support():
            return call()
        try:
            call()
        except RuntimeError as exc:
            if "8.9" not in str(exc):
                raise
        else:
            raise AssertionError("fused_moe ran float8 weights on a GPU without FP8 (fp8_support said no)")

    return run


def fp8_layer_workloads() -> List[Workload]:
    """FP8 w8a8 layers (float8_e4m3fn weights, heuristic tiles): DeepSeek-V3 block-scaled [128, 128] at each
    fp8 rule's token count (16x64, 32x128 and 64x128 tiles), with pointer loads at prefill, and with an up
    GEMM of BLOCK_SIZE_N = 256 whose epilogue quantizes the SwiGLU output, with the persistent kernel, and
    with [64, 128] weight blocks (a 64x128 tile spans two: one weight scale per column instead of one per
    tile); Qwen3 per-channel with per-token activations; Mixtral per-tensor with static activation scales.
    (The tuned table's FP8 entries are block-scaled layers of `tuned_workloads`.)"""
    wl: List[Workload] = []
    for name, tokens, scheme, use_tma in (
        ("deepseek-v3", (1, 64, 4096), "block", "auto"),
        ("deepseek-v3", (4096,), "block", False),
        ("deepseek-v3", (64, 4096), "block, quantized by the epilogue", "auto"),
        ("deepseek-v3", (4096,), "block, persistent", "auto"),
        ("deepseek-v3", (64, 4096), "block, [64, 128] weight blocks", "auto"),
        ("qwen3-30b-a3b", (1, 4096), "channel", "auto"),
        ("mixtral-8x7b", (4096,), "tensor", "auto"),
    ):
        p = moe_lab.PRESETS[name]
        shape = (p.num_experts, p.top_k, p.hidden_size, p.intermediate_size)
        calls = []
        for t in tokens:
            config = None
            base = heuristic(t, *shape, torch.float8_e4m3fn)
            if "epilogue" in scheme:  # 128 output columns per program: whole groups, quantized in the epilogue
                config = MoEConfig(replace(base.up, BLOCK_SIZE_N=256, num_warps=8), base.down)
            elif "persistent" in scheme:
                config = MoEConfig(replace(base.up, persistent=True), replace(base.down, persistent=True))
            block_shape = (64, 128) if "[64, 128]" in scheme else (128, 128)
            calls.append(
                fp8_layer_call(t, *shape, config, scheme.split(",")[0], use_tma=use_tma, block_shape=block_shape)
            )
        label = f"fp8 {name} {scheme} T={','.join(map(str, tokens))}" + ("" if use_tma == "auto" else " use_tma=False")
        wl.append((label, lambda calls=calls: [call() for call in calls]))
    return wl


def gluon_fp8_workloads() -> List[Workload]:
    """The warp-specialized Gluon FP8 grouped GEMM pair (moe_lab.gluon_fp8) at DeepSeek-V3's shape, T = 4096:
    the up GEMM (rows permuted, sorted store; plain, with the SwiGLU epilogue writing float8 and its scales as
    `fused_moe` runs it, and with swigluoai writing bfloat16) and the down GEMM (routed weights, scatter),
    BLOCK_SIZE_M 64 and 128 (one and two MMA warpgroups). Compiled where `gluon_fp8_support` says yes (sm_90, a
    Triton with Gluon's warp_specialize); elsewhere the workload checks that the launcher refuses with that reason."""
    from moe_lab.gluon_fp8 import gluon_fp8_support, grouped_matmul_fp8_gluon

    fp8, f32 = torch.float8_e4m3fn, torch.float32
    SILU, SWIGLUOAI = moe_lab.Activation(), moe_lab.Activation("swigluoai")
    p = moe_lab.PRESETS["deepseek-v3"]
    e, k, h, i, t = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, 4096

    def pair(block_m):
        routing = moe_lab.moe_align(_empty(t, k, dtype=torch.int32), e, block_m)
        rows = routing.max_num_tokens_padded
        up = dict(a_scale=_empty(t, h // 128, dtype=f32), w_scale=_empty(e, 2 * i // 128, h // 128, dtype=f32))
        x, w1 = _empty(t, h, dtype=fp8), _empty(e, 2 * i, h, dtype=fp8)
        grouped_matmul_fp8_gluon(x, w1, routing, gather_a=True, **up)
        # fused_moe's up GEMM: the SwiGLU epilogue quantizing its output to float8 (and gpt-oss's, bfloat16 out)
        act_scale = _empty(rows, i // 128, dtype=f32)
        grouped_matmul_fp8_gluon(x, w1, routing, gather_a=True, activation=SILU, out_scale=act_scale, **up)
        grouped_matmul_fp8_gluon(x, w1, routing, gather_a=True, activation=SWIGLUOAI, **up)
        down = dict(a_scale=_empty(rows, i // 128, dtype=f32), w_scale=_empty(e, h // 128, i // 128, dtype=f32))
        grouped_matmul_fp8_gluon(
            _empty(rows, i, dtype=fp8),
            _empty(e, h, i, dtype=fp8),
            routing,
            gather_a=False,
            scatter=True,
            topk_weights=_empty(t, k, dtype=f32),
            **down,
        )

    def run():
        reason = gluon_fp8_support()
        if reason is None:
            return [pair(block_m) for block_m in (64, 128)]
        try:
            pair(64)
        except RuntimeError as exc:  # the Gluon gate's reason, or (no FP8 tensor cores) the FP8 check's first
            fp8 = moe_lab.fp8_support()
            if reason not in str(exc) and (fp8.available or fp8.reason not in str(exc)):
                raise
        else:
            raise AssertionError(f"the Gluon FP8 GEMM launched where gluon_fp8_support said: {reason}")

    return [(f"gluon fp8 deepseek-v3 up and down T={t} BLOCK_SIZE_M=64,128", run)]


def expert_kind_workloads() -> List[Workload]:
    """gpt-oss-20b's layer (clamped SwiGLU on interleaved gate/up rows, biases on both projections), bf16
    with heuristic configs: at decode, a middle and prefill; by pointer, unfused (the activation kernel on
    interleaved columns), persistent, and FP8 block-scaled at 64 tokens. The other activation names once each
    at T = 64, and shared experts (DeepSeek-V2-Lite's two of I = 1408) beside 64 routed ones."""
    p = moe_lab.get_preset("gpt-oss-20b")
    e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
    bf16 = torch.bfloat16

    def gpt_oss(activation=moe_lab.GPT_OSS, biases=True, bias_dtype=bf16):
        def kwargs():
            bias = dict(w1_bias=_empty(e, 2 * i, dtype=bias_dtype), w2_bias=_empty(e, h, dtype=bias_dtype))
            return dict(activation=activation, **(bias if biases else {}))

        return kwargs

    wl: List[Workload] = []
    for t in (1, 64, 4096):
        cfg = heuristic(t, e, k, h, i, bf16)
        runs = [("", cfg, "auto")]
        if t != 64:
            runs += [
                (" use_tma=False", cfg, False),
                (" fuse_swiglu=False", MoEConfig(replace(cfg.up, fuse_swiglu=False), cfg.down), "auto"),
            ]
        if t == 4096:
            runs.append((" persistent", MoEConfig(replace(cfg.up, persistent=True), cfg.down), "auto"))
        for switch, config, use_tma in runs:
            wl.append(
                (
                    f"expert kinds gpt-oss-20b swigluoai interleaved, biases, bfloat16 T={t}{switch}",
                    layer_call(t, e, k, h, i, bf16, config, use_tma=use_tma, layer_kwargs=gpt_oss()),
                )
            )
    cfg = heuristic(64, e, k, h, i, bf16)
    for name, activation in (
        ("swigluoai halves", moe_lab.Activation("swigluoai")),
        ("silu interleaved", moe_lab.Activation("silu", "interleaved")),
    ):
        wl.append(
            (
                f"expert kinds gpt-oss-20b {name}, float32 biases, bfloat16 T=64",
                layer_call(64, e, k, h, i, bf16, cfg, layer_kwargs=gpt_oss(activation, bias_dtype=torch.float32)),
            )
        )
    fp8_cfg = heuristic(64, e, k, h, i, torch.float8_e4m3fn)
    wl.append(
        (
            "expert kinds gpt-oss-20b swigluoai interleaved, biases, fp8 block T=64",
            fp8_layer_call(64, e, k, h, i, fp8_cfg, layer_kwargs=gpt_oss()),
        )
    )

    def shared():
        return dict(
            shared_w1=_empty(2, 2 * 1408, 2048, dtype=bf16),
            shared_w2=_empty(2, 2048, 1408, dtype=bf16),
            shared_weights=_empty(64, 2, dtype=torch.float32),
        )

    wl.append(
        (
            "expert kinds shared experts, DeepSeek-V2-Lite's 2 of I=1408 beside E=64, k=6, bfloat16 T=64",
            layer_call(64, 64, 6, 2048, 1408, bf16, heuristic(64, 64, 6, 2048, 1408, bf16), layer_kwargs=shared),
        )
    )
    return wl


def all_workloads() -> List[Workload]:
    return (
        heuristic_workloads()
        + tuned_workloads()
        + odd_shape_workloads()
        + parallel_workloads()
        + kernel_workloads()
        + fp8_layer_workloads()
        + gluon_fp8_workloads()
        + expert_kind_workloads()
    )
