"""Look inside the compiled grouped matmul: the PTX Triton makes for a GPU, on any machine (no GPU needed).

    from moe_lab.tools import look_inside
    tma = look_inside.compile_grouped_matmul("tma", cc=90)      # an H100/H200
    print(tma.count("cp.async.bulk.tensor"), tma.lines("cp.async.bulk.tensor"))

Triton compiles for a target it is told about; it needs no GPU for that (only to launch). Each call runs
a child process with the interpreter off (TRITON_INTERPRET=0) and a stand-in Triton driver for the target
(`moe_lab.tools.compile_only`), launches `grouped_matmul` on meta tensors (no memory, no values), and returns
the kernel's PTX, the virtual GPU assembly that ptxas turns into machine code (SASS). The layout is the
down projection's: rows already in padded sorted order, so on sm_90 both A and w can be loaded through
tensor descriptors. Triton caches compiled kernels on disk (~/.triton/cache), so a second call is quick.

Source: the PTX ISA (docs.nvidia.com/cuda/parallel-thread-execution), sections on `cp.async.bulk.tensor`
(TMA), `cp.async` and `wgmma`.
"""

from __future__ import annotations

import json
import numbers
import operator
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import List

LOAD_PATHS = ("tma", "pointer")
TARGETS = (80, 90, 100)

# What a reader of the PTX looks for, and what each says about how tiles reach shared memory.
MEMORY_INSTRUCTIONS = {
    "cp.async.bulk.tensor": "TMA: one thread hands the copy engine a descriptor and a box; the engine copies "
    "the whole tile from global to shared memory (sm_90+)",
    "cp.async.cg.shared.global": "per-thread asynchronous copies of 16 bytes each, global to shared "
    "(sm_80+): how pointer loads are pipelined across num_stages",
    "ld.global": "ordinary loads from global memory into registers",
    "wgmma.mma_async": "Hopper's warpgroup matrix multiply, reading its tiles from shared memory",
    "mma.sync": "the tensor-core matrix multiply of sm_80 (tiles in registers)",
}

# What shows warp specialization in the PTX of the Gluon FP8 GEMM (`compile_gluon_fp8`).
WARP_SPECIALIZATION_INSTRUCTIONS = {
    "setmaxnreg": "a partition gives registers back (the load warp) or takes more (the MMA warpgroups)",
    "mbarrier.try_wait": "a wait on an mbarrier's phase: the MMA partition for a full stage, the load warp for an "
    "empty one",
    "mbarrier.arrive": "an arrival on an mbarrier: a stage released (empty), or bytes announced (expect_tx)",
    "cp.async.bulk.tensor": MEMORY_INSTRUCTIONS["cp.async.bulk.tensor"],
    "wgmma.mma_async": MEMORY_INSTRUCTIONS["wgmma.mma_async"],
    "wgmma.wait_group": "wait until at most N wgmma groups are in flight: the product of a K block is ready",
}


@dataclass(frozen=True)
class CompiledKernel:
    """One compile of `grouped_matmul_kernel`: the PTX, and what Triton reports about the kernel."""

    load_path: str
    cc: int
    ptx: str
    shared_bytes: int
    num_warps: int

    def count(self, instruction: str) -> int:
        """How many PTX instructions start with `instruction` (e.g. "cp.async.bulk.tensor")."""
        return len(self.lines(instruction, limit=None))

    def lines(self, instruction: str, limit: int | None = 3) -> List[str]:
        """The first `limit` PTX lines (all if None) whose instruction starts with `instruction`."""
        pattern = re.compile(r"^\s*(@%p\d+\s+)?" + re.escape(instruction) + r"\b")
        found = [line.strip() for line in self.ptx.splitlines() if pattern.match(line)]
        return found if limit is None else found[:limit]

    def summary(self) -> str:
        rows = [
            f"sm_{self.cc} {self.load_path} path: {self.num_warps} warps, {self.shared_bytes} bytes of shared memory"
        ]
        for instruction in MEMORY_INSTRUCTIONS:
            n = self.count(instruction)
            if n:
                rows.append(f"  {n:4d} x {instruction}")
        return "\n".join(rows)


def _check_int(name: str, value, choices) -> int:
    """`value` as an int (a Python or numpy integer; not 90.0, not "90", not True), else TypeError naming it."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, one of {choices}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, one of {choices}, got {value!r} ({type(value).__name__})") from None


def _check_timeout(timeout_s) -> float:
    """`timeout_s` as a float (a Python or numpy number), if finite and > 0."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise TypeError(f"timeout_s must be a number of seconds, got {timeout_s!r} ({type(timeout_s).__name__})")
    if not 0 < timeout_s <= 86400:  # NaN too; past a day the child's clock arithmetic can overflow
        raise ValueError(f"timeout_s must be a number of seconds > 0 and at most 86400 (a day), got {timeout_s!r}")
    return float(timeout_s)


def compile_grouped_matmul(load_path: str = "tma", cc: int = 90, timeout_s: float = 600) -> CompiledKernel:
    """Compile the grouped matmul for sm_`cc` with `load_path` "tma" (tensor descriptors where the target
    has TMA) or "pointer" (use_tma=False), in a child process stopped after `timeout_s` seconds. Raises
    TypeError for a `cc` that is not an int or a `timeout_s` that is not a number, ValueError for an unknown
    path or target or a `timeout_s` <= 0, and RuntimeError with the compiler's error if the compile fails
    or takes longer than `timeout_s`."""
    if load_path not in LOAD_PATHS:
        raise ValueError(f"load_path must be one of {LOAD_PATHS}, got {load_path!r}")
    cc = _check_int("cc", cc, TARGETS)
    timeout_s = _check_timeout(timeout_s)
    if cc not in TARGETS:
        raise ValueError(f"cc must be one of {TARGETS} (sm_80 A100, sm_90 H100/H200, sm_100 B200), got {cc!r}")
    return _child([load_path, str(cc)], f"grouped_matmul_kernel for sm_{cc}", timeout_s)


def compile_gluon_fp8(block_m: int = 128, timeout_s: float = 600) -> CompiledKernel:
    """Compile the warp-specialized Gluon FP8 GEMM (`moe_lab.gluon_fp8`) for sm_90 with BLOCK_SIZE_M `block_m`
    (64: one MMA warpgroup, 128: two), in a child process as `compile_grouped_matmul` does. Its load_path is
    "gluon". Raises TypeError / ValueError for arguments as `compile_grouped_matmul` does, and RuntimeError with
    the compiler's error (or this Triton's missing Gluon) if the compile fails or takes longer than `timeout_s`."""
    block_m = _check_int("block_m", block_m, (64, 128))
    timeout_s = _check_timeout(timeout_s)
    if block_m not in (64, 128):
        raise ValueError(f"block_m must be 64 or 128 (one or two MMA warpgroups), got {block_m!r}")
    return _child(["gluon", str(block_m)], "fp8_grouped_matmul_ws_kernel for sm_90", timeout_s)


class CompileFailed(RuntimeError):
    """In the child: the compiler's own error, recorded by the compile-only Session (the child prints it
    alone, no traceback of ours around it)."""


def _child(argv: List[str], what: str, timeout_s: float) -> CompiledKernel:
    env = dict(os.environ, TRITON_INTERPRET="0")
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, *argv], capture_output=True, text=True, env=env, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"compiling {what} took longer than timeout_s={timeout_s:g} s and was stopped (a first compile "
            "takes seconds to a minute; later ones come from Triton's cache)"
        ) from None
    result = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not result:
        raise RuntimeError(
            f"compiling {what} failed (`moe-lab doctor` checks Triton's cache folder):\n{done.stderr[-3000:]}"
        )
    return CompiledKernel(**json.loads(result[-1]))


def _the_kernel(session, name: str):
    """The one compiled kernel `name` of the Session, or CompileFailed with the compiler's error where none
    came back (an unusable Triton cache folder, a ptxas error)."""
    found = [k for k in session.kernels.values() if k.name == name]
    if len(found) == 1:
        return found[0]
    errors = [o["error"] for o in session.outcomes.values() if o.get("error")]
    raise CompileFailed(
        "\n".join(errors) if errors else f"{len(found)} compiled kernels named {name} came back, not one"
    )


def _compile_gluon_in_this_process(block_m: int) -> dict:
    import torch

    from .. import AlignedRouting, capability
    from . import compile_only

    problem = capability._gluon_problem()
    if problem:
        raise RuntimeError(problem)
    compile_only.patch_moe_lab()
    from ..gluon_fp8 import grouped_matmul_fp8_gluon

    def meta(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device="meta")

    num_experts, n, k, rows, fp8, f32 = 8, 256, 512, 1024, torch.float8_e4m3fn, torch.float32
    routing = AlignedRouting(
        meta(num_experts), meta(rows), meta(rows // block_m), meta(1), block_m, 256, 2, num_experts
    )
    session = compile_only.Session(compile_missing=True)
    with compile_only.fake_gpu(90, session):
        grouped_matmul_fp8_gluon(
            meta(rows, k, dtype=fp8),
            meta(num_experts, n, k, dtype=fp8),
            routing,
            gather_a=False,
            a_scale=meta(rows, k // 128, dtype=f32),
            w_scale=meta(num_experts, n // 128, k // 128, dtype=f32),
        )
    kernel = _the_kernel(session, "fp8_grouped_matmul_ws_kernel")
    return {
        "load_path": "gluon",
        "cc": 90,
        "ptx": kernel.asm["ptx"],
        "shared_bytes": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
    }


def _compile_in_this_process(load_path: str, cc: int) -> dict:
    import torch

    from .. import AlignedRouting, GemmConfig, grouped_matmul
    from . import compile_only

    compile_only.patch_moe_lab()

    def meta(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device="meta")

    num_experts, n, k, block_m, rows = 8, 256, 512, 64, 1024
    routing = AlignedRouting(
        meta(num_experts), meta(rows), meta(rows // block_m), meta(1), block_m, 256, 2, num_experts
    )
    a, w = meta(rows, k, dtype=torch.bfloat16), meta(num_experts, n, k, dtype=torch.bfloat16)
    session = compile_only.Session(compile_missing=True)
    with compile_only.fake_gpu(cc, session):
        grouped_matmul(
            a,
            w,
            routing,
            GemmConfig(block_m, 128, 64, 8, 4, 3),
            gather_a=False,
            use_tma="auto" if load_path == "tma" else False,
        )
    kernel = _the_kernel(session, "grouped_matmul_kernel")
    return {
        "load_path": load_path,
        "cc": cc,
        "ptx": kernel.asm["ptx"],
        "shared_bytes": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
    }


if __name__ == "__main__":
    try:
        if sys.argv[1] == "gluon":
            print(json.dumps(_compile_gluon_in_this_process(int(sys.argv[2]))))
        else:
            print(json.dumps(_compile_in_this_process(sys.argv[1], int(sys.argv[2]))))
    except CompileFailed as exc:  # the compiler's error is the whole story
        print(exc, file=sys.stderr)
        sys.exit(1)
