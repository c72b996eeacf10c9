"""Notebook 05b's capstone: the learner writes the whole grouped GEMM, of the up and of the down projection.

    capstone_up_kernel(a_ptr, w_desc, out_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
                       num_m_blocks, N, K, num_slots, stride_am, stride_om,
                       TOP_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)
    capstone_down_kernel(a_desc, w_desc, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                         num_tokens_post_padded_ptr, num_m_blocks, N, K, num_slots, stride_om,
                         BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)

Both run on a 1-D grid of num_m_blocks * cdiv(N, BLOCK_SIZE_N) programs; program p computes the tile
(pid_m, pid_n) that Triton's grouped ordering gives it (GROUP_SIZE_M M-blocks walk the N-blocks together),
returns at once when its M-block lies past num_tokens_post_padded, and multiplies the block's rows by the
weights of its expert, `expert_ids[pid_m]`, read through a 3-D descriptor over w [E, N, K].
- up: row r of the block is token row a[sorted_token_ids[r] // TOP_K], gathered by pointer (masked: padding
  rows hold the sentinel num_slots = T * TOP_K; and past K), stored at out row r ([max_num_tokens_padded, N],
  padding rows as zeros), the columns masked past N.
- down: a [max_num_tokens_padded, K] is already in sorted order: the block's rows are one box of a 2-D
  descriptor at [pid_m * BLOCK_SIZE_M, k0]. Each row is multiplied by its slot's routed weight,
  topk_weights.flatten()[slot], and stored at out row `slot` ([T * TOP_K, N]); padding rows store nothing.

The learner also writes the host helpers that build the descriptors, `weight_desc(w, BLOCK_SIZE_N,
BLOCK_SIZE_K)` and `sorted_rows_desc(a, BLOCK_SIZE_M, BLOCK_SIZE_K)`. The reference solution is in
`capstone_solution.py`. On a GPU, a right kernel is also timed against `moe_lab.grouped_matmul` on the same
inputs at a real model's shape (`time_against_moe_lab`), and the ratio printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..._validate import check_bool, described
from ...align import AlignedRouting, moe_align
from ...plan import tile_grid, tile_of_program
from ...runtime import default_device, interpreter_active, require_gpu_timing
from ..guarded import GuardedRun, run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade, report

UP, DOWN = "capstone_up_kernel", "capstone_down_kernel"
EXERCISES = {"check_capstone_up": UP, "check_capstone_down": DOWN}  # each checker's label
TOL = 2e-3  # float16 outputs of float32 sums
OTHER_HINT = "other=0.0: padding rows (and columns past K) must multiply as zeros"


@dataclass(frozen=True)
class Case:
    """One size of the check: T tokens routed to TOP_K of E experts; the GEMM's K and N; the blocks."""

    T: int
    E: int
    TOP_K: int
    K: int
    N: int
    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    topk_ids: Optional[Tuple[Tuple[int, ...], ...]] = None  # None: every expert for every token (TOP_K = E)

    def describe(self, projection: str) -> str:
        return (
            f"T = {self.T}, E = {self.E}, TOP_K = {self.TOP_K}, K = {self.K}, N = {self.N}, blocks "
            f"{self.BLOCK_SIZE_M} x {self.BLOCK_SIZE_N} x {self.BLOCK_SIZE_K}, GROUP_SIZE_M = {self.GROUP_SIZE_M}"
        )


# E = 5 (not a power of two), expert 2 gets no token; K not a multiple of BLOCK_SIZE_K, N not of BLOCK_SIZE_N;
# 5 M-blocks (4 in use) in groups of 3: the last group is short, and holds a block in use.
_IDS = ((0, 1), (1, 3), (4, 0), (3, 4), (0, 1), (1, 4), (3, 0))
CASES = {
    UP: (Case(7, 5, 2, 56, 48, 16, 32, 16, 3, _IDS), Case(5, 3, 3, 40, 24, 16, 16, 32, 2)),
    DOWN: (Case(7, 5, 2, 24, 56, 16, 32, 16, 3, _IDS), Case(5, 3, 3, 40, 40, 16, 16, 32, 2)),
}


@dataclass
class Inputs:
    case: Case
    routing: AlignedRouting
    a: torch.Tensor  # up: [T, K] token rows (a view, rows K + 8 apart); down: [max_num_tokens_padded, K] sorted
    w: torch.Tensor  # [E, N, K]
    topk_weights: torch.Tensor  # [T, TOP_K] float32
    out: torch.Tensor  # NaN; up [max_num_tokens_padded, N], down [T * TOP_K, N]; rows padded past the N-blocks


def _inputs(case: Case, projection: str, device=None, dtype=torch.float16) -> Inputs:
    device = device or default_device()
    if case.topk_ids is None:
        ids = torch.stack([torch.randperm(case.E) for _ in range(case.T)])[:, : case.TOP_K]
    else:
        ids = torch.tensor(case.topk_ids)
    routing = moe_align(ids.to(torch.int32).to(device), case.E, case.BLOCK_SIZE_M)
    rows = case.T if projection == UP else routing.max_num_tokens_padded
    a = torch.randn(rows, case.K + 8, device=device).to(dtype)[:, : case.K]  # rows 16 bytes apart and more
    w = (torch.randn(case.E, case.N, case.K, device=device) / case.K**0.5).to(dtype)
    topk_weights = torch.softmax(torch.randn(case.T, case.TOP_K, device=device), dim=-1)
    out_rows = routing.max_num_tokens_padded if projection == UP else routing.num_slots
    # rows wider than the N-blocks reach: a store past N lands in the gap and shows
    width = triton.cdiv(case.N, case.BLOCK_SIZE_N) * case.BLOCK_SIZE_N + 8
    out = torch.full((out_rows, width), float("nan"), dtype=dtype, device=device)[:, : case.N]
    return Inputs(case, routing, a, w, topk_weights, out)


def _model(
    inp: Inputs,
    projection: str,
    *,
    expert: Callable[[int, int], int] = lambda block, e: e,
    k_stop: Optional[int] = None,
    k_start: int = 0,
    weight_power: int = 1,
    unused_written: bool = False,
    padding_written: bool = True,
    token_of_slot: Callable[[torch.Tensor, int], torch.Tensor] = lambda s, top_k: s // top_k,
    a_row0: Callable[[int, int], int] = lambda block, block_m: block * block_m,
) -> torch.Tensor:
    """What out holds after a kernel that computes this way (float64 sums, rounded to out's dtype): the
    right answer with the defaults; `expert(block, expert_ids[block])` the expert a block multiplies by (one
    outside [0, E) reads the descriptor's zeros); `k_stop` the K where the sum stops, `k_start` where it
    starts; `weight_power` how often the routed weight is applied (down); `unused_written` blocks past
    num_tokens_post_padded stored as zeros (up); `padding_written` padding rows stored as zeros (up);
    `token_of_slot(slots, TOP_K)` the token row a slot reads (up); `a_row0(block, BLOCK_SIZE_M)` the first
    sorted row the A box of a block starts at (down; rows past A read the descriptor's zeros)."""
    case, r = inp.case, inp.routing
    slots = r.sorted_token_ids.long().cpu()
    want = inp.out.detach().cpu().double().clone()
    a, w = inp.a.detach().cpu().double(), inp.w.detach().cpu().double()
    weights = inp.topk_weights.detach().cpu().double().flatten()
    used = int(r.num_tokens_post_padded.item()) // case.BLOCK_SIZE_M
    for block, e in enumerate(r.expert_ids.tolist()):
        rows = slice(block * case.BLOCK_SIZE_M, (block + 1) * case.BLOCK_SIZE_M)
        s = slots[rows]
        real = s < r.num_slots
        if block >= used:
            if unused_written and projection == UP:
                want[rows] = 0
            continue
        e = expert(block, e)
        wt = w[e] if 0 <= e < case.E else torch.zeros_like(w[0])
        if projection == UP:
            x = torch.zeros(case.BLOCK_SIZE_M, case.K, dtype=torch.float64)
            x[real] = a[token_of_slot(s[real], case.TOP_K)]
        else:
            x = torch.zeros(case.BLOCK_SIZE_M, case.K, dtype=torch.float64)
            start = a_row0(block, case.BLOCK_SIZE_M)
            box = a[start : start + case.BLOCK_SIZE_M]
            x[: box.shape[0]] = box
        if k_stop is not None:
            x[:, k_stop:] = 0
        x[:, :k_start] = 0
        y = x @ wt.T
        if projection == UP:
            want[rows] = torch.where(real[:, None] | padding_written, y, want[rows])
        else:
            want[s[real]] = y[real] * weights[s[real], None] ** weight_power
    return want.to(inp.out.dtype).to(inp.out.device)


def _mistakes(inp: Inputs, projection: str) -> List[Tuple[str, torch.Tensor]]:
    case = inp.case
    k_stop = case.K // case.BLOCK_SIZE_K * case.BLOCK_SIZE_K
    found = [
        (
            "wrong expert id: every block multiplied by expert 0's weights. The expert of M-block pid_m is "
            "tl.load(expert_ids_ptr + pid_m), the first offset of the weight box [expert, n0, k0]",
            _model(inp, projection, expert=lambda b, e: 0),
        ),
        (
            "wrong expert id: the M-block index pid_m is used as the expert. M-block pid_m belongs to expert "
            "tl.load(expert_ids_ptr + pid_m) (blocks are sorted by expert, several per expert, none for an "
            "expert without tokens)",
            _model(inp, projection, expert=lambda b, e: b),
        ),
        (
            f"the K tail is missing: K = {case.K} is not a multiple of BLOCK_SIZE_K = {case.BLOCK_SIZE_K}, and the "
            f"loop stopped at k0 = {k_stop}. Loop `for k0 in range(0, K, BLOCK_SIZE_K)`: the last step is partial "
            "(the descriptor gives zeros past K" + (", and the masked A load must too)" if projection == UP else ")"),
            _model(inp, projection, k_stop=k_stop),
        ),
        (
            "only the last K step's product is in the result: `acc = tl.dot(a, w.T)` starts the sum afresh at each "
            "step; pass the accumulator in, `acc = tl.dot(a, w.T, acc)` (or acc += tl.dot(a, w.T))",
            _model(inp, projection, k_start=(case.K - 1) // case.BLOCK_SIZE_K * case.BLOCK_SIZE_K),
        ),
    ]
    if projection == UP:
        found += [
            (
                "blocks past num_tokens_post_padded were written (with zeros): return at once when "
                "pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr); those blocks hold no rows (expert -1)",
                _model(inp, projection, unused_written=True),
            ),
            (
                "the padding rows of the blocks in use were left unwritten: store every row of the block (mask "
                "only the columns, offs_n < N); padding rows hold zeros, since their A rows load as 0.0",
                _model(inp, projection, padding_written=False),
            ),
            (
                "the token row is slots % TOP_K, which is the slot's place among its token's TOP_K experts: the "
                "token is slots // TOP_K",
                _model(inp, projection, token_of_slot=lambda s, top_k: s % top_k),
            ),
        ]
    else:
        found += [
            (
                "the routed weight is missing: multiply each row by its slot's weight, "
                "tl.load(topk_weights_ptr + slots, mask=row_ok, other=0.0)[:, None], before the store",
                _model(inp, projection, weight_power=0),
            ),
            (
                "the routed weight is applied twice: multiply the accumulator by it once, in the epilogue",
                _model(inp, projection, weight_power=2),
            ),
            (
                "the A box starts at row pid_m: M-block pid_m's sorted rows start at pid_m * BLOCK_SIZE_M, "
                "a_desc.load([pid_m * BLOCK_SIZE_M, k0])",
                _model(inp, projection, a_row0=lambda block, block_m: block),
            ),
        ]
    return found


def _tiles_seen(run: GuardedRun, inp: Inputs) -> Dict[int, Tuple[int, int]]:
    """{program: (pid_m, pid_n)} of every program that stored into out, from the record of its accesses:
    its M-block from its loads of sorted_token_ids, its N-block from the columns it stored."""
    case, stride = inp.case, inp.out.stride(0)
    rows: Dict[int, int] = {}
    cols: Dict[int, int] = {}
    for access in run.accesses:
        inside = access.offsets[access.in_bounds]
        if not inside.size:
            continue
        p = access.program[0]
        if access.tensor == "sorted_token_ids_ptr" and access.kind == "load":
            rows[p] = min(rows.get(p, 1 << 60), int(inside.min()) // case.BLOCK_SIZE_M)
        elif access.tensor == "out_ptr" and access.kind == "store":
            cols[p] = min(cols.get(p, 1 << 60), int((inside % stride).min()) // case.BLOCK_SIZE_N)
    return {p: (rows[p], cols[p]) for p in cols if p in rows}


def _order_problem(run: GuardedRun, inp: Inputs) -> Optional[str]:
    """What the record says about the program -> tile map, when every tile is right: None if it is the
    grouped ordering, else which order the kernel took."""
    case = inp.case
    num_m, num_n = inp.routing.max_num_m_blocks, triton.cdiv(case.N, case.BLOCK_SIZE_N)
    seen = _tiles_seen(run, inp)
    g = case.GROUP_SIZE_M

    def unclipped(p):
        first = p // (g * num_n) * g
        return first + p % (g * num_n) % g, p % (g * num_n) // g

    orders = {
        "grouped": lambda p: tile_of_program(p, num_m, num_n, g),
        f"row-major order (pid_m = pid // num_pid_n): with GROUP_SIZE_M = {g}, GROUP_SIZE_M M-blocks walk the "
        "N-blocks together, so neighbouring programs share weight tiles in the L2: group_id = pid // "
        "(GROUP_SIZE_M * num_pid_n), first_pid_m = group_id * GROUP_SIZE_M, pid_m = first_pid_m + (pid % "
        "num_pid_in_group) % group_size_m, pid_n = (pid % num_pid_in_group) // group_size_m": lambda p: divmod(
            p, num_n
        ),
        "column-major order (pid_m = pid % num_m_blocks): program pid must take the tile of the grouped "
        f"ordering, GROUP_SIZE_M = {g} M-blocks walking the N-blocks together": lambda p: (p % num_m, p // num_m),
        f"grouped order with the last group not clipped: with {num_m} M-blocks and GROUP_SIZE_M = {g}, the last "
        f"group has {num_m % g or g}; group_size_m = min(num_m_blocks - first_pid_m, GROUP_SIZE_M)": unclipped,
    }
    for why, order in orders.items():
        if all(order(p) == tile for p, tile in seen.items()):
            return None if why == "grouped" else f"every value is right, but the programs take their tiles in {why}"
    p, tile = next((p, t) for p, t in sorted(seen.items()) if t != tile_of_program(p, num_m, num_n, g))
    return (
        f"every value is right, but program {p} computed tile (pid_m, pid_n) = {tile}, where the grouped ordering "
        f"(GROUP_SIZE_M = {g}, {num_m} M-blocks, {num_n} N-blocks) gives it {tile_of_program(p, num_m, num_n, g)}"
    )


def _bounds_hint(run: GuardedRun, inp: Inputs, projection: str) -> str:
    """The causes that fit where the out-of-bounds accesses went (and only those)."""
    case, causes = inp.case, []
    for o in run.out_of_bounds:
        x = run.offsets(o.tensor, o.kind)
        if o.tensor in ("a_ptr", "out_ptr") and x.size:
            t = inp.a if o.tensor == "a_ptr" else inp.out
            col, row = x % t.stride(0), x // t.stride(0)
            gap = bool(((col >= t.shape[1]) & (row < t.shape[0])).any())
            past = bool((row >= t.shape[0]).any())
        else:
            gap, past = False, True
        if o.tensor == "a_ptr" and past and int(row.max()) > case.T:  # a masked sentinel reads row T at most
            causes.append(
                f"the token row is slot // TOP_K: the load read rows up to {int(row.max())} of a's {case.T}, rows "
                f"that only a slot itself reaches (slots run to T * TOP_K = {inp.routing.num_slots}). Each token "
                "feeds TOP_K slots, so slot s reads a's row s // TOP_K: tokens = slots // TOP_K"
            )
        elif o.tensor == "a_ptr" and past:
            causes.append(
                "missing mask on the padded slots: padding rows hold the sentinel num_slots = "
                f"{inp.routing.num_slots}, whose row num_slots // TOP_K = {case.T} is past a's {case.T} rows: load "
                "with mask row_ok = slots < num_slots (and other=0.0)"
            )
        if o.tensor == "a_ptr" and gap:
            causes.append(
                f"K tail unmasked: K = {case.K} is not a multiple of BLOCK_SIZE_K = {case.BLOCK_SIZE_K}, so the last "
                f"K step reaches columns {case.K} and on, past each row of a: mask the load with k0 + offs_k < K"
            )
        tiles_end = triton.cdiv(case.N, case.BLOCK_SIZE_N) * case.BLOCK_SIZE_N  # the last column a tile reaches
        if o.tensor == "out_ptr" and gap and bool((col >= tiles_end).any()):
            row_of = "r (pid_m * BLOCK_SIZE_M + i)" if projection == UP else "sorted_token_ids[r]"
            causes.append(
                f"the output row stride: the store reached column {int(col.max())} of out's rows, past the "
                f"{tiles_end} columns that the N-blocks cover (an N mask missing reaches no further), so its rows "
                f"are not stride_om apart. out is a view whose rows lie stride_om = {inp.out.stride(0)} elements "
                f"apart, not N = {case.N}: row {row_of} starts at out_ptr + row * stride_om"
            )
        elif o.tensor == "out_ptr" and gap:
            causes.append(
                f"no N mask on the store: N = {case.N} is not a multiple of BLOCK_SIZE_N = {case.BLOCK_SIZE_N}: "
                "mask the store's columns with offs_n < N"
            )
        if o.tensor == "out_ptr" and past and projection == DOWN:
            causes.append(
                f"missing mask on the padded slots: out has a row per slot ({inp.routing.num_slots}), and padding "
                "rows hold the sentinel num_slots, one past its last row: store with mask (slots < num_slots) & "
                "(offs_n < N). (Row r of the block goes to out row sorted_token_ids[r], not to row r)"
            )
        if o.tensor == "out_ptr" and past and projection == UP:
            causes.append(
                "the up projection stores in the sorted layout: row r of the block goes to out row r "
                "(pid_m * BLOCK_SIZE_M + i), not to row sorted_token_ids[r]"
            )
        if o.tensor == "topk_weights_ptr":
            causes.append(
                "the routed weight of a padding row was loaded unmasked (its slot is the sentinel num_slots, one "
                "past topk_weights): load it with mask=row_ok, other=0.0"
            )
        if o.tensor in ("sorted_token_ids_ptr", "expert_ids_ptr"):
            causes.append(
                f"{o.tensor[:-4]} read past its end: a program took an M-block that does not exist. pid_m comes "
                "from the grouped ordering (the last group clipped: group_size_m = min(num_m_blocks - first_pid_m, "
                "GROUP_SIZE_M)), and expert_ids is indexed by pid_m, not by the program id"
            )
    return "; ".join(dict.fromkeys(causes))


def _desc_problem(make, args, want_block, name: str, tensor: str, layout: str) -> Tuple[object, Optional[str]]:
    """(the learner's descriptor, None) or (None, what is wrong with it)."""
    label = getattr(make, "__name__", "the descriptor helper")
    call = f"{label}({tensor}, {args[1]}, {args[2]})"
    try:
        desc = make(*args)
    except Exception as exc:  # noqa: BLE001 - the learner's helper; reported
        first = (str(exc).strip().splitlines() or [""])[0].split("TensorDescriptor(")[0].rstrip(": ")[:200]
        why = (
            f" (wrong box shape: {name} {layout} needs a block shape of {len(want_block)} entries)"
            if "rank" in first
            else ""
        )
        return None, f"{call} raised {type(exc).__name__}: {first}{why}"
    if not isinstance(desc, TensorDescriptor):
        got = "None" if desc is None else described(desc)
        return None, f"{call} returned {got}, not a TensorDescriptor over {tensor} {layout}"
    block = list(desc.block_shape)
    if block != want_block:
        why = " (N and K swapped)" if len(block) == 3 == len(want_block) and block == [1, *want_block[:0:-1]] else ""
        return None, (
            f"wrong box shape: {call} has block_shape {block}{why}; {name} {layout} needs {want_block}, "
            + (
                "[1, BLOCK_SIZE_N, BLOCK_SIZE_K]: one box is one expert's BLOCK_SIZE_N x BLOCK_SIZE_K tile"
                if len(want_block) == 3
                else "[BLOCK_SIZE_M, BLOCK_SIZE_K]: one box is the BLOCK_SIZE_M rows of one M-block"
            )
        )
    if list(desc.shape) != list(args[0].shape) or desc.base.data_ptr() != args[0].data_ptr():
        return None, f"{call} describes a tensor of shape {list(desc.shape)}, not {tensor} {list(args[0].shape)}"
    return desc, None


def _descriptors(inp: Inputs, projection: str, make_w_desc, make_a_desc):
    """({parameter: descriptor}, None) or (None, what is wrong with a helper)."""
    from .capstone_solution import sorted_rows_desc_solution, weight_desc_solution

    case = inp.case
    descs = {}
    w_desc, problem = _desc_problem(
        make_w_desc or weight_desc_solution,
        (inp.w, case.BLOCK_SIZE_N, case.BLOCK_SIZE_K),
        [1, case.BLOCK_SIZE_N, case.BLOCK_SIZE_K],
        "w",
        "w",
        "[E, N, K]",
    )
    if problem:
        return None, problem
    descs["w_desc"] = w_desc
    if projection == DOWN:
        a_desc, problem = _desc_problem(
            make_a_desc or sorted_rows_desc_solution,
            (inp.a, case.BLOCK_SIZE_M, case.BLOCK_SIZE_K),
            [case.BLOCK_SIZE_M, case.BLOCK_SIZE_K],
            "a",
            "a",
            "[max_num_tokens_padded, K]",
        )
        if problem:
            return None, problem
        descs["a_desc"] = a_desc
    return descs, None


def kernel_args(inp: Inputs, projection: str, descs: dict) -> dict:
    """The kernel's arguments by name, for `inp`."""
    case, r = inp.case, inp.routing
    args = dict(descs)
    if projection == UP:
        args.update(a_ptr=inp.a, out_ptr=inp.out)
    else:
        args.update(out_ptr=inp.out, topk_weights_ptr=inp.topk_weights)
    args.update(
        sorted_token_ids_ptr=r.sorted_token_ids,
        expert_ids_ptr=r.expert_ids,
        num_tokens_post_padded_ptr=r.num_tokens_post_padded,
        num_m_blocks=r.max_num_m_blocks,
        N=case.N,
        K=case.K,
        num_slots=r.num_slots,
    )
    if projection == UP:
        args.update(stride_am=inp.a.stride(0), stride_om=inp.out.stride(0), TOP_K=case.TOP_K)
    else:
        args.update(stride_om=inp.out.stride(0))
    args.update(
        BLOCK_SIZE_M=case.BLOCK_SIZE_M,
        BLOCK_SIZE_N=case.BLOCK_SIZE_N,
        BLOCK_SIZE_K=case.BLOCK_SIZE_K,
        GROUP_SIZE_M=case.GROUP_SIZE_M,
    )
    return args


def grid(inp: Inputs) -> Tuple[int]:
    return (tile_grid(inp.routing.max_num_m_blocks, inp.case.N, inp.case.BLOCK_SIZE_N),)


def _run(kernel, inp: Inputs, projection: str, make_w_desc, make_a_desc):
    """(the guarded run, None) or (None, what is wrong with a descriptor helper)."""
    descs, problem = _descriptors(inp, projection, make_w_desc, make_a_desc)
    if problem:
        return None, problem
    return run_guarded(kernel, grid(inp), **kernel_args(inp, projection, descs)), None


def _second_size(kernel, projection: str, make_w_desc, make_a_desc) -> Optional[str]:
    first, second = CASES[projection]
    inp = _inputs(second, projection)
    run, problem = _run(kernel, inp, projection, make_w_desc, make_a_desc)
    if run is not None:
        problem = diagnose(
            run,
            "out_ptr",
            _model(inp, projection),
            tol=TOL,
            mistakes=_mistakes(inp, projection),
            out_of_bounds_hint=_bounds_hint(run, inp, projection),
            untouched=inp.out,
            undefined_hint=OTHER_HINT,
        )
    return at_other_sizes(
        problem,
        first.describe(projection),
        second.describe(projection) + " (every token routed to every expert)",
        "look for a size written into the kernel or a helper where T, TOP_K, K, N, num_slots or a block size belongs",
    )


PROBE_STRIDE = 2**30  # the int64 probe's stride_am: token 4's row at 4 * 2^30 wraps to 0 in int32


def _int32_rows(kernel, make_w_desc, make_a_desc) -> Optional[str]:
    """The up kernel's int64 probe (as notebook 03's checker has it): stride_am = 2^30 stands for token rows past
    2^31 elements. With the row offset in int64 every token's row but 0's lies far outside the small A and
    reads 0 (dropped); in int32 token 4's offset 4 * 2^30 = 2^32 wraps to 0 and its rows read row 0 of A."""
    inp = _inputs(CASES[UP][0], UP)
    inp.a = inp.a + 3.0  # no zeros in row 0
    descs, problem = _descriptors(inp, UP, make_w_desc, make_a_desc)
    if problem:
        return None
    run = run_guarded(kernel, grid(inp), **{**kernel_args(inp, UP, descs), "stride_am": PROBE_STRIDE})
    if run.error is not None:
        return f"with stride_am = 2^30 (standing for token rows past 2^31 elements), {run.problem()}"
    slots = inp.routing.sorted_token_ids[: inp.out.shape[0]].long()
    token_4 = (slots // inp.case.TOP_K == 4) & (slots < inp.routing.num_slots)
    got = run.tensors["out_ptr"][token_4].float()
    if token_4.any() and bool(torch.nan_to_num(got, nan=0.0).abs().max() > 0):
        return (
            "the row offset `tokens * stride_am` is computed in int32. With stride_am = 2^30 (a probe standing for "
            "token rows past 2^31 elements: 262144 tokens of H = 8192), token 4's offset 4 * 2^30 = 2^32 wrapped "
            "around to 0 and read row 0 of A. Cast the token index before multiplying: "
            "`tokens = (slots // TOP_K).to(tl.int64)`"
        )
    return None


def _check(projection: str, kernel, make_w_desc, make_a_desc, strict: bool, timing: bool) -> Verdict:
    check_bool("strict", strict)
    check_bool("timing", timing)
    first = CASES[projection][0]
    inp = _inputs(first, projection)
    run, problem = _run(kernel, inp, projection, make_w_desc, make_a_desc)
    if run is None:
        return report(projection, problem, "", strict)

    def then() -> Optional[str]:
        return (
            _order_problem(run, inp)
            or _second_size(kernel, projection, make_w_desc, make_a_desc)
            or (_int32_rows(kernel, make_w_desc, make_a_desc) if projection == UP else None)
        )

    verdict = grade(
        projection,
        run,
        "out_ptr",
        _model(inp, projection),
        tol=TOL,
        strict=strict,
        mistakes=_mistakes(inp, projection),
        untouched=inp.out,
        out_of_bounds_hint=_bounds_hint(run, inp, projection),
        undefined_hint=OTHER_HINT,
        nothing_written="the kernel stores nothing: fill in the TODOs (the tile of the program, the expert, the K "
        "loop, the masked store)",
        then=(
            f"in GROUP_SIZE_M order, and with {CASES[projection][1].describe(projection)}"
            + (", and int64 token offsets" if projection == UP else ""),
            then,
        ),
    )
    if verdict.passed and timing and torch.cuda.is_available() and not interpreter_active():
        try:
            print(time_against_moe_lab(kernel, projection, make_w_desc, make_a_desc).describe())
        except Exception as exc:  # noqa: BLE001 - the grade stands; the timing says why it could not run
            print(f"(no timing: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})")
    return verdict


def check_capstone_up(kernel, make_w_desc=None, strict: bool = False, timing: bool = True) -> Verdict:
    """Grade the learner's `capstone_up_kernel` (signature in the module doc) and, optionally, their
    `weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)` (default: TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N,
    BLOCK_SIZE_K])).

    Sizes: float16; T = 7 tokens, TOP_K = 2 of E = 5 experts (expert 2 gets none), K = 56 (BLOCK_SIZE_K = 16),
    N = 48 (BLOCK_SIZE_N = 32), BLOCK_SIZE_M = 16, GROUP_SIZE_M = 3 (5 M-blocks, 4 in use: the last group is
    short); a [7, 56] a view with rows 64 apart; out [max_num_tokens_padded, 48] poisoned with NaN, its rows
    72 apart (a store past N lands in the gap). Right: rows of used blocks a[slot // TOP_K] @ w[expert].T,
    padding rows 0, rows of unused blocks left NaN. Names: a wrong expert id (expert 0, pid_m), the row mask
    missing (a padding slot reads row T), the token row not slot // TOP_K, the K tail unmasked (columns past K)
    or missing (the loop stops early), no N mask on the store, rows stored N apart instead of stride_om, a load
    without other=, unused blocks written, padding rows unwritten,
    the wrong box shape of the helper's descriptor; then, once right, the GROUP_SIZE_M ordering from the
    record of each program's accesses (row-major, column-major, the last group not clipped), and a second
    size (T = 5, TOP_K = E = 3, K = 40, N = 24, blocks 16 x 16 x 32, GROUP_SIZE_M = 2) for sizes written in.
    On a GPU (not the interpreter), a right kernel is timed against `moe_lab.grouped_matmul` at
    Qwen3-30B-A3B's shape (T = 512, bf16; `time_against_moe_lab`) unless timing=False, and the ratio printed.
    """
    return _check(UP, kernel, make_w_desc, None, strict, timing)


def check_capstone_down(
    kernel, make_w_desc=None, make_a_desc=None, strict: bool = False, timing: bool = True
) -> Verdict:
    """Grade the learner's `capstone_down_kernel` (signature in the module doc) and, optionally, their
    descriptor helpers `weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)` and `sorted_rows_desc(a, BLOCK_SIZE_M,
    BLOCK_SIZE_K)` (defaults: block shapes [1, BLOCK_SIZE_N, BLOCK_SIZE_K] and [BLOCK_SIZE_M, BLOCK_SIZE_K]).

    Sizes: float16; T = 7, TOP_K = 2 of E = 5 (expert 2 gets none), K = 24 (BLOCK_SIZE_K = 16), N = 56
    (BLOCK_SIZE_N = 32), BLOCK_SIZE_M = 16, GROUP_SIZE_M = 3; a [max_num_tokens_padded, 24] a view with rows
    32 apart; topk_weights [7, 2] float32 (softmax rows); out [14, 56] poisoned with NaN, rows 72 apart.
    Right: out[slot] = topk_weights.flatten()[slot] * (a[r] @ w[expert].T) for every real slot. Names: a
    wrong expert id, the routed weight missing or applied twice, the K tail missing, the store's row mask
    missing (a padding slot stores at row num_slots) or N mask missing, rows stored N apart instead of
    stride_om, the routed weight loaded unmasked,
    the wrong box shape of either helper; then the GROUP_SIZE_M ordering and a second size (T = 5, TOP_K = E
    = 3, K = 40, N = 40, blocks 16 x 16 x 32, GROUP_SIZE_M = 2). On a GPU, timed as `check_capstone_up`.
    """
    return _check(DOWN, kernel, make_w_desc, make_a_desc, strict, timing)


# ---- on a GPU: the learner's kernel against moe_lab.grouped_matmul, same inputs, same tile config ----


@dataclass(frozen=True)
class Timing:
    projection: str
    preset: str
    num_tokens: int
    yours_ms: float
    moe_lab_ms: float
    error: float  # relative Frobenius error of yours against moe-lab's output
    config: str

    @property
    def ratio(self) -> float:
        return self.yours_ms / self.moe_lab_ms

    def describe(self) -> str:
        which = "up" if self.projection == UP else "down"
        return (
            f"{which} GEMM at {self.preset}'s shape, T = {self.num_tokens}, bf16, on {torch.cuda.get_device_name()}: "
            f"yours {self.yours_ms:.3f} ms, moe_lab.grouped_matmul {self.moe_lab_ms:.3f} ms (medians of CUDA-graph "
            f"replays, L2 flushed; same inputs, tiles {self.config}): yours takes {self.ratio:.2f}x its time "
            f"(relative error against its output {self.error:.1e})"
        )


def time_against_moe_lab(
    kernel,
    projection: str,
    make_w_desc=None,
    make_a_desc=None,
    preset: str = "qwen3-30b-a3b",
    num_tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
) -> Timing:
    """Time `kernel` (a capstone kernel, UP or DOWN) and `moe_lab.grouped_matmul` on the same inputs of
    `preset`'s layer at `num_tokens` tokens, on a CUDA GPU: moe-lab with its default config for the shape,
    the kernel with that config's tiles, GROUP_SIZE_M, num_warps and num_stages (as launched). Medians of
    CUDA-graph replays with the L2 flushed (`moe_lab.tools.timing.graph_ms`). Raises RuntimeError under the
    interpreter or without a GPU."""
    import moe_lab

    from ...tools.timing import graph_ms
    from .capstone_solution import sorted_rows_desc_solution, weight_desc_solution

    require_gpu_timing("time_against_moe_lab")
    p = moe_lab.get_preset(preset)
    hs, w1, w2, (topk_weights, topk_ids) = p.build(num_tokens, dtype=dtype, device="cuda")
    cfg = moe_lab.default_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, dtype)
    routing = moe_align(topk_ids, p.num_experts, cfg.block_size_m)
    if projection == UP:
        a, w, gemm = hs, w1, cfg.up
        theirs = lambda out: moe_lab.grouped_matmul(a, w, routing, gemm, gather_a=True, out=out)  # noqa: E731
        out_rows = routing.max_num_tokens_padded
    else:
        a = torch.randn(routing.max_num_tokens_padded, p.intermediate_size, device="cuda").to(dtype)
        w, gemm = w2, cfg.down
        theirs = lambda out: moe_lab.grouped_matmul(  # noqa: E731
            a, w, routing, gemm, gather_a=False, scatter=True, topk_weights=topk_weights, out=out
        )
        out_rows = routing.num_slots
    want, plan = (
        moe_lab.grouped_matmul(a, w, routing, gemm, gather_a=True, return_plan=True)
        if projection == UP
        else moe_lab.grouped_matmul(
            a, w, routing, gemm, gather_a=False, scatter=True, topk_weights=topk_weights, return_plan=True
        )
    )
    c = plan.config
    n, k = w.shape[1], w.shape[2]
    case = Case(
        num_tokens, p.num_experts, p.top_k, k, n, c.BLOCK_SIZE_M, c.BLOCK_SIZE_N, c.BLOCK_SIZE_K, c.GROUP_SIZE_M
    )
    out = torch.empty(out_rows, n, dtype=dtype, device="cuda")
    inp = Inputs(case, routing, a, w, topk_weights, out)
    descs = {"w_desc": (make_w_desc or weight_desc_solution)(w, c.BLOCK_SIZE_N, c.BLOCK_SIZE_K)}
    if projection == DOWN:
        descs["a_desc"] = (make_a_desc or sorted_rows_desc_solution)(a, c.BLOCK_SIZE_M, c.BLOCK_SIZE_K)
    args = kernel_args(inp, projection, descs)
    launch = lambda: kernel[grid(inp)](**args, num_warps=c.num_warps, num_stages=c.num_stages)  # noqa: E731
    launch()
    torch.cuda.synchronize()
    rows = slice(None)
    if projection == UP:  # the rows of real slots: what moe-lab writes to padding rows is not specified
        padded = int(routing.num_tokens_post_padded.item())
        rows = torch.nonzero(routing.sorted_token_ids[:padded] < routing.num_slots).flatten()
    error = moe_lab.relative_error(out[rows], want[rows])
    theirs_out = torch.empty_like(want)
    moe_lab_ms = graph_ms(lambda: theirs(theirs_out))
    yours_ms = graph_ms(launch)
    tiles = f"{c.BLOCK_SIZE_M}x{c.BLOCK_SIZE_N}x{c.BLOCK_SIZE_K}, group {c.GROUP_SIZE_M}, {c.num_warps} warps, "
    tiles += f"{c.num_stages} stages"
    return Timing(projection, preset, num_tokens, yours_ms, moe_lab_ms, error, tiles)
