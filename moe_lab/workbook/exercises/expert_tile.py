"""Notebook 05's exercise: the weight tile of the grouped GEMM, read through a 3-D tensor descriptor.

Program (pid_m, pid_n, pid_k) stands for one program of the grouped GEMM at M-block pid_m, N-block pid_n,
in its K step pid_k: it loads the BLOCK_SIZE_N x BLOCK_SIZE_K tile of w [E, N, K] that the GEMM would
multiply, for the expert of its M-block, `expert_ids[pid_m]`, and stores it where the checker can see it.
"""

from __future__ import annotations

import re
from typing import Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..._validate import described
from ...runtime import default_device
from ..guarded import run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade
from .descriptor_copy import ALIGNMENT_HINT, error_verdict, verdict

E, N, K = 5, 40, 64  # 5 experts: not a power of two; N = 40 not a multiple of BLOCK_SIZE_N
BLOCK_SIZE_N, BLOCK_SIZE_K = 16, 32
N_PADDED = triton.cdiv(N, BLOCK_SIZE_N) * BLOCK_SIZE_N  # 48: the last N-block's box reaches 8 rows past N
EXPERT_IDS = [0, 1, 1, 3, 4, -1, -1]  # one per M-block, sorted by expert (expert 2 got no tokens), then unused
GRID = (len(EXPERT_IDS), N_PADDED // BLOCK_SIZE_N, K // BLOCK_SIZE_K)
EXERCISE = "expert_tile_kernel"
# the second launch, once the first is right: other sizes (N not a multiple of BLOCK_SIZE_N again)
E2, N2, K2, BLOCK_SIZE_N2, BLOCK_SIZE_K2 = 3, 20, 48, 8, 16
EXPERT_IDS2 = [2, 0, 0, -1]
UNUSED = 1000.0  # what out holds in the unused M-blocks before the launch, and must hold after it (elsewhere NaN)

RESHAPE_HINT = (
    "the box of a 3-D descriptor is 3-D, [1, BLOCK_SIZE_N, BLOCK_SIZE_K] like its block shape: "
    "reshape it to [BLOCK_SIZE_N, BLOCK_SIZE_K] (tile.reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)) before "
    "storing it through the 2-D out_ptrs"
)
ERROR_HINTS = [
    (
        r"16-byte aligned|illegal instruction",
        ALIGNMENT_HINT.replace("pid_n * BLOCK_N", "k0 = pid_k * BLOCK_SIZE_K").replace("index pid_n", "index pid_k"),
    ),
    (
        r"expected \d+ offsets",
        "the load needs one offset per dimension of the descriptor: [expert, n0, k0] for a descriptor over w [E, N, K]",
    ),
    (
        r"(load|store)\(\) got multiple values for argument '_(semantic|builder)'",
        "the offsets go in one list: w_desc.load([expert, n0, k0]), not w_desc.load(expert, n0, k0)",
    ),
    (
        r"tensor_descriptor\w*' object has no attribute",
        "a tensor descriptor is not a pointer: tl.load and pointer arithmetic do not take it. Load the box with "
        "tile = w_desc.load([expert, n0, k0])",
    ),
]


def _reshape_forgotten(text: str) -> bool:
    """Does an error text speak of a [1, BLOCK_SIZE_N, BLOCK_SIZE_K] tile (however it spells shapes)?"""
    return f"1,{BLOCK_SIZE_N},{BLOCK_SIZE_K}" in re.sub(r"[^0-9,]", "", text)


def _poisoned(w: torch.Tensor) -> torch.Tensor:
    """out before the launch: NaN in the M-blocks in use, UNUSED in the -1 blocks."""
    out = torch.full((len(EXPERT_IDS), N_PADDED, K), float("nan"), dtype=w.dtype, device=w.device)
    out[torch.tensor(EXPERT_IDS, device=w.device) < 0] = UNUSED
    return out


def _tiles(w: torch.Tensor, read, skip_unused: bool) -> torch.Tensor:
    """out after every M-block b stores read(b, expert_ids[b]) ([N_PADDED, K]), the -1 blocks only if not
    skipped: what a kernel that reads that way computes."""
    out = _poisoned(w)
    for b, e in enumerate(EXPERT_IDS):
        if e >= 0 or not skip_unused:
            out[b] = read(b, e)
    return out


def _rows(flat: torch.Tensor, rows) -> torch.Tensor:
    """Rows `rows` of a 2-D tensor, zeros where a row is outside it (a descriptor's zero fill)."""
    index = torch.tensor(rows, device=flat.device)
    inside = (index >= 0) & (index < flat.shape[0])
    return torch.where(inside[:, None], flat[index.clamp(0, flat.shape[0] - 1)], 0).to(flat.dtype)


def _mistakes(w: torch.Tensor):
    """(explanation, what out holds after a kernel with that mistake) pairs, most specific first."""
    flat = w.reshape(E * N, K)

    def right(b, e):  # expert e's rows, zeros past N (and for an expert outside w)
        return _rows(flat, [e * N + n if 0 <= e < E and n < N else -1 for n in range(N_PADDED)])

    def flat_2d(b, e):  # a 2-D descriptor over w.view(E * N, K): bounds [E * N, K], not per expert
        return _rows(flat, [e * N + n for n in range(N_PADDED)])

    def n_blocks(b, e):  # n0 = pid_n: each N-block's box starts pid_n rows in
        return _rows(
            flat,
            [
                e * N + pid_n + i if 0 <= e < E and pid_n + i < N else -1
                for pid_n in range(GRID[1])
                for i in range(BLOCK_SIZE_N)
            ],
        )

    mistakes = [
        (
            "the unused M-blocks (expert_ids = -1) were written: load the expert first and return when it "
            "is -1. Expert -1 is outside w: a descriptor gave zeros there, a pointer load would read before w",
            _tiles(w, right, skip_unused=False),
        )
    ]
    also_unused = "; and the unused M-blocks (expert_ids = -1) were written too: return when the expert is -1"
    for why, read in (
        (
            "the expert offset is forgotten: every M-block read expert 0's weights. Load the expert of the block, "
            "expert = tl.load(expert_ids_ptr + pid_m), and pass it as the first offset: [expert, n0, k0]",
            lambda b, e: right(b, 0),
        ),
        (
            "the M-block index is used as the expert: M-block pid_m belongs to expert "
            "tl.load(expert_ids_ptr + pid_m), not to expert pid_m",
            lambda b, e: right(b, b),
        ),
        (
            "a 2-D descriptor over w.view(E * N, K) at row expert * N + n0: its bounds are the whole [E * N, K], so "
            f"the last N-block's box (rows {N}-{N_PADDED - 1} of an expert) read the NEXT expert's first rows "
            "instead of zeros. Build a 3-D descriptor over w [E, N, K] with block shape [1, BLOCK_SIZE_N, "
            "BLOCK_SIZE_K] and load at [expert, n0, k0]: its bounds are per expert",
            flat_2d,
        ),
        ("n0 is in block units: the offsets are element offsets, n0 = pid_n * BLOCK_SIZE_N (not pid_n)", n_blocks),
    ):
        mistakes += [(why, _tiles(w, read, skip_unused=True)), (why + also_unused, _tiles(w, read, skip_unused=False))]
    return right, mistakes


def _is_kernel(fn) -> bool:
    """A @triton.jit function (compiled or interpreted), as run_guarded takes it."""
    return hasattr(fn, "arg_names") and hasattr(fn, "__getitem__")


def _misplaced(kernel, make_w_desc):
    """What is wrong with the call itself when a @triton.jit function stands where the host helper goes
    (the arguments swapped, or the kernel passed twice), or None."""
    if make_w_desc is None or not _is_kernel(make_w_desc):
        return None
    name = lambda fn: getattr(fn, "__name__", type(fn).__name__)  # noqa: E731
    if not _is_kernel(kernel):
        return (
            f"the arguments are swapped: check_expert_tile(kernel, make_w_desc) takes the @triton.jit kernel "
            f"first, then the host helper that builds the descriptor; {name(make_w_desc)} is the kernel and "
            f"{name(kernel)} the helper: check_expert_tile({name(make_w_desc)}, {name(kernel)})"
        )
    return (
        f"{name(make_w_desc)} is a @triton.jit kernel, passed where the descriptor helper goes: the second "
        "argument is the plain Python function that builds the host TensorDescriptor, "
        "expert_weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)"
    )


def _learner_desc(make_w_desc, w: torch.Tensor, block_n: int = BLOCK_SIZE_N, block_k: int = BLOCK_SIZE_K):
    """(the learner's descriptor, None) or (None, what is wrong with the helper)."""
    name = getattr(make_w_desc, "__name__", "make_w_desc")
    call = f"{name}(w, {block_n}, {block_k})"
    try:
        w_desc = make_w_desc(w, block_n, block_k)
    except Exception as exc:  # noqa: BLE001 - the learner's helper; reported
        first = (str(exc).strip().splitlines() or [""])[0].split("TensorDescriptor(")[0].rstrip(": ")[:200]
        why = (
            " (the block shape needs one entry per dimension of w: [1, BLOCK_SIZE_N, BLOCK_SIZE_K])"
            if "rank mismatch" in first
            else ""
        )
        return None, f"{call} raised {type(exc).__name__}: {first}{why}"
    if not isinstance(w_desc, TensorDescriptor):
        got = "None" if w_desc is None else described(w_desc)
        return None, (
            f"{call} returned {got}, not a TensorDescriptor: build one over w [E, N, K] whose box is "
            "one expert's BLOCK_SIZE_N x BLOCK_SIZE_K tile"
        )
    return w_desc, None


def _second_size(kernel, make_w_desc) -> Optional[str]:
    """The kernel (and the learner's descriptor helper) at other sizes: sizes written into either."""
    device = default_device()
    w = torch.randn(E2, N2, K2, device=device).to(torch.float16)
    if make_w_desc is None:
        w_desc = TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N2, BLOCK_SIZE_K2])
    else:
        w_desc, problem = _learner_desc(make_w_desc, w, BLOCK_SIZE_N2, BLOCK_SIZE_K2)
        if problem:
            return problem
    padded = triton.cdiv(N2, BLOCK_SIZE_N2) * BLOCK_SIZE_N2
    ids = torch.tensor(EXPERT_IDS2, dtype=torch.int32, device=device)
    out = torch.full((len(EXPERT_IDS2), padded, K2), float("nan"), dtype=w.dtype, device=device)
    out[ids < 0] = UNUSED
    want = out.clone()
    for b, e in enumerate(EXPERT_IDS2):
        if e >= 0:
            want[b] = 0
            want[b, :N2] = w[e]
    run = run_guarded(
        kernel,
        (len(EXPERT_IDS2), padded // BLOCK_SIZE_N2, K2 // BLOCK_SIZE_K2),
        w_desc=w_desc,
        expert_ids_ptr=ids,
        out_ptr=out,
        N=N2,
        stride_ob=out.stride(0),
        stride_on=out.stride(1),
        BLOCK_SIZE_N=BLOCK_SIZE_N2,
        BLOCK_SIZE_K=BLOCK_SIZE_K2,
    )
    return at_other_sizes(
        diagnose(run, "out_ptr", want, tol=1e-6, untouched=out),
        f"w [{E}, {N}, {K}] and blocks of {BLOCK_SIZE_N} x {BLOCK_SIZE_K}",
        f"w [{E2}, {N2}, {K2}] and blocks of {BLOCK_SIZE_N2} x {BLOCK_SIZE_K2}",
        f"look for a size written into the kernel or the helper ({BLOCK_SIZE_N}, {BLOCK_SIZE_K}, {N}, {E}) where "
        "BLOCK_SIZE_N, BLOCK_SIZE_K or N belong",
    )


def check_expert_tile(kernel, make_w_desc=None, strict: bool = False) -> Verdict:
    """Grade `expert_tile_kernel(w_desc, expert_ids_ptr, out_ptr, N, stride_ob, stride_on,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr)` on grid (M-blocks, N-blocks, K-blocks):
    program (pid_m, pid_n, pid_k) loads the box of w at [expert_ids[pid_m], pid_n * BLOCK_SIZE_N,
    pid_k * BLOCK_SIZE_K], reshapes it to [BLOCK_SIZE_N, BLOCK_SIZE_K] and stores it at
    out[pid_m, pid_n * BLOCK_SIZE_N:, pid_k * BLOCK_SIZE_K:]; M-blocks whose expert is -1 store nothing.

    make_w_desc: the learner's `expert_weight_desc(w, BLOCK_SIZE_N, BLOCK_SIZE_K)`, which returns the host
    descriptor the kernel gets as w_desc (default: TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N,
    BLOCK_SIZE_K])). Sizes: float16 w [5, 40, 64], BLOCK_SIZE_N = 16, BLOCK_SIZE_K = 32, int32
    expert_ids [0, 1, 1, 3, 4, -1, -1], grid (7, 3, 2), out [7, 48, 64] float16 (48 = N rounded up to
    BLOCK_SIZE_N: rows 40-47 of an expert's tile must be the descriptor's zeros) holding NaN in the
    blocks in use and 1000 in the unused ones, which must keep it; stride_ob = 48 * 64, stride_on = 64.
    Names: the expert offset forgotten (every block reads expert 0), the M-block index used as the
    expert, n0 or k0 in block units, a 2-D descriptor over w.view(E * N, K) (the last box reads the next
    expert's rows), -1 blocks not skipped, the reshape forgotten, a wrong number of offsets, nothing
    stored, a descriptor helper that returns something else or raises, the two arguments swapped (a
    @triton.jit function where the helper goes). Then, if right, a second launch (w [3, 20, 48], blocks of
    8 x 16, expert_ids [2, 0, 0, -1], the helper called with those blocks) for sizes written in.
    """
    misplaced = _misplaced(kernel, make_w_desc)
    if misplaced:
        return verdict(EXERCISE, misplaced, strict)
    device = default_device()
    w = torch.randn(E, N, K, device=device).to(torch.float16)
    expert_ids = torch.tensor(EXPERT_IDS, dtype=torch.int32, device=device)
    if make_w_desc is None:
        w_desc = TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_N, BLOCK_SIZE_K])
    else:
        w_desc, problem = _learner_desc(make_w_desc, w)
        if problem:
            return verdict(EXERCISE, problem, strict)
    out = _poisoned(w)
    run = run_guarded(
        kernel,
        GRID,
        w_desc=w_desc,
        expert_ids_ptr=expert_ids,
        out_ptr=out,
        N=N,
        stride_ob=out.stride(0),
        stride_on=out.stride(1),
        BLOCK_SIZE_N=BLOCK_SIZE_N,
        BLOCK_SIZE_K=BLOCK_SIZE_K,
    )
    if run.error is not None and _reshape_forgotten(str(run.error)):
        return verdict(EXERCISE, f"{RESHAPE_HINT}. Launch: {run.problem()}", strict)
    failed = error_verdict(EXERCISE, run, ERROR_HINTS, strict)
    if failed is not None:
        return failed
    right, mistakes = _mistakes(w)
    return grade(
        EXERCISE,
        run,
        "out_ptr",
        _tiles(w, right, skip_unused=True),
        tol=1e-6,
        strict=strict,
        mistakes=mistakes,
        untouched=out,
        out_of_bounds_hint="the kernel reaches w only through its descriptor, which never goes outside "
        "its shape: load the expert at expert_ids_ptr + pid_m, and store through the "
        "stub's out_ptrs as given",
        nothing_written="the kernel stores nothing: load the tile and tl.store(out_ptrs, tile)",
        then=(
            f"and with w [{E2}, {N2}, {K2}], blocks of {BLOCK_SIZE_N2} x {BLOCK_SIZE_K2}",
            lambda: _second_size(kernel, make_w_desc),
        ),
    )
