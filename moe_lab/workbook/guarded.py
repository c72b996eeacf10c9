"""Run a learner's Triton kernel on guarded buffers, and say which tensor it read or wrote out of bounds.

`run_guarded(kernel, grid, x_ptr=x, out_ptr=out, n=1000, BLOCK=256)` launches `kernel` once with every
tensor argument copied into the middle of a larger buffer: guard bytes of a known value (canaries) sit
before and after it, and between its rows where its strides leave gaps. It returns a `GuardedRun`: the
tensors as the kernel left them, the out-of-bounds accesses it made, and the error it raised, if any.
It never raises for a wrong kernel (a wrong kernel is the normal case in an exercise); it raises
`TypeError` / `ValueError` only for a wrong call of the runner itself.

What it catches, and how:
- Under Triton's interpreter (no GPU): every load, store and atomic of the launch is checked before it
  happens (the runner stands in for the interpreter's memory module during the launch). An access outside
  its tensor, however far off, is dropped (a load gives 0) and recorded with the tensor's parameter name,
  the kind of access and the element offsets, so the process is never corrupted. Without this an unmasked
  store writes into the Python process's own heap (`free(): invalid size`, a dead Jupyter kernel).
- On a GPU: the same check first, under the interpreter on CPU copies of the arguments (the kernel's
  Python source run by Triton's interpreter), so an out-of-bounds access is found exactly and never
  reaches the GPU. Then the GPU launch itself: stores into the guard bytes are found by comparing the
  canaries after it (offsets known); reads of guard bytes by launching again with other canary values
  around one input at a time: if what the kernel wrote changes, it read outside that input.

What it adds to what a GPU does, so that a kernel right only by luck under the interpreter fails here too:
- The masked lanes of a `tl.load` without `other=` hold poison (the largest finite value of the dtype:
  NaN would slip through `tl.max`, which skips it): a GPU leaves them undefined, while the interpreter
  alone would give 0. A kernel whose result depends on them (a sum or max over a masked row, a padding row
  stored as loaded) is wrong on a GPU; `GuardedRun.undefined_lanes` counts them per tensor, and
  `GuardedRun.with_zero_lanes()` launches again with them 0, to show that they made the difference.
- A launch that runs longer than `MAX_SECONDS` is stopped (`NeverEnds`, naming the program that ran): a
  loop that never ends would otherwise hang the learner's Jupyter kernel. A keyboard interrupt during a
  launch raises `Stopped` (a KeyboardInterrupt) saying where the kernel was.

What it cannot catch:
- On a GPU, an access that only the compiled kernel makes (the interpreter takes the other branch: a
  kernel reading different data on the two, or one the interpreter cannot run). Beyond the guard it
  lands in other memory or raises "illegal memory access", after which the CUDA context is unusable.
- Descriptor (TMA) accesses outside the descriptor's shape: by design they read zeros and drop stores,
  on a GPU and in the interpreter; only a wrong shape or stride given to the descriptor shows here.
- On a GPU, a kernel that never ends only there (the interpreter's run, which comes first, is stopped).
- On a GPU, reads outside a tensor by a kernel whose results differ from launch to launch (a race
  between programs, float atomics in varying order): a control launch shows it and the read check is
  skipped (the interpreter's check, which runs first, still covers them).

Why not triton-viz's sanitizer (PyPI `triton-viz` 3.0): it imports only with Triton 3.6
and 3.7 (3.8 and 3.9: AttributeError on `create_make_block_ptr`), evaluates accesses symbolically so a
sanitized launch computes no result, stops the process (`sys.exit`) at the first violation unless told
not to, reports one address, and leaves the interpreter patched after a traced launch (later kernels from
other modules fail). It also brings about 280 MB of dependencies. Its tracer, which records each
program's loads and stores, is worth a look on Triton 3.6/3.7 (`docs/exercises.md`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import operator
import os
import re
import signal
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .._validate import type_name
from ..runtime import interpreter_active, interpreter_numpy_problem, interpreter_serialized

GUARD_BYTES = 4096  # canary bytes before and after every tensor (a few blocks of any exercise)
# An interpreted launch that makes more memory accesses, or runs longer, is stopped: a loop that never
# ends would otherwise hang the learner's Jupyter kernel. Every exercise needs a few thousand, in seconds.
MAX_ACCESSES = 200_000
MAX_SECONDS = 20.0
CANARY = 0x7F  # a float32/bf16 of 3.4e38 (fp16: NaN), an int32 of 2139062143: easy to spot
SECOND_CANARY = 0xFF  # NaN in every float dtype, -1 in every int dtype: the GPU read check's other fill
SHOWN_OFFSETS = 6  # offsets listed per finding


@dataclass(frozen=True)
class OutOfBounds:
    """Accesses of one kind to memory outside one tensor argument.

    `offsets` are element offsets from the tensor's first element (negative: before it; at least
    `numel`: past it; in between: a gap its strides skip), the first few in ascending order, or empty where
    a GPU read was seen but cannot be located. `count` is the number of accesses (lanes)."""

    tensor: str
    kind: str  # "load", "store" or "atomic"
    offsets: Tuple[int, ...]
    count: int
    numel: int
    span: int  # elements from the first to the last one of the tensor (numel if contiguous)
    far: bool = False  # outside every guarded buffer: `tensor` is only the nearest one
    more: bool = False  # more distinct offsets than `offsets` lists

    def describe(self) -> str:
        if not self.offsets:
            return (
                f"{self.kind}s outside {self.tensor} (its results changed when only the memory around "
                f"{self.tensor} changed)"
            )
        shown = ", ".join(str(o) for o in self.offsets)
        more = " and more" if self.more else ""
        if self.far:
            return (
                f"{self.count} {self.kind}(s) far outside every tensor (the nearest is {self.tensor}: element "
                f"offsets {shown}{more} from its start): check the strides and offsets"
            )
        where = (
            "before the first element"
            if self.offsets[-1] < 0
            else f"past the {self.numel} elements"
            if self.offsets[0] >= self.span
            else f"outside the {self.numel} elements (in gaps its strides skip, or around it)"
        )
        return f"{self.count} {self.kind}(s) {where} of {self.tensor}, at element offsets {shown}{more}"


@dataclass(frozen=True)
class Access:
    """One load, store or atomic of one program, on one tensor (recorded by the interpreter's check).
    `offsets`: element offsets from the tensor's first element, one per active lane; `in_bounds`: which of
    them lie inside the tensor."""

    program: Tuple[int, int, int]
    kind: str
    tensor: str
    offsets: np.ndarray
    in_bounds: np.ndarray


@dataclass
class GuardedRun:
    """What one guarded launch did. `tensors` maps each tensor argument's parameter name to its contents
    after the launch (a copy, same shape and dtype as given); `error` is what the launch raised."""

    tensors: Dict[str, torch.Tensor]
    out_of_bounds: List[OutOfBounds] = field(default_factory=list)
    error: Optional[BaseException] = None
    checked_by: str = "interpreter"  # or "interpreter, then canaries" (a GPU)
    accesses: List[Access] = field(default_factory=list)  # every program's accesses, in order (interpreter)
    # masked lanes of loads without other= (poisoned, see the module doc), per tensor parameter name
    undefined_lanes: Dict[str, int] = field(default_factory=dict)
    relaunch: Optional[Callable[[], "GuardedRun"]] = field(default=None, repr=False, compare=False)

    def with_zero_lanes(self) -> Optional["GuardedRun"]:
        """The same launch under the interpreter with the masked lanes of loads without `other=` left 0 (no
        poison), or None if this launch had none or cannot be repeated."""
        return self.relaunch() if self.undefined_lanes and self.relaunch is not None else None

    @property
    def clean(self) -> bool:
        return self.error is None and not self.out_of_bounds

    def offsets(
        self, tensor: Optional[str] = None, kind: Optional[str] = None, outside_only: bool = True
    ) -> np.ndarray:
        """Every element offset the launch's accesses of `tensor` of `kind` (None: any) reached, only those
        outside the tensor by default; from the interpreter's record of each access, else (an access seen
        on a GPU only) the offsets the out-of-bounds reports list."""

        def wanted(a):
            return (tensor is None or a.tensor == tensor) and (kind is None or a.kind == kind)

        chunks = [a.offsets[~a.in_bounds] if outside_only else a.offsets for a in self.accesses if wanted(a)]
        found = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
        if outside_only and not found.size:
            found = np.array([x for o in self.out_of_bounds if wanted(o) for x in o.offsets], dtype=np.int64)
        return found

    def problem(self) -> Optional[str]:
        """One line for a learner, or None when the launch ran within bounds and raised nothing."""
        if self.error is not None:
            return describe_error(self.error)
        if self.out_of_bounds:
            return "; ".join(o.describe() for o in self.out_of_bounds)
        return None


class KernelMismatch(TypeError):
    """What was handed over is not a kernel that takes these arguments (a learner's signature, or no
    kernel at all): the exercise checkers turn it into a NOT YET."""


def _launched_kernel(fn):
    """The kernel of `kernel[grid]` (Triton returns a lambda holding it), else None."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if hasattr(value, "arg_names") and hasattr(value, "__getitem__"):
            return value
    return None


def _not_a_kernel(kernel) -> str:
    if kernel is None:
        return "got None instead of a kernel: run the cell that defines it (with @triton.jit) first"
    launched = _launched_kernel(kernel)
    if launched is not None:
        name = getattr(launched, "__name__", "kernel")
        return f"got {name}[grid], a launch of the kernel: pass the kernel itself ({name}), the checker picks the grid"
    if type(kernel).__name__ == "partial":
        return (
            f"got functools.partial({getattr(kernel.func, '__name__', type(kernel.func).__name__)}, ...), where a "
            "@triton.jit kernel is expected: pass the kernel itself, the checker passes every argument"
        )
    if getattr(kernel, "__name__", "") == "<lambda>":
        return (
            "got a lambda, a plain Python function, where a @triton.jit kernel is expected: pass the kernel "
            "itself (the function under @triton.jit), the checker launches it"
        )
    if callable(kernel):
        return (
            f"got {getattr(kernel, '__name__', type(kernel).__name__)}, a plain Python function: a Triton "
            "kernel needs the @triton.jit decorator"
        )
    return f"expected a @triton.jit function, got {type(kernel).__name__}"


class NeverEnds(RuntimeError):
    """An interpreted launch ran past `MAX_SECONDS` or `MAX_ACCESSES`: the kernel was stopped."""


class WontCompile(ValueError):
    """A kernel the interpreter runs but a GPU's compiler refuses (`static_range_problem`)."""


_RUNTIME_CALLS = ("program_id", "num_programs", "load")
_CONSTANT_ATTRIBUTES = ("shape", "block_shape", "block_type", "dtype", "type", "numel")


def static_range_problem(kernel) -> Optional[str]:
    """Why a `tl.static_range` loop of `kernel` will not compile, or None: its bounds must be tl.constexpr (the
    loop is unrolled when the kernel compiles), and the interpreter runs it with runtime bounds all the same.
    Read from the source: a bound naming a parameter that is not a tl.constexpr, a local variable assigned
    without a tl.constexpr annotation, a loop variable, or a tl.load / tl.program_id / tl.num_programs."""
    fn = _python_function(kernel)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))) if fn is not None else None
    except (OSError, TypeError, SyntaxError):  # no source to read (a lambda, a function made by exec)
        return None
    func = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None) if tree else None
    if func is None:
        return None

    def constexpr(annotation) -> bool:
        return annotation is not None and "constexpr" in ast.unparse(annotation)

    runtime = {a.arg for a in func.args.args if not constexpr(a.annotation)}

    def runtime_part(expr) -> Optional[str]:
        """The first runtime value `expr` reads (a name or a tl call), or None where it is a constant (a
        tensor's or descriptor's shape and type are constants even where the tensor is not)."""
        if isinstance(expr, ast.Attribute) and expr.attr in _CONSTANT_ATTRIBUTES:
            return None
        if isinstance(expr, ast.Name) and expr.id in runtime:
            return expr.id
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _RUNTIME_CALLS:
            return f"tl.{expr.func.attr}(...)"
        return next(filter(None, map(runtime_part, ast.iter_child_nodes(expr))), None)

    def is_static_range(expr) -> bool:
        call = expr.func if isinstance(expr, ast.Call) else None
        return (call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", None)) == "static_range"

    changed = True
    while changed:  # a local is a constant where every value given to it is (Triton keeps constexpr through =)
        before = len(runtime)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and runtime_part(node.value):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and not constexpr(node.annotation):
                targets = [node.target]
            elif isinstance(node, ast.AugAssign) and runtime_part(node.value):
                targets = [node.target]
            elif isinstance(node, ast.For) and not is_static_range(node.iter):  # static_range's index: a constant
                targets = [node.target]
            else:
                continue
            runtime |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        changed = len(runtime) != before
    for node in ast.walk(func):
        if not is_static_range(node):
            continue
        for arg in node.args:
            what = runtime_part(arg)
            if what:
                return (
                    f"`{ast.unparse(node)}`: the bounds of tl.static_range must be tl.constexpr (the loop is "
                    f"unrolled when the kernel compiles), and {what} is a runtime value, so a GPU will not "
                    "compile this kernel (the interpreter runs it anyway). Loop over runtime bounds with "
                    "tl.range(...) or range(...)"
                )
    return None


class Stopped(KeyboardInterrupt):
    """A keyboard interrupt (Jupyter's stop button) during a guarded launch; says where the kernel was."""


# A grid of more programs than this is named as a likely cause when a launch is stopped (every exercise
# launches at most a few hundred; the interpreter runs each program in turn).
LARGE_GRID = 4096


def never_ends_message(seconds: float, accesses: int, program, programs: Optional[int] = None) -> str:
    """Why a launch was stopped. `programs`: the grid's number of programs, if known (a tuple grid)."""
    text = (
        f"stopped after {seconds:.0f} s and {accesses} memory accesses, in program {tuple(program)}; every "
        "exercise runs in a few seconds: a loop that never ends? A `while` loop whose variable never steps "
        "(no `+= ...` in its body), a `tl.range` whose bound is far too large, or a loop variable that is "
        "reset in the body"
    )
    if programs is not None and programs > LARGE_GRID:
        text += (
            f"; or a grid far too large: {programs} programs, run one after another by the interpreter "
            "(one program per block of the data: triton.cdiv(n, BLOCK), not n)"
        )
    return text


def _grid_programs(grid) -> Optional[int]:
    """The number of programs of a tuple grid (None for a callable one)."""
    return int(np.prod(grid)) if isinstance(grid, tuple) else None


def _checked_grid(grid):
    """`grid` as Triton takes it: a tuple of 1 to 3 ints >= 0 (a list is made a tuple), or a callable.
    Raises TypeError / ValueError naming grid: a wrong call of the runner, not the kernel's fault."""
    if callable(grid):
        return grid
    expected = "a tuple of 1 to 3 ints, the programs along each axis, such as (triton.cdiv(n, BLOCK),) (or a callable)"
    if not isinstance(grid, (tuple, list)):
        hint = f" (one axis: write ({grid!r},))" if isinstance(grid, int) and not isinstance(grid, bool) else ""
        raise TypeError(f"grid must be {expected}, got {type(grid).__name__} {grid!r}{hint}")
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"grid must be {expected}, got {len(grid)} axes: {grid!r}")
    sizes = []
    for size in grid:
        try:
            if isinstance(size, bool):  # an int to operator.index, not a size
                raise TypeError
            sizes.append(operator.index(size))
        except TypeError:
            raise TypeError(f"grid must be {expected}, got {grid!r} (holding {type(size).__name__} {size!r})") from None
    if any(size < 0 for size in sizes):
        raise ValueError(f"grid must hold ints >= 0 (programs along each axis), got {grid!r}")
    return tuple(sizes)


# The torch dtypes a Triton kernel takes as a pointer argument (Triton's own list: triton._utils).
KERNEL_DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    *(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)),
)  # fmt: skip


def _check_tensor_argument(name: str, tensor: torch.Tensor) -> None:
    """A tensor the guard (and a Triton kernel) can take; raises TypeError / ValueError naming it."""
    if tensor.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{name} is a {str(tensor.dtype).replace('torch.', '')} tensor, which a Triton kernel cannot take: "
            "pass bool, int, uint, float (16, 32, 64 bits, bfloat16) or float8 tensors"
        )
    if tensor.numel() and any(s < 0 for s in tensor.stride()):
        raise ValueError(f"{name}: negative strides are not supported, got {tensor.stride()}")
    if tensor.numel() > 1 and any(s == 0 and n > 1 for n, s in zip(tensor.shape, tensor.stride())):
        raise ValueError(
            f"{name} has stride 0 (strides {tensor.stride()} for shape {tuple(tensor.shape)}: an expand or a "
            f"broadcast, its elements share memory): pass a tensor of its own, {name}.contiguous()"
        )


# A numpy array's repr inside a message (several numbers between brackets, over lines); the interpreter's
# "cannot cast [...] to <[shape], type>".
_NUMBERS = re.compile(r"\[[-+0-9.eE\s|]{20,}\]")
_CAST = re.compile(r"cannot cast .*? to <\[[^\]]*\], (\w+)>")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # moe_lab/


def _kernel_line(exc: BaseException) -> str:
    """Where in the learner's code the interpreter met what it wraps (InterpreterError's cause): the innermost
    frame outside Triton, torch and moe_lab, as ' (in NAME, line N: SOURCE)'; '' where none."""
    import triton

    libraries = tuple(os.path.dirname(m.__file__) + os.sep for m in (triton, torch)) + (_PACKAGE_DIR,)
    for cause in (exc.__cause__, exc.__context__):
        if cause is None:
            continue
        frames = [f for f in traceback.extract_tb(cause.__traceback__) if not f.filename.startswith(libraries)]
        if frames:
            f = frames[-1]
            return (
                f" (in {f.name}, line {f.lineno}: {f.line.strip()})" if f.line else f" (in {f.name}, line {f.lineno})"
            )
    return ""


def describe_error(exc: BaseException) -> str:
    """The first lines of what a kernel raised, without the interpreter's traceback noise, and where in the
    learner's code it was raised (`_kernel_line`)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, (NeverEnds, WontCompile)):  # the interpreter may wrap what a kernel raised
            return str(cause)
    text = str(exc).strip() or repr(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    if "illegal memory access" in text or "illegal instruction" in text:
        return (
            f"the GPU stopped the kernel ({lines[0]}): an access it cannot make, such as an address far "
            "outside its tensors or a descriptor offset that breaks the 16-byte rule. The CUDA context is "
            "now unusable: restart the Python kernel, then run this exercise under the interpreter "
            "(TRITON_INTERPRET=1, no GPU needed) to see which access goes where"
        )
    text = _NUMBERS.sub("[...]", " | ".join(lines[-4:]))  # an array's values say nothing here, its type does
    cast = _CAST.search(text)
    if cast:  # the interpreter's store or cast of a value its target type cannot take
        return (
            f"the kernel raised {type(exc).__name__}: the interpreter cannot convert a tensor to {cast.group(1)} "
            f"(integers stored into a float8 buffer?): store float values, or .to() the buffer's element type first"
        )
    return f"the kernel raised {type(exc).__name__}: " + text[:600] + _kernel_line(exc)


@dataclass
class _Guarded:
    """One tensor argument inside its guarded buffer."""

    name: str
    original: torch.Tensor
    buffer: torch.Tensor  # uint8, guard + span + guard bytes
    view: torch.Tensor  # the tensor handed to the kernel: `original`'s shape, strides and values
    inside: np.ndarray  # bool per buffer byte: True where a byte of `view` lies
    canary: int  # the byte value of its guard

    @property
    def start(self) -> int:  # byte address of view's first element
        return self.view.data_ptr()

    def extent(self) -> Tuple[int, int]:
        """(numel, span): its element count, and elements from its first to its last one."""
        return self.original.numel(), _span(self.original)

    def element_offsets(self, byte_index: np.ndarray) -> np.ndarray:
        return (byte_index - GUARD_BYTES) // self.original.element_size()


def _span(tensor: torch.Tensor) -> int:
    """Elements from the tensor's first to its last one (numel if contiguous, 0 if empty)."""
    return 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0


def _guard(name: str, tensor: torch.Tensor, canary: int) -> _Guarded:
    item = tensor.element_size()  # (the tensor passed `run_guarded`'s `_check_tensor_argument`)
    buffer = torch.full((2 * GUARD_BYTES + _span(tensor) * item,), canary, dtype=torch.uint8, device=tensor.device)
    typed = buffer.view(tensor.dtype)
    view = typed.as_strided(tensor.shape, tensor.stride(), GUARD_BYTES // item)
    view.copy_(tensor)  # (other overlapping strides than a stride 0 copy as they are: torch checks only that)
    marks = torch.zeros(buffer.numel() // item, dtype=torch.bool)
    marks.as_strided(tensor.shape, tensor.stride(), GUARD_BYTES // item).fill_(True)
    inside = np.repeat(marks.numpy(), item)
    return _Guarded(name, tensor, buffer, view, inside, canary)


class _CheckedMemory:
    """Stands in for the interpreter's memory module (`triton.runtime.interpreter._interpreter`) during a
    guarded launch: each load, store and atomic first drops and records the lanes outside every guarded
    tensor, then goes to the real module. Everything else is forwarded unchanged."""

    def __init__(self, real, guarded: List[_Guarded]):
        self._real = real
        self._guarded = guarded
        self.findings: Dict[Tuple[str, str, bool], List[np.ndarray]] = {}
        self.accesses: List[Access] = []
        self.undefined_lanes: Dict[str, int] = {}
        self.stopped: Optional[str] = None  # why the launch was stopped (NeverEnds), if it was
        self.programs: Optional[int] = None  # the grid's number of programs (a tuple grid), for the message
        self._calls = 0
        self._started = time.monotonic()
        from triton.runtime import interpreter

        self._builder = interpreter.interpreter_builder  # knows which program runs

    def __getattr__(self, name):
        return getattr(self._real, name)

    def program(self) -> Tuple[int, int, int]:
        return tuple(getattr(self._builder, "grid_idx", None) or (0, 0, 0))

    def seconds(self) -> float:
        return time.monotonic() - self._started

    def _allowed(self, kind: str, ptrs: np.ndarray, mask: Optional[np.ndarray]) -> np.ndarray:
        self._calls += 1
        if self._calls > MAX_ACCESSES or self.seconds() > MAX_SECONDS:
            self.stopped = never_ends_message(self.seconds(), self._calls - 1, self.program(), self.programs)
            raise NeverEnds(self.stopped)
        addresses = np.asarray(ptrs, dtype=np.uint64).astype(np.int64)
        active = (
            np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), addresses.shape)
        )
        ok = np.zeros(addresses.shape, bool)
        placed = np.zeros(addresses.shape, bool)
        for g in self._guarded:
            base = g.buffer.data_ptr()
            index = addresses - base
            in_buffer = active & (index >= 0) & (index < g.inside.size)
            if not in_buffer.any():
                continue
            placed |= in_buffer
            hit = np.zeros(addresses.shape, bool)
            hit[in_buffer] = g.inside[index[in_buffer]]
            ok |= hit
            bad = in_buffer & ~hit
            self.accesses.append(
                Access(
                    self.program(),
                    kind,
                    g.name,
                    g.element_offsets(index[in_buffer]),
                    hit[in_buffer],
                )
            )
            if bad.any():
                self.findings.setdefault((g.name, kind, False), []).append(g.element_offsets(index[bad]))
        wild = active & ~placed
        if wild.any():  # outside every buffer: name the nearest tensor
            first = int(addresses[wild].min())
            g = min(self._guarded, key=lambda g: abs(first - g.start))
            self.findings.setdefault((g.name, kind, True), []).append(
                (addresses[wild] - g.start) // g.original.element_size()
            )
        return active & ok

    def load(self, ptrs, mask, other, dtype):
        return self._real.load(ptrs, self._allowed("load", ptrs, mask), other, dtype)

    def tensor_at(self, address: int) -> str:
        """The parameter name of the guarded tensor nearest to a byte address."""
        return min(self._guarded, key=lambda g: abs(address - g.start)).name

    def masked_load(self, real):
        """The interpreter builder's `create_masked_load`, with poison in the masked lanes of a load that has
        no `other` (the interpreter alone would give them 0; a GPU leaves them undefined)."""

        def create_masked_load(ptrs, mask, other, *rest, **kwargs):
            loaded = real(ptrs, mask, other, *rest, **kwargs)
            if other is None and self._guarded:
                data = loaded.data
                unset = ~np.broadcast_to(np.asarray(mask.data, bool), data.shape)
                kind = data.dtype.kind
                if unset.any() and kind in "fiu":
                    data[unset] = np.finfo(data.dtype).max if kind == "f" else np.iinfo(data.dtype).max
                    name = self.tensor_at(int(np.asarray(ptrs.data, dtype=np.uint64).ravel()[0]))
                    self.undefined_lanes[name] = self.undefined_lanes.get(name, 0) + int(unset.sum())
            return loaded

        return create_masked_load

    def store(self, ptrs, value, mask):
        return self._real.store(ptrs, value, self._allowed("store", ptrs, mask))

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        return self._real.atomic_rmw(op, ptrs, value, self._allowed("atomic", ptrs, mask), sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        if not self._allowed("atomic", ptrs, None).all():
            raise IndexError("atomic_cas outside its tensor (it has no mask): stopped before it ran")
        return self._real.atomic_cas(ptrs, cmp, value, sem)


def _findings_to_reports(findings, guarded: Dict[str, _Guarded]) -> List[OutOfBounds]:
    reports = []
    for (name, kind, far), chunks in findings.items():
        offsets = np.unique(np.concatenate(chunks))
        count = int(sum(len(c) for c in chunks))
        reports.append(
            OutOfBounds(
                name,
                kind,
                tuple(int(o) for o in offsets[:SHOWN_OFFSETS]),
                count,
                *guarded[name].extent(),
                far=far,
                more=len(offsets) > SHOWN_OFFSETS,
            )
        )
    return reports


def _written_guards(guarded: Dict[str, _Guarded]) -> List[OutOfBounds]:
    reports = []
    for g in guarded.values():
        changed = (g.buffer.cpu().numpy() != g.canary) & ~g.inside
        if changed.any():
            offsets = np.unique(g.element_offsets(np.nonzero(changed)[0]))
            reports.append(
                OutOfBounds(
                    g.name,
                    "store",
                    tuple(int(o) for o in offsets[:SHOWN_OFFSETS]),
                    len(offsets),
                    *g.extent(),
                    more=len(offsets) > SHOWN_OFFSETS,
                )
            )
    return reports


def _launch(
    kernel, grid, args: dict, check_accesses: bool, second_canary_for: Optional[str] = None, poison: bool = True
):
    """One launch on fresh guarded copies; (guarded tensors, the access checker or None, error). Each tensor
    has a canary of its own (a copy from one guard into another shows), but `second_canary_for`'s."""
    guarded, call = {}, {}
    for index, (name, value) in enumerate(args.items()):
        canary = SECOND_CANARY if name == second_canary_for else CANARY - index
        if isinstance(value, torch.Tensor):
            guarded[name] = _guard(name, value, canary)
            call[name] = guarded[name].view
        elif _is_descriptor(value):
            guarded[name] = _guard(name, value.base, canary)
            call[name] = dataclasses.replace(value, base=guarded[name].view)
        else:
            call[name] = value
    checker, error = None, None
    if check_accesses:
        from triton.runtime import interpreter as interp

        checker = _CheckedMemory(interp._interpreter, list(guarded.values()))
        checker.programs = _grid_programs(grid)
        interp._interpreter = checker
        builder = interp.interpreter_builder
        if poison:
            builder.create_masked_load = checker.masked_load(builder.create_masked_load)
    started = time.monotonic()
    try:
        # (poisoned lanes overflow sums: numpy's warnings about it would only be noise in a notebook)
        with _deadline(MAX_SECONDS if check_accesses else None, checker), np.errstate(over="ignore", invalid="ignore"):
            kernel[grid](**call)
        if not check_accesses and torch.cuda.is_available():
            torch.cuda.synchronize()
    except KeyboardInterrupt as exc:
        where = f", in program {checker.program()} after {checker._calls} memory accesses" if checker else ""
        raise Stopped(
            f"stopped by a keyboard interrupt after {time.monotonic() - started:.0f} s{where}. If the check "
            f"ran for more than a few seconds, does a loop never end? (The check stops one by itself after "
            f"{MAX_SECONDS:.0f} s.)"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a learner's kernel may raise anything; it is reported
        # (the interpreter wraps some of what a kernel raised in its own error: the stop is named as such)
        error = NeverEnds(checker.stopped) if checker is not None and checker.stopped else exc
    finally:
        if checker is not None:
            interp._interpreter = checker._real
            builder.__dict__.pop("create_masked_load", None)  # back to the class's method
    return guarded, checker, error


@contextlib.contextmanager
def _deadline(seconds: Optional[float], checker: Optional[_CheckedMemory] = None):
    """Stop an interpreted launch after `seconds` even where it touches no memory (a loop of arithmetic
    only never reaches the access checker's clock): a SIGALRM timer in the main thread of a Unix process
    (as a Jupyter kernel runs cells), elsewhere a watchdog thread that raises `NeverEnds` in this one."""
    if seconds is None:
        yield
        return

    def message() -> str:
        text = (
            never_ends_message(seconds, checker._calls, checker.program(), checker.programs) if checker else "stopped"
        )
        if checker:
            checker.stopped = text
        return text

    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():

        def stop(signum, frame):
            raise NeverEnds(message())

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    import ctypes

    target = threading.get_ident()
    done = threading.Event()
    reason: List[str] = []

    # raised in this thread by the watchdog, which can pass a class only: the message is read when shown
    stop = type("NeverEnds", (NeverEnds,), {"__str__": lambda self: reason[0] if reason else "stopped"})

    def watch():
        if not done.wait(seconds):
            reason.append(message())
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(stop))

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def _has_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) or (_is_descriptor(value) and isinstance(value.base, torch.Tensor))


def _is_descriptor(value) -> bool:
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "base")


def _python_function(kernel):
    """The Python function under a JITFunction, an InterpretedFunction, an Autotuner or Heuristics; None if
    there is none."""
    fn = kernel
    while not inspect.isfunction(fn) and hasattr(fn, "fn"):
        fn = fn.fn
    return fn if inspect.isfunction(fn) else None


def _check_arguments(kernel, args: dict) -> None:
    """Mistakes of the call that the launch would report from deep inside Triton: a parameter without a
    default left out (KernelMismatch; a plain @triton.jit kernel only: an autotuner's or heuristics' configs
    supply some), and an argument no kernel takes (a list, a numpy array, a dict or set; a str where the
    parameter is not a tl.constexpr)."""
    fn = _python_function(kernel)
    if fn is None:
        return
    params = inspect.signature(fn).parameters
    missing = [name for name, p in params.items() if name not in args and p.default is inspect.Parameter.empty]
    if missing and inspect.isfunction(getattr(kernel, "fn", None)):
        raise KernelMismatch(
            f"{fn.__name__}({', '.join(params)}) needs {', '.join(missing)}: this exercise passes "
            f"{', '.join(args) or 'nothing'}. Keep the stub's parameter names."
        )
    for name, value in args.items():
        constexpr = "constexpr" in str(params[name].annotation)
        if isinstance(value, (list, dict, set, np.ndarray)) or (isinstance(value, str) and not constexpr):
            hint = {list: "; torch.tensor(...) makes one", np.ndarray: "; torch.from_numpy(...) makes one"}
            raise TypeError(
                f"{name} must be a torch.Tensor (a pointer), an int, float or bool (a scalar), None, or for a "
                f"tl.constexpr parameter a constant, got {type_name(value)}{hint.get(type(value), '')}"
            )


@interpreter_serialized
def run_guarded(kernel, grid, **args) -> GuardedRun:
    """Launch `kernel[grid](**args)` once on guarded copies of its tensor arguments (see the module doc).

    kernel: a `@triton.jit` function. grid: a tuple (or list) of 1 to 3 ints >= 0, or a callable, as Triton
    takes. args: every kernel argument by its parameter name; torch tensors (any dtype a Triton kernel
    takes, any shape, non-negative strides and no two elements at one address: not a stride-0 expand, on
    the device the kernels run on) and host `TensorDescriptor`s (their base is guarded) are copied, the
    caller's tensors are never written. Returns a `GuardedRun`; raises `KernelMismatch` (a TypeError)
    if `kernel` is not a Triton kernel, an argument name is not one of its parameters or (a plain @triton.jit
    kernel: an autotuner's or heuristics' configs supply some) a parameter without a default is not passed,
    TypeError / ValueError naming `grid` or the argument for a wrong grid, a tensor it cannot take (complex,
    stride 0, negative strides) or a value no kernel takes (a list, a numpy array, a dict or set; a str for a
    parameter that is not a tl.constexpr): mistakes of the call, found before the kernel runs. An autotuner of
    several configs cannot run without a GPU (Triton times them there). numpy scalars are taken as the
    Python int, float or bool they hold.
    """
    names = getattr(kernel, "arg_names", None)
    if names is None or not hasattr(kernel, "__getitem__"):
        raise KernelMismatch(_not_a_kernel(kernel))
    unknown = [name for name in args if name not in names]
    if unknown:
        name = getattr(_python_function(kernel), "__name__", "kernel")
        raise KernelMismatch(
            f"{name}({', '.join(names)}) has no parameter {', '.join(unknown)}: this "
            f"exercise passes {', '.join(args)}. Keep the stub's parameter names."
        )
    _check_arguments(kernel, args)
    # numpy scalars (a shape or count read from an array) as the Python scalars Triton takes
    args = {name: value.item() if isinstance(value, np.generic) else value for name, value in args.items()}
    grid = _checked_grid(grid)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            _check_tensor_argument(name, value)
        elif _is_descriptor(value) and isinstance(value.base, torch.Tensor):
            _check_tensor_argument(f"{name}.base", value.base)
    unrolled = static_range_problem(kernel)
    if unrolled is not None:  # found before it runs: the interpreter would run it
        tensors = {name: (v.base if _is_descriptor(v) else v).clone() for name, v in args.items() if _has_tensor(v)}
        return GuardedRun(tensors, error=WontCompile(unrolled))
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):  # interpreted: defined while TRITON_INTERPRET=1
        return _interpreted_run(kernel, grid, args)
    first = _first_check(kernel, grid, args)
    # A GPU: first the interpreter on CPU copies, so an access out of bounds is found exactly and never
    # reaches the GPU (where a wild one would end the CUDA context); then the GPU itself, with canaries.
    if not first.clean or interpreter_active() or not torch.cuda.is_available():
        # (a compiled kernel with the interpreter on: defined before `import moe_lab` switched it on)
        first.tensors = {name: t.to(_device_of(args[name])) for name, t in first.tensors.items()}
        return first
    guarded, _, error = _launch(kernel, grid, args, check_accesses=False)
    tensors = {name: g.view.clone() for name, g in guarded.items()}
    if error is not None:
        return GuardedRun(
            tensors, [], error, "interpreter, then canaries", first.accesses, first.undefined_lanes, first.relaunch
        )
    reports = _written_guards(guarded)
    control, _, error = _launch(kernel, grid, args, check_accesses=False)
    if error is not None or any(not torch.equal(control[n].buffer, g.buffer) for n, g in guarded.items()):
        # The same launch wrote something else (a race between programs): changing canaries proves nothing.
        return GuardedRun(
            tensors,
            reports,
            error,
            "interpreter, then canaries (writes only: the kernel's results vary from launch to launch)",
            first.accesses,
            first.undefined_lanes,
            first.relaunch,
        )
    for name in guarded:  # reads: change one tensor's canaries; does anything the kernel wrote move?
        again, _, error = _launch(kernel, grid, args, check_accesses=False, second_canary_for=name)
        if error is not None:
            return GuardedRun(
                tensors, reports, error, "interpreter, then canaries", first.accesses, first.undefined_lanes
            )
        moved = any(
            not torch.equal(again[other].buffer, guarded[other].buffer) for other in guarded if other != name
        ) or not _same(again[name].view, tensors[name])
        if moved:
            reports.append(OutOfBounds(name, "load", (), 0, *guarded[name].extent()))
    return GuardedRun(
        tensors, reports, None, "interpreter, then canaries", first.accesses, first.undefined_lanes, first.relaunch
    )


def _first_check(kernel, grid, args: dict, poison: bool = True) -> GuardedRun:
    """A compiled kernel's check under the interpreter, on CPU copies of its arguments."""
    with _interpreting_beside_a_gpu():
        run = _interpreted_run(_interpreted(kernel), grid, {n: _on_cpu(v) for n, v in args.items()}, poison)
    run.relaunch = lambda: _first_check(kernel, grid, args, poison=False)
    return run


def _interpreted_run(kernel, grid, args: dict, poison: bool = True) -> GuardedRun:
    guarded, checker, error = _launch(kernel, grid, args, check_accesses=True, poison=poison)
    tensors = {name: g.view.clone() for name, g in guarded.items()}
    return GuardedRun(
        tensors,
        _findings_to_reports(checker.findings, guarded),
        error,
        "interpreter",
        checker.accesses,
        checker.undefined_lanes,
        lambda: _interpreted_run(kernel, grid, args, poison=False),
    )


def _interpreted(kernel):
    """The interpreter's version of a compiled `@triton.jit` kernel (same Python source)."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(kernel.fn)


@contextlib.contextmanager
def _interpreting_beside_a_gpu():
    """Within, the interpreter runs a compiled kernel's source as it would with TRITON_INTERPRET=1:
    - a call of a compiled `@triton.jit` function (a learner's helper, `tl.cdiv`, `tl.sum`) runs its
      interpreted version (with TRITON_INTERPRET=1 every such function is interpreted from the start;
      outside a kernel Triton refuses such calls);
    - with Triton <= 3.6 and numpy >= 2.4, a loop's run-time bound is read as Triton 3.7 reads it
      (`int()` of a one-element array fails under numpy 2.4; see runtime.interpreter_numpy_problem).
    Everything is put back on the way out: the GPU compiles the same kernel next."""
    import triton
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    had_own_call = "__call__" in JITFunction.__dict__
    original_call = JITFunction.__dict__.get("__call__")
    original_patch_tensor = interpreter._patch_lang_tensor
    interpreted = {}

    def call(self, *args, **kwargs):
        if self.fn not in interpreted:
            interpreted[self.fn] = interpreter.InterpretedFunction(self.fn)
        # As InterpretedFunction.__call__ does, but undoing its patches of triton.language afterwards (it
        # leaves them, harmless when everything is interpreted; here the GPU compiles next).
        scope = interpreter._patch_lang(self.fn)
        try:
            return interpreted[self.fn].rewrite()(*args, **kwargs)
        finally:
            scope.restore()

    def patch_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    JITFunction.__call__ = call
    if interpreter_numpy_problem(triton.__version__, np.__version__):
        interpreter._patch_lang_tensor = patch_tensor
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original_patch_tensor
        if had_own_call:
            JITFunction.__call__ = original_call
        else:
            del JITFunction.__call__


def _device_of(value) -> torch.device:
    return value.base.device if _is_descriptor(value) else value.device


def _on_cpu(value):
    """A CPU copy with the same strides (`.cpu()` makes a non-dense view contiguous)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).copy_(value)
    if _is_descriptor(value):
        return dataclasses.replace(value, base=_on_cpu(value.base))
    return value


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.element_size() == 1 and a.is_floating_point():  # float8: compare bytes (few float8 ops exist)
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)
