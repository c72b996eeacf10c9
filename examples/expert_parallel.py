"""Expert parallelism over the GPUs of one host, with moe-lab's `expert_map`.

Each rank holds E / world_size experts (a contiguous slice of w1 and w2), computes the share of every
token's output that its experts produce (`fused_moe(..., expert_map=...)`: slots routed to other ranks
contribute zero), and one all-reduce sums the shares. Rank 0 checks the result against the same layer on
one GPU and against the float32 reference.

    torchrun --nproc_per_node 2 examples/expert_parallel.py [--model qwen3-30b-a3b] [--tokens 512]
"""

import argparse
import os

import torch
import torch.distributed as dist

from moe_lab import fused_moe, fused_moe_reference, get_preset, relative_error


def shard_experts(num_experts: int, rank: int, world: int, device) -> tuple:
    """This rank's expert slice [lo, hi) and the map global expert -> local index (-1 elsewhere)."""
    per_rank = -(-num_experts // world)
    lo, hi = rank * per_rank, min(num_experts, (rank + 1) * per_rank)
    expert_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
    expert_map[lo:hi] = torch.arange(hi - lo, dtype=torch.int32, device=device)
    return lo, hi, expert_map


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)

    # Rank 0 draws the layer and the routing; every rank receives the same tensors.
    preset = get_preset(args.model)
    hs, w1, w2, (tw, ti) = preset.build(args.tokens, dtype=torch.bfloat16, device=device, seed=0)
    for t in (hs, w1, w2, tw, ti):
        dist.broadcast(t, src=0)

    lo, hi, expert_map = shard_experts(preset.num_experts, rank, world, device)
    w1_local, w2_local = w1[lo:hi].contiguous(), w2[lo:hi].contiguous()
    out = fused_moe(hs, w1_local, w2_local, tw, ti, expert_map=expert_map)
    dist.all_reduce(out)  # the shares of the experts on every rank

    status = 0
    if rank == 0:
        single = fused_moe(hs, w1, w2, tw, ti)
        err_single = relative_error(out, single)
        err_ref = relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti))
        ok = err_single < 1e-2 and err_ref < 1e-2
        print(
            f"{preset.name}, T={args.tokens}, {world} GPUs x {hi - lo} experts: relative error vs one GPU "
            f"{err_single:.2e}, vs float32 reference {err_ref:.2e}: {'ok' if ok else 'FAIL'}",
            flush=True,
        )
        status = 0 if ok else 1
    flag = torch.tensor([status], device=device)
    dist.broadcast(flag, src=0)
    dist.destroy_process_group()
    return int(flag.item())


if __name__ == "__main__":
    raise SystemExit(main())
