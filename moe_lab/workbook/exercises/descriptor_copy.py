"""Notebook 04's exercises: a 2-D copy, box by box, through tensor descriptors.

`check_descriptor_copy`: the descriptors are built on the host (`TensorDescriptor`) and passed in;
`check_device_descriptor_copy`: the kernel builds them itself with `tl.make_tensor_descriptor`.
Both copy a 60 x 84 float32 view `src = x[:, :84]` of a 60 x 100 tensor (row stride 100 elements =
400 bytes, 16-byte aligned, bigger than the width) into a contiguous `dst` poisoned with NaN, with
boxes of 16 x 32 on a (4, 3) grid: the boxes of the last row and column stick out of the tensor, and
the descriptor, not a mask, keeps them inside. The grid is not square, so program axes taken the other
way round (the row block from program_id(1)) leave boxes uncopied.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ...runtime import default_device, interpreter_active
from ..guarded import GuardedRun, run_guarded
from ._grade import Verdict, at_other_sizes, diagnose, grade

M, N, ROW_STRIDE = 60, 84, 100  # src = x[:, :N] of x [M, ROW_STRIDE]: neither size a multiple of its block
BLOCK_M, BLOCK_N = 16, 32
GRID = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
# the second launch, once the first is right: src = x[:, :72] of x [40, 80], boxes of 32 x 16 on a (2, 5) grid
M2, N2, ROW_STRIDE2, BLOCK_M2, BLOCK_N2 = 40, 72, 80, 32, 16

# What a launch that raised usually means in a descriptor kernel: (a pattern of the error, the hint).
ALIGNMENT_HINT = (
    "a descriptor offset in the last dimension is not a multiple of 16 bytes: the offsets are the element "
    "offsets of the box's corner, pid_n * BLOCK_N, not the block index pid_n (on an H200 such a load is an "
    "'illegal instruction', and the CUDA context stays unusable until the Python kernel restarts)"
)
STRIDES_HINT = (
    "the strides are swapped: strides=[stride_m, 1], the row stride first; the last stride is the "
    "constant 1 (the elements of a row are contiguous)"
)
OFFSETS_LIST_HINT = (
    "the offsets go in one list, one per dimension of the descriptor: desc.load([row, col]) and "
    "desc.store([row, col], tile), not desc.load(row, col)"
)
NOT_A_POINTER_HINT = (
    "a tensor descriptor is not a pointer: tl.load, tl.store and pointer arithmetic do not take "
    "it. Load a box with tile = desc.load([row, col]) and store one with desc.store([row, col], "
    "tile)"
)
ERROR_HINTS = [
    (r"16-byte aligned|illegal instruction", ALIGNMENT_HINT),
    (r"(load|store)\(\) got multiple values for argument '_(semantic|builder)'", OFFSETS_LIST_HINT),
    (r"tensor_descriptor\w*' object has no attribute", NOT_A_POINTER_HINT),
    (r"last dim must be 1", STRIDES_HINT),
    # Compiled for a GPU (Triton 3.6-3.9), a run-time last stride fails with this message instead.
    (r"make_tensor_descriptor[\s\S]*`_semantic` argument must be provided", STRIDES_HINT),
]


def verdict(exercise: str, problem: str, strict: bool) -> Verdict:
    """NOT YET with `problem` (printed), or AssertionError("FAIL ...") if `strict`: as `grade` says it."""
    if strict:
        raise AssertionError(f"FAIL {exercise}: {problem}")
    result = Verdict(exercise, "NOT YET", problem)
    print(result)
    return result


def error_verdict(exercise: str, run: GuardedRun, hints: Sequence[Tuple[str, str]], strict: bool):
    """The verdict for a launch that raised an error one of `hints` explains (its hint, then the error
    itself), or None: then `grade` reports the launch as usual."""
    if run.error is None:
        return None
    text = str(run.error)
    for pattern, hint in hints:
        if re.search(pattern, text):
            return verdict(exercise, f"{hint}. Launch: {run.problem()}", strict)
    return None


def box_copy(src: torch.Tensor, dst: torch.Tensor, load_at: Callable, store_at: Callable) -> torch.Tensor:
    """What `dst` becomes when program (pid_m, pid_n) of GRID loads the BLOCK_M x BLOCK_N box of `src` at
    `load_at(pid_m, pid_n)` (zeros outside src) and stores it at `store_at(pid_m, pid_n)` (dropped
    outside dst): the result of a copy kernel with those offsets."""
    out = dst.clone()
    for pid_m in range(GRID[0]):
        for pid_n in range(GRID[1]):
            box = torch.zeros(BLOCK_M, BLOCK_N, dtype=src.dtype, device=src.device)
            _window(box, src, *load_at(pid_m, pid_n), into_box=True)
            _window(box, out, *store_at(pid_m, pid_n), into_box=False)
    return out


def _window(box, tensor, row, col, into_box):
    r0, r1 = max(row, 0), min(row + BLOCK_M, tensor.shape[0])
    c0, c1 = max(col, 0), min(col + BLOCK_N, tensor.shape[1])
    if r0 >= r1 or c0 >= c1:
        return
    if into_box:
        box[r0 - row : r1 - row, c0 - col : c1 - col] = tensor[r0:r1, c0:c1]
    else:
        tensor[r0:r1, c0:c1] = box[r0 - row : r1 - row, c0 - col : c1 - col]


def _inputs(m: int = M, n: int = N, row_stride: int = ROW_STRIDE):
    x = torch.randn(m, row_stride, device=default_device())
    src = x[:, :n]  # non-contiguous: rows row_stride elements apart
    dst = torch.full((m, n), float("nan"), device=src.device)
    return src, dst


def _corners(run: GuardedRun, tensor: str, kind: str, row_stride: int) -> Dict[Tuple[int, int], Tuple[int, ...]]:
    """{(pid_m, pid_n): (first row, first column, rows, columns)} of the elements each program's accesses of
    `kind` reached inside `tensor` (rows `row_stride` elements apart), from the interpreter's record."""
    reached: Dict[Tuple[int, int], List[np.ndarray]] = {}
    for a in run.accesses:
        if a.tensor == tensor and a.kind == kind and a.in_bounds.any():
            reached.setdefault(a.program[:2], []).append(a.offsets[a.in_bounds])
    boxes = {}
    for program, chunks in reached.items():
        rows, cols = np.divmod(np.concatenate(chunks), row_stride)
        boxes[program] = (int(rows.min()), int(cols.min()), int(np.ptp(rows)) + 1, int(np.ptp(cols)) + 1)
    return boxes


def box_problem(
    run: GuardedRun, names: Tuple[str, str], sizes: Tuple[int, int, int, int], src_row_stride: int
) -> Optional[str]:
    """What the record of each program's loads and stores says is wrong with its box: the same corner for
    every program (a constant offset), a row or column offset that steps by the other block size or by 1,
    or a box of another size than BLOCK_M x BLOCK_N (the descriptor's block shape); None if nothing."""
    m, n, bm, bn = sizes
    problems: Dict[str, List[str]] = {}
    for what, tensor, kind, row_stride in (
        ("load", names[0], "load", src_row_stride),
        ("store", names[1], "store", n),
    ):
        boxes = _corners(run, tensor, kind, row_stride)
        if len(boxes) < 2:
            continue
        corners = {(r, c) for r, c, _, _ in boxes.values()}
        if len(corners) == 1:
            ((r, c),) = corners
            problems.setdefault(what, []).append(
                f"every program's {{what}} is at the same offsets [{r}, {c}]: a constant offset; the box of program "
                "(pid_m, pid_n) is at [pid_m * BLOCK_M, pid_n * BLOCK_N] (tl.program_id(0) and tl.program_id(1))"
            )
            continue
        for axis, label, block, other, pid in ((0, "row", bm, bn, 0), (1, "column", bn, bm, 1)):
            starts = {p: box[axis] for p, box in boxes.items()}
            if all(v == p[pid] * block for p, v in starts.items()):
                continue
            for step, why in ((other, f"{'BLOCK_N' if axis == 0 else 'BLOCK_M'}, the other block size"), (1, "1")):
                if all(v == p[pid] * step for p, v in starts.items() if p[pid] * step < (m, n)[axis]):
                    problems.setdefault(what, []).append(
                        f"the {{what}}'s {label} offset steps by {why}: it is pid_{'mn'[axis]} * {step}, and must be "
                        f"pid_{'mn'[axis]} * {'BLOCK_M' if axis == 0 else 'BLOCK_N'} (= {block})"
                    )
                    break
            else:
                if len(set(starts.values())) == 1:
                    problems.setdefault(what, []).append(
                        f"the {{what}}'s {label} offset is the same ({next(iter(starts.values()))}) in every "
                        f"program: it must be pid_{'mn'[axis]} * {'BLOCK_M' if axis == 0 else 'BLOCK_N'}"
                    )
        whole = [(h, w) for (r, c, h, w) in boxes.values() if r + bm <= m and c + bn <= n]
        if whole and all(size != (bm, bn) for size in whole):
            h, w = whole[0]
            problems.setdefault(what, []).append(
                f"each {{what}} moves a box of {h} x {w} elements, not BLOCK_M x BLOCK_N = {bm} x {bn}: the "
                "descriptor's block_shape is [BLOCK_M, BLOCK_N]"
            )
    load, store = problems.get("load", []), problems.get("store", [])
    both = [p for p in load if p in store]  # the same slip in the load and the store: say it once
    texts = [p.format(what="load and store") for p in both]
    texts += [p.format(what=what) for what, ps in (("load", load), ("store", store)) for p in ps if p not in both]
    return "; ".join(texts) or None


def _second_size(kernel, device_descriptors: bool) -> Optional[str]:
    """The same copy at other sizes (M2, N2, boxes BLOCK_M2 x BLOCK_N2): sizes written into the kernel."""
    src, dst = _inputs(M2, N2, ROW_STRIDE2)
    grid = (triton.cdiv(M2, BLOCK_M2), triton.cdiv(N2, BLOCK_N2))
    if device_descriptors:
        args = dict(src_ptr=src, dst_ptr=dst, M=M2, N=N2, stride_src_m=ROW_STRIDE2, stride_dst_m=N2)
        names = ("src_ptr", "dst_ptr")
    else:
        args = dict(
            src_desc=TensorDescriptor(src, [M2, N2], [ROW_STRIDE2, 1], [BLOCK_M2, BLOCK_N2]),
            dst_desc=TensorDescriptor.from_tensor(dst, [BLOCK_M2, BLOCK_N2]),
        )
        names = ("src_desc", "dst_desc")
    run = run_guarded(kernel, grid, **args, BLOCK_M=BLOCK_M2, BLOCK_N=BLOCK_N2)
    box = box_problem(run, names, (M2, N2, BLOCK_M2, BLOCK_N2), ROW_STRIDE2)
    problem = diagnose(run, names[1], src, tol=1e-6, mistakes=[(box, run.tensors[names[1]])] if box else [])
    return at_other_sizes(
        problem,
        f"{M} x {N} and boxes of {BLOCK_M} x {BLOCK_N}",
        f"{M2} x {N2} (rows {ROW_STRIDE2} apart) and boxes of {BLOCK_M2} x {BLOCK_N2}",
        f"look for a size written into the kernel ({BLOCK_M}, {BLOCK_N}, {M}, {N}, {ROW_STRIDE}) where BLOCK_M, "
        "BLOCK_N, M, N or a stride belongs",
    )


def _mistakes(src: torch.Tensor, dst: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
    right = lambda pm, pn: (pm * BLOCK_M, pn * BLOCK_N)  # noqa: E731
    swapped = lambda pm, pn: (pn * BLOCK_N, pm * BLOCK_M)  # noqa: E731
    first = lambda pm, pn: (0, 0)  # noqa: E731
    axes = lambda pm, pn: (pn * BLOCK_M, pm * BLOCK_N)  # noqa: E731
    mixed = lambda pm, pn: (pm * BLOCK_N, pn * BLOCK_M)  # noqa: E731
    return [
        (
            f"the program axes are swapped: the grid is (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) = {GRID}, so the row "
            "block is tl.program_id(0) and the column block tl.program_id(1): row = tl.program_id(0) * BLOCK_M, "
            "col = tl.program_id(1) * BLOCK_N",
            box_copy(src, dst, axes, axes),
        ),
        (
            "row and column offsets swapped (or BLOCK_M and BLOCK_N mixed up): the first offset is the row, "
            "pid_m * BLOCK_M, the second the column, pid_n * BLOCK_N; as written, some boxes are copied twice and "
            "others never",
            box_copy(src, dst, swapped, swapped),
        ),
        (
            "BLOCK_M and BLOCK_N mixed up: the row offset is pid_m * BLOCK_M (boxes are BLOCK_M rows tall), the "
            "column offset pid_n * BLOCK_N",
            box_copy(src, dst, mixed, mixed),
        ),
        (
            "the load's row and column offsets are swapped: load at [pid_m * BLOCK_M, pid_n * BLOCK_N], the row first",
            box_copy(src, dst, swapped, right),
        ),
        (
            "the store's row and column offsets are swapped: store at [pid_m * BLOCK_M, pid_n * BLOCK_N], "
            "the row first",
            box_copy(src, dst, right, swapped),
        ),
        (
            "every program copies the box at [0, 0]: offset the box by this program's position, "
            "[pid_m * BLOCK_M, pid_n * BLOCK_N]",
            box_copy(src, dst, first, first),
        ),
    ]


def check_descriptor_copy(kernel, strict: bool = False) -> Verdict:
    """Grade `copy_2d_kernel(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr)`: program
    (pid_m, pid_n) of grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) copies the box at element offsets
    [pid_m * BLOCK_M, pid_n * BLOCK_N] from `src_desc` to `dst_desc`.

    Sizes: float32 src = x[:, :84] of x [60, 100] (non-contiguous), dst [60, 84] poisoned with NaN,
    BLOCK_M = 16, BLOCK_N = 32, grid (4, 3) (not square); host descriptors
    `TensorDescriptor(src, shape=[60, 84], strides=[100, 1], block_shape=[16, 32])` and
    `TensorDescriptor.from_tensor(dst, [16, 32])`. Names: block indices passed as offsets (`[pid_m,
    pid_n]`: the 16-byte rule), the program axes swapped, row and column offsets swapped (in the load,
    the store or both), every program at [0, 0], nothing stored, offsets not in a list
    (`desc.load(row, col)`), a descriptor used as a pointer (`tl.load(desc)`); from the record of each
    program's loads and stores: a constant load or store offset, an offset stepping by the other block size
    or by 1. Then, if right, a second launch (src 40 x 72 of rows 80 apart, boxes of 32 x 16, grid (2, 5)).
    """
    src, dst = _inputs()
    run = run_guarded(
        kernel,
        GRID,
        src_desc=TensorDescriptor(src, [M, N], [src.stride(0), 1], [BLOCK_M, BLOCK_N]),
        dst_desc=TensorDescriptor.from_tensor(dst, [BLOCK_M, BLOCK_N]),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
    )
    exercise = "copy_2d_kernel"
    box = box_problem(run, ("src_desc", "dst_desc"), (M, N, BLOCK_M, BLOCK_N), ROW_STRIDE)
    return error_verdict(exercise, run, ERROR_HINTS, strict) or grade(
        exercise,
        run,
        "dst_desc",
        src,
        tol=1e-6,
        strict=strict,
        mistakes=_mistakes(src, dst) + ([(box, run.tensors["dst_desc"])] if box else []),
        then=(f"and at {M2} x {N2} with boxes of {BLOCK_M2} x {BLOCK_N2}", lambda: _second_size(kernel, False)),
        nothing_written="the kernel stores nothing: load the box (tile = src_desc.load([row, col])) and store it "
        "with dst_desc.store([row, col], tile)",
    )


def _scratch(size: int, alignment: int, stream):
    """Triton's allocator for kernels that build descriptors: global memory for their tensor maps."""
    return torch.empty(size, dtype=torch.int8, device=default_device())


def _bounds_hint(run: GuardedRun) -> str:
    """What an access outside src or dst means in a kernel that reaches memory only through descriptors."""
    names = {o.tensor for o in run.out_of_bounds}
    hint = (
        "A descriptor never reaches outside its shape, so a shape or stride given to tl.make_tensor_descriptor "
        "does not describe its tensor"
    )
    if {"src_ptr", "dst_ptr"} <= names:
        hint += (
            ". The shape is the real tensor's [M, N], not the grid's padded size [cdiv(M, BLOCK_M) * BLOCK_M, "
            "...]: boxes that stick out are the descriptor's job"
        )
    if "src_ptr" in names:
        hint += (
            f". src: shape=[M, N], strides=[stride_src_m, 1]; src is a view of a wider tensor, its rows are "
            f"stride_src_m = {ROW_STRIDE} elements apart, not N = {N}"
        )
    if "dst_ptr" in names:
        hint += ". dst: shape=[M, N], strides=[stride_dst_m, 1]"
    return hint


def check_device_descriptor_copy(kernel, strict: bool = False) -> Verdict:
    """Grade `copy_2d_device_kernel(src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr)`: the same copy as `check_descriptor_copy`, with
    the descriptors built in the kernel, `tl.make_tensor_descriptor(src_ptr, shape=[M, N],
    strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])` (and the same over dst_ptr).

    Same sizes: src = x[:, :84] of x [60, 100] (stride_src_m = 100), dst [60, 84] (stride_dst_m = 84).
    On a GPU such a kernel needs scratch memory for its tensor maps: this checker sets
    `triton.set_allocator` itself, in the call that launches (the allocator lives in a ContextVar, which
    Jupyter does not carry from cell to cell); the interpreter needs none. Names: block indices passed as
    offsets, strides swapped ([1, stride]), a shape or stride that is not the tensor's (the padded grid
    size as shape, N as src's row stride, src's stride for dst: out-of-bounds accesses), row and column
    offsets swapped, every program at [0, 0], nothing stored; from the record of each program's loads and
    stores: a constant load or store offset, an offset stepping by the other block size or by 1, a box of
    another size than BLOCK_M x BLOCK_N (a wrong block_shape). Then, if right, the second launch of
    `check_descriptor_copy`'s sizes.
    """
    src, dst = _inputs()
    if not interpreter_active():
        triton.set_allocator(_scratch)
    run = run_guarded(
        kernel,
        GRID,
        src_ptr=src,
        dst_ptr=dst,
        M=M,
        N=N,
        stride_src_m=src.stride(0),
        stride_dst_m=dst.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
    )
    exercise = "copy_2d_device_kernel"
    box = box_problem(run, ("src_ptr", "dst_ptr"), (M, N, BLOCK_M, BLOCK_N), ROW_STRIDE)
    return error_verdict(exercise, run, ERROR_HINTS, strict) or grade(
        exercise,
        run,
        "dst_ptr",
        src,
        tol=1e-6,
        strict=strict,
        mistakes=_mistakes(src, dst) + ([(box, run.tensors["dst_ptr"])] if box else []),
        then=(f"and at {M2} x {N2} with boxes of {BLOCK_M2} x {BLOCK_N2}", lambda: _second_size(kernel, True)),
        out_of_bounds_hint=_bounds_hint(run) if run.out_of_bounds else "",
        nothing_written="the kernel stores nothing: build both descriptors, load the box from src's and store it "
        "into dst's at the same offsets",
    )
