"""The decisions of a grouped matmul call, in one place: each returns an immutable plan, launches nothing.

    select_load_path  each operand's load path (TMA or pointers), with the reason
    plan_gemm         the config as launched (fitted to the scale blocks and the device's shared memory,
                      folds and the persistent kernel where they apply), the kernel, its grid and its
                      constexprs (`LaunchPlan.constexprs`: every variant a launch can compile)

    layer_key         what a `fused_moe` call's plan and input checks depend on, as a hashable LayerKey
    plan_layer        a LayerPlan from a LayerKey: per chunk, the config, the schedule's kind and both
                      GEMMs' LaunchPlans; `fused_moe` keeps it by key (`cached_layer_plan`)

The config itself is chosen in `moe_lab.tuned.choose_config` (tuned table, heuristic or the user's); the
device's facts come from `moe_lab.capability`. A plan depends only on its inputs' shapes, dtypes, strides
and alignment, the device, the config and `use_tma`. `moe_lab.gemm.grouped_matmul` checks its arguments,
plans and launches; `moe_lab.layer.fused_moe` checks a call of a new key, plans it once, and runs every call
of that key from its LayerPlan unchecked (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import threading
from dataclasses import dataclass, field, replace
from typing import Dict, Hashable, Mapping, NamedTuple, Optional, Tuple, Union

import torch

from ._ints import cdiv
from ._kernels.grouped_matmul import _tile_coords
from ._launch import LaunchSite, current_stream
from ._validate import check_bool, check_positive_int, is_bool, type_name
from .align import AlignedRouting, max_num_tokens_padded, slot_order_applies
from .capability import (
    assumed_facts,
    descriptor_problem,
    env_setting,
    gluon_fp8_support,
    multiprocessor_count,
    shared_memory_budget,
    tma_support,
)
from .configs import ConfigLike, GemmConfig, MoEConfig, fit_to_shared_memory, full_precision_fp32
from .expert_kind import SILU, Activation
from .quantize import FP8_DTYPE, MIN_FP8_DOT_K, check_block_shape
from .runtime import interpreter_active, keeps_buffers
from .tuned import ConfigChoice, choose_config

log = logging.getLogger(__name__)
_logged_fallbacks: set = set()

UseTma = Union[bool, str]
# Programs of a persistent launch under the interpreter (no SMs to count): enough to make each walk tiles.
INTERPRETER_PROGRAMS = 3
# use_tma is True, False or "auto" everywhere in Python; where only words will do (the command line),
# these are the words, mapped in this one place.
USE_TMA_WORDS = {"auto": "auto", "on": True, "off": False}


@dataclass(frozen=True)
class LoadPath:
    """How one grouped matmul loads its operands, and why."""

    a_tma: bool
    w_tma: bool
    reason: str

    @property
    def name(self) -> str:
        """Short form for tables, e.g. "a:ptr w:tma"."""
        return f"a:{'tma' if self.a_tma else 'ptr'} w:{'tma' if self.w_tma else 'ptr'}"

    @property
    def choice(self) -> str:
        """The reason without the device's note on TMA (its trailing " [...]"), for a table that gives it once."""
        return self.reason.partition(" [")[0]

    @property
    def device_note(self) -> str:
        """The device's note on TMA at the reason's end ("" where there is none)."""
        return self.reason.partition(" [")[2].removesuffix("]")


def gate_up_halves(swiglu: bool, activation: Activation) -> bool:
    """Whether a GEMM with the SwiGLU epilogue (`swiglu`) of `activation` reads gate and up rows as halves of w
    (the weight descriptor's [E, 2, I, K] view, `select_load_path(swiglu=True)`); interleaved gate and up rows
    are read as rows in a row, as the plain GEMM reads them. The kernels' own rule, from the activation's
    name: `moe_lab._kernels.common.gate_up_halves`."""
    return swiglu and not activation.interleaved


@dataclass(frozen=True)
class LaunchPlan:
    """What one `grouped_matmul` call launches, decided once (`plan_gemm`) and launched as is.

    config: the GemmConfig as launched: the one asked for, with num_stages lowered where the device's
        shared memory (or the compiler) needed it.
    path: each operand's load path and why (`select_load_path`).
    gather_a: the kernel gathers token rows itself (the up projection).
    scatter: output rows go to their (token, k) slot. swiglu: the epilogue applies the gated activation
    `activation` (SiLU-and-mul by default), each program reading BLOCK_SIZE_N/2 gate rows and the matching
    BLOCK_SIZE_N/2 up rows of w (in halves, or BLOCK_SIZE_N interleaved rows in a row: `activation`'s layout).
    grid: programs launched (M-blocks x N-tiles, or with `persistent` one per SM at most).
    persistent: `grouped_matmul_persistent_kernel` walks the tiles (config.persistent); tail tiles are off.
    fold_m (property): config.fold_tail_rows, which the plan sets to 0 where folds do not apply (the
    persistent kernel, slot order, float8): an expert's last block of at most that many valid rows is
    computed by the block before.
    scales: "none", or for float8 operands where their scales enter: "outer" (per tensor, channel or token:
    once, on the float32 sum) or "block" (block_shape: at every K step; config.BLOCK_SIZE_K divides the
    block's K, or is a multiple of it: see dots_per_step). w_scale_per_tile: with block scales, a program's
    weight rows (each half's, with swiglu) lie in one scale block, so each dot reads one weight scale
    (per half) rather than one per column. dots_per_step: with block scales and a BLOCK_SIZE_K of several
    scale blocks, each K step loads and scales them one block at a time (that many dots, load boxes of
    BLOCK_SIZE_K / dots_per_step channels): larger loads per step where one scale block's are small
    (FP8 decode streams 128-byte rows per block).
    out_quant_group: the epilogue writes float8 with one scale per row per this many columns (0: the output
    dtype as is). scale_group_k: the scale blocks' K (block scales; 1 otherwise). even_k: K is a multiple of
    BLOCK_SIZE_K (no K mask). dot: "mma" (tensor cores), "ieee" (float32 at full precision,
    `moe_lab.configs.full_precision_fp32`) or "interpreter" (Triton's interpreter: exact products)."""

    config: GemmConfig
    path: LoadPath
    gather_a: bool
    scatter: bool
    grid: int
    swiglu: bool = False
    persistent: bool = False
    scales: str = "none"
    out_quant_group: int = 0
    w_scale_per_tile: bool = False
    dots_per_step: int = 1
    scale_group_k: int = 1
    even_k: bool = True
    dot: str = "mma"
    activation: Activation = SILU

    @property
    def gate_up_halves(self) -> bool:
        """The SwiGLU epilogue reads gate and up rows as halves of w: the weight descriptor views w as
        [E, 2, I, K] (`weight_box`)."""
        return gate_up_halves(self.swiglu, self.activation)

    @property
    def fold_m(self) -> int:
        """Rows of an expert's last block folded into the block before (config.fold_tail_rows, 0 where the
        plan turned it off)."""
        return self.config.fold_tail_rows

    @property
    def box_k(self) -> int:
        """K channels of each load (a tensor descriptor's box) and dot."""
        return self.config.BLOCK_SIZE_K // self.dots_per_step

    @property
    def tile_n(self) -> int:
        """Output columns per program: BLOCK_SIZE_N, or half of it with the SwiGLU epilogue."""
        return self.config.BLOCK_SIZE_N // 2 if self.swiglu else self.config.BLOCK_SIZE_N

    @functools.cached_property
    def constexprs(self) -> dict:
        """The kernel's constexpr arguments (moe_lab/_kernels/grouped_matmul.py), and Triton's num_warps and
        num_stages: with `persistent` those of `grouped_matmul_persistent_kernel`, else of
        `grouped_matmul_kernel` (which also takes TAIL_SPLITS and FOLD_M). Made once per plan: read it, do
        not change it."""
        config = self.config
        args = dict(
            ROWS="gather" if self.gather_a else "scatter" if self.scatter else "sorted",
            SWIGLU=self.activation.kernel_name if self.swiglu else "none",
            SCALES="block_tile" if self.w_scale_per_tile else self.scales,
            SCALE_GROUP_K=self.scale_group_k,
            EVEN_K=self.even_k,
            DOT=self.dot,
        )
        if not self.persistent:
            args.update(TAIL_SPLITS=config.tail_splits, FOLD_M=self.fold_m)
        return dict(
            args,
            BLOCK_SIZE_M=config.BLOCK_SIZE_M,
            BLOCK_SIZE_N=config.BLOCK_SIZE_N,
            BLOCK_SIZE_K=config.BLOCK_SIZE_K,
            GROUP_SIZE_M=config.GROUP_SIZE_M,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )


def check_use_tma(use_tma: UseTma) -> None:
    """Raise ValueError unless use_tma is the bool True or False or the string "auto" (not 0, 1, ...)."""
    if not (isinstance(use_tma, bool) or (isinstance(use_tma, str) and use_tma == "auto")):
        raise ValueError(f"use_tma must be True, False or 'auto', got {use_tma!r}")


def select_load_path(
    a: torch.Tensor,
    w: torch.Tensor,
    config: GemmConfig,
    *,
    gather_a: bool,
    use_tma: UseTma = "auto",
    swiglu: bool = False,
    w_name: str = "w",
) -> LoadPath:
    """Decide the load path of each operand: does this call use TMA (`moe_lab.capability` answers the
    other question, whether this device and Triton can). Precedence, first match wins:
    1. `use_tma=False`: pointer loads. 2. `use_tma="auto"` with `config.tma=False` (the tuner found
    pointer loads faster for this shape): pointer loads. 3. `MOE_LAB_TMA=0`, or a device/Triton without TMA:
    pointer loads (and ValueError with `use_tma=True`). 4. Per operand, TMA where its tensor meets the
    descriptor rules; elsewhere pointer loads with the broken rule as the reason, or ValueError with
    `use_tma=True` (for w, and for a sorted-layout a). With `swiglu` (the SwiGLU epilogue, gate and up rows
    as halves of w) the weights are read as [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, BLOCK_SIZE_K]: gate
    and up rows in one tile (interleaved gate and up rows are plain rows: swiglu=False here). (With
    block scales a step of several scale blocks loads boxes of one block's K, `LaunchPlan.box_k`: valid
    wherever BLOCK_SIZE_K's are, the inner box staying >= 16 bytes.) `w_name`: w's name in the error
    (`fused_moe`'s w1 or w2; the reasons say w). Raises TypeError for a gather_a or swiglu that is not a bool."""
    check_bool("gather_a", gather_a)
    check_bool("swiglu", swiglu)
    check_use_tma(use_tma)
    if use_tma is False:
        return LoadPath(False, False, "use_tma=False")
    if use_tma == "auto" and not config.tma:
        return LoadPath(False, False, "the config for this shape prefers pointer loads (config.tma=False)")
    support = tma_support(w.device)
    if not support.available:
        if use_tma is True:
            raise ValueError(f"use_tma=True but TMA cannot be used here: {support.reason}")
        return LoadPath(False, False, f"no TMA: {support.reason}")
    reasons = []
    w_view, w_box = weight_box(w, config.BLOCK_SIZE_N, swiglu, config.BLOCK_SIZE_K)
    w_problem = descriptor_problem(w_view, w_box)
    if w_problem and use_tma is True:
        viewed = f", viewed as [E, 2, I, K] {tuple(w_view.shape)} for the SwiGLU epilogue," if swiglu else ""
        raise ValueError(
            f"use_tma=True but {w_name} {tuple(w.shape)} ({w.dtype}){viewed} cannot be read through a tensor "
            f"descriptor: {w_problem}"
        )
    if w_problem and swiglu:
        w_problem = f"the SwiGLU epilogue's 4-D view of w: {w_problem}"  # no " [": LoadPath.choice cuts there
    reasons.append(f"w: {'pointer (' + w_problem + ')' if w_problem else 'tma'}")
    if gather_a:
        a_problem = "gathered token rows: TMA gather needs Blackwell"
    else:
        a_problem = descriptor_problem(a, [config.BLOCK_SIZE_M, config.BLOCK_SIZE_K])
        if a_problem and use_tma is True:
            raise ValueError(
                f"use_tma=True but a {tuple(a.shape)} ({a.dtype}) cannot be read through a "
                f"tensor descriptor: {a_problem}"
            )
    reasons.append(f"a: {'pointer (' + a_problem + ')' if a_problem else 'tma'}")
    path = LoadPath(not a_problem, not w_problem, "; ".join(reasons) + f" [{support.reason}]")
    fallback = (w_problem, None if gather_a else a_problem)
    if any(fallback) and fallback not in _logged_fallbacks:
        _logged_fallbacks.add(fallback)
        log.debug("grouped_matmul falls back to pointer loads: %s", path.reason)
    return path


def plan_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    routing: AlignedRouting,
    config: GemmConfig,
    *,
    gather_a: bool,
    scatter: bool = False,
    swiglu: bool = False,
    use_tma: UseTma = "auto",
    scales=None,
    out_quant_group: int = 0,
    activation: Activation = SILU,
    w_name: str = "w",
) -> LaunchPlan:
    """The LaunchPlan of a `grouped_matmul` call with these arguments, checked by the caller: the config
    fitted to the device's shared memory (and, with block scales, BLOCK_SIZE_K to the scale block), the
    load paths, the kernel and its grid. `a` may be a meta tensor of the operand's shape, dtype and strides
    (a buffer not made yet, 16-byte aligned); the device is w's. `routing`: the AlignedRouting, or its
    `ScheduleShape` (the two facts read of it) where the schedule is not made yet. `scales`: None for float
    operands, else the float8 scales' layout (`mode`, `group_n`, `group_k`, as `moe_lab.gemm.Fp8Scales` or
    `ScaleLayout` holds them).
    `activation`: the SwiGLU epilogue's (`moe_lab.Activation`; only read with swiglu). `w_name`: w's name in
    the error. Launches nothing. Callers get the plan with `grouped_matmul(..., return_plan=True)`."""
    halves = gate_up_halves(swiglu, activation)
    if not routing.expert_sorted and config.persistent:  # its blocks may name no expert: skipped per program
        config = replace(config, persistent=False)
    if scales is not None and config.BLOCK_SIZE_K < MIN_FP8_DOT_K:
        config = replace(config, BLOCK_SIZE_K=MIN_FP8_DOT_K)
    dots_per_step = 1
    if scales is not None and scales.mode == "block":
        if config.BLOCK_SIZE_K > scales.group_k and config.BLOCK_SIZE_K % scales.group_k == 0:
            dots_per_step = config.BLOCK_SIZE_K // scales.group_k  # a step of whole scale blocks, one dot each
        elif scales.group_k % config.BLOCK_SIZE_K:
            # each dot must lie in one scale block: the largest power of two dividing block_k (>= 32)
            config = replace(config, BLOCK_SIZE_K=min(config.BLOCK_SIZE_K, scales.group_k & -scales.group_k))
    # Folded tails need blocks of one expert in a row (expert-sorted) and a program per tile to skip; off
    # before the shared-memory fit, which would count their rows.
    if config.fold_tail_rows and (not routing.expert_sorted or config.persistent or scales is not None):
        config = replace(config, fold_tail_rows=0)
    budget = shared_memory_budget(w.device)
    if budget is not None:  # a config tuned on a bigger GPU must not crash this one
        config = fit_to_shared_memory(config, w.element_size(), budget)
    # With the SwiGLU epilogue a program covers BLOCK_SIZE_N/2 of the I output columns: the same grid.
    grid = tile_grid(routing.max_num_m_blocks, w.shape[1], config.BLOCK_SIZE_N)
    if config.persistent and grid:
        grid = min(grid, INTERPRETER_PROGRAMS if interpreter_active() else multiprocessor_count(w.device))
    if grid == 0:
        path = LoadPath(False, False, "nothing to launch (no rows or no columns)")
    else:
        path = select_load_path(a, w, config, gather_a=gather_a, use_tma=use_tma, swiglu=halves, w_name=w_name)
    # A program's weight rows (each half's, with SwiGLU in halves) start at a multiple of their count, so they
    # lie in one scale block when block_n is a multiple of that count (and, for the up half, I too). Not with
    # K = 0: that loop loads the first step's scales before it starts, and there are no K groups.
    tile_rows = config.BLOCK_SIZE_N // 2 if halves else config.BLOCK_SIZE_N
    w_scale_per_tile = (
        scales is not None
        and scales.mode == "block"
        and scales.group_n % tile_rows == 0
        and (not halves or (w.shape[1] // 2) % tile_rows == 0)
        and w.shape[2] > 0
    )
    dot = "interpreter" if interpreter_active() else "ieee" if full_precision_fp32(w.dtype) else "mma"
    return LaunchPlan(
        config,
        path,
        gather_a,
        scatter,
        grid,
        swiglu,
        config.persistent,
        scales.mode if scales is not None else "none",
        out_quant_group,
        w_scale_per_tile,
        dots_per_step,
        scales.group_k if scales is not None else 1,
        w.shape[2] % config.BLOCK_SIZE_K == 0,
        dot,
        activation if swiglu else SILU,
    )


def tile_grid(num_m_blocks: int, n: int, block_size_n: int) -> int:
    """Tiles of a grouped matmul, the programs of its per-tile launch: one per M-block and BLOCK_SIZE_N of
    w's N rows (0 without rows)."""
    return num_m_blocks * cdiv(n, block_size_n)


def tile_of_program(pid: int, num_m_blocks: int, num_pid_n: int, group_size_m: int) -> Tuple[int, int]:
    """(pid_m, pid_n) of tile `pid` (a per-tile launch's program id) in GROUP_SIZE_M ordering: the grouped
    matmul kernels' own `_tile_coords`, run on the host (the workbook's checkers and pictures read it)."""
    return _tile_coords.fn(pid, num_m_blocks, num_pid_n, group_size_m)


def weight_box(w: torch.Tensor, block_size_n: int, swiglu: bool, box_k: int):
    """The view of w that the weight descriptor covers, and its block shape: [E, N, K] in boxes of
    [1, BLOCK_SIZE_N, box_k]; with `swiglu` (the SwiGLU epilogue with gate and up in halves,
    `LaunchPlan.gate_up_halves`) [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, box_k],
    whose two halves are a gate tile and the matching up tile. box_k: BLOCK_SIZE_K, or one dot's K where a
    K step runs several (`LaunchPlan.box_k`); validity does not depend on it (the inner box stays >= 16 bytes)."""
    if swiglu:
        return w.unflatten(1, (2, w.shape[1] // 2)), [1, 2, block_size_n // 2, box_k]
    return w, [1, block_size_n, box_k]


# --- The layer: one plan per call's key, cached. ---


class ScaleLayout(NamedTuple):
    """What a plan reads of float8 scales (`moe_lab.gemm.Fp8Scales` holds the same three with the tensors):
    "outer" (per tensor, channel or token) or "block" (block_shape [group_n, group_k])."""

    mode: str
    group_n: int = 1
    group_k: int = 1


class ScheduleShape(NamedTuple):
    """What a plan reads of a schedule (an `AlignedRouting` has both): whether its blocks are expert-sorted
    (False: one token's slots in order) and its number of M-blocks (the grid's rows)."""

    expert_sorted: bool
    max_num_m_blocks: int


def tensor_facts(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """What a layer plan and the layer's input checks read of a tensor: (shape, strides, dtype, device,
    requires_grad, data_ptr % 16, is_neg); None for None. Raises AttributeError/TypeError for what is not a
    tensor."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() % 16, t.is_neg())


def _frozen(value):
    """`value` as a hashable key, types kept (so that 1 and True, which compare equal, stay apart)."""
    if isinstance(value, Mapping):
        return ("dict", tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    try:
        hash(value)
    except TypeError:  # e.g. a 0-d numpy array, which an int field takes: its type and repr are its key
        return (type(value), "repr", repr(value))
    return (type(value), value)


class LayerKey(NamedTuple):
    """Everything a `fused_moe` call's plan (`plan_layer`) and its cached input checks depend on, hashable.
    Tensors enter as `tensor_facts`: shape (T, and every size the checks and plans read), strides (the
    descriptor rules, slot order), dtype, device (tuned table, TMA and FP8 support, shared memory, SMs),
    requires_grad (the inference-only check), data_ptr % 16 (the descriptor's base alignment) and the
    negation bit (refused); `scales` holds w1_scale, w2_scale, a1_scale, a2_scale so. `config` is `config`
    frozen (a dict's keys and values, types kept); use_tma, chunk_size and block_shape as checked;
    grad_enabled is torch.is_grad_enabled(); fp32_precision is torch.get_float32_matmul_precision() for float32
    inputs ("" else: the dot of float32 operands and their heuristic config follow it). Not in the key, read
    when a plan is made: the tuned tables (`moe_lab.tuned.clear_cache` clears the plans too), and the
    environment (TRITON_INTERPRET, MOE_LAB_TMA): call `clear_layer_plans()` after changing either in a running
    process.
    The expert kind: `activation` (a `moe_lab.Activation`, as checked) and `expert_tensors`, the
    `tensor_facts` of w1_bias, w2_bias, shared_w1, shared_w2 and shared_weights (their checks are cached)."""

    hidden_states: tuple
    w1: tuple
    w2: tuple
    topk_weights: tuple
    topk_ids: tuple
    expert_map: Optional[tuple]
    out: Optional[tuple]
    scales: tuple
    block_shape: Optional[tuple]
    config: Hashable
    use_tma: UseTma
    chunk_size: Optional[int]
    grad_enabled: bool
    fp32_precision: str
    activation: Activation = SILU
    expert_tensors: tuple = (None,) * 5


def layer_key(
    hidden_states,
    w1,
    w2,
    topk_weights,
    topk_ids,
    *,
    expert_map=None,
    out=None,
    scales=(None, None, None, None),
    block_shape=None,
    config=None,
    use_tma: UseTma = "auto",
    chunk_size: Optional[int] = None,
    activation: Activation = SILU,
    expert_tensors=(None,) * 5,
) -> Optional[LayerKey]:
    """The `LayerKey` of a `fused_moe` call, or None where an argument cannot be part of a key (not a
    tensor, an unhashable config value): such a call is checked and planned without the cache (and its
    checks then say what is wrong). `use_tma`, `chunk_size`, `block_shape` and `activation` as checked;
    `expert_tensors`: the biases and shared experts' tensors (None where not given)."""
    try:
        return LayerKey(
            tensor_facts(hidden_states),
            tensor_facts(w1),
            tensor_facts(w2),
            tensor_facts(topk_weights),
            tensor_facts(topk_ids),
            tensor_facts(expert_map),
            tensor_facts(out),
            tuple(map(tensor_facts, scales)),
            block_shape,
            config if config is None or isinstance(config, (GemmConfig, MoEConfig)) else _frozen(config),
            use_tma,
            chunk_size,
            torch.is_grad_enabled(),
            torch.get_float32_matmul_precision() if hidden_states.dtype == torch.float32 else "",
            activation,
            tuple(map(tensor_facts, expert_tensors)),
        )
    except (AttributeError, TypeError, RuntimeError):  # (RuntimeError: a tensor without storage, e.g. sparse)
        return None


@dataclass(frozen=True)
class ChunkPlan:
    """The stages of `fused_moe` over one chunk of `num_tokens` tokens.

    choice: the MoEConfig and where it came from (`moe_lab.tuned.choose_config`).
    slot_order: one token's slots in order, no align launch (`moe_lab.align.slot_order_routing`; the align
        runs where its rows cannot be made, during a CUDA-graph capture).
    up, down: each GEMM's LaunchPlan (`plan_gemm`); None where there is nothing to launch (T = 0, H = 0).
    rows: the schedule's padded rows (max_num_tokens_padded), act_cols and act_dtype: the up GEMM's output
        [rows, act_cols] (I with the SwiGLU epilogue, else 2I; float8 where its epilogue quantizes, float32
        for float8 weights otherwise), the Gluon up GEMM's where it runs.
    out_scale_cols: where the up GEMM's epilogue quantizes its output to float8, its scales per row
        (ceil(I / block_k)); 0 otherwise.
    gluon: where `gluon_applies` says so, the warp-specialized Gluon GEMMs that run instead of up and down
        (up and down are then the Triton plans, not launched); gemm_reason: why Gluon runs or does not."""

    num_tokens: int
    choice: ConfigChoice
    slot_order: bool
    up: Optional[LaunchPlan]
    down: Optional[LaunchPlan]
    rows: int = 0
    act_cols: int = 0
    act_dtype: Optional[torch.dtype] = None
    out_scale_cols: int = 0
    gluon: Optional["GluonLayerPlan"] = None
    gemm_reason: str = ""

    @property
    def block_size_m(self) -> int:
        """The schedule's BLOCK_SIZE_M: the Gluon GEMMs' where they run, else the config's."""
        return self.gluon.block_size_m if self.gluon is not None else self.choice.config.block_size_m


@dataclass(frozen=True)
class LayerPlan:
    """What a `fused_moe` call does, decided once per `LayerKey` (`plan_layer`) and run as is: the chunks
    (first token, end token, ChunkPlan), one unless chunk_size splits T; equal chunks share a ChunkPlan.
    `sites`: where its launches keep their compiled kernels (`site`, `moe_lab._launch`), filled by the calls
    that run it."""

    key: LayerKey
    chunks: Tuple[Tuple[int, int, ChunkPlan], ...]
    sites: Dict[tuple, LaunchSite] = field(default_factory=dict, compare=False, repr=False)
    workspaces: Dict[tuple, object] = field(default_factory=dict, compare=False, repr=False)

    def site(self, index: int, stage: str) -> LaunchSite:
        """The launch site of stage `stage` ("align", "up", ...) of chunk `index` (each chunk its own: equal
        chunks share a ChunkPlan, not their inputs' offsets), made on first use."""
        site = self.sites.get((index, stage))
        if site is None:
            site = self.sites[(index, stage)] = LaunchSite()
        return site

    def launched(self, index: int, up: LaunchPlan, down: LaunchPlan) -> "LayerPlan":
        """This plan with chunk `index`'s GEMMs as launched (`moe_lab.gemm.run_gemm` lowers num_stages where
        the compiler needed more shared memory than estimated); its sites kept (their kernels are the ones
        launched)."""
        start, end, chunk = self.chunks[index]
        chunk = replace(chunk, up=up, down=down)
        return replace(self, chunks=self.chunks[:index] + ((start, end, chunk),) + self.chunks[index + 1 :])


def quantized_by_epilogue(block_shape: Optional[tuple], up: GemmConfig) -> bool:
    """Whether the up GEMM's SwiGLU epilogue writes its output as float8 itself (no [rows, I] float32 buffer,
    no quantization launch): block scales, and each program's I columns (BLOCK_SIZE_N / 2) hold whole groups
    of block_k. Bit for bit the same as quantizing afterwards."""
    return block_shape is not None and up.swiglu_epilogue and (up.BLOCK_SIZE_N // 2) % block_shape[1] == 0


def _weight_scale_layout(block_shape: Optional[tuple], fp8: bool) -> Optional[ScaleLayout]:
    if not fp8:
        return None
    return ScaleLayout("block", *block_shape) if block_shape is not None else ScaleLayout("outer")


def plan_chunk(key: LayerKey, num_tokens: int, w1: torch.Tensor, w2: torch.Tensor, config: ConfigLike) -> ChunkPlan:
    """The ChunkPlan of `num_tokens` tokens of the call whose key is `key` (inputs checked). w1, w2 and
    config are the call's, read only for what the key holds (the weights' descriptor rules and device, the
    config the key holds frozen)."""
    (_, hidden), dtype, device = key.hidden_states[0], key.hidden_states[2], w1.device
    num_experts, two_inter, _ = w1.shape
    inter, top_k = two_inter // 2, key.topk_ids[0][1]
    choice = choose_config(num_tokens, num_experts, top_k, hidden, inter, w1.dtype, config=config, device=device)
    cfg, use_tma = choice.config, key.use_tma
    swiglu = cfg.up.swiglu_epilogue
    x = torch.empty((num_tokens, hidden), dtype=w1.dtype, device="meta")  # read by pointer (gathered rows)
    if num_tokens == 0 or hidden == 0:  # nothing to launch, but use_tma=True holds to its rules as with work
        if use_tma is True:  # the up GEMM gathers token rows; the down GEMM reads [rows, I] sorted rows
            halves = gate_up_halves(swiglu, key.activation)  # the weight descriptor's 4-D view
            select_load_path(x, w1, cfg.up, gather_a=True, use_tma=True, swiglu=halves, w_name="w1")
            act = torch.empty((cfg.block_size_m, inter), dtype=w2.dtype, device="meta")
            select_load_path(act, w2, cfg.down, gather_a=False, use_tma=True, w_name="w2")
        return ChunkPlan(num_tokens, choice, False, None, None)
    gluon, gemm_reason = plan_gluon_layer(key, num_tokens, w1, w2)
    ids_shape, ids_stride, ids_dtype = (num_tokens, top_k), key.topk_ids[1], key.topk_ids[2]
    # The Gluon GEMMs read an aligned schedule (expert-sorted M-blocks of their own BLOCK_SIZE_M).
    slot_order = gluon is None and slot_order_applies(ids_shape, ids_stride, ids_dtype, key.expert_map is not None)
    bm = cfg.block_size_m
    if slot_order:
        schedule = ScheduleShape(False, top_k)
    else:
        schedule = ScheduleShape(True, max_num_tokens_padded(num_tokens * top_k, num_experts, bm) // bm)
    rows = schedule.max_num_m_blocks * bm
    fp8 = w1.dtype == FP8_DTYPE
    scales = _weight_scale_layout(key.block_shape, fp8)
    fused_quant = fp8 and quantized_by_epilogue(key.block_shape, cfg.up)
    # float8 inputs for both GEMMs: the SwiGLU output is quantized from float32 (in the epilogue, or from a
    # float32 buffer): rounded to bfloat16 first, a row's amax (its scale) would move by a bfloat16 step.
    act_dtype = (FP8_DTYPE if fused_quant else torch.float32) if fp8 else dtype
    up = plan_gemm(
        x,
        w1,
        schedule,
        cfg.up,
        gather_a=True,
        swiglu=swiglu,
        use_tma=use_tma,
        scales=scales,
        out_quant_group=key.block_shape[1] if fused_quant else 0,
        activation=key.activation,
        w_name="w1",
    )
    act = torch.empty((rows, inter), dtype=w2.dtype, device="meta")  # a new buffer, contiguous, aligned
    down = plan_gemm(
        act, w2, schedule, cfg.down, gather_a=False, scatter=True, use_tma=use_tma, scales=scales, w_name="w2"
    )
    out_scale_cols = -(-inter // key.block_shape[1]) if fused_quant else 0
    act_cols = inter if swiglu else two_inter
    if gluon is not None:  # the Gluon up GEMM writes float8 [rows, I] and a scale per row per 128 columns
        bm = gluon.block_size_m
        rows = max_num_tokens_padded(num_tokens * top_k, num_experts, bm)
        act_dtype, act_cols, out_scale_cols = FP8_DTYPE, inter, inter // 128
    return ChunkPlan(
        num_tokens, choice, slot_order, up, down, rows, act_cols, act_dtype, out_scale_cols, gluon, gemm_reason
    )


def plan_layer(key: LayerKey, w1: torch.Tensor, w2: torch.Tensor, config: ConfigLike = None) -> LayerPlan:
    """The LayerPlan of a `fused_moe` call whose inputs were checked: a function of its key (w1, w2 and
    config are the call's, read only for what the key holds). Launches nothing; raises ValueError where
    use_tma=True cannot hold, and TypeError/ValueError for a malformed config."""
    num_tokens = key.hidden_states[0][0]
    step = key.chunk_size or max(num_tokens, 1)
    plans: Dict[int, ChunkPlan] = {}
    chunks = []
    for start in range(0, max(num_tokens, 1), step):
        end = min(start + step, num_tokens)
        if end - start not in plans:
            plans[end - start] = plan_chunk(key, end - start, w1, w2, config)
        chunks.append((start, end, plans[end - start]))
    return LayerPlan(key, tuple(chunks))


# Plans by key, oldest first; at most LAYER_PLANS of them (a serving process sees a few shapes per layer
# and token count).
LAYER_PLANS = 1024
_layer_plans: Dict[LayerKey, LayerPlan] = {}
_cache_on = True


def cached_layer_plan(key: Optional[LayerKey]) -> Optional[LayerPlan]:
    """The plan made for `key` before (its inputs then passed the checks), or None."""
    return _layer_plans.get(key) if key is not None and _cache_on else None


def remember_layer_plan(plan: LayerPlan) -> LayerPlan:
    """Keep `plan` for its key (the oldest plan goes when LAYER_PLANS are kept); returns it."""
    if _cache_on:
        if len(_layer_plans) >= LAYER_PLANS:
            _release_workspaces(_layer_plans.pop(next(iter(_layer_plans))))
        _layer_plans[plan.key] = plan
    return plan


def clear_layer_plans() -> None:
    """Forget every layer plan, and the workspaces they keep: after changing TRITON_INTERPRET or MOE_LAB_TMA
    in a running process (the plans read them when made), or a tuned table (`moe_lab.tuned.clear_cache`
    calls this)."""
    global _workspace_bytes
    _layer_plans.clear()
    _workspace_bytes = 0


# A kept plan's workspaces: the buffers each chunk writes between its stages (the align's result, the up GEMM's
# output, the down GEMM's), kept for the next call on the same CUDA stream and thread instead of allocated
# per call. The stream orders one call's reads before the next call's writes; another stream or thread has
# its own. All plans' workspaces together hold at most WORKSPACE_BUDGET bytes: past it, calls allocate.
WORKSPACE_BUDGET = 256 << 20
_workspace_bytes = 0


def workspace_slot(index: int, device: torch.device) -> Optional[tuple]:
    """Where chunk `index` of a kept plan finds its workspace (`LayerPlan.workspaces`) on this thread and
    `device`'s current stream; None while that stream captures a CUDA graph (a graph's buffers are its own) or
    inside `moe_lab.runtime.keeping_no_buffers()`."""
    if not keeps_buffers():
        return None
    if device.type != "cuda":
        return (index, None, threading.get_ident())
    if torch.cuda.is_current_stream_capturing():
        return None
    return (index, current_stream(device.index), threading.get_ident())


def reserve_workspace(nbytes: int) -> bool:
    """Count `nbytes` more of kept workspaces, where the budget allows (True), else nothing (False)."""
    global _workspace_bytes
    if _workspace_bytes + nbytes > WORKSPACE_BUDGET:
        return False
    _workspace_bytes += nbytes
    return True


def _release_workspaces(plan: LayerPlan) -> None:
    global _workspace_bytes
    _workspace_bytes -= sum(workspace.nbytes for workspace in plan.workspaces.values())
    plan.workspaces.clear()


@contextlib.contextmanager
def layer_plan_cache(enabled: bool):
    """Within the block, `fused_moe` uses the plan cache (True) or checks and plans every call (False), as
    benchmarks/host_cost.py compares them."""
    global _cache_on
    before, _cache_on = _cache_on, bool(enabled)
    try:
        yield
    finally:
        _cache_on = before


# --- The warp-specialized Gluon FP8 grouped GEMM (moe_lab.gluon_fp8): its launch, decided here. ---

# Registers per thread of the Gluon kernel's load partition (one warp issuing TMA copies and reading the schedule):
# setmaxnreg's least, so the MMA partitions get the rest.
GLUON_LOAD_REGS = 24
# The TMA producer's warp counts as a whole warpgroup when registers are shared out.
_WARPGROUP = 4
# The Gluon FP8 kernel's K step: the weight scales' block_k (one wgmma chain per scale block), and the column
# group of its float8 output's scales.
GLUON_BLOCK_K = 128
# Its default BLOCK_SIZE_N (`plan_gluon_fp8`'s, and so `fused_moe`'s).
GLUON_BLOCK_SIZE_N = 128


def _launch_regs(warps: int) -> int:
    """Registers per thread that let `warps` warps fit one SM's 64K (at most 248, a multiple of 8)."""
    return min(248, 65536 // (warps * 32)) // 8 * 8


# Registers per thread of each MMA partition with 128-row tiles: what the launch's registers (64K per SM shared
# by 3 warpgroups, rounded down to 8 per thread: 168) leave to two warpgroups beside the load partition's (240).
# A 64x128 tile's sums and two products in flight take 192, and the SwiGLU tile's four half sums as many; with 232
# ptxas spilled the SwiGLU K loop's addresses.
GLUON_CONSUMER_REGS = (3 * _launch_regs(3 * _WARPGROUP) - GLUON_LOAD_REGS) // 2 // 8 * 8


@dataclass(frozen=True)
class GluonFp8Plan:
    """What one `grouped_matmul_fp8_gluon` call launches (moe_lab/_kernels/gluon_fp8.py).

    config: BLOCK_SIZE_M (the routing's), BLOCK_SIZE_N, BLOCK_SIZE_K (= the scale blocks' K), GROUP_SIZE_M,
        num_stages (the shared-memory ring, lowered to fit) and num_warps (4: each MMA partition is one
        warpgroup, taking 64 rows of the tile; 128-row tiles have two).
    grid: programs (`gluon_programs`: one per SM at most, each walking tiles, or one per tile). maxnreg: the
    register limit per thread that lets every warp of the MMA and load partitions fit one SM's 64K registers.
    activation: the SwiGLU epilogue's (gate and up as halves of w), or None for the plain GEMM."""

    config: GemmConfig
    grid: int
    maxnreg: int
    scale_group_n: int
    activation: Optional[Activation] = None

    @functools.cached_property
    def constexprs(self) -> dict:
        """The kernel's constexprs and Triton's launch options (num_warps, maxnreg)."""
        return dict(
            GROUP_SIZE_M=self.config.GROUP_SIZE_M,
            GROUP_N=self.scale_group_n,
            STAGES=self.config.num_stages,
            SWIGLU=self.activation.kernel_name if self.activation is not None else "none",
            CONSUMERS=self.config.BLOCK_SIZE_M // GLUON_PARTITION_ROWS,
            CONSUMER_REGS=GLUON_CONSUMER_REGS,
            LOAD_REGS=GLUON_LOAD_REGS,
            num_warps=self.config.num_warps,
            maxnreg=self.maxnreg,
        )


class BlockSchedule(NamedTuple):
    """What `plan_gluon_fp8` reads of a schedule (an `AlignedRouting` has both) where it is not made yet."""

    block_size_m: int
    max_num_m_blocks: int


def plan_gluon_fp8(
    routing,
    n: int,
    k: int,
    block_shape: Tuple[int, int],
    device: torch.device,
    config: Optional[GemmConfig] = None,
    out_itemsize: int = 2,
    activation: Optional[Activation] = None,
) -> GluonFp8Plan:
    """The launch of the Gluon FP8 grouped GEMM for a routing (or its `BlockSchedule`) and a weight [E, n, k]
    with `block_shape` scales: the config (default: the routing's BLOCK_SIZE_M, BLOCK_SIZE_N = 128, 4 stages,
    GROUP_SIZE_M `gluon_group_size_m`'s) fitted to the device's shared memory, the grid and the register limit.
    Raises ValueError for a config or block shape the kernel cannot run: BLOCK_SIZE_M 64 or 128 (one or two
    warpgroups of 64 rows), BLOCK_SIZE_K = block_k = 128 (one wgmma chain per scale block), BLOCK_SIZE_N dividing
    block_n (one weight scale per tile and K block), K a multiple of 16 (TMA's 16-byte strides for float8 rows).
    With `activation` (the SwiGLU epilogue; out [rows, n / 2]): gate and up rows as halves only (interleaved
    rows refused), n / 2 a multiple of BLOCK_SIZE_N (each up box in one expert's up rows and one scale
    block), and with a float8 output (out_itemsize 1) BLOCK_SIZE_N = block_k (one output scale per row and
    tile). TypeError/ValueError naming the argument for arguments of the wrong kind: routing an AlignedRouting
    or BlockSchedule, n and k ints >= 0 (n even with activation), block_shape two ints >= 1, device a
    torch.device or its name, config a GemmConfig or None, out_itemsize 1, 2 or 4, activation an Activation or
    None."""
    if not isinstance(routing, (AlignedRouting, BlockSchedule)):
        raise TypeError(f"routing must be an AlignedRouting (moe_align's) or a BlockSchedule, got {type_name(routing)}")
    if isinstance(routing, BlockSchedule):  # an AlignedRouting checks its own
        if is_bool(routing.block_size_m) or routing.block_size_m not in (64, 128):
            raise ValueError(f"routing.block_size_m must be 64 or 128, got {routing.block_size_m!r}")
        check_positive_int("routing.max_num_m_blocks", routing.max_num_m_blocks, minimum=0)
    n, k = check_positive_int("n", n, minimum=0), check_positive_int("k", k, minimum=0)
    if block_shape is None:
        raise ValueError("block_shape must be given ([block_n, 128]): the Gluon kernel takes block scales only")
    block_n, block_k = block_shape = check_block_shape(block_shape)
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"device must be a torch.device or its name, got {type_name(device)}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be a torch.device or its name ('cuda:0', 'meta'), got {device!r}") from None
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig or None, got {type_name(config)}")
    if is_bool(out_itemsize) or not isinstance(out_itemsize, numbers.Integral) or out_itemsize not in (1, 2, 4):
        raise ValueError(f"out_itemsize must be 1, 2 or 4 (bytes of an output element), got {out_itemsize!r}")
    if activation is not None and not isinstance(activation, Activation):
        raise TypeError(f"activation must be an Activation or None, got {type_name(activation)}")
    if activation is not None and n % 2:
        raise ValueError(f"n must be even (2I: gate and up rows) with activation, got {n}")
    default = config is None
    if default:
        config = GemmConfig(BLOCK_SIZE_M=routing.block_size_m, BLOCK_SIZE_N=GLUON_BLOCK_SIZE_N, num_stages=4)
    if config.BLOCK_SIZE_M != routing.block_size_m:
        raise ValueError(
            f"config.BLOCK_SIZE_M={config.BLOCK_SIZE_M} must equal the routing's block_size_m={routing.block_size_m}"
        )
    if config.BLOCK_SIZE_M not in (64, 128):
        raise ValueError(
            f"the Gluon FP8 kernel takes BLOCK_SIZE_M 64 or 128 (one warpgroup per 64 rows), got {config.BLOCK_SIZE_M}"
        )
    problem = gluon_block_shape_problem(block_shape, config.BLOCK_SIZE_N) or gluon_k_problem(k)
    if problem:
        raise ValueError(problem)
    parts, n_out = 1, n
    if activation is not None:
        problem = gluon_swiglu_problem(activation, n // 2, config.BLOCK_SIZE_N, out_itemsize == 1)
        if problem:
            raise ValueError(f"the Gluon FP8 kernel's SwiGLU epilogue cannot run here: {problem}")
        parts, n_out = 2, n // 2
    per_stage = (config.BLOCK_SIZE_M + parts * config.BLOCK_SIZE_N) * block_k  # float8 A and W boxes
    # The layout change before the store: float32 sums, or the float8 output.
    epilogue = config.BLOCK_SIZE_M * config.BLOCK_SIZE_N * (1 if out_itemsize == 1 else 4)
    budget = shared_memory_budget(device)
    stages = config.num_stages
    if budget is not None:
        stages = min(stages, (budget - epilogue - 1024) // per_stage)
    if stages < 2:
        room = f" in {budget} bytes of shared memory" if budget is not None else ""
        raise ValueError(f"config {config} leaves fewer than 2 pipeline stages{room}")
    # A CUDA device on a machine without one plans as a meta device does (one program), unless a GPU is assumed.
    on_gpu = (device.type == "cuda" and torch.cuda.is_available()) or assumed_facts() is not None
    sms = multiprocessor_count(device) if on_gpu else 1
    if default:
        n_tiles = cdiv(n_out, config.BLOCK_SIZE_N)
        config = replace(config, GROUP_SIZE_M=gluon_group_size_m(n_tiles, sms, activation is not None))
    config = replace(config, BLOCK_SIZE_K=block_k, num_warps=4, num_stages=stages)
    tiles = tile_grid(routing.max_num_m_blocks, n_out, config.BLOCK_SIZE_N)
    grid = gluon_programs(tiles, sms, activation is not None, n * k)
    warps = config.BLOCK_SIZE_M // GLUON_PARTITION_ROWS * _WARPGROUP + _WARPGROUP  # and the load warp's
    return GluonFp8Plan(config, grid, _launch_regs(warps), block_n, activation)


def gluon_group_size_m(n_tiles: int, programs: int, swiglu: bool) -> int:
    """The Gluon FP8 kernel's default GROUP_SIZE_M for a GEMM of `n_tiles` N tiles on `programs` programs (one
    per SM): 1 (each M-block's N tiles in a row) for the up GEMM with the SwiGLU epilogue (`swiglu`) where one
    wave of programs holds every N tile of two M-blocks or more, else 8: where each measured faster
    (docs/experiments.md, "The Gluon GEMMs' tile order"). TypeError/ValueError for counts that are not ints
    (n_tiles >= 0, programs >= 1) or a `swiglu` that is not a bool."""
    n_tiles = check_positive_int("n_tiles", n_tiles, minimum=0)
    programs = check_positive_int("programs", programs)
    check_bool("swiglu", swiglu)
    return 1 if swiglu and 2 * n_tiles <= programs else 8


# A large expert: one whose float8 w1 takes this many bytes or more (DeepSeek-V3's 29 MB, Mixtral-8x7B's 117 MB;
# Qwen3-30B-A3B's 3 MB is not). Its SwiGLU up GEMM launches one program per tile (`gluon_programs`), and "auto"
# takes the Gluon GEMMs from GLUON_AUTO_ROWS_PER_LARGE_EXPERT rows per expert (`gluon_applies`).
GLUON_LARGE_EXPERT_W_BYTES = 16 * 2**20


def gluon_programs(tiles: int, sms: int, swiglu: bool, expert_w_bytes: int) -> int:
    """Programs of a Gluon FP8 launch over `tiles` tiles (at most; programs past the schedule's tiles return) on
    `sms` SMs. One per tile for the up GEMM with the SwiGLU epilogue (`swiglu`) where one expert's weights take
    GLUON_LARGE_EXPERT_W_BYTES or more (DeepSeek-V3's w1 29 MB, Mixtral-8x7B's 117 MB): the GPU starts tiles
    in order, so the M-blocks of an expert that share a weight box run at once and read it through L2, where
    programs walking tiles drift apart and read it from DRAM. Else one per SM at most, each walking tiles
    (Qwen3-30B-A3B's w1 of 3 MB, which stays in L2; the down GEMM). Where each measured faster:
    docs/experiments.md, "One program per tile". At least 1. TypeError/ValueError for counts that are not
    ints (tiles and expert_w_bytes >= 0, sms >= 1), a `swiglu` that is not a bool, or more programs than a
    CUDA grid holds (2**31 - 1)."""
    tiles, sms = check_positive_int("tiles", tiles, minimum=0), check_positive_int("sms", sms)
    expert_w_bytes = check_positive_int("expert_w_bytes", expert_w_bytes, minimum=0)
    check_bool("swiglu", swiglu)
    per_tile = swiglu and expert_w_bytes >= GLUON_LARGE_EXPERT_W_BYTES
    programs = max(1, tiles if per_tile else min(sms, tiles))
    if programs > 2**31 - 1:
        raise ValueError(f"tiles={tiles} make {programs} programs, more than a CUDA grid holds (2**31 - 1)")
    return programs


def gluon_block_shape_problem(block_shape, block_size_n: int = GLUON_BLOCK_SIZE_N) -> Optional[str]:
    """None if the Gluon FP8 kernel can take weight scales in blocks of `block_shape` [block_n, block_k] with
    tiles of `block_size_n` weight rows, else what is wrong: block_k must be its K step GLUON_BLOCK_K (one
    wgmma chain per scale block), and block_size_n must divide block_n (one weight scale per tile and K block)."""
    block_n, block_k = block_shape
    if block_k != GLUON_BLOCK_K:
        return (
            f"the Gluon FP8 kernel needs block_shape [block_n, {GLUON_BLOCK_K}] (its K step), got {list(block_shape)}"
        )
    if block_n % block_size_n:
        return (
            f"block_shape's block_n={block_n} must be a multiple of BLOCK_SIZE_N={block_size_n} (the Gluon FP8 "
            f"kernel reads one weight scale per tile and K block), got block_shape {list(block_shape)}"
        )
    return None


def gluon_k_problem(k: int, name: str = "K") -> Optional[str]:
    """None if the Gluon FP8 kernel can take a GEMM of depth `k` (a's columns, w's last dimension; `name` in
    the message), else why not: a multiple of 16, so that float8 rows of k bytes keep TMA's 16-byte strides."""
    if k % 16:
        return (
            f"the Gluon FP8 kernel needs {name} a multiple of 16 (TMA strides of float8 rows are 16-byte "
            f"aligned), got {name}={k}"
        )
    return None


def gluon_weight_problem(name: str, w: torch.Tensor) -> Optional[str]:
    """None if the Gluon FP8 kernel can read weights `w` [E, N, K] (named `name` in the message) through one
    tensor descriptor over their [E * N, K] view (`run_gluon_fp8`), else what is wrong: K a multiple of 16
    (`gluon_k_problem`), and what Triton's `TensorDescriptor.from_tensor` asserts of that view: last stride 1,
    the row stride (stride(1)) a multiple of 16 bytes, a 16-byte aligned base; and stride(0) = N * stride(1)
    where E > 1 (with one expert the view does not read stride(0))."""
    num_experts, n, k = w.shape
    problem = gluon_k_problem(k, f"{name}.shape[2]")
    if problem:
        return problem
    strides = tuple(w.stride())
    if strides[2] != 1 or (strides[1] * w.element_size()) % 16 or (num_experts > 1 and strides[0] != n * strides[1]):
        return (
            f"{name} must view as one [E * N, K] matrix for the Gluon FP8 kernel's descriptor (last stride 1, "
            f"stride(1) a multiple of 16 bytes, stride(0) = N * stride(1) unless E = 1), got strides {strides} "
            f"for shape {tuple(w.shape)}"
        )
    if w.data_ptr() % 16:
        return (
            f"{name} must start at a 16-byte aligned address for the Gluon FP8 kernel's descriptor, got an "
            f"address {w.data_ptr() % 16} bytes past one"
        )
    return None


def gluon_swiglu_problem(
    activation: Activation, inter: int, block_n: int = GLUON_BLOCK_SIZE_N, quantized: bool = True
) -> Optional[str]:
    """None if the Gluon FP8 kernel's SwiGLU epilogue can compute `activation` for I = `inter` with tiles of
    `block_n` output columns (a float8 output quantized per GLUON_BLOCK_K columns where `quantized`), else why
    not."""
    if activation.interleaved:
        return (
            "gate and up rows interleaved (gpt-oss's layout) are not built: the tile would hold gate and up in "
            "one accumulator's even and odd columns, split by the activation; the kernel reads halves"
        )
    if inter % block_n:
        return f"I={inter} is not a multiple of BLOCK_SIZE_N={block_n} (each tile's up rows in one scale block)"
    if quantized and block_n != GLUON_BLOCK_K:
        return (
            f"BLOCK_SIZE_N={block_n} must equal the output's scale group {GLUON_BLOCK_K} (one scale per row and tile)"
        )
    return None


# --- The Gluon GEMMs in `fused_moe`: where they run instead of the Triton ones, decided here. ---

# The Gluon GEMMs' BLOCK_SIZE_M: 128 (two warpgroups) where experts get that many rows, else 64.
GLUON_WIDE_ROWS_PER_EXPERT = 128
# Whether `fused_moe` runs the Gluon GEMMs: "auto" (the default: where the experts get GLUON_AUTO_ROWS_PER_EXPERT
# rows each or more, and no config is given), "1" (wherever they can run, at every T), "0" (never). Read when a
# layer plan is made: `clear_layer_plans()` after a change.
GLUON_ENV_VAR = "MOE_LAB_GLUON"
# "auto"'s threshold on a chunk's T * top_k / E (E: every expert, this rank's or not, with an expert_map): where
# the Gluon layer measured faster (docs/experiments.md, "The Gluon GEMMs' tile order" and "auto for large
# experts"; "Where the Gluon and Triton layers part" says why switching by T adds no dependence on the batch that
# FP8's tuned tiles do not already have). Large experts (GLUON_LARGE_EXPERT_W_BYTES) from full 128-row tiles:
# their long K leaves the epilogue a small share of a tile, where Qwen3-30B-A3B's short K does not.
GLUON_AUTO_ROWS_PER_EXPERT = 256
GLUON_AUTO_ROWS_PER_LARGE_EXPERT = 128
# Rows of a tile per MMA partition (one warpgroup) of the Gluon FP8 kernel: tiles of 64 rows have one, of 128 two.
GLUON_PARTITION_ROWS = 64


def gluon_setting() -> str:
    """The `MOE_LAB_GLUON` setting (`moe_lab.capability.env_setting`): "0", "1" or "auto" (the default)."""
    return env_setting(GLUON_ENV_VAR)


def gluon_applies(
    w1: torch.Tensor,
    w2: torch.Tensor,
    block_shape: Optional[tuple],
    activation: Activation = SILU,
    has_bias: bool = False,
    setting: Optional[str] = None,
    rows_per_expert: Optional[float] = None,
    config_given: bool = False,
    use_tma: UseTma = "auto",
) -> Tuple[bool, str]:
    """Whether `fused_moe` runs its two GEMMs on the warp-specialized Gluon FP8 kernel, and why (or why not), in
    words. It runs where it can (`moe_lab.capability.gluon_fp8_support`: Gluon's warp_specialize, an sm_90 GPU,
    no interpreter; float8_e4m3fn w1 [E, 2I, H] and w2 [E, H, I] with block_shape [128 n, 128]
    (`gluon_block_shape_problem`); the SwiGLU of `activation` on gate and up halves, I a multiple of 128
    (`gluon_swiglu_problem`); no biases; each weight read as one [E * N, K] TMA matrix, H a multiple of 16
    (`gluon_weight_problem`)) and as `setting` says (default: `gluon_setting()`): "1" at every T, "0" never,
    "auto" where `rows_per_expert` (the chunk's T * top_k / E, E counting every expert with an expert_map) is at
    least GLUON_AUTO_ROWS_PER_EXPERT (GLUON_AUTO_ROWS_PER_LARGE_EXPERT where one expert's w1 takes
    GLUON_LARGE_EXPERT_W_BYTES or more) and no config was given (`config_given`: the caller chose Triton tiles).
    Never with use_tma=False: the caller asked for pointer loads, and the Gluon kernel loads by TMA alone.
    Takes `fused_moe`'s checked weights (their shapes are not matched here); TypeError/ValueError naming the
    argument for w1/w2 that are not tensors, a block_shape that is not two ints >= 1, an activation that is not
    an Activation, has_bias/config_given that are not bools, rows_per_expert that is not a finite number >= 0,
    or use_tma other than True, False or "auto"."""
    for name, value in (("w1", w1), ("w2", w2)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type_name(value)}")
    block_shape = check_block_shape(block_shape)
    if not isinstance(activation, Activation):
        raise TypeError(f"activation must be an Activation, got {type_name(activation)}")
    for name, value in (("has_bias", has_bias), ("config_given", config_given)):
        check_bool(name, value)
    check_use_tma(use_tma)
    if rows_per_expert is not None:
        if is_bool(rows_per_expert) or not isinstance(rows_per_expert, numbers.Real):
            raise TypeError(
                f"rows_per_expert must be a number (T * top_k / E) or None, got {type_name(rows_per_expert)}"
            )
        if not 0 <= rows_per_expert < float("inf"):  # NaN fails too
            raise ValueError(f"rows_per_expert must be a finite number >= 0 (T * top_k / E), got {rows_per_expert}")
    setting = gluon_setting() if setting is None else setting
    if setting not in ("0", "1", "auto"):
        raise ValueError(f"setting must be '0', '1' or 'auto' (as {GLUON_ENV_VAR}), got {setting!r}")
    if use_tma is False:
        return False, "use_tma=False (pointer loads; the Gluon kernel loads by TMA)"
    if w1.dtype != FP8_DTYPE or block_shape is None:  # what the layer is comes before what the switch says
        return False, "not block-scaled float8 weights"
    if setting == "0":
        return False, f"{GLUON_ENV_VAR}=0"
    problem = gluon_fp8_support(w1.device)
    if problem:
        return False, problem
    problem = gluon_block_shape_problem(block_shape) or gluon_swiglu_problem(activation, w1.shape[1] // 2)
    if problem:
        return False, problem
    if has_bias:
        return False, "w1_bias or w2_bias given: the Gluon kernel adds no bias"
    problem = gluon_weight_problem("w1", w1) or gluon_weight_problem("w2", w2)
    if problem:
        return False, problem
    if setting == "1":
        return True, f"{GLUON_ENV_VAR}=1"
    if config_given:
        return False, f"{GLUON_ENV_VAR}=auto with a config given runs the Triton GEMMs of that config"
    large = w1.shape[1] * w1.shape[2] * w1.element_size() >= GLUON_LARGE_EXPERT_W_BYTES  # one expert's w1
    threshold = GLUON_AUTO_ROWS_PER_LARGE_EXPERT if large else GLUON_AUTO_ROWS_PER_EXPERT
    if rows_per_expert is None:
        return False, f"{GLUON_ENV_VAR}=auto needs the rows per expert (T * top_k / E) to decide"
    rows = f"{rows_per_expert:.6g}"
    which = f"{threshold}" + (f" (large experts: w1 >= {GLUON_LARGE_EXPERT_W_BYTES >> 20} MiB each)" if large else "")
    if rows_per_expert < threshold:
        return False, (
            f"{GLUON_ENV_VAR}=auto: {rows} rows per expert (T * top_k / E) < {which}, where the Triton GEMMs "
            f"are faster ({GLUON_ENV_VAR}=1 runs Gluon at every T)"
        )
    return True, f"{GLUON_ENV_VAR}=auto: {rows} rows per expert (T * top_k / E) >= {which}"


@dataclass(frozen=True)
class GluonLayerPlan:
    """The Gluon GEMMs of a `fused_moe` chunk: the aligned schedule's BLOCK_SIZE_M, the up GEMM (token rows
    permuted, SwiGLU and float8 quantization in its epilogue) and the down GEMM (routed weights, scattered),
    each a GluonFp8Plan."""

    block_size_m: int
    up: GluonFp8Plan
    down: GluonFp8Plan


def plan_gluon_layer(key: LayerKey, num_tokens: int, w1: torch.Tensor, w2: torch.Tensor):
    """(the GluonLayerPlan of a chunk of `num_tokens` tokens, or None; why) for the call whose key is `key`
    (`gluon_applies` decides)."""
    top_k = key.topk_ids[0][1]
    has_bias = any(t is not None for t in key.expert_tensors[:2])
    num_experts, two_inter, hidden = w1.shape
    # Rows per expert of all of them: with an expert_map, topk_ids name global experts, this rank holds w1's.
    global_experts = key.expert_map[0][0] if key.expert_map is not None else num_experts
    rows_per_expert = num_tokens * top_k / global_experts
    config_given = key.config is not None and key.config != _frozen({})  # ({}: nothing changed)
    applies, reason = gluon_applies(
        w1,
        w2,
        key.block_shape,
        key.activation,
        has_bias,
        rows_per_expert=rows_per_expert,
        config_given=config_given,
        use_tma=key.use_tma,
    )
    if not applies:
        return None, f"triton GEMMs: {reason}"
    wide = rows_per_expert >= GLUON_WIDE_ROWS_PER_EXPERT
    block_m = 128 if wide else 64
    schedule = BlockSchedule(block_m, max_num_tokens_padded(num_tokens * top_k, num_experts, block_m) // block_m)
    up = plan_gluon_fp8(schedule, two_inter, hidden, key.block_shape, w1.device, None, 1, key.activation)
    out_itemsize = key.hidden_states[2].itemsize
    down = plan_gluon_fp8(schedule, hidden, two_inter // 2, key.block_shape, w1.device, None, out_itemsize)
    return GluonLayerPlan(block_m, up, down), f"gluon GEMMs: {reason}"
