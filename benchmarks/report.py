"""Turn committed benchmark results into the tables and plots of docs/performance.md and benchmarks/README.md.

    python benchmarks/report.py [results.json]   # default: the newest benchmarks/results/*.json

Prints markdown tables (moe-lab vs the target times in targets.json; pointer vs TMA per GEMM; the whole
layer vs torch._grouped_mm with its glue) and writes time_vs_tokens.png and roofline.png next to the
results. Runs anywhere (no GPU needed): it only reads data.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")

from moe_lab.workbook.viz import performance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def row(results, model, tokens, impl):
    found = performance.select_rows(results, model=model, impl=impl)
    return next((r for r in found if r["T"] == tokens), None)


def best_moe_lab(results, model, tokens):
    rows = [row(results, model, tokens, impl) for impl in ("moe-lab pointer", "moe-lab tma")]
    rows = [r for r in rows if r and r.get("gemms_ms")]
    return min(rows, key=lambda r: r["gemms_ms"]) if rows else None


def main(path=None):
    results = performance.load_results(path)
    targets = json.load(open(os.path.join(HERE, "targets.json")))
    print(performance.describe_results(results), "\n")

    print("### The two GEMMs against the target times (ms, lower is better; ratio < 1 means moe-lab is faster)\n")
    print("| model | " + " | ".join(f"T={t}" for t in targets["tokens"]) + " |")
    print("|---|" + "---|" * len(targets["tokens"]))
    for model, target_ms in targets["ms"].items():
        cells = []
        for tokens, goal in zip(targets["tokens"], target_ms):
            best = best_moe_lab(results, model, tokens)
            cells.append("-" if best is None else f"{best['gemms_ms']:.3f} / {goal} = {best['gemms_ms'] / goal:.2f}")
        print(f"| {model} | " + " | ".join(cells) + " |")

    print("\n### Pointer vs TMA load path, same config (ms)\n")
    print("| model | T | up ptr | up TMA | down ptr | down TMA | both ptr | both TMA | TMA / ptr |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in targets["ms"]:
        for tokens in targets["tokens"]:
            p, t = row(results, model, tokens, "moe-lab pointer"), row(results, model, tokens, "moe-lab tma")
            if p and t and p.get("gemms_ms") and t.get("gemms_ms"):
                print(
                    f"| {model} | {tokens} | {p['up_ms']:.3f} | {t['up_ms']:.3f} | {p['down_ms']:.3f} | "
                    f"{t['down_ms']:.3f} | {p['gemms_ms']:.3f} | {t['gemms_ms']:.3f} | "
                    f"{t['gemms_ms'] / p['gemms_ms']:.2f} |"
                )

    print("\n### The whole layer (align, activation and reduce included) vs torch._grouped_mm with its glue (ms)\n")
    print("| model | T | moe-lab (best path) | torch._grouped_mm + glue | ratio |")
    print("|---|---|---|---|---|")
    for model in targets["ms"]:
        for tokens in targets["tokens"]:
            ours = [
                r["layer_ms"]
                for r in (row(results, model, tokens, i) for i in ("moe-lab pointer", "moe-lab tma"))
                if r and r.get("layer_ms")
            ]
            peer = row(results, model, tokens, "torch._grouped_mm")
            if ours and peer and peer.get("layer_ms"):
                print(
                    f"| {model} | {tokens} | {min(ours):.3f} | {peer['layer_ms']:.3f} | "
                    f"{min(ours) / peer['layer_ms']:.2f} |"
                )

    out_dir = os.path.dirname(results["path"])
    performance.plot_time_grid(results).savefig(os.path.join(out_dir, "time_vs_tokens.png"), dpi=110)
    performance.plot_roofline(results["ceilings"], results=results).savefig(
        os.path.join(out_dir, "roofline.png"), dpi=110
    )
    print(f"\nwrote {out_dir}/time_vs_tokens.png and roofline.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
