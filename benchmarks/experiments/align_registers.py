"""Experiment: the lean decode layer: the align in registers, the top-k reduce in the down GEMM (H200,
bf16, shipped configs).

For few slots (T*k <= ONE_PROGRAM_MAX_SLOTS) `moe_align` runs one program. Until 2026-12-01 that program
ran the three kernels' steps one after the other (`align_one_program_kernel`: a histogram per chunk,
stores of the chunk offsets, a barrier, loads back, the block map from the stored totals); now it works on
slot-by-slot comparisons in registers (`align_in_registers_kernel`: one load of the ids, no round trip
through memory between the steps, no barrier). For each model and T, CUDA-graph medians (L2 flushed,
least of 3 rounds) of
  - align: moe_align as it is now (the register kernel at these sizes), align8 the same with 8 warps;
  - old:   the one-program kernel it replaces, launched as moe_align launched it (while it still exists);
  - three: moe_align forced to its three launches (count, prefix, scatter);
  - pair: the layer's GEMM pair (as `moe-lab bench` times it);
  - layer: the whole fused_moe, with the top-k reduce in its down GEMM (`layer.REDUCE_IN_DOWN_GEMM`,
    where it applies), and layer_sep with the reduce as a launch of its own;
and whether the schedules and the reference agree bit for bit (also on 200 random routings with
repeated and out-of-range ids), and the two layers' outputs too. Writes JSON to argv[1] if it ends in .json.
Usage: python benchmarks/experiments/align_registers.py [OUT.json]
"""
import json
import sys

import torch
import triton

import moe_lab._kernels.align as kernels
import moe_lab.align as align
import moe_lab.layer as layer
from moe_lab import fused_moe, moe_align, moe_align_reference
from moe_lab.bench import _both, _layer_gemms
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.timing import graph_ms
from moe_lab.tuned import default_config

POINTS = (("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8), ("qwen3-30b-a3b", 16), ("deepseek-v3", 1),
          ("deepseek-v3", 8), ("deepseek-v3", 16), ("mixtral-8x7b", 1), ("mixtral-8x7b", 8),
          ("mixtral-8x7b", 64), ("qwen3-30b-a3b", 64))
FIELDS = ("counts", "sorted_token_ids", "expert_ids", "num_tokens_post_padded")


def same(a, b):
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def old_align(ids, num_experts, block_size_m):
    """moe_align's one-program launch before the register kernel (None once that kernel is gone)."""
    old = getattr(kernels, "align_one_program_kernel", None)
    if old is None:
        return None
    num_slots = ids.numel()
    padded_len = align.max_num_tokens_padded(num_slots, num_experts, block_size_m)
    i32 = dict(dtype=torch.int32, device=ids.device)
    counts, start, ntpp = (torch.empty(num_experts, **i32), torch.empty(num_experts, **i32),
                           torch.empty(1, **i32))
    sorted_ids, expert_ids = torch.empty(padded_len, **i32), torch.empty(padded_len // block_size_m, **i32)
    offsets = torch.empty((triton.cdiv(num_slots, align.CHUNK), num_experts), **i32)
    flat = ids.reshape(-1).contiguous()

    def launch():
        old[(1,)](flat, flat, offsets, counts, start, ntpp, sorted_ids, expert_ids, num_slots, num_experts,
                  num_experts, padded_len // block_size_m, HAS_EXPERT_MAP=False, CHUNK=align.CHUNK,
                  NUM_BINS=triton.next_power_of_2(num_experts + 1), BLOCK_SIZE_M=block_size_m,
                  BLOCKS_PER_PROGRAM=4 * align.BLOCKS_PER_PROGRAM, PDL=False)
        return align.AlignedRouting(counts, sorted_ids, expert_ids, ntpp, block_size_m, ids.shape[0], ids.shape[1],
                                    num_experts)
    return launch


def three_launches(ids, num_experts, block_size_m):
    limit, align.ONE_PROGRAM_MAX_SLOTS = align.ONE_PROGRAM_MAX_SLOTS, 0
    try:
        return moe_align(ids, num_experts, block_size_m)
    finally:
        align.ONE_PROGRAM_MAX_SLOTS = limit


def random_check(n=200):
    g = torch.Generator().manual_seed(0)
    bad = 0
    for _ in range(n):
        e = int(torch.randint(1, align.ONE_PROGRAM_MAX_EXPERTS + 1, (1,), generator=g))
        k = int(torch.randint(1, 9, (1,), generator=g))
        t = int(torch.randint(1, align.ONE_PROGRAM_MAX_SLOTS // k + 1, (1,), generator=g))
        bm = 2 ** int(torch.randint(4, 9, (1,), generator=g))
        ids = torch.randint(0, int(torch.randint(1, e + 1, (1,), generator=g)), (t, k), generator=g, dtype=torch.int32)
        ids[torch.rand(ids.shape, generator=g) < 0.1] = e + 1
        ids = ids.cuda()
        got = moe_align(ids, e, bm)
        bad += not (same(got, three_launches(ids, e, bm)) and same(got, moe_align_reference(ids, e, bm)))
    return bad


def point(model, t):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(t, device="cuda")
    tw, ti = uniform_routing(t, p.num_experts, p.top_k, seed=1)
    cfg = default_config(t, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, hs.dtype)
    bm, e = cfg.block_size_m, p.num_experts
    routing = moe_align(ti, e, bm)
    row = dict(model=model, T=t, slots=t * p.top_k, E=e, BLOCK_SIZE_M=bm)
    old = old_align(ti, e, bm)
    row["bitwise"] = same(routing, three_launches(ti, e, bm)) and same(routing, moe_align_reference(ti, e, bm)) \
        and (old is None or same(routing, old()))
    row["align_ms"] = graph_ms(lambda: moe_align(ti, e, bm), rounds=3)
    align.ONE_PROGRAM_NUM_WARPS = 8
    row["align8_ms"] = graph_ms(lambda: moe_align(ti, e, bm), rounds=3)
    align.ONE_PROGRAM_NUM_WARPS = 4
    row["old_ms"] = graph_ms(old, rounds=3) if old else None
    row["three_ms"] = graph_ms(lambda: three_launches(ti, e, bm), rounds=3)
    up, down = _layer_gemms(hs, w1, w2, tw, routing, cfg)
    row["pair_ms"] = graph_ms(_both(up, down), rounds=3)
    row["reduce_in_gemm"] = layer._reduce_in_down_gemm(t * p.top_k, e, cfg.down)
    fused = fused_moe(hs, w1, w2, tw, ti, config=cfg)
    for name, on in (("layer", True), ("layer_sep", False), ("layer", True), ("layer_sep", False)):
        layer.REDUCE_IN_DOWN_GEMM = on
        ms = graph_ms(lambda: fused_moe(hs, w1, w2, tw, ti, config=cfg), rounds=3)
        row[f"{name}_ms"] = min(ms, row.get(f"{name}_ms", ms))
    row["layers_bitwise"] = torch.equal(fused.view(torch.int16), fused_moe(hs, w1, w2, tw, ti, config=cfg).view(torch.int16))
    layer.REDUCE_IN_DOWN_GEMM = True
    row["layer_over_pair"] = row["layer_ms"] / row["pair_ms"]
    row["layer_sep_over_pair"] = row["layer_sep_ms"] / row["pair_ms"]
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".json") else None
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    print(env)
    rows = [point(m, t) for m, t in POINTS]
    bad = random_check()
    print(f"random routings where the register kernel differs from three launches or the reference: {bad} of 200")
    print("times in us; layer: reduce in the down GEMM where it applies (rin), layer_sep: reduce launched apart")
    print(f"{'model':<15} {'T':>4} {'slots':>5} {'BM':>4} {'align':>6} {'align8':>6} {'old':>6} {'three':>6} "
          f"{'pair':>8} {'layer':>8} {'sep':>8} {'layer/pair':>10} {'sep/pair':>8} rin bitwise")
    for r in rows:
        old = f"{1e3 * r['old_ms']:6.1f}" if r["old_ms"] else f"{'-':>6}"
        print(f"{r['model']:<15} {r['T']:>4} {r['slots']:>5} {r['BLOCK_SIZE_M']:>4} {1e3 * r['align_ms']:6.1f} "
              f"{1e3 * r['align8_ms']:6.1f} {old} {1e3 * r['three_ms']:6.1f} {1e3 * r['pair_ms']:8.1f} "
              f"{1e3 * r['layer_ms']:8.1f} {1e3 * r['layer_sep_ms']:8.1f} {r['layer_over_pair']:10.3f} "
              f"{r['layer_sep_over_pair']:8.3f} {'y' if r['reduce_in_gemm'] else 'n':>3} "
              f"{r['bitwise'] and r['layers_bitwise']}")
    if out:
        with open(out, "w") as f:
            json.dump(dict(env, rows=rows, random_mismatches=bad), f, indent=1)


if __name__ == "__main__":
    main()
