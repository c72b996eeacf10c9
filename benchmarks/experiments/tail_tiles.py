"""Experiment: tail tiles, a config sweep around them, and pre-gathered A for the up GEMM (H200).

Prediction written before the run: at 64-512 rows per expert an expert's last M-block is on average half
padding, 18-33 % of all MMA rows; half/quarter tail tiles should cut the up and down GEMMs by 10-20 % at
Qwen3 T=512/4096, Mixtral T=512, DeepSeek T=4096/16384, and by < 2 % where rows per expert are >= 2048
(Mixtral T=16384). Pre-gathering A (a copy, then TMA for A) should help where N is wide enough to hide the
copy: Mixtral (N = 28672), not Qwen3 (N = 1536). Usage: python benchmarks/experiments/tail_tiles.py OUT_DIR
"""
import json
import os
import sys
from dataclasses import replace

import torch

from moe_lab import fused_moe, moe_align, silu_and_mul
from moe_lab.configs import GemmConfig, MoEConfig
from moe_lab.grouped_matmul import grouped_matmul
from moe_lab.presets import get_preset
from moe_lab.reference import fused_moe_reference, relative_error
from moe_lab.routing import uniform_routing
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import default_config

POINTS = [("qwen3-30b-a3b", 512), ("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 512), ("deepseek-v3", 4096),
          ("qwen3-30b-a3b", 16384), ("deepseek-v3", 16384), ("mixtral-8x7b", 16384), ("mixtral-8x7b", 4096)]
SWEEP = [(256, 64, 8, 8, 3), (256, 64, 8, 8, 4), (128, 64, 8, 4, 4), (128, 128, 8, 8, 3), (128, 64, 8, 8, 4),
         (128, 128, 8, 4, 3)]


def t(fn):
    try:
        return graph_ms(fn, rep_ms=25)
    except Exception as exc:  # noqa: BLE001 - a config that fails to compile is a result too
        print("   fail:", type(exc).__name__, str(exc)[:120], flush=True)
        return None


def main(out_dir):
    results = []
    for model, T in POINTS:
        p = get_preset(model)
        e, k, h, i = p.num_experts, p.top_k, p.hidden_size, p.intermediate_size
        hs, w1, w2, _ = p.build(T, device="cuda")
        tw, ti = uniform_routing(T, e, k, seed=1)
        out_k = torch.empty(T * k, h, dtype=hs.dtype, device="cuda")
        tuned = default_config(T, e, k, h, i, hs.dtype)
        res = dict(model=model, T=T, tuned=dict(up=tuned.up.to_dict(), down=tuned.down.to_dict()), runs=[])

        def gemms(up: GemmConfig, down: GemmConfig, label):
            r = moe_align(ti, e, up.BLOCK_SIZE_M)
            gu = grouped_matmul(hs, w1, r, up, gather_a=True)
            act = silu_and_mul(gu, routing=r)
            tu = t(lambda: grouped_matmul(hs, w1, r, up, gather_a=True, out=gu))
            td = t(lambda: grouped_matmul(act, w2, r, down, gather_a=False, scatter=True, topk_weights=tw, out=out_k))
            run = dict(label=label, up=up.to_dict(), down=down.to_dict(), up_ms=tu, down_ms=td)
            res["runs"].append(run)
            print(f"{model:<14} T={T:<6} {label:<34} up {tu or 0:7.3f}  down {td or 0:7.3f}  "
                  f"sum {(tu or 0) + (td or 0):7.3f}", flush=True)
            return run

        gemms(replace(tuned.up, tail_tiles=False), replace(tuned.down, tail_tiles=False), "tuned, tail off")
        gemms(tuned.up, tuned.down, "tuned, tail on")
        if T * k / e >= 64:
            for bm in (64, 128):
                for n_, k_, g, w, s in SWEEP:
                    c = GemmConfig(bm, n_, k_, g, w, s)
                    gemms(c, c, f"sweep {bm}/{n_}/{k_}/g{g}/w{w}/s{s}")
        # Best up and down per BLOCK_SIZE_M, and the layer with them (error against the reference).
        best = {}
        for run in res["runs"]:
            bm = run["up"]["BLOCK_SIZE_M"]
            for g in ("up", "down"):
                ms = run[f"{g}_ms"]
                if ms is not None and ((bm, g) not in best or ms < best[(bm, g)][0]):
                    best[(bm, g)] = (ms, run[g])
        for bm in sorted({b for b, _ in best}):
            if (bm, "up") in best and (bm, "down") in best:
                print(f"   best BM={bm}: up {best[(bm, 'up')][0]:.3f} {best[(bm, 'up')][1]}  "
                      f"down {best[(bm, 'down')][0]:.3f} {best[(bm, 'down')][1]}  "
                      f"sum {best[(bm, 'up')][0] + best[(bm, 'down')][0]:.3f}", flush=True)
        if T <= 4096:
            cfg = MoEConfig(tuned.up, tuned.down)
            res["rel_err_tail_on"] = relative_error(fused_moe(hs, w1, w2, tw, ti, config=cfg),
                                                    fused_moe_reference(hs, w1, w2, tw, ti))
            print(f"   layer rel err (tuned, tail on): {res['rel_err_tail_on']:.2e}", flush=True)
        if T >= 4096:  # pre-gathered A: one copy into padded sorted order, then TMA for A as well
            r = moe_align(ti, e, tuned.block_size_m)
            rows = (r.sorted_token_ids.clamp(max=T * k - 1) // k).long()
            a_sorted = hs.index_select(0, rows)
            gu = grouped_matmul(a_sorted, w1, r, tuned.up, gather_a=False)
            t_copy = t(lambda: torch.index_select(hs, 0, rows, out=a_sorted))
            t_up = t(lambda: grouped_matmul(a_sorted, w1, r, tuned.up, gather_a=False, out=gu, use_tma=True))
            res["pregather"] = dict(copy_ms=t_copy, up_ms=t_up)
            print(f"   pre-gathered A: copy {t_copy:.3f} + up (A and W by TMA) {t_up:.3f} = {t_copy + t_up:.3f}",
                  flush=True)
        results.append(res)
        del hs, w1, w2
        torch.cuda.empty_cache()
        with open(os.path.join(out_dir, "tail_tiles.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
