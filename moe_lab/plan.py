"""The decisions of a grouped matmul call, in one place: each returns an immutable plan, launches nothing.

    select_load_path  each operand's load path (TMA or pointers), with the reason
    plan_gemm         the config as launched (fitted to the scale blocks and the device's shared memory,
                      folds and the persistent kernel where they apply), the kernel, its grid and its
                      constexprs (`LaunchPlan.constexprs`: every variant a launch can compile)

The config itself is chosen in `moe_lab.tuned.choose_config` (tuned table, heuristic or the user's); the
device's facts come from `moe_lab.capability`. A plan depends only on its inputs' shapes, dtypes, strides
and alignment, the device, the config and `use_tma`. `moe_lab.gemm.grouped_matmul` checks its arguments,
plans and launches; `moe_lab.layer.fused_moe` plans both GEMMs of a layer and launches them unchecked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch
import triton

from .align import AlignedRouting
from .capability import descriptor_problem, multiprocessor_count, shared_memory_limit, tma_support
from .configs import GemmConfig, fit_to_shared_memory, full_precision_fp32
from .quantize import MIN_FP8_DOT_K
from .runtime import interpreter_active

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


@dataclass(frozen=True)
class LaunchPlan:
    """What one `grouped_matmul` call launches, decided once (`plan_gemm`) and launched as is.

    config: the GemmConfig as launched: the one asked for, with num_stages lowered where the device's
        shared memory (or the compiler) needed it.
    path: each operand's load path and why (`select_load_path`).
    gather_a: the kernel gathers token rows itself (the up projection).
    scatter: output rows go to their (token, k) slot. swiglu: the epilogue applies SiLU-and-mul, each
    program reading BLOCK_SIZE_N/2 gate rows and the matching BLOCK_SIZE_N/2 up rows of w.
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

    @property
    def constexprs(self) -> dict:
        """The kernel's constexpr arguments (moe_lab/_kernels/grouped_matmul.py), and Triton's num_warps and
        num_stages: with `persistent` those of `grouped_matmul_persistent_kernel`, else of
        `grouped_matmul_kernel` (which also takes TAIL_SPLITS and FOLD_M)."""
        config = self.config
        args = dict(
            ROWS="gather" if self.gather_a else "scatter" if self.scatter else "sorted",
            SWIGLU=self.swiglu,
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
) -> LoadPath:
    """Decide the load path of each operand: does this call use TMA (`moe_lab.capability` answers the
    other question, whether this device and Triton can). Precedence, first match wins:
    1. `use_tma=False`: pointer loads. 2. `MOE_LAB_TMA=0`, or a device/Triton without TMA: pointer loads
    (and ValueError with `use_tma=True`). 3. `use_tma="auto"` with `config.tma=False` (the tuner found
    pointer loads faster for this shape): pointer loads. 4. Per operand, TMA where its tensor meets the
    descriptor rules; elsewhere pointer loads with the broken rule as the reason, or ValueError with
    `use_tma=True` (for w, and for a sorted-layout a). With `swiglu` the weights are read
    as [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, BLOCK_SIZE_K]: gate and up rows in one tile. (With
    block scales a step of several scale blocks loads boxes of one block's K, `LaunchPlan.box_k`: valid
    wherever BLOCK_SIZE_K's are, the inner box staying >= 16 bytes.)"""
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
    w_view, w_box = weight_box(w, config, swiglu, config.BLOCK_SIZE_K)
    w_problem = descriptor_problem(w_view, w_box)
    if w_problem and use_tma is True:
        viewed = f", viewed as [E, 2, I, K] {tuple(w_view.shape)} for the SwiGLU epilogue," if swiglu else ""
        raise ValueError(
            f"use_tma=True but w {tuple(w.shape)} ({w.dtype}){viewed} cannot be read through a tensor "
            f"descriptor: {w_problem}"
        )
    if w_problem and swiglu:
        w_problem = f"the SwiGLU epilogue's 4-D view of w: {w_problem}"  # no " [": readers split the device off there
    reasons.append(f"w: {'pointer (' + w_problem + ')' if w_problem else 'tma'}")
    if gather_a:
        a_problem = "gathered token rows (TMA gather needs Blackwell)"
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
) -> LaunchPlan:
    """The LaunchPlan of a `grouped_matmul` call with these arguments, checked by the caller: the config
    fitted to the device's shared memory (and, with block scales, BLOCK_SIZE_K to the scale block), the
    load paths, the kernel and its grid. `a` may be a meta tensor of the operand's shape, dtype and strides
    (a buffer not made yet, 16-byte aligned); the device is w's. `scales`: None for float operands, else
    the float8 scales' layout (`mode`, `group_n`, `group_k`, as `moe_lab.gemm.Fp8Scales` holds them).
    Launches nothing. Callers get the plan with `grouped_matmul(..., return_plan=True)`."""
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
    grid = routing.max_num_m_blocks * triton.cdiv(w.shape[1], config.BLOCK_SIZE_N) if w.shape[1] else 0
    if config.persistent and grid:
        grid = min(grid, INTERPRETER_PROGRAMS if interpreter_active() else multiprocessor_count(w.device))
    if grid == 0:
        path = LoadPath(False, False, "nothing to launch (no rows or no columns)")
    else:
        path = select_load_path(a, w, config, gather_a=gather_a, use_tma=use_tma, swiglu=swiglu)
    # A program's weight rows (each half's, with SwiGLU) start at a multiple of their count, so they lie in
    # one scale block when block_n is a multiple of that count (and, for the up half, I too). Not with
    # K = 0: that loop loads the first step's scales before it starts, and there are no K groups.
    tile_rows = config.BLOCK_SIZE_N // 2 if swiglu else config.BLOCK_SIZE_N
    w_scale_per_tile = (
        scales is not None
        and scales.mode == "block"
        and scales.group_n % tile_rows == 0
        and (not swiglu or (w.shape[1] // 2) % tile_rows == 0)
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
    )


def weight_box(w: torch.Tensor, config: GemmConfig, swiglu: bool, box_k: int):
    """The view of w that the weight descriptor covers, and its block shape: [E, N, K] in boxes of
    [1, BLOCK_SIZE_N, box_k]; with the SwiGLU epilogue [E, 2, I, K] in boxes of [1, 2, BLOCK_SIZE_N/2, box_k],
    whose two halves are a gate tile and the matching up tile. box_k: BLOCK_SIZE_K, or one dot's K where a
    K step runs several (`LaunchPlan.box_k`); validity does not depend on it (the inner box stays >= 16 bytes)."""
    if swiglu:
        return w.unflatten(1, (2, w.shape[1] // 2)), [1, 2, config.BLOCK_SIZE_N // 2, box_k]
    return w, [1, config.BLOCK_SIZE_N, box_k]


def shared_memory_budget(device: torch.device) -> Optional[int]:
    """Bytes of shared memory one program may use where kernels compile for a CUDA GPU; None under the
    interpreter (no limit to fit)."""
    if device.type != "cuda" or interpreter_active():
        return None
    return shared_memory_limit(device)
