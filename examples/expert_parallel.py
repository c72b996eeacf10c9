"""Expert parallelism with moe-lab, both modes of `moe_lab.fused_moe_expert_parallel`.

Each rank holds a contiguous block of the experts (`moe_lab.expert_range`).
- all_to_all: each rank keeps its own T tokens; their rows travel to their experts' ranks and back
  (dispatch and combine), so each rank's GEMMs see only the rows routed to it.
- all_reduce: every rank holds the same tokens (here all ranks' W*T), computes its experts' share
  (`fused_moe(..., expert_map=...)`) and one all-reduce sums the shares.
Every rank checks its result against the same layer on one device and against the float32 reference.
docs/expert_parallel.md says which mode wins where.

    torchrun --nproc_per_node 2 examples/expert_parallel.py [--model qwen3-30b-a3b] [--tokens 512]
    python examples/expert_parallel.py          # no GPU: 2 processes over gloo, H and I divided by 64

Any preset runs, gpt-oss's too (with its kind of experts: `preset.expert_kind()`, the activation and the
biases, each rank passing its block of the biases as of the weights). The arguments are checked before any
process starts: --world (or torchrun's world size) from 1 to the model's number of experts, --tokens >= 1.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_lab import expert_range, fused_moe, fused_moe_expert_parallel, fused_moe_reference, get_preset, relative_error
from moe_lab.presets import EXPERT_KIND_PRESETS, PRESETS
from moe_lab.tools.cli import int_at_least_one

MODELS = (*PRESETS, *EXPERT_KIND_PRESETS)


def run(rank: int, world: int, args, init_method: str) -> int:
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=init_method, rank=rank, world_size=world)
    torch.set_grad_enabled(False)

    # Every rank draws the same layer and the same batch of W*T tokens (one seed); rank r owns rows [r*T, (r+1)*T).
    preset = get_preset(args.model) if on_gpu else get_preset(args.model).scaled(64)
    tokens = args.tokens or (512 if on_gpu else 4)
    hs, w1, w2, (tw, ti) = preset.build(world * tokens, dtype=torch.bfloat16, device=device, seed=0)
    kind = preset.expert_kind(dtype=torch.bfloat16, device=device, seed=1)  # gpt-oss: activation, biases; else {}
    lo, hi = expert_range(preset.num_experts, rank, world)
    w1_local, w2_local = w1[lo:hi].contiguous(), w2[lo:hi].contiguous()
    local_kind = {k: (v[lo:hi].contiguous() if k.endswith("_bias") else v) for k, v in kind.items()}  # this block's
    mine = slice(rank * tokens, (rank + 1) * tokens)

    single = fused_moe(hs, w1, w2, tw, ti, **kind)
    reference = fused_moe_reference(hs, w1, w2, tw, ti, **kind)
    outputs = {
        "all_to_all": (fused_moe_expert_parallel(hs[mine], w1_local, w2_local, tw[mine], ti[mine],
                                                 num_experts=preset.num_experts, **local_kind), mine),
        "all_reduce": (fused_moe_expert_parallel(hs, w1_local, w2_local, tw, ti, num_experts=preset.num_experts,
                                                 mode="all_reduce", **local_kind), slice(None)),
    }  # fmt: skip
    failed = 0
    for mode, (out, rows) in outputs.items():
        err_single, err_ref = relative_error(out, single[rows]), relative_error(out, reference[rows])
        ok = err_single < 1e-2 and err_ref < 1e-2
        failed += not ok
        print(
            f"rank {rank}, {mode}: {preset.name}, T={tokens} per rank, {world} ranks x {hi - lo} experts: "
            f"relative error vs one device {err_single:.2e} (bitwise equal: {torch.equal(out, single[rows])}), "
            f"vs float32 reference {err_ref:.2e}: {'ok' if ok else 'FAIL'}",
            flush=True,
        )
    flag = torch.tensor([failed], device=device)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return int(flag.item())


def _spawned(rank, world, args, init_method):
    if run(rank, world, args, init_method):
        raise SystemExit(1)


def parse_args(argv=None, world_from_torchrun=None):
    """The options, checked before any process starts (argparse's error, exit status 2, on a mistake)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-30b-a3b", type=str.lower, choices=MODELS, help="a model preset")
    parser.add_argument(
        "--tokens",
        type=int_at_least_one,
        default=None,
        help="tokens per rank, >= 1 (default: 512 on GPUs, 4 on the CPU)",
    )
    parser.add_argument(
        "--world", type=int_at_least_one, default=2, help="without torchrun: the number of processes (1 to E)"
    )
    args = parser.parse_args(argv)
    num_experts = get_preset(args.model).num_experts
    world, where = (args.world, "--world") if world_from_torchrun is None else (world_from_torchrun, "WORLD_SIZE")
    if world > num_experts:
        parser.error(f"{where} {world}: at most {args.model}'s {num_experts} experts (each rank holds one or more)")
    return args


def main(argv=None) -> int:
    torchrun = "RANK" in os.environ
    args = parse_args(argv, int(os.environ["WORLD_SIZE"]) if torchrun else None)
    if torchrun:
        return run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
    with tempfile.TemporaryDirectory() as tmp:  # a file:// rendezvous: no network
        mp.spawn(_spawned, args=(args.world, args, f"file://{tmp}/init"), nprocs=args.world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
