"""moe-lab inside transformers, timed on a GPU: the experts modules of transformers at full size (random
weights, bf16) with experts_implementation "moe_lab" against transformers' own "grouped_mm", "batched_mm" and
"eager", and a whole-model decode (`generate`, eager mode) of a Qwen3-30B-A3B config cut to a few layers.

    python benchmarks/transformers_experts.py --out h200-out/   # writes transformers-experts-<device>-<date>.json / .md

Experts: Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3's routed experts and gpt-oss-20b (biases, interleaved gate/up
rows, clamped SwiGLU: `fused_moe`'s expert kinds) at T = 1, 8, 64, 512, 4096 tokens,
uniform random top-k routing. Each point: every implementation called twice to warm up, then rounds of one
call each in a rotated order (L2 flushed before each call); the time is the median of CUDA-event times (ms)
per call, launches and host work included (eager mode, as a transformers model runs). batched_mm gathers a
copy of the weights per (token, slot) and is skipped where that copy would pass 6 GB. "vs eager" is the
relative Frobenius difference from the eager experts' bf16 output (both round in bf16).
Decode: tokens per second of `generate` (greedy, a 32-token prompt, 64 new tokens) of Qwen3-30B-A3B and
gpt-oss-20b cut to 4 layers at batch 1 and 8, the implementations alternating, median of 3; then Qwen3-30B-A3B
at batch 1 with a static cache, which `generate` compiles
(torch.compile, inductor, CUDA graphs; moe_lab runs as its custom op there), eager's experts left out
(--no-compiled-decode skips it). Needs a CUDA GPU (Triton's interpreter is refused); a few minutes and at
most ~30 GB on an H200.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import time

import torch
import transformers
import triton

import moe_lab
from moe_lab import relative_error
from moe_lab.integrations.transformers import register
from moe_lab.runtime import require_gpu_timing

IMPLEMENTATIONS = ("moe_lab", "grouped_mm", "batched_mm", "eager")
TOKENS = (1, 8, 64, 512, 4096)
BATCHED_MM_LIMIT = 6e9  # bytes of weights batched_mm may gather

# name: (config class, experts class (module, name), config fields)
EXPERTS = {
    "qwen3-30b-a3b": (
        "Qwen3MoeConfig",
        ("qwen3_moe", "Qwen3MoeExperts"),
        dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8),
    ),
    "mixtral-8x7b": (
        "MixtralConfig",
        ("mixtral", "MixtralExperts"),
        dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2),
    ),
    "deepseek-v3": (
        "DeepseekV3Config",
        ("deepseek_v3", "DeepseekV3Experts"),
        dict(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8),
    ),
    "gpt-oss-20b": (
        "GptOssConfig",
        ("gpt_oss", "GptOssExperts"),
        dict(hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4),
    ),
}
QWEN3_30B_A3B = dict(
    hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936, norm_topk_prob=True,
)  # fmt: skip
# The whole models of the decode table: config class and fields (GptOssConfig's defaults are gpt-oss-20b's).
DECODE_MODELS = {"qwen3-30b-a3b": ("Qwen3MoeConfig", QWEN3_30B_A3B), "gpt-oss-20b": ("GptOssConfig", {})}


def build_experts(name: str) -> torch.nn.Module:
    """transformers' own experts module of `name`, in bf16 on the GPU, weights normal with std 1/sqrt(fan-in)."""
    config_class, (module, class_name), fields = EXPERTS[name]
    config = getattr(transformers, config_class)(**fields)
    experts_class = getattr(getattr(transformers.models, module), f"modeling_{module}").__dict__[class_name]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # allocated in bf16 at once (DeepSeek-V3's are 22 GB)
    try:
        with torch.device("cuda"):
            experts = experts_class(config)
    finally:
        torch.set_default_dtype(default_dtype)
    with torch.no_grad():
        for param in experts.parameters():
            if param.dim() == 3:  # [E, out, in], or [E, in, out] where transposed
                param.normal_(0, param.shape[-2 if getattr(experts, "is_transposed", False) else -1] ** -0.5)
            else:  # biases
                param.normal_(0, 0.02)
    return experts.eval().requires_grad_(False)


def routing(num_tokens: int, num_experts: int, top_k: int):
    ids = torch.rand(num_tokens, num_experts, device="cuda").topk(top_k, dim=1).indices
    weights = torch.softmax(torch.randn(num_tokens, top_k, device="cuda"), dim=-1)
    return ids, weights


def gathered_bytes(experts: torch.nn.Module, num_tokens: int, top_k: int) -> float:
    """Bytes of weights batched_mm copies: one [2I, H] and one [H, I] slice per (token, slot)."""
    per_slot = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
    return num_tokens * top_k * per_slot * experts.gate_up_proj.element_size()


def time_rotated(calls: dict, rounds: int) -> dict:
    """Median ms per call of each function, the order rotated every round, L2 flushed before each call."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    events = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in pairs) for name, pairs in events.items()}


def bench_experts(name: str) -> list:
    experts = build_experts(name)
    config = experts.config
    top_k = config.num_experts_per_tok
    rows = []
    for num_tokens in TOKENS:
        hidden = torch.randn(num_tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        ids, weights = routing(num_tokens, experts.gate_up_proj.shape[0], top_k)
        row = dict(model=name, tokens=num_tokens, ms={}, vs_eager={}, skipped={})
        outputs, calls = {}, {}
        for impl in IMPLEMENTATIONS:
            if impl == "batched_mm" and gathered_bytes(experts, num_tokens, top_k) > BATCHED_MM_LIMIT:
                gb = gathered_bytes(experts, num_tokens, top_k) / 1e9
                row["skipped"][impl] = f"would gather {gb:.0f} GB of weights"
                continue

            def call(impl=impl):
                config._experts_implementation = impl
                return experts(hidden, ids, weights)

            try:
                with torch.no_grad():
                    outputs[impl] = call()
                    call()
            except NotImplementedError as refusal:
                row["skipped"][impl] = str(refusal)
                continue
            calls[impl] = call
        with torch.no_grad():
            row["ms"] = time_rotated(calls, rounds=15 if num_tokens < 4096 else 7)
        for impl, out in outputs.items():
            if impl != "eager" and "eager" in outputs:
                row["vs_eager"][impl] = relative_error(out, outputs["eager"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows  # the weights are freed with this frame


def bench_decode(
    name: str = "qwen3-30b-a3b", num_layers: int = 4, prompt: int = 32, new_tokens: int = 64, compiled: bool = False
) -> list:
    """generate's tokens/s of model `name` cut to `num_layers` layers (random weights): eager mode (batch 1 and
    8, every implementation, tokens against eager's) or compiled (batch 1: a static cache, which transformers'
    generate compiles with torch.compile, inductor, CUDA graphs; eager's experts loop is left out; tokens
    against grouped_mm's)."""
    config_class, fields = DECODE_MODELS[name]
    config = getattr(transformers, config_class)(**fields, num_hidden_layers=num_layers)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    implementations = IMPLEMENTATIONS[:-1] if compiled else IMPLEMENTATIONS
    reference = "grouped_mm" if compiled else "eager"
    options = dict(cache_implementation="static") if compiled else {}
    rows = []
    for batch in (1,) if compiled else (1, 8):
        input_ids = torch.randint(0, config.vocab_size, (batch, prompt), device="cuda")
        seconds = {impl: [] for impl in implementations}
        tokens = {}
        n = len(implementations)
        for r in range(4):  # round 0 warms up (compiles, allocates); rounds 1-3 are timed
            for impl in implementations[r % n :] + implementations[: r % n]:
                model.set_experts_implementation(impl)
                torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(
                        input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **options
                    )
                torch.cuda.synchronize()
                if r:
                    seconds[impl].append(time.perf_counter() - start)
                tokens[impl] = out[:, prompt:]
        row = dict(
            model=f"{name}, {num_layers} layers" + (", static cache, torch.compile" if compiled else ""),
            batch=batch,
            tokens_per_s={impl: batch * new_tokens / statistics.median(s) for impl, s in seconds.items()},
            same_tokens_as=reference,
            same_tokens_as_eager={impl: bool(torch.equal(t, tokens[reference])) for impl, t in tokens.items()},
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    lines = [
        f"# transformers experts: moe_lab vs transformers' implementations ({result['device']})",
        "",
        f"torch {result['torch']}, Triton {result['triton']}, transformers {result['transformers']}, "
        f"moe-lab {result['moe_lab']}, {result['date']}. bf16, random weights, uniform routing; median ms per "
        "call of the experts module (eager mode, launches included); in brackets the relative difference from "
        "eager's output.",
        "",
        "| model | T | " + " | ".join(IMPLEMENTATIONS) + " | moe_lab speedup vs grouped_mm |",
        "|---|---:|" + "---:|" * (len(IMPLEMENTATIONS) + 1),
    ]
    for row in result["experts"]:
        cells = []
        for impl in IMPLEMENTATIONS:
            if impl in row["ms"]:
                diff = f" ({row['vs_eager'][impl]:.1e})" if impl in row["vs_eager"] else ""
                cells.append(f"{row['ms'][impl]:.3f}{diff}")
            else:
                cells.append("refused" if "cannot run" in row["skipped"].get(impl, "") else "skipped")
        speedup = (
            f"{row['ms']['grouped_mm'] / row['ms']['moe_lab']:.2f}x"
            if {"moe_lab", "grouped_mm"} <= set(row["ms"])
            else "-"
        )
        lines.append(f"| {row['model']} | {row['tokens']} | " + " | ".join(cells) + f" | {speedup} |")
    not_timed = {}
    for row in result["experts"]:
        for impl, why in row["skipped"].items():
            not_timed.setdefault((row["model"], impl, why if "cannot run" in why else "gathers too much"), []).append(
                row["tokens"]
            )
    if not_timed:
        lines += ["", "Not timed:"]
        for (model, impl, why), tokens in not_timed.items():
            if why == "gathers too much":
                why = f"its copy of the weights per (token, slot) would pass {BATCHED_MM_LIMIT / 1e9:.0f} GB"
            lines.append(f"- {model}, {impl}, T = {', '.join(map(str, tokens))}: {why}")
    lines += [
        "",
        "## Decode: `generate` tokens/s (greedy, 32-token prompt, 64 new tokens; eager mode, then with a static "
        "cache, which generate compiles: torch.compile, inductor, CUDA graphs; tokens differ: from eager's, "
        "compiled from grouped_mm's)",
        "",
        "| model | batch | " + " | ".join(IMPLEMENTATIONS) + " |",
        "|---|---:|" + "---:|" * len(IMPLEMENTATIONS),
    ]
    for row in result["decode"]:
        cells = [
            f"{row['tokens_per_s'][impl]:.1f}" + ("" if row["same_tokens_as_eager"][impl] else " (tokens differ)")
            if impl in row["tokens_per_s"]
            else "-"
            for impl in IMPLEMENTATIONS
        ]
        lines.append(f"| {row['model']} | {row['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/transformers", help="folder for the .json and .md")
    parser.add_argument("--models", nargs="+", default=list(EXPERTS), choices=list(EXPERTS))
    parser.add_argument("--no-decode", action="store_true", help="skip the whole-model decode")
    parser.add_argument("--no-compiled-decode", action="store_true", help="skip the decode under torch.compile")
    args = parser.parse_args(argv)
    require_gpu_timing("benchmarks/transformers_experts.py")
    register()
    started = time.time()
    device = torch.cuda.get_device_name()
    result = dict(
        device=device,
        torch=torch.__version__,
        triton=triton.__version__,
        transformers=transformers.__version__,
        moe_lab=moe_lab.__version__,
        date=datetime.date.today().isoformat(),
        experts=[],
    )
    for name in args.models:
        result["experts"] += bench_experts(name)
        torch.cuda.empty_cache()
    result["decode"] = []
    if not args.no_decode:
        result["decode"] += bench_decode("qwen3-30b-a3b") + bench_decode("gpt-oss-20b")
        if not args.no_compiled_decode:
            result["decode"] += bench_decode("qwen3-30b-a3b", compiled=True)
    result["seconds"] = round(time.time() - started, 1)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"transformers-experts-{device.replace(' ', '_')}-{result['date']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {stem}.json and {stem}.md in {result['seconds']} s; peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
