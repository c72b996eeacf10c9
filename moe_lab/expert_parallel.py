"""Expert parallelism over a torch.distributed group: each rank holds a contiguous block of the experts.

Two ways to run a layer whose experts are spread over the ranks (docs/expert_parallel.md compares them):

    all_reduce   every rank holds the same T tokens; each computes the share of its experts
                 (`fused_moe(..., expert_map=...)`) and one all-reduce of [T, H] sums the shares.
    all_to_all   each rank holds its own tokens; their (token, slot) rows travel to the ranks of their
                 experts (dispatch), run there as rows of top_k = 1, and travel back (combine), where each
                 token sums its k slots in slot order, as `fused_moe` does on one GPU.

    topk_ids [T, k] ──dest rank, stable sort──▶ order [S] ──all_to_all(counts), one host sync──▶ split sizes
    hidden_states[order // k], (local expert, weight) ──all_to_all──▶ rows [R, H] on the experts' rank
    fused_moe(rows, w1_local, w2_local, top_k = 1) [R, H] ──all_to_all──▶ out_k[order] [T*k, H]
    out_k ──topk_reduce (slots in order)──▶ out [T, H]

The experts are split by `expert_range`: the first E % world ranks hold one expert more.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ._validate import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_layer_out,
    check_layer_out_overlap,
    check_one_device,
    check_positive_int,
    check_tensor,
)
from .layer import fused_moe
from .reduce import topk_reduce

MODES = ("all_to_all", "all_reduce")


def expert_range(num_experts: int, rank: int, world_size: int) -> Tuple[int, int]:
    """The experts [lo, hi) that `rank` of `world_size` holds: contiguous blocks, the first
    num_experts % world_size ranks one expert more (E = 6 over 4 ranks: [0, 2), [2, 4), [4, 5), [5, 6)).
    Raises TypeError for an argument that is not an int, ValueError unless 0 <= rank < world_size <=
    num_experts (every rank holds an expert)."""
    num_experts = check_positive_int("num_experts", num_experts)
    world_size = check_positive_int("world_size", world_size)
    if world_size > num_experts:
        raise ValueError(
            f"world_size must be at most num_experts={num_experts} (each rank holds at least one expert), "
            f"got {world_size}"
        )
    rank = check_positive_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, {world_size}) (world_size={world_size}), got {rank}")
    per_rank, extra = divmod(num_experts, world_size)
    lo = rank * per_rank + min(rank, extra)
    return lo, lo + per_rank + (rank < extra)


@functools.lru_cache(maxsize=64)
def expert_map_for_rank(num_experts: int, rank: int, world_size: int, device: torch.device) -> torch.Tensor:
    """[E] int32: global expert -> its index in this rank's block (`expert_range`), -1 on other ranks;
    the `expert_map` of `fused_moe`. Cached per (E, rank, world_size, device): treat it as read-only."""
    lo, hi = expert_range(num_experts, rank, world_size)
    expert_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
    expert_map[lo:hi] = torch.arange(hi - lo, dtype=torch.int32, device=device)
    return expert_map


@dataclass(frozen=True)
class Dispatched:
    """What `dispatch` delivered to this rank and what `combine` needs to send it back.

    hidden_states [R, H]: the rows routed to this rank's experts, grouped by source rank, each group in
    its tokens' (token, slot) order; topk_weights [R, 1] float32 and topk_ids [R, 1] int32 (local experts):
    their routing, as `fused_moe` takes it with top_k = 1. order [S] int64: the slot t*k + j of each row
    this rank sent, in sending order. send_counts / recv_counts: rows sent to / received from each rank."""

    hidden_states: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    order: torch.Tensor
    send_counts: List[int]
    recv_counts: List[int]


def _group_rank_and_size(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "expert parallelism needs torch.distributed initialized (dist.init_process_group: nccl on GPUs, "
            "gloo on CPUs)"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _destinations(topk_ids: torch.Tensor, num_experts: int, world_size: int):
    """(rank, local expert) of every slot, [T*k] int64 each; rank = world_size for ids outside [0, E)."""
    ids = topk_ids.reshape(-1).long()
    per_rank, extra = divmod(num_experts, world_size)
    wide = extra * (per_rank + 1)  # the experts of the ranks that hold one more
    rank = torch.where(ids < wide, ids // (per_rank + 1), extra + (ids - wide) // per_rank)
    local = torch.where(ids < wide, ids % (per_rank + 1), (ids - wide) % per_rank)
    valid = (ids >= 0) & (ids < num_experts)
    return torch.where(valid, rank, world_size), local


# The facts each rank adds to its counts: (ids outside [0, E), H, dtype index, num_experts, refused).
_FACTS = 5


def _exchange_counts(counts: torch.Tensor, facts: torch.Tensor, group, world: int):
    """The collective every rank's dispatch starts with: row r of `send` goes to rank r, (rows for r, this
    rank's facts [_FACTS]), so every rank sees every rank's facts. Returns (send_counts, recv_counts, facts
    per rank) as Python ints: the one host sync."""
    send = torch.cat((counts[:, None], facts.expand(world, _FACTS)), dim=1)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    both = torch.cat((send[:, 0], recv[:, 0], recv[:, 1:].reshape(-1))).tolist()
    facts = [tuple(both[2 * world + r * _FACTS : 2 * world + (r + 1) * _FACTS]) for r in range(world)]
    return both[:world], both[world : 2 * world], facts


def _check_agreement(seen: list) -> None:
    """Raise on every rank if a rank refused its arguments or the ranks disagree on num_experts."""
    refused = [r for r, fact in enumerate(seen) if fact[4]]
    if refused:
        ranks, its = (
            (f"ranks {', '.join(map(str, refused))}", "their") if len(refused) > 1 else (f"rank {refused[0]}", "its")
        )
        raise ValueError(
            f"{ranks} of the group refused {its} arguments ({its} own error says why); every rank of the group "
            "raises this instead of waiting for it"
        )
    experts = [fact[3] for fact in seen]
    if len(set(experts)) > 1:
        raise ValueError(
            "num_experts must be the same on every rank of the group, got "
            + ", ".join(f"rank {r}: {e}" for r, e in enumerate(experts))
        )


def _refuse_together(hidden_states, group, world: int) -> None:
    """This rank's arguments failed its checks: join the counts' exchange (sending no rows) with the refusal
    flag set, so that the other ranks raise too instead of waiting in a collective."""
    # The backend's device, not hidden_states' (which may be the mistake): NCCL exchanges CUDA tensors, gloo CPU
    # ones; a group of both (the default "cpu:gloo,cuda:nccl") takes the rows' device where it is one of the two.
    backend = str(dist.get_backend(group))
    rows_on_cpu = isinstance(hidden_states, torch.Tensor) and hidden_states.device.type == "cpu"
    if backend == "gloo" or not torch.cuda.is_available() or (backend != "nccl" and rows_on_cpu):
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    counts = torch.zeros(world, dtype=torch.int64, device=device)
    _exchange_counts(counts, counts.new_tensor([0, 0, 0, 0, 1]), group, world)


def dispatch(
    hidden_states: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    num_experts: int,
    group=None,
) -> Dispatched:
    """Send each (token, slot) row of this rank to the rank holding its expert; see `Dispatched`.

    Collective: every rank of `group` calls it (a rank with T = 0 too). It exchanges the counts, reads them
    back to the host once (the one sync: `all_to_all_single` takes its split sizes as Python ints), then
    sends the rows in hidden_states' dtype and their (local expert, weight) pairs. Raises ValueError on
    every rank if any rank's topk_ids hold an expert outside [0, num_experts), or if the ranks' hidden_states
    differ in H or dtype."""
    rank, world = _group_rank_and_size(group)
    expert_range(num_experts, rank, world)  # raises unless every rank holds an expert
    top_k = topk_ids.shape[1]
    dest, local = _destinations(topk_ids, num_experts, world)
    order = torch.argsort(dest, stable=True)  # by rank, each rank's slots in (token, slot) order
    counts = torch.bincount(dest, minlength=world + 1)
    facts = torch.cat(
        (
            counts[world:],
            counts.new_tensor([hidden_states.shape[1], FLOAT_DTYPES.index(hidden_states.dtype), num_experts, 0]),
        )
    )
    send_counts, recv_counts, seen = _exchange_counts(counts[:world], facts, group, world)
    _check_agreement(seen)
    bad, widths, dtypes = ([fact[i] for fact in seen] for i in range(3))
    if any(bad):
        worst = next(r for r, b in enumerate(bad) if b)
        raise ValueError(
            f"topk_ids must hold experts in [0, {num_experts}): rank {worst} of the group has {bad[worst]} outside"
        )
    if len(set(widths)) > 1 or len(set(dtypes)) > 1:
        seen = ", ".join(f"rank {r}: H={h} {FLOAT_DTYPES[d]}" for r, (h, d) in enumerate(zip(widths, dtypes)))
        raise ValueError(f"hidden_states must have the same H and dtype on every rank of the group, got {seen}")
    rows = hidden_states.index_select(0, order // top_k)
    # The local expert and the routed weight's float32 bits travel together, one collective for both; the
    # kernel multiplies in float32 anyway, so a bfloat16 weight sent as float32 gives the same product.
    meta = torch.stack((local[order].int(), topk_weights.reshape(-1)[order].float().view(torch.int32)), dim=1)
    got_rows = rows.new_empty((sum(recv_counts), rows.shape[1]))
    got_meta = meta.new_empty((got_rows.shape[0], 2))
    dist.all_to_all_single(got_rows, rows, recv_counts, send_counts, group=group)
    dist.all_to_all_single(got_meta, meta, recv_counts, send_counts, group=group)
    return Dispatched(
        got_rows,
        got_meta[:, 1:].view(torch.float32),
        got_meta[:, :1],
        order,
        send_counts,
        recv_counts,
    )


def combine(
    expert_out: torch.Tensor,
    dispatched: Dispatched,
    topk_ids: torch.Tensor,
    *,
    num_experts: int,
    group=None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Send the experts' rows expert_out [R, H] (in `dispatched.hidden_states`' order) back to their
    tokens' ranks and sum each token's k slots in slot order (`topk_reduce`, float32 accumulation).
    Collective, like `dispatch`; no host sync (the split sizes are the dispatch's). Returns [T, H] (`out`
    if given) in expert_out's dtype."""
    num_tokens, top_k = topk_ids.shape
    back = expert_out.new_empty((len(dispatched.order), expert_out.shape[1]))
    dist.all_to_all_single(back, expert_out, dispatched.send_counts, dispatched.recv_counts, group=group)
    out_k = torch.empty((num_tokens * top_k, expert_out.shape[1]), dtype=back.dtype, device=back.device)
    out_k.index_copy_(0, dispatched.order, back)  # every slot is sent once and comes back once
    return topk_reduce(out_k, topk_ids, num_experts, out=out)


def fused_moe_expert_parallel(
    hidden_states: torch.Tensor,
    w1_local: torch.Tensor,
    w2_local: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    num_experts: int,
    mode: str = "all_to_all",
    group=None,
    out: Optional[torch.Tensor] = None,
    **layer_options,
) -> torch.Tensor:
    """The MoE layer of `fused_moe` with the experts spread over the ranks of a torch.distributed group
    (NCCL on GPUs, gloo on CPUs). Collective: every rank of `group` calls it, with the same mode.

    Args:
        hidden_states: [T, H] this rank's tokens (all_to_all: its own, T may differ between ranks and be 0;
            all_reduce: the same T tokens on every rank).
        w1_local: [E_local, 2I, H] and w2_local: [E_local, H, I]: this rank's experts, global experts
            [lo, hi) = `expert_range(num_experts, rank, world_size)` (the first E % world ranks hold one more):
            pass `w1[lo:hi]` and `w2[lo:hi]`. Only their number of experts can be checked (E_local = hi - lo);
            which experts they hold cannot: another block of the same size gives a wrong result silently.
        topk_weights, topk_ids: [T, k] routing over the global experts [0, num_experts).
        num_experts: E, the global number of experts (world_size <= E).
        mode: "all_to_all" (dispatch and combine) or "all_reduce" (`fused_moe` with the rank's
            `expert_map`, then one all-reduce of [T, H]).
        group: the process group (default: the world).
        out: optional [T, H] output buffer, as `fused_moe` takes it (checked before any exchange).
        layer_options: `fused_moe`'s keywords (config, use_tma, activation, w1_bias / w2_bias and w1_scale /
            w2_scale of the local experts, a1_scale, a2_scale, block_shape, chunk_size, check_ids); not
            expert_map (set here) nor shared experts (every rank holds them: run them apart).
    Returns:
        [T, H] in hidden_states' dtype: this rank's tokens' outputs.

    all_to_all: the counts' exchange reads them back to the host once (to size the buffers), so this mode
    cannot be captured in a CUDA graph. Rows travel in hidden_states' dtype; with FP8 weights the receiving
    rank quantizes them (per token, as `fused_moe` does), so they are the same float8 values as on one GPU.
    The routed weight multiplies each row on the expert's rank (in the down GEMM's epilogue, as on one GPU),
    and each token sums its k slots in slot order after the combine, so a token's output is bitwise the
    same as one GPU's `fused_moe` of any batch holding it, at any world size, wherever `fused_moe` is batch
    invariant (bf16 and float32; the received rows run with top_k = 1 and E_local experts, which on a GPU
    takes the heuristic config where no tuned entry exists: it must sum K in the same steps). FP8 on Hopper
    with the tuned tiles is not batch invariant (docs/usage.md), so neither is it here.
    all_reduce: no host sync, CUDA-graph safe; the output is the sum of world_size rounded shares, in the
    order NCCL chooses, so it matches one GPU to rounding only.
    Raises:
        ValueError for an unknown mode, a w1_local whose number of experts is not this rank's block's
        (hi - lo; which experts it holds is the caller's to get right), expert_map or shared experts among
        layer_options, or (on every rank) experts outside [0, num_experts) on any rank or ranks
        whose hidden_states differ in H or dtype; RuntimeError without torch.distributed initialized;
        `fused_moe`'s TypeError / ValueError for bad shapes, dtypes and options.
        all_to_all: a rank whose own arguments fail these checks (`fused_moe`'s included, run on no rows
        first, which costs host time per call) raises its error after telling the others in the
        counts' exchange, where they raise a ValueError naming it; ranks that disagree on num_experts all
        raise. A failure after the exchange (the received rows' launch) is not shared. all_reduce has no exchange to
        tell them in (no host sync): a rank refused alone raises alone and the others wait in the all-reduce
        until the group's timeout, as they do for a T that differs between ranks (gloo may abort the
        process); ranks that disagree on num_experts (with as many local experts) compute wrong shares
        without an error: every rank must pass the same. Ranks in different modes wait in different
        collectives: the mode must be the same.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    rank, world = _group_rank_and_size(group)
    num_experts = check_positive_int("num_experts", num_experts)  # (a 0-d tensor or numpy int as a Python int)
    if mode == "all_reduce":
        _check_local(hidden_states, w1_local, w2_local, topk_weights, topk_ids, num_experts, rank, world, layer_options)
        if out is not None:  # (fused_moe checks it too, naming its own arguments: w1, not w1_local)
            _check_out(out, hidden_states, w1_local, w2_local, topk_weights, topk_ids)
        expert_map = expert_map_for_rank(num_experts, rank, world, hidden_states.device)
        out = fused_moe(
            hidden_states, w1_local, w2_local, topk_weights, topk_ids, expert_map=expert_map, out=out, **layer_options
        )
        # the shares of every rank's experts; the collective reduces dense memory (an out with gaps between its
        # rows, which fused_moe takes, would be reduced wrong and past its rows)
        dense = out if out.is_contiguous() else out.contiguous()
        dist.all_reduce(dense, group=group)
        return out if dense is out else out.copy_(dense)
    try:
        _check_local(hidden_states, w1_local, w2_local, topk_weights, topk_ids, num_experts, rank, world, layer_options)
        if out is not None:  # as fused_moe checks it (combine writes it last, after the exchanges)
            _check_out(out, hidden_states, w1_local, w2_local, topk_weights, topk_ids)
        # fused_moe's own checks of the local experts and options, on no rows (the received rows' routing:
        # top_k = 1, float32 weights, int32 local ids): before the first collective.
        no_weights = topk_weights.new_empty((0, 1), dtype=torch.float32)
        fused_moe(hidden_states[:0], w1_local, w2_local, no_weights, no_weights.int(), **layer_options)
    except (TypeError, ValueError, RuntimeError):
        with contextlib.suppress(Exception):  # this rank's own error is the one to raise
            _refuse_together(hidden_states, group, world)
        raise
    dispatched = dispatch(hidden_states, topk_weights, topk_ids, num_experts=num_experts, group=group)
    expert_out = fused_moe(
        dispatched.hidden_states, w1_local, w2_local, dispatched.topk_weights, dispatched.topk_ids, **layer_options
    )
    return combine(expert_out, dispatched, topk_ids, num_experts=num_experts, group=group, out=out)


def _check_out(out, hidden_states, w1_local, w2_local, topk_weights, topk_ids):
    """`out` [T, H] as fused_moe takes it (its checks, shared: moe_lab._validate)."""
    check_layer_out(out, hidden_states, "fused_moe_expert_parallel")
    check_layer_out_overlap(
        out, hidden_states, w1_local=w1_local, w2_local=w2_local, topk_weights=topk_weights, topk_ids=topk_ids
    )


def _check_local(hidden_states, w1_local, w2_local, topk_weights, topk_ids, num_experts, rank, world, layer_options):
    """The checks of fused_moe_expert_parallel's arguments that need no other rank."""
    lo, hi = expert_range(num_experts, rank, world)
    check_tensor("hidden_states", hidden_states, ndim=2, dtypes=FLOAT_DTYPES, layout="[T, H]")
    check_tensor(
        "topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, shape=(hidden_states.shape[0], None), layout="[T, k]"
    )
    check_tensor(
        "topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES, shape=tuple(topk_ids.shape), layout="[T, k]"
    )
    check_one_device(hidden_states=hidden_states, topk_ids=topk_ids, topk_weights=topk_weights)
    if "return_info" in layer_options:
        raise ValueError("return_info is fused_moe's alone: fused_moe_expert_parallel returns the output only")
    if not 1 <= topk_ids.shape[1] <= num_experts:
        raise ValueError(f"topk_ids must have 1 <= k <= E={num_experts} columns, got shape {tuple(topk_ids.shape)}")
    if not isinstance(w1_local, torch.Tensor) or w1_local.dim() != 3 or w1_local.shape[0] != hi - lo:
        got = tuple(w1_local.shape) if isinstance(w1_local, torch.Tensor) else type(w1_local).__name__
        raise ValueError(
            f"w1_local must be [E_local, 2I, H] with this rank's {hi - lo} experts (global [{lo}, {hi}) of "
            f"{num_experts} over {world} ranks: expert_range), got {got}; pass w1[{lo}:{hi}] of the global w1"
        )
    if "expert_map" in layer_options:
        raise ValueError("expert_map is set per rank by fused_moe_expert_parallel (expert_range); do not pass it")
    shared = sorted(name for name in ("shared_w1", "shared_w2", "shared_weights") if name in layer_options)
    if shared:
        raise ValueError(
            f"shared experts ({', '.join(shared)}) are not split over ranks: every rank holds them, so run them on "
            "this rank's tokens with fused_moe or a dense MLP and add that to this function's output"
        )
