"""Experiment: FP8 decode with K steps of two scale blocks (BLOCK_SIZE_K = 256, one dot per block).

A block-scaled FP8 K step was one scale block (128 channels): 128-byte rows per load, half of what a
bf16 step of 64 channels loads, and twice the steps of a bf16 step of 128. With `LaunchPlan.dots_per_step`
a step of BLOCK_SIZE_K = 256 loads two blocks and multiplies them one at a time (the same sums in the same
order: the same bits). For each model and decode T, CUDA-graph medians (L2 flushed, least of 3 rounds, the
variants timed alternately, twice each) of the GEMM pair (up with its SwiGLU epilogue, down), FP8:
  - before: the FP8 table of the previous commit (argv[1], a JSON table), steps of one block;
  - wide:   the same configs with BLOCK_SIZE_K = 256 (two dots per step);
  - tuned:  the package table (re-tuned with candidates of both step sizes);
and moe-lab's bf16 pair (package table) for the speedup. Writes JSON to argv[2] if given.
Usage: python benchmarks/experiments/fp8_wide_steps.py OLD_TABLE.json [OUT.json]
"""
import json
import sys
from dataclasses import replace

import torch

from moe_lab import MoEConfig, fused_moe, moe_align
from moe_lab.tools.bench import _both, _layer_gemms
from moe_lab.configs import GemmConfig
from moe_lab.presets import get_preset
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config, shape_key

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
TOKENS = (1, 8, 64)


def old_config(table, p, num_tokens):
    key = shape_key(p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, torch.float8_e4m3fn)
    entry = table["shapes"][key][str(num_tokens)]
    return MoEConfig(*(GemmConfig(**entry[g]) for g in ("up", "down")))


def point(model, num_tokens, table):
    p = get_preset(model)
    hs, w1, w2, _ = p.build(num_tokens, device="cuda")
    tw, ti = uniform_routing(num_tokens, p.num_experts, p.top_k, seed=1)
    w1_q, w2_q, scales = p.quantize_fp8(w1, w2)
    before = old_config(table, p, num_tokens)
    configs = dict(before=before,
                   wide=MoEConfig(replace(before.up, BLOCK_SIZE_K=256), replace(before.down, BLOCK_SIZE_K=256)),
                   tuned=choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size,
                                       torch.float8_e4m3fn).config)
    bf16_cfg = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size).config
    pairs = {}
    for name, cfg in configs.items():
        up, down = _layer_gemms(hs, w1_q, w2_q, tw, moe_align(ti, p.num_experts, cfg.block_size_m), cfg, scales=scales)
        pairs[name] = _both(up, down)
    up, down = _layer_gemms(hs, w1, w2, tw, moe_align(ti, p.num_experts, bf16_cfg.block_size_m), bf16_cfg)
    pairs["bf16"] = _both(up, down)
    outs = {n: fused_moe(hs, w1_q, w2_q, tw, ti, config=c, **scales) for n, c in configs.items()}
    times = {n: [] for n in pairs}
    for _ in range(2):
        for n, fn in pairs.items():
            times[n].append(graph_ms(fn, rounds=3))
    row = dict(model=model, T=num_tokens, **{f"{n}_ms": min(v) for n, v in times.items()},
               wide_bitwise_before=torch.equal(outs["wide"], outs["before"]),
               tuned_bitwise_before=torch.equal(outs["tuned"], outs["before"]),
               tuned_cfg=dict(up=configs["tuned"].up.to_dict(), down=configs["tuned"].down.to_dict()))
    for n in ("before", "wide", "tuned"):
        row[f"speedup_{n}"] = row["bf16_ms"] / row[f"{n}_ms"]
    return row


def main():
    table = json.load(open(sys.argv[1]))
    rows = []
    print(f"{'model':<15} {'T':>3} {'bf16':>8} {'before':>8} {'wide':>8} {'tuned':>8}  x before  x wide  x tuned  bitwise  tuned (up / down: M N K stages tma)")
    for model in MODELS:
        for t in TOKENS:
            r = point(model, t, table)
            rows.append(r)
            cfg = " / ".join(f"{c['BLOCK_SIZE_M']} {c['BLOCK_SIZE_N']} {c['BLOCK_SIZE_K']} {c['num_stages']} {int(c['tma'])}"
                             for c in (r["tuned_cfg"]["up"], r["tuned_cfg"]["down"]))
            print(f"{model:<15} {t:>3} {r['bf16_ms']:8.4f} {r['before_ms']:8.4f} {r['wide_ms']:8.4f} {r['tuned_ms']:8.4f}"
                  f"  {r['speedup_before']:7.2f} {r['speedup_wide']:7.2f} {r['speedup_tuned']:8.2f}  "
                  f"{r['wide_bitwise_before']!s:>5}/{r['tuned_bitwise_before']!s:<5}  {cfg}", flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
