"""Notebook 10's exercise: the producer of a warp-specialized TMA copy, in Gluon.

    @gluon.jit
    def copy_load_partition(src_desc, bufs, ready, empty, M, N):

the load partition of `ws_copy_kernels.ws_copy_kernel` (one warp): for each tile of its program, in the order
t = program_id, program_id + num_programs, ..., wait until stage `step % STAGES` of the ring is empty (the
consumer has read what was there), make that stage's `ready` barrier expect one box's bytes
(`src_desc.block_type.nbytes`) and issue the TMA load of the tile's box into `bufs.index(stage)`, signalling
`ready.index(stage)`; `step` counts the program's loads from 0. The waits on `empty` are for parity
((step // STAGES) & 1) ^ 1: a fresh barrier counts as having completed the phase before phase 0, so the first
round passes at once, and round r waits for the consumer's r-th release of the stage.

Gluon has no interpreter, so the check has three parts:
1. a model of the protocol in Python, on any machine: the producer's own Python body runs with stand-ins for
   `mbarrier`, `tma`/`tma_load` and `gl.program_id`/`gl.num_programs`/`gl.cdiv`, which record every wait,
   expect and load (gl.static_assert, gl.static_print and gl.where/minimum/maximum run on Python numbers; any
   other Gluon function says the model cannot run it); its record is compared with the protocol step by step
   (each classic slip is named), then played against the consumer's protocol with real mbarrier semantics
   (phases, arrivals, transaction bytes): a deadlock or a box overwritten before it was read shows there. It
   plays the three sizes of the GPU run (CONFIGS: 2 to 7 programs, 2 to 4 stages, up to 19 rounds of the ring,
   three box sizes), so a number written into the producer is found on any machine (the body is stopped after
   MODEL_SECONDS or MODEL_OPS calls: a loop that never ends is reported, not waited on);
2. the kernel compiled for sm_90 (no GPU needed), in a process of its own: it compiles, its TTGIR holds a
   `ttg.warp_specialize` region, its PTX mbarrier waits and TMA copies;
3. on a Hopper GPU, the copy run in a process of its own with a time limit (a wrong protocol hangs a GPU
   kernel, and the process is then stopped, not the notebook), compared bit for bit at three sizes.
The producer is recompiled alone in that process, with `gluon`, `gl`, `mbarrier`, `tma` and `tma_load` (the
names the notebook imports) and nothing else from the notebook.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..._validate import check_bool, described
from ..guarded import KernelMismatch, NeverEnds, _deadline, _launched_kernel
from ._grade import Verdict, at_other_sizes, report

EXERCISE = "copy_load_partition"


@dataclass(frozen=True)
class Config:
    """One size the model plays: P programs over the cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) tiles of M x N float32,
    a ring of STAGES stages."""

    m: int
    n: int
    block_m: int
    block_n: int
    stages: int
    programs: int

    @property
    def nbytes(self) -> int:
        return self.block_m * self.block_n * 4

    def tiles(self, program: int) -> List[Tuple[int, int]]:
        """The box coordinates of one program's tiles, in its order."""
        num_n = -(-self.n // self.block_n)
        tiles = range(program, -(-self.m // self.block_m) * num_n, self.programs)
        return [((t // num_n) * self.block_m, (t % num_n) * self.block_n) for t in tiles]

    @property
    def rounds(self) -> int:
        return -(-len(self.tiles(0)) // self.stages)

    def __str__(self) -> str:
        return (
            f"{self.programs} programs, STAGES = {self.stages} and boxes of {self.block_m} x {self.block_n} "
            f"({self.rounds} rounds of the ring)"
        )


# The model's sizes, those of the GPU run (ws_copy_kernels.CASES): 2 programs over 4 x 3 boxes of 16 x 32 float32
# with 3 stages (two rounds of the ring); 5 programs over 10 x 7 boxes of 32 x 32 with 2 stages (7 rounds); 7 programs
# over 16 x 32 boxes of 64 x 32 with 4 stages (19 rounds). The first is the notebook's; a producer right there but
# not at the others has a number written into it (STAGES, the box's bytes) or a parity right only in the first rounds.
CONFIGS = (Config(60, 84, 16, 32, 3, 2), Config(300, 200, 32, 32, 2, 5), Config(1000, 1000, 64, 32, 4, 7))
GPU_SECONDS = 120  # the GPU run's limit, compile included
MODEL_SECONDS = 5.0  # the model's limit on the producer's Python body (it takes milliseconds)
MODEL_OPS = 1000  # the most waits, expects, arrives and loads one program's body may record (the protocol: 3 a tile)
PARAMETERS = ("src_desc", "bufs", "ready", "empty", "M", "N")
COMPILE_SECONDS = 300
PRODUCER_HEADER = """\
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

"""


class ModelError(Exception):
    """The producer did something the protocol has no place for (a stage out of range, a wrong argument)."""


@dataclass(frozen=True)
class Bar:
    ring: str  # "ready" or "empty"
    stage: int

    def __str__(self) -> str:
        return f"{self.ring}[{self.stage}]"


@dataclass(frozen=True)
class Op:
    kind: str  # "wait", "expect", "arrive", "load"
    bar: Bar
    value: object = None  # wait: parity; expect: bytes; arrive: count; load: (coordinates, buffer stage)


# --- stand-ins for what the producer's Python body calls ------------------------------------------------


class _Rings:
    def __init__(self, name: str, stages: int):
        self.name, self.stages = name, stages

    def index(self, stage):
        stage = int(stage)
        if not 0 <= stage < self.stages:
            raise ModelError(
                f"{self.name}.index({stage}): the ring has STAGES = {self.stages} stages, 0 to "
                f"{self.stages - 1} (stage = step % STAGES)"
            )
        return Bar(self.name, stage)

    def __getitem__(self, stage):
        raise ModelError(f"{self.name}[...]: a stage of the ring is {self.name}.index(stage)")


@dataclass(frozen=True)
class _Box:
    stage: int


class _Bufs:
    def __init__(self, stages: int, block_m: int, block_n: int):
        self.type = types.SimpleNamespace(shape=[stages, block_m, block_n])
        self.stages = stages

    def index(self, stage):
        stage = int(stage)
        if not 0 <= stage < self.stages:
            raise ModelError(f"bufs.index({stage}): the ring has STAGES = {self.stages} stages, 0 to {self.stages - 1}")
        return _Box(stage)

    def __getitem__(self, stage):
        raise ModelError("bufs[...]: a stage of the ring is bufs.index(stage)")


class _Recorder:
    def __init__(self, desc, tiles: int):
        self.desc, self.tiles = desc, tiles
        self.ops: List[Op] = []

    def _add(self, op: Op):
        if len(self.ops) >= MODEL_OPS:
            raise ModelError(
                f"the producer's body made more than {MODEL_OPS} mbarrier and TMA calls for its "
                f"{self.tiles} tiles (the protocol makes 3 per tile): a loop that never ends? One pass of the "
                "loop over t per tile, no loop inside it"
            )
        self.ops.append(op)

    @staticmethod
    def _bar(bar, what: str) -> Bar:
        if isinstance(bar, _Rings):
            raise ModelError(f"{what} takes one barrier, {bar.name}.index(stage), not the whole ring {bar.name}")
        if not isinstance(bar, Bar):
            raise ModelError(f"{what} takes a barrier (ready.index(stage) or empty.index(stage)), got {bar!r}")
        return bar

    # pred=False: the call does nothing, as on the GPU (a predicated-off wait waits for nothing)
    def wait(self, bar, phase, pred=True, deps=()):
        bar = self._bar(bar, "mbarrier.wait")
        if pred:
            self._add(Op("wait", bar, int(phase)))

    def expect(self, bar, bytes_per_cta=None, pred=True):
        bar = self._bar(bar, "mbarrier.expect")
        if pred:
            self._add(Op("expect", bar, int(bytes_per_cta)))

    def arrive(self, bar, *, count=1, pred=True):
        bar = self._bar(bar, "mbarrier.arrive")
        if pred:
            self._add(Op("arrive", bar, int(count)))

    def load(self, desc, coord, barrier, result, pred=True, **_):
        if desc is not self.desc:
            raise ModelError("the TMA load must read src_desc")
        if not isinstance(result, _Box):
            raise ModelError(f"the TMA load's destination is a stage of the ring, bufs.index(stage), got {result!r}")
        coord = tuple(int(c) for c in coord)
        barrier = self._bar(barrier, "the TMA load's barrier")
        if pred:
            self._add(Op("load", barrier, (coord, result.stage)))

    # named as the learner calls them, for a call with wrong arguments ("mbarrier.expect() got an unexpected ...")
    wait.__qualname__, expect.__qualname__, arrive.__qualname__ = "mbarrier.wait", "mbarrier.expect", "mbarrier.arrive"
    load.__qualname__ = "tma_load"


# What the model runs of the producer's body besides the mbarrier and TMA calls it records
MODEL_RUNS = (
    "range, gl.program_id, gl.num_programs, gl.cdiv, gl.static_range, gl.static_assert, gl.static_print and "
    "gl.where / gl.minimum / gl.maximum on scalars"
)


def _cannot_run(name: str):
    """A stand-in for a Gluon function the model cannot run on Python numbers: calling it says so."""

    def call(*args, **kwargs):
        raise ModelError(
            f"the model runs the producer's body as plain Python and cannot run {name}: it runs {MODEL_RUNS}, "
            "and records mbarrier.wait, mbarrier.expect and tma_load; the load loop needs no more (compute the "
            "rest with //, %, & and ^)"
        )

    call.__qualname__ = name
    return call


class _Stand:
    """A module as the model sees it: the functions in `runs`, the module's other values as they are, and each of
    its other functions a stand-in that says the model cannot run it."""

    def __init__(self, module, prefix: str, runs: dict):
        self._module, self._prefix, self._runs = module, prefix, runs

    def __getattr__(self, name):
        if name in self._runs:
            return self._runs[name]
        value = getattr(self._module, name)
        if getattr(value, "__triton_builtin__", False) or (callable(value) and not isinstance(value, type)):
            return _cannot_run(f"{self._prefix}.{name}")
        return value


def _static_assert(where: str):
    def static_assert(cond, msg=""):
        if not cond:
            raise ModelError(
                f"the producer's gl.static_assert failed{': ' + repr(str(msg)) if msg else ''} (in the model, with "
                f"{where}): the compiler stops there too. Assert what holds for every ring and box, or leave it out"
            )

    return static_assert


def _stand_ins(recorder: _Recorder, program: int, config: Config):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    fake_mbarrier = _Stand(
        mbarrier, "mbarrier", dict(wait=recorder.wait, expect=recorder.expect, arrive=recorder.arrive)
    )
    fake_tma = _Stand(tma, "tma", dict(async_copy_global_to_shared=recorder.load, async_load=recorder.load))
    fake_gl = _Stand(
        gl,
        "gl",
        dict(
            program_id=lambda axis=0: program,
            num_programs=lambda axis=0: config.programs,
            cdiv=lambda a, b: -(-int(a) // int(b)),
            static_range=range,
            static_assert=_static_assert(f"STAGES = {config.stages} and boxes of {config.block_m} x {config.block_n}"),
            static_print=lambda *args, **kwargs: None,
            where=lambda condition, x, y: x if condition else y,
            minimum=lambda x, y, propagate_nan=None: min(x, y),
            maximum=lambda x, y, propagate_nan=None: max(x, y),
        ),
    )
    real_loads = {getattr(tma, name, None) for name in ("async_load", "async_copy_global_to_shared")} - {None}
    return {id(gl): fake_gl, id(mbarrier): fake_mbarrier, id(tma): fake_tma}, real_loads


class _Desc(types.SimpleNamespace):
    """The model's src_desc (and its block_type): what the load loop reads of a tensor descriptor. Anything else
    is said to be out of the model's reach, not shown as an AttributeError of a stand-in."""

    def __getattr__(self, name):
        known = ", ".join(k for k in vars(self))
        raise ModelError(
            f"the model's src_desc has {known} (block_type: shape, nbytes, element_ty), not .{name}: the load loop "
            "needs only src_desc.block_type.shape and .nbytes"
        )


def _int_division(a, b, op: str, text: str = ""):
    """`a // b` or `a % b` (`op`; `text`: the producer's expression) as the model runs it. On a GPU, // and % of
    run-time integers round toward zero, as in C; Python's round toward minus infinity. They differ only where one
    operand is negative and the division is not exact: there the model stops and says so, rather than follow
    Python where the GPU would not."""
    result = a // b if op == "//" else a % b
    if isinstance(a, int) and isinstance(b, int) and b and (a < 0) != (b < 0) and a % b:
        quotient = -(abs(a) // abs(b))
        on_gpu = quotient if op == "//" else a - b * quotient
        raise ModelError(
            f"`{text}` is {a} {op} {b}: {result} in Python but {on_gpu} on the GPU, where run-time integers divide "
            "toward zero (as in C): the producer divides a negative number. Divide step itself, which never goes "
            "negative: its round is step // STAGES, its stage step % STAGES"
        )
    return result


class _GpuDivision(ast.NodeTransformer):
    """Every // and % of the producer's body (also //= and %=) as a call of _int_division."""

    OPS = {ast.FloorDiv: "//", ast.Mod: "%"}

    def _call(self, node, op: str):
        """The call that replaces `node` (a BinOp or an AugAssign's value), its operands rewritten first."""
        text = ast.unparse(node)
        self.generic_visit(node)
        left = ast.Name(node.target.id, ast.Load()) if isinstance(node, ast.AugAssign) else node.left
        right = node.value if isinstance(node, ast.AugAssign) else node.right
        args = [left, right, ast.Constant(op), ast.Constant(text)]
        return ast.copy_location(ast.Call(ast.Name("_int_division", ast.Load()), args, []), node)

    def visit_BinOp(self, node):
        op = self.OPS.get(type(node.op))
        return self._call(node, op) if op else self.generic_visit(node)

    def visit_AugAssign(self, node):
        op = self.OPS.get(type(node.op))
        if op is None or not isinstance(node.target, ast.Name):
            return self.generic_visit(node)
        return ast.copy_location(ast.Assign([node.target], self._call(node, op)), node)


def _model_body(kernel, scope: dict):
    """The producer's Python function with the GPU's integer division (`_GpuDivision`), its globals `scope`; its
    own code where its source cannot be rewritten (no source, or variables of an enclosing function)."""
    fn = kernel.fn
    try:
        tree = ast.parse(textwrap.dedent(kernel.src))
    except (AttributeError, TypeError, SyntaxError):
        tree = None
    if tree is None or fn.__closure__ or not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
        return types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    tree.body[0].decorator_list = []
    tree = ast.fix_missing_locations(_GpuDivision().visit(tree))
    scope["_int_division"] = _int_division
    exec(compile(tree, fn.__code__.co_filename, "exec"), scope)  # noqa: S102 - defines the learner's own function
    return scope[tree.body[0].name]


def record(kernel, program: int, config: Config = CONFIGS[0]) -> List[Op]:
    """Run the producer's Python body for one program of the model at `config` with the stand-ins: its waits,
    expects, arrives and loads in order. Raises ModelError for a call the protocol has no place for."""
    from triton.experimental.gluon import language as gl

    fn = kernel.fn
    desc = _Desc(
        block_type=_Desc(shape=[config.block_m, config.block_n], nbytes=config.nbytes, element_ty=gl.float32),
        dtype=gl.float32,
        shape=[config.m, config.n],
    )
    recorder = _Recorder(desc, len(config.tiles(program)))
    by_id, real_loads = _stand_ins(recorder, program, config)
    scope = {}
    for name, value in fn.__globals__.items():
        if id(value) in by_id:
            value = by_id[id(value)]
        elif any(value is load for load in real_loads):
            value = recorder.load
        scope[name] = value
    body = _model_body(kernel, scope)
    ready, empty = _Rings("ready", config.stages), _Rings("empty", config.stages)
    try:
        # a `while` loop that never ends stops here, not the notebook; a print in the body prints nothing here
        with _deadline(MODEL_SECONDS), contextlib.redirect_stdout(io.StringIO()):
            body(desc, _Bufs(config.stages, config.block_m, config.block_n), ready, empty, config.m, config.n)
    except NeverEnds:
        raise ModelError(
            f"the producer's body ran for more than {MODEL_SECONDS:g} s in the model (it takes milliseconds) "
            f"after {len(recorder.ops)} mbarrier and TMA calls, and was stopped: a loop that never ends? A "
            "`while` loop whose condition never changes, or a range far too large"
        ) from None
    return recorder.ops


# --- the protocol, step by step ---------------------------------------------------------------------------


def _steps(ops: List[Op]) -> List[List[Op]]:
    """The ops cut after each load: one list per load, what led to it (what follows the last load is left out)."""
    steps, current = [], []
    for op in ops:
        current.append(op)
        if op.kind == "load":
            steps.append(current)
            current = []
    return steps


def protocol_problem(ops: List[Op], program: int, config: Config = CONFIGS[0]) -> Optional[str]:
    """The first slip in one program's record against the protocol at `config`, named, or None."""
    S, nbytes, programs = config.stages, config.nbytes, config.programs
    tiles = config.tiles(program)
    steps = _steps(ops)
    loads = [step[-1] for step in steps]
    load_at = [j for j, op in enumerate(ops) if op.kind == "load"]
    where = f"program {program} of {programs}"
    if not loads:
        return "the producer issues no TMA load: tma_load(src_desc, [row, col], ready.index(stage), bufs.index(stage))"
    arrivals = [op for op in ops if op.kind == "arrive"]
    if arrivals:
        return (
            f"the producer arrives on {arrivals[0].bar} itself: only the consumer arrives (on empty, when it "
            "has read a stage); ready's phase completes by the expect and the TMA load's bytes"
        )
    if len(loads) != len(tiles):
        return (
            f"{where} issues {len(loads)} TMA loads for its {len(tiles)} tiles: one load per tile, in the loop over t"
        )
    for i, load in enumerate(loads):
        box = load.value[1]
        if load.bar.ring != "ready":
            return (
                f"the TMA load signals {load.bar}: it must signal ready[{box}], the barrier the consumer "
                "waits on before it reads the stage"
            )
        if load.bar.stage != box:
            return (
                f"step {i} loads into bufs[{box}] but signals ready[{load.bar.stage}]: the box and its barrier "
                "are the same stage"
            )
    stages = [load.value[1] for load in loads]
    want = [i % S for i in range(len(loads))]
    if stages != want:
        tile_ids = range(program, program + programs * len(loads), programs)
        if stages == [(i + 1) % S for i in range(len(loads))]:
            return (
                "off by one in the ring: the first load goes to stage 1, but the consumer reads stage 0 first. "
                "stage = step % STAGES with step counting from 0: increment step after the load, not before"
            )
        if len(set(stages)) == 1:
            return (
                f"every load goes to stage {stages[0]}: step never advances (step += 1 after each load), so the "
                "ring has one stage in use"
            )
        if stages == [t % S for t in tile_ids]:
            return (
                "the stage comes from the tile index t, not from the program's step count: with "
                f"{programs} programs, t steps by {programs}, so the stages are used out of order "
                "(the consumer reads stage step % STAGES). Count the loads: stage = step % STAGES, step += 1"
            )
        return (
            f"{where} loads into stages {stages}; the protocol's are {want}: stage = step % STAGES, step "
            "counting the program's loads from 0"
        )
    for i, (step, load) in enumerate(zip(steps, loads)):
        stage, parity = i % S, ((i // S) & 1) ^ 1
        coord, box = load.value
        if coord != tiles[i]:
            return (
                f"step {i} of {where} loads the box at {list(coord)}; its tile is at {list(tiles[i])} "
                "([row, col] in elements)"
            )
        waits = [op for op in step if op.kind == "wait"]
        on_empty = [op for op in waits if op.bar.ring == "empty"]
        # a wait on empty[stage] between this load and the next: the wait comes after the load
        after = ops[load_at[i] + 1 : load_at[i + 1] if i + 1 < len(load_at) else len(ops)]
        later = any(op.kind == "wait" and op.bar == Bar("empty", stage) for op in after)
        if not on_empty and i < S and not later and not [op for op in waits if op.bar.ring == "ready"]:
            pass  # round 0 without a wait: every stage starts empty, so its wait would pass at once anyway
        elif not on_empty:
            if [op for op in waits if op.bar.ring == "ready"]:
                return (
                    f"the producer waits on ready[{stage}], the consumer's barrier: it must wait on empty[stage] "
                    "until the consumer has read the stage, then load"
                )
            if later:
                return (
                    f"the wait on empty[{stage}] comes after the load into it: the load may overwrite a box the "
                    "consumer has not read yet. Wait first, then expect, then load"
                )
            return (
                f"the producer does not wait for stage {stage} to be empty before loading into it: from the "
                "second round on it overwrites boxes the consumer has not read. "
                "mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1) first"
            )
        if on_empty and on_empty[-1].bar.stage != stage:
            return f"step {i} waits on {on_empty[-1].bar} and loads into stage {stage}: wait on empty[{stage}]"
        got = on_empty[-1].value if on_empty else parity
        if got != parity:
            parities = [[op for op in s if op.kind == "wait" and op.bar.ring == "empty"][-1:] for s in steps]
            seen = [p[0].value if p else None for p in parities]
            if seen == [(j // S) & 1 for j in range(len(steps))]:
                return (
                    "the parity of the wait on empty is not flipped: the first wait is for parity 0, a phase a "
                    "fresh barrier has not completed, so the producer waits forever (deadlock) while the consumer "
                    "waits for a box. A fresh barrier counts as having completed the phase before phase 0: "
                    "wait on ((step // STAGES) & 1) ^ 1, so round 0 passes at once"
                )
            if len(set(seen)) == 1:
                return (
                    f"the wait on empty always uses parity {seen[0]}: the parity must alternate with each round "
                    f"of the ring, ((step // STAGES) & 1) ^ 1; step {i} (round {i // S}) waits for parity {got}, "
                    + (
                        "which has passed already, so it refills the stage before the consumer read it"
                        if got == 1
                        else "which never completes: deadlock"
                    )
                )
            return (
                f"step {i} (round {i // S} of the ring) waits on empty[{stage}] for parity {got}, the protocol "
                f"for {parity}: ((step // STAGES) & 1) ^ 1"
            )
        # this step's expects: after its wait, before its load; or, if the load came first, right after it
        waits_at = [j for j, op in enumerate(step) if op.kind == "wait"]
        expects = [op for op in step[waits_at[-1] + 1 if waits_at else 0 :] if op.kind == "expect"]
        if not expects:
            for op in ops[load_at[i] + 1 :]:
                if op.kind in ("wait", "load"):
                    break
                expects += [op] if op.kind == "expect" else []
        if not expects and any(op.kind == "expect" for op in step[: waits_at[-1] if waits_at else 0]):
            return (
                f"the expect on ready[{stage}] comes before the wait on empty[{stage}]: until the consumer has "
                "released the stage, its ready barrier may still be in the last round (the expect would count "
                "toward that one). Order per tile: wait on empty, expect on ready, then the load"
            )
        if not expects:
            return (
                f"no expect on ready[{stage}]: ready's one arrival comes from mbarrier.expect(ready.index(stage), "
                "src_desc.block_type.nbytes), so without it the stage never becomes ready and the consumer waits "
                "forever (deadlock)"
            )
        if expects[0].bar.ring != "ready":
            return (
                f"the expect is on {expects[0].bar}: the bytes are expected on ready[{stage}], the barrier the "
                "TMA load signals"
            )
        if len(expects) > 1:
            return f"step {i} expects on ready[{stage}] {len(expects)} times: once per load"
        if expects[0].value != nbytes:
            return (
                f"the expect counts {expects[0].value} bytes; one box is {nbytes} bytes "
                f"({config.block_m} x {config.block_n} float32): src_desc.block_type.nbytes. "
                + (
                    "Too many: the phase never completes (deadlock)"
                    if expects[0].value > nbytes
                    else "Too few: the count no longer matches the bytes that land, so on a GPU the phase may "
                    "complete before the whole box has landed (the consumer reads a half-written box) or not at all, "
                    "and bytes left over count against the next phase"
                )
            )
    return None


# --- the protocol, played against the consumer --------------------------------------------------------------


@dataclass
class MBarrier:
    """A Hopper mbarrier as the model plays it (initialized with count 1): `arrive` counts an arrival, `bytes`
    adds (expect_tx) or removes (a TMA copy landing) transaction bytes; the current phase completes when no
    arrival and no byte is pending, and the next one starts. `passes(parity)`: a wait for `parity` returns,
    i.e. the last completed phase has that parity; a fresh barrier passes parity 1 (the phase before phase 0)."""

    phase: int = 0  # phases completed
    pending: int = 1  # arrivals still expected in the current phase (init count 1)
    tx: int = 0  # transaction bytes still expected

    def arrive(self, count: int = 1):
        self.pending -= count
        self._complete()

    def bytes(self, n: int):
        self.tx += n
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = 1

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity


@dataclass
class Play:
    """What happened when one program's producer record met the consumer's protocol."""

    reads: List[Tuple[int, int]] = field(default_factory=list)  # the box the consumer read at each step
    overwritten: Optional[str] = None  # the first box overwritten before it was read
    deadlock: Optional[str] = None


def play(ops: List[Op], program: int, config: Config = CONFIGS[0]) -> Play:
    """Run the producer's record against the consumer (wait ready[s] on (step // STAGES) & 1, read, arrive on
    empty[s]), the producer first whenever it can go on (the order that shows an early refill)."""
    S, nbytes = config.stages, config.nbytes
    tiles = config.tiles(program)
    bars = {Bar(ring, s): MBarrier() for ring in ("ready", "empty") for s in range(S)}
    boxes: List[Optional[Tuple[int, int]]] = [None] * S
    unread = [False] * S
    out = Play()
    p = c = 0  # next producer op, next consumer step
    while p < len(ops) or c < len(tiles):
        if p < len(ops):
            op = ops[p]
            if op.kind != "wait" or bars[op.bar].passes(op.value):
                if op.kind == "expect":
                    bars[op.bar].bytes(op.value)  # arrive.expect_tx: the bytes first, then the arrival
                    bars[op.bar].arrive()
                elif op.kind == "arrive":
                    bars[op.bar].arrive(op.value)
                elif op.kind == "load":
                    coord, stage = op.value
                    if unread[stage] and out.overwritten is None:
                        out.overwritten = (
                            f"box {list(boxes[stage])} in stage {stage} was overwritten by box "
                            f"{list(coord)} before the consumer read it"
                        )
                    boxes[stage], unread[stage] = coord, True
                    bars[op.bar].bytes(-nbytes)
                p += 1
                continue
        if c < len(tiles):
            stage = c % S
            if bars[Bar("ready", stage)].passes((c // S) & 1):
                out.reads.append(boxes[stage])
                unread[stage] = False
                bars[Bar("empty", stage)].arrive()
                c += 1
                continue
        blocked = []
        if p < len(ops):
            blocked.append(f"the producer waits on {ops[p].bar} for parity {ops[p].value}")
        if c < len(tiles):
            blocked.append(f"the consumer, at step {c}, waits on ready[{c % S}] for parity {(c // S) & 1}")
        out.deadlock = " and ".join(blocked) + ", and neither can go on"
        return out
    return out


def _problem_at(kernel, config: Config) -> Optional[str]:
    """The model's verdict at one size: None, or the slip (named) and what it does to the copy."""
    for program in range(config.programs):
        try:
            ops = record(kernel, program, config)
        except ModelError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - the learner's Python body may raise anything
            error = f"{type(exc).__name__}: {exc}"
            if "_semantic" in str(exc):  # a Gluon builtin called on Python numbers, not "forget @gluon.jit"
                error = "a Gluon function it calls works only while the kernel compiles"
            elif "outside of the scope of a kernel" in str(exc):  # the learner's own @gluon.jit helper
                error = (
                    "it calls a @gluon.jit function of its own, which runs only inside a kernel: write that code "
                    "in the producer itself (the checker also compiles the producer alone)"
                )
            return (
                f"the model could not run the producer's body: {error}. The model runs {MODEL_RUNS}, and records "
                "mbarrier.wait, mbarrier.expect and tma_load; the load loop needs no more"
            )
        tiles = config.tiles(program)
        named = protocol_problem(ops, program, config)
        outcome = play(ops, program, config)
        effects = []
        if outcome.overwritten:
            effects.append(f"race in the model: {outcome.overwritten}")
        if outcome.deadlock:
            effects.append(f"deadlock in the model: {outcome.deadlock}")
        elif outcome.reads != tiles:
            step = next(i for i, (a, b) in enumerate(zip(outcome.reads, tiles)) if a != b)
            effects.append(
                f"in the model the consumer's step {step} reads box {list(outcome.reads[step] or [])}, "
                f"not {list(tiles[step])}"
            )
        if named or effects:
            return "; ".join([named] * bool(named) + effects) + (
                f" (model: {config.programs} programs, STAGES = {config.stages}, {len(tiles)} tiles each)"
            )
    return None


def model_problem(kernel) -> Optional[str]:
    """The model's verdict on the producer: None, or the slip (named) and what it does to the copy, at the first
    size of CONFIGS where there is one (past the first: "right with ..., but not with ...")."""
    first, *others = CONFIGS
    problem = _problem_at(kernel, first)
    for config in others:
        if problem is not None:
            break
        problem = at_other_sizes(
            _problem_at(kernel, config),
            str(first),
            str(config),
            "look for a number written into the producer: STAGES is bufs.type.shape[0], one box's bytes "
            "src_desc.block_type.nbytes, and the parity ((step // STAGES) & 1) ^ 1 alternates every round",
        )
    return problem


# --- compiled for sm_90, run on a GPU: in a child process ----------------------------------------------------


def _child(kernel, mode: str, seconds: float) -> dict:
    """Compile (mode "compile") or run ("run") ws_copy_kernel with this producer in a process of its own."""
    source = PRODUCER_HEADER + "\n@gluon.jit\n" + textwrap.dedent(kernel.src)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "producer.py")
        with open(path, "w") as f:
            f.write(source)
        env = dict(os.environ, TRITON_INTERPRET="0")
        command = [sys.executable, "-m", "moe_lab.workbook.exercises.ws_copy_kernels", mode, path, kernel.__name__]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=seconds, env=env)
        except subprocess.TimeoutExpired:
            return {"timeout": seconds}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        return {"error": f"the child process ended with code {proc.returncode}: {tail[-800:]}"}
    result = json.loads(lines[-1][len("RESULT ") :])
    said = re.search(r"producer\.py:(\d+):\d+: error: (.+)", proc.stderr or "")
    if result.get("error") and not result.get("where") and said:  # MLIR's diagnostic, on stderr only
        line = int(said.group(1)) - source.count("\n", 0, source.index("\ndef ") + 1)
        text = kernel.src.splitlines()[line - 1].strip() if 0 < line <= len(kernel.src.splitlines()) else ""
        result.update(where=f"`{text}` (line {line} of {kernel.__name__}, its def line 1)", cause=said.group(2))
    return result


BUILTIN_ADVICE = {
    "divmod": "Gluon kernels cannot call Python's divmod: use // and %",
    "print": 'print in a kernel prints on the device and takes a string first: gl.device_print("stage", stage)',
}


def _error_problem(compiled: dict) -> str:
    """The compile error as the learner needs it: the producer's line where it failed (once) and why."""
    error, where, cause, builtin = (compiled.get(key) for key in ("error", "where", "cause", "builtin"))
    if where is None:  # no line in the producer (the entry kernel's, a ptxas error): the compiler's own words
        if "NameError" in error or "is not defined" in error:
            return (
                f"compiling the producer failed: {error}. The checker compiles the producer alone, with gluon, gl, "
                "mbarrier, tma and tma_load: keep everything else it needs inside it"
            )
        return f"compiling the producer for sm_90 failed: {error}"
    if builtin:
        advice = BUILTIN_ADVICE.get(builtin, f"{builtin} is a Python builtin Gluon does not run inside a kernel")
        return f"compiling the producer for sm_90 failed at {where}: {advice} ({cause})"
    if cause.startswith("NameError"):
        return (
            f"compiling the producer failed at {where}: {cause}. The checker compiles the producer alone, with "
            "gluon, gl, mbarrier, tma and tma_load: keep everything else it needs inside it"
        )
    return f"compiling the producer for sm_90 failed at {where}: {cause}"


def _is_gluon(kernel) -> bool:
    return type(kernel).__name__ == "GluonJITFunction"


def _not_gluon(kernel) -> str:
    """What was handed over instead of a @gluon.jit function, and what to do."""
    launched = _launched_kernel(kernel)
    if kernel is None:
        got = "None: run the cell that defines the producer first"
    elif launched is not None:
        name = getattr(launched, "__name__", "kernel")
        got = f"{name}[grid], a launch: pass the function itself ({name}); the entry kernel runs it"
    elif hasattr(kernel, "arg_names"):  # a @triton.jit function
        got = f"{getattr(kernel, '__name__', 'a kernel')}, a @triton.jit function, which Gluon cannot call"
    elif getattr(kernel, "__name__", "") == "<lambda>":
        got = "a lambda: write the producer as a function under @gluon.jit"
    elif callable(kernel):
        got = f"{getattr(kernel, '__name__', type(kernel).__name__)}, a plain Python function: decorate it"
    else:
        got = described(kernel)
    return (
        f"expected a @gluon.jit function (the producer partition), got {got} "
        "(from triton.experimental import gluon; @gluon.jit)"
    )


def check_ws_copy(kernel, strict: bool = False, gpu: Optional[bool] = None) -> Verdict:
    """Grade the producer `copy_load_partition(src_desc, bufs, ready, empty, M, N)` (a `@gluon.jit` function) of
    `ws_copy_kernels.ws_copy_kernel`: the protocol model at the three sizes of CONFIGS (those of the GPU run: 2, 5
    and 7 programs, 3, 2 and 4 stages, boxes of 16 x 32, 32 x 32 and 64 x 32 float32, 2 to 19 rounds of the ring; the
    producer's Python body stopped after MODEL_SECONDS or MODEL_OPS calls), then the kernel compiled for sm_90 in a
    child process (TTGIR: a warp_specialize region; PTX: mbarrier waits, TMA copies), then, on a Hopper GPU (`gpu`,
    default: an sm_90 device is present), the copy run in a child process with a limit of GPU_SECONDS and compared bit
    for bit at the three sizes of `ws_copy_kernels.CASES`. Named slips: no wait on empty, a wait on ready, the wait
    after the load, the parity not flipped (deadlock), a constant parity, no expect (deadlock), the expect on empty, the
    wrong byte count, the box and its barrier in different stages, the load signalling empty, the stage from the tile
    index, step never advancing, step off by one, a stage out of the ring, the producer arriving itself, one load per
    tile, a loop that never ends, a signature of other than six parameters, something other than a @gluon.jit function
    (None, a @triton.jit kernel, kernel[grid], a plain function), a // or % of a negative number (the GPU rounds it
    toward zero, Python's body in the model toward minus infinity). Anything else the model finds is reported as the
    deadlock or race it causes. TypeError for a strict or gpu that is not a bool; ValueError for gpu=True where
    there is no Hopper GPU."""
    if not _is_gluon(kernel):
        raise KernelMismatch(_not_gluon(kernel))
    check_bool("strict", strict)
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    if gpu is None:
        gpu = hopper
    elif check_bool("gpu", gpu) and not hopper:
        raise ValueError("gpu=True runs the copy on a Hopper GPU (sm_90), and there is none here: leave gpu=None")
    label = EXERCISE  # the exercise, as every checker labels its verdict (not the function's name)
    if len(kernel.arg_names) != len(PARAMETERS):
        return report(
            label,
            f"the producer takes ({', '.join(kernel.arg_names)}); the entry kernel passes it "
            f"({', '.join(PARAMETERS)}), in that order",
            "",
            strict,
        )
    problem = model_problem(kernel)
    if problem:
        return report(label, problem, "", strict)
    compiled = _child(kernel, "compile", COMPILE_SECONDS)
    if compiled.get("timeout"):
        return report(label, f"compiling for sm_90 took more than {COMPILE_SECONDS} s", "", strict)
    if compiled.get("error"):
        return report(label, _error_problem(compiled), "", strict)
    if not (compiled["warp_specialize"] and compiled["mbarrier_waits"] and compiled["tma_loads"]):
        return report(label, f"compiled for sm_90, but its code lacks a piece of the protocol: {compiled}", "", strict)
    passed = (
        "the protocol is right in the model at three sizes (2, 5 and 7 programs, STAGES = 3, 2 and 4, boxes of "
        f"16 x 32, 32 x 32 and 64 x 32, up to {max(c.rounds for c in CONFIGS)} rounds of the ring), and the kernel "
        "compiles for sm_90: a warp_specialize region in its TTGIR; in its PTX "
        f"mbarrier.try_wait x {compiled['mbarrier_waits']}, cp.async.bulk.tensor x {compiled['tma_loads']}"
    )
    if not gpu:
        return report(label, None, passed + " (no Hopper GPU here: not run)", strict)
    ran = _child(kernel, "run", GPU_SECONDS)
    if ran.get("timeout"):
        return report(
            label,
            f"on the GPU the copy did not finish within {GPU_SECONDS} s and was stopped: a wait "
            "that never passes (a deadlock) the model did not see",
            "",
            strict,
        )
    if ran.get("error"):
        return report(label, f"on the GPU: {ran['error']}", "", strict)
    if ran["wrong"]:
        m, n, bm, bn, stages, programs = ran["case"]
        return report(
            label,
            f"on the GPU the copy of {m} x {n} (boxes {bm} x {bn}, {stages} stages, {programs} "
            f"programs) has {ran['wrong']} wrong values ({ran['unwritten']} unwritten), the first at "
            f"{ran['first']}",
            "",
            strict,
        )
    return report(label, None, passed + "; on the GPU the copy is bitwise right at three sizes", strict)
