"""Expert parallelism over the GPUs of one host: all_to_all (dispatch and combine) against all_reduce, each
checked against one GPU's `fused_moe` of the whole batch and timed per layer.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 8 benchmarks/expert_parallel.py [--models ...] [--tokens ...]
    python benchmarks/expert_parallel.py --cpu --world 2    # gloo and the interpreter at tiny sizes: the logic only

Per model (Qwen3-30B-A3B and DeepSeek-V3 by default, random weights; gpt-oss's with its kind of experts,
`preset.expert_kind()`: the activation and biases) and T tokens per rank (1, 64, 512, 4096):
the whole batch is W*T tokens, rank r owning rows [r*T, (r+1)*T).
- all_to_all: each rank runs `fused_moe_expert_parallel(mode="all_to_all")` on its T tokens. Checked against
  one GPU (bitwise? and the relative Frobenius error); timed as a whole and by phase (dispatch, experts,
  combine, a sync between phases), communication share = (dispatch + combine) / (sum of the phases).
- all_reduce: every rank holds the whole batch (W*T tokens) and runs mode="all_reduce"; phases: experts and
  the all-reduce. The all-gather of [T, H] that would replicate data-parallel tokens is timed on its own.
- bytes per rank: all_to_all, the rows a rank sends to other ranks, both ways ((H x itemsize + 8) bytes per
  row and slot: the row, its local expert and weight); all_reduce, a ring's 2 (W-1)/W x W*T x H x itemsize.
Each time is the median over --iters calls of the host's clock around the call (device synchronized, ranks
at a barrier first), the slowest rank's. Writes JSON (--json; on a GPU by default
benchmarks/results/expert_parallel-<device>-<W>gpu-<date>.json) and prints a markdown table. Under the
interpreter (--cpu) the times are not measurements; the run checks the logic only. Needs about 25 GB per GPU
at DeepSeek-V3's shape (each rank builds every expert, to compute the one-GPU result itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

MODELS = ("qwen3-30b-a3b", "deepseek-v3")
TOKENS = (1, 64, 512, 4096)
TOLERANCE = 1e-2  # relative Frobenius error against one GPU's fused_moe (both round in bf16)


def _check_json_path(parser, path):
    """--json must be a file rank 0 can write at the end: refused now, not after the whole run (its folder is
    made now and probed with a temporary file of its own name, so ranks checking at once do not collide)."""
    from moe_lab.tools.timing import folder_write_problem

    target = pathlib.Path(path)
    if not path or target.is_dir():
        parser.error(f"--json {path!r}: give a file name (such as results.json), not a folder")
    existing = next(p for p in (target.parent.absolute(), *target.parent.absolute().parents) if p.exists())
    if not existing.is_dir():
        parser.error(f"--json {path}: {existing} is not a folder")
    problem = folder_write_problem(str(target.parent))
    if problem is None and target.exists() and not os.access(target, os.W_OK):
        problem = "the file is not writable"
    if problem:
        parser.error(f"--json {path}: cannot write there ({problem}); give a file in a writable folder")


def parse_args(argv=None, world_from_torchrun=None):
    """The options, checked before any process starts (argparse's error, exit status 2, on a mistake)."""
    from moe_lab import get_preset
    from moe_lab.presets import EXPERT_KIND_PRESETS, PRESETS
    from moe_lab.tools.cli import int_at_least_one

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", nargs="+", type=str.lower, choices=(*PRESETS, *EXPERT_KIND_PRESETS), default=list(MODELS)
    )
    parser.add_argument(
        "--tokens",
        nargs="+",
        type=int_at_least_one,
        default=None,
        help="tokens per rank, each >= 1 (default 1 64 512 4096)",
    )
    parser.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16", help="fp8: [128, 128] block-scaled weights")
    parser.add_argument(
        "--iters", type=int_at_least_one, default=None, help="timed calls per point (default 20; 1 with --cpu)"
    )
    parser.add_argument("--json", default=None, help="where to write the results (a file; checked before the run)")
    parser.add_argument("--cpu", action="store_true", help="gloo and Triton's interpreter, H and I divided by --scale")
    parser.add_argument(
        "--world", type=int_at_least_one, default=2, help="with --cpu: the number of processes to spawn (1 to E)"
    )
    parser.add_argument("--scale", type=int_at_least_one, default=64, help="with --cpu: divide H and I by this")
    parser.add_argument(
        "--experts", type=int_at_least_one, default=None, help="with --cpu: this many experts (default: the model's)"
    )
    args = parser.parse_args(argv)
    world, where = (args.world, "--world") if world_from_torchrun is None else (world_from_torchrun, "WORLD_SIZE")
    for name in args.models:
        preset = get_preset(name)
        experts = args.experts if args.cpu and args.experts else preset.num_experts
        source = "--experts" if args.cpu and args.experts else f"{name}'s"
        if experts < preset.top_k:
            parser.error(f"--experts {experts}: {name} routes each token to {preset.top_k}; give at least that many")
        if world > experts:
            parser.error(f"{where} {world}: at most {source} {experts} experts (each rank holds one or more)")
    if args.json is not None:
        _check_json_path(parser, args.json)
    args.tokens = args.tokens or ([1, 4] if args.cpu else list(TOKENS))
    args.iters = args.iters or (1 if args.cpu else 20)
    args.warmup = 0 if args.cpu else 2  # the interpreter compiles nothing
    return args


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(values, device, op=dist.ReduceOp.MAX):
    """The per-rank values reduced over the ranks (the slowest rank's time by default)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def _phases(steps, args, device):
    """Median milliseconds of each step of `steps` (callables run in order, each given the previous one's
    result) over args.iters calls after args.warmup, the device synchronized between steps and the ranks
    at a barrier first; the slowest rank's."""
    times = [[] for _ in steps]
    for _ in range(args.warmup + args.iters):
        dist.barrier()
        _sync(device)
        value = None
        for i, step in enumerate(steps):
            start = time.perf_counter()
            value = step(value)
            _sync(device)
            times[i].append((time.perf_counter() - start) * 1e3)
    return _slowest([statistics.median(t[args.warmup :]) for t in times], device)


def run_model(name, args, rank, world, device):
    from moe_lab import fused_moe, get_preset, relative_error
    from moe_lab.expert_parallel import combine, dispatch, expert_map_for_rank, expert_range, fused_moe_expert_parallel

    preset = get_preset(name)
    if args.cpu:
        preset = preset.scaled(args.scale)
        if args.experts:  # fewer experts: the interpreter walks every expert's padded blocks
            preset = dataclasses.replace(preset, num_experts=args.experts)
    E, H = preset.num_experts, preset.hidden_size
    hs_all, w1, w2, routing = preset.build(world * max(args.tokens), dtype=torch.bfloat16, device=device, seed=0)
    scales = {}
    if args.dtype == "fp8":
        w1, w2, scales = preset.quantize_fp8(w1, w2, block_shape=(128, 128))
    scales.update(preset.expert_kind(dtype=torch.bfloat16, device=device, seed=1))  # gpt-oss: activation, biases
    lo, hi = expert_range(E, rank, world)
    w1_local, w2_local = w1[lo:hi].contiguous(), w2[lo:hi].contiguous()
    local_scales = {k: (v[lo:hi].contiguous() if k.endswith(("_scale", "_bias")) else v) for k, v in scales.items()}
    item = hs_all.element_size()
    rows = []
    for T in args.tokens:
        n = world * T
        hs, tw, ti = hs_all[:n], routing.topk_weights[:n], routing.topk_ids[:n]
        mine = slice(rank * T, (rank + 1) * T)
        single = fused_moe(hs, w1, w2, tw, ti, **scales)

        def layer(mode, x, weights, ids):
            return fused_moe_expert_parallel(
                x, w1_local, w2_local, weights, ids, num_experts=E, mode=mode, **local_scales
            )

        # all_to_all: this rank's T tokens
        out = layer("all_to_all", hs[mine], tw[mine], ti[mine])
        bitwise, err = _slowest([float(not torch.equal(out, single[mine])), relative_error(out, single[mine])], device)
        (whole,) = _phases([lambda _: layer("all_to_all", hs[mine], tw[mine], ti[mine])], args, device)
        d = dispatch(hs[mine], tw[mine], ti[mine], num_experts=E, group=None)
        sent = sum(d.send_counts) - d.send_counts[rank]
        a2a_bytes = _slowest([2.0 * sent * (H * item + 8)], device, dist.ReduceOp.SUM)[0] / world
        t_dispatch, t_experts, t_combine = _phases(
            [
                lambda _: dispatch(hs[mine], tw[mine], ti[mine], num_experts=E),
                lambda d: (
                    d,
                    fused_moe(d.hidden_states, w1_local, w2_local, d.topk_weights, d.topk_ids, **local_scales),
                ),
                lambda de: combine(de[1], de[0], ti[mine], num_experts=E),
            ],
            args,
            device,
        )
        comm = t_dispatch + t_combine
        rows.append(
            dict(
                model=name, world=world, tokens_per_rank=T, mode="all_to_all", ms=whole,
                phases_ms=dict(dispatch=t_dispatch, experts=t_experts, combine=t_combine),
                comm_share=comm / max(comm + t_experts, 1e-9), bytes_per_rank=a2a_bytes,
                bitwise_vs_one_gpu=bitwise == 0.0, rel_err_vs_one_gpu=err,
            )
        )  # fmt: skip
        # all_reduce: every rank the whole batch
        out = layer("all_reduce", hs, tw, ti)
        (err,) = _slowest([relative_error(out, single)], device)
        (whole,) = _phases([lambda _: layer("all_reduce", hs, tw, ti)], args, device)
        emap = expert_map_for_rank(E, rank, world, device)
        t_experts, t_reduce = _phases(
            [
                lambda _: fused_moe(hs, w1_local, w2_local, tw, ti, expert_map=emap, **local_scales),
                lambda y: dist.all_reduce(y),
            ],
            args,
            device,
        )
        gathered = hs.new_empty((n, H))
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13
        (t_gather,) = _phases([lambda _: all_gather(gathered, hs[mine])], args, device)
        rows.append(
            dict(
                model=name, world=world, tokens_per_rank=T, mode="all_reduce", ms=whole,
                phases_ms=dict(experts=t_experts, all_reduce=t_reduce, all_gather_not_included=t_gather),
                comm_share=t_reduce / max(t_reduce + t_experts, 1e-9),
                bytes_per_rank=2.0 * (world - 1) / world * n * H * item,
                bitwise_vs_one_gpu=bool(torch.equal(out, single)), rel_err_vs_one_gpu=err,
            )
        )  # fmt: skip
    return rows


def table(rows, interpreted):
    note = " (interpreter: not measurements)" if interpreted else ""
    lines = [
        f"| model | W | T/rank | mode | ms/layer{note} | phases (ms) | comm share | MB/rank | bitwise | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        phases = ", ".join(f"{k} {v:.3f}" for k, v in r["phases_ms"].items())
        lines.append(
            f"| {r['model']} | {r['world']} | {r['tokens_per_rank']} | {r['mode']} | {r['ms']:.3f} | {phases} | "
            f"{r['comm_share']:.0%} | {r['bytes_per_rank'] / 1e6:.3f} | {r['bitwise_vs_one_gpu']} | "
            f"{r['rel_err_vs_one_gpu']:.1e} |"
        )
    return "\n".join(lines)


def worker(rank, world, args, init_method=None):
    if args.cpu:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        device = torch.device("cpu")
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    import moe_lab
    from moe_lab.runtime import interpreter_active

    torch.set_grad_enabled(False)
    rows = [row for name in args.models for row in run_model(name, args, rank, world, device)]
    failed = [r for r in rows if not r["rel_err_vs_one_gpu"] < TOLERANCE]
    if rank == 0:
        print(table(rows, interpreter_active()), flush=True)
        print(f"{'FAIL: ' + str(len(failed)) + ' points' if failed else 'ok'}: relative error vs one GPU < {TOLERANCE}")
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
        path = args.json or (
            None
            if args.cpu
            else f"benchmarks/results/expert_parallel-{device_name.replace(' ', '_')}-{world}gpu-"
            f"{datetime.date.today().isoformat()}.json"
        )
        if path:
            pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            info = dict(
                device=device_name, world=world, dtype=args.dtype, torch=torch.__version__,
                moe_lab=moe_lab.__version__, date=datetime.date.today().isoformat(),
                interpreter=interpreter_active(), iters=args.iters, rows=rows,
            )  # fmt: skip
            pathlib.Path(path).write_text(json.dumps(info, indent=1) + "\n")
            print(f"wrote {path}")
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


def main(argv=None) -> int:
    args = parse_args(argv, int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ else None)
    if "RANK" in os.environ:  # under torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, init_method="env://")
        return 0
    if not args.cpu:
        print("run it under torchrun (see the docstring), or with --cpu", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:  # a file:// rendezvous: no network
        mp.spawn(worker, args=(args.world, args, f"file://{tmp}/init"), nprocs=args.world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
