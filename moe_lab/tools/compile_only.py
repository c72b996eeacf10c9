"""Compile Triton kernels for a GPU that is not there: a fake Triton driver and compile-only launches.

Set TRITON_INTERPRET=0 before `moe_lab` is first imported (so `@triton.jit` makes real JITFunctions, not
interpreted ones); importing this module checks it. Used by the compile-only CI check (.ci/compile_check.py)
and by `moe_lab.tools.look_inside` (the PTX of a kernel for a GPU that is not there), each in a process of its own.
Inside `fake_gpu(cc, session)` every `kernel[grid](...)` goes to Triton's own `JITFunction.run(...,
warmup=True)`: Triton binds and specializes the arguments as for a launch on that GPU, its JIT cache hook
hands the specialization to the `Session` (which records it, or compiles it), and nothing is launched.
Tensors may live on the meta device: Triton only looks at dtype, shape, strides and `data_ptr() % 16`
(0 on meta), and any read of a buffer's contents raises.

What is faked, and nothing else:
- Triton's driver: target GPUTarget("cuda", cc, 32), device index = cc (so Triton's per-device kernel
  caches keep the targets apart), stream 0, and the real GPUs' shared memory per block (DEVICES);
- the GPU moe_lab's device rules answer for: `fake_gpu` assumes DEVICES[cc] (`moe_lab.capability.assumed_device`),
  so the real rules (`tma_support`, `fp8_support`, `gluon_fp8_support`) answer for it whatever the tensors'
  device (meta here), and the launch plan fits its config to its shared memory and sizes persistent grids by
  its SMs, as for CUDA tensors;
- meta storages' addresses, for moe_lab's aliasing checks (`patch_moe_lab`);
- the checks Triton makes when it loads a compiled kernel (`CompiledKernel._init_handles`: shared
  memory, tensor memory, threads per block) run after the compile and raise `OutOfResources` as that
  launch would, so a launcher's own handling (grouped_matmul's retry with fewer stages) runs.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.autotuner import OutOfResources
from triton.runtime.jit import JITFunction

from ..runtime import interpreter_active

if interpreter_active():
    raise RuntimeError(
        "moe_lab.tools.compile_only compiles real kernels: set TRITON_INTERPRET=0 in the environment "
        "before moe_lab is first imported (here the interpreter is on, so every kernel is an "
        "interpreted function)"
    )


@dataclass(frozen=True)
class Device:
    name: str
    max_shared_mem: int  # bytes per block (opt-in), as cudaDevAttrMaxSharedMemoryPerBlockOptin reports
    sm_count: int


# The GPU each target stands for: the launcher's shared-memory fit and Triton's launch check use these.
DEVICES = {
    80: Device("NVIDIA A100-SXM4-80GB", 166912, 108),
    90: Device("NVIDIA H200", 232448, 132),
    100: Device("NVIDIA B200", 232448, 148),
}


class _Utils:
    def get_device_properties(self, device):
        d = DEVICES[device]
        return {
            "max_shared_mem": d.max_shared_mem,
            "multiprocessor_count": d.sm_count,
            "max_num_regs": 65536,
            "warpSize": 32,
            "sm_clock_rate": 1980000,
            "mem_clock_rate": 2619000,
            "mem_bus_width": 5120,
        }


class FakeCudaDriver:
    """What `JITFunction.run(..., warmup=True)` asks of the active driver, for a GPU of capability `cc`."""

    def __init__(self, cc: int = 90):
        self.cc = cc
        self.utils = _Utils()

    @staticmethod
    def is_active():
        return False

    def get_current_target(self):
        return GPUTarget("cuda", self.cc, 32)

    def get_current_device(self):
        return self.cc

    def set_current_device(self, device):
        self.cc = device

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("meta")

    def get_benchmarker(self):
        raise RuntimeError("compile-only check: nothing is launched, nothing can be timed")


DRIVER = FakeCudaDriver()
_ORIGINAL_RUN = JITFunction.run


@triton.jit
def _probe_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, offs)


def target_supported(cc: int) -> Optional[str]:
    """None if this Triton compiles a tiny kernel for sm_`cc` through to cubin, else the error."""
    session = Session(compile_missing=True)
    with fake_gpu(cc, session):
        session.launch(_probe_kernel, (torch.empty(64, dtype=torch.int32, device="meta"),), {"BLOCK": 64})
    for outcome in session.outcomes.values():
        return outcome["error"] and outcome["error"].splitlines()[0]
    return "the probe kernel was not compiled"


# --- what moe_lab needs beyond the assumed device ---------------------------------------------------

_PATCHED = False


def patch_moe_lab() -> None:
    """Make meta tensors pass moe_lab's aliasing checks (each meta storage gets a stand-in address of its
    own). Call once, before `fake_gpu`; idempotent. moe_lab's device questions need nothing here: `fake_gpu`
    assumes the fake GPU (`moe_lab.capability.assumed_device`) and the real rules answer for it."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    # A shim, not a moe_lab override: every meta storage reports address 0, so an aliasing check
    # (permute_tokens: "out shares memory with hidden_states") would see any two meta buffers as one, and
    # PyTorch has no other way to give meta storages addresses: each gets its StorageImpl's. Tensors'
    # data_ptr(), which Triton specializes on, stay 0 (aligned).
    storage_data_ptr = torch.UntypedStorage.data_ptr

    def data_ptr(self):
        return self._cdata if self.device.type == "meta" else storage_data_ptr(self)

    torch.UntypedStorage.data_ptr = data_ptr


# --- compile-only launches ---------------------------------------------------------------------------

# Constexprs of moe_lab's kernels that only set integer constants of index arithmetic (a divisor, a
# tile-order group size, an unrolled loop count, a rounding step): variants that differ only in these
# compile alike (same code shape, same layouts, same shared memory), so one of them stands for the rest.
EQUIVALENT_CONSTEXPRS = {
    "*": frozenset({"TOP_K", "GROUP_SIZE_M"}),
    "moe_lab._kernels.align.prefix_kernel": frozenset({"BLOCK_SIZE_M"}),  # only cdiv(total, BLOCK_SIZE_M)
    # rounding step, and the width of the masked int32 store of padding sentinels (no dot, no reduction)
    "moe_lab._kernels.align.scatter_kernel": frozenset({"BLOCK_SIZE_M"}),
}


def _equivalent_names(fn: JITFunction) -> frozenset:
    if not fn.__module__.startswith("moe_lab."):
        return frozenset()  # notebook kernels: each variant compiled
    return EQUIVALENT_CONSTEXPRS["*"] | EQUIVALENT_CONSTEXPRS.get(f"{fn.__module__}.{fn.__name__}", frozenset())


@dataclass
class Variant:
    """One distinct specialization (Triton's own cache key) of one kernel for one target."""

    index: int
    cc: int
    fn: JITFunction
    args: tuple
    kwargs: dict
    key: str
    group: tuple  # equal for variants that compile alike (EQUIVALENT_CONSTEXPRS aside)
    constants: Dict[str, Any]
    signature: Dict[str, str]
    options: str
    launched_by: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.fn.__name__

    def describe(self) -> str:
        consts = ", ".join(f"{k}={v}" for k, v in self.constants.items())
        return f"{self.name}[{consts}] {self.options}".rstrip()

    def cost(self) -> float:
        """Rough compile cost, to start the slow ones first: the tile size, fp32 dots the most."""
        c = self.constants
        tile = 1
        for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            tile *= c[k] if isinstance(c.get(k), int) else 1
        fp32 = any("fp32" in t for t in self.signature.values()) and c.get("FP32_IEEE", False)
        return tile * (4 if fp32 else 1) + max((c[k] for k in ("NUM_BINS",) if isinstance(c.get(k), int)), default=0)


def _param_name(fn: JITFunction, path) -> str:
    names = [p.name for p in fn.params]
    idx = path[0] if isinstance(path, tuple) else path
    name = names[idx] if isinstance(idx, int) and idx < len(names) else str(path)
    if isinstance(path, tuple) and len(path) > 1:
        name += "".join(f"[{i}]" for i in path[1:])
    return name


def _constants(fn: JITFunction, info: dict) -> Dict[str, Any]:
    """Declared constexpr arguments by name (Triton keys them by path, e.g. (12,), and also lists run-time
    arguments it folded, such as None pointers; those stay in the key but are not shown here)."""
    constexpr = {p.name for p in fn.params if p.is_constexpr}
    out = {}
    for path, value in (info.get("constants") or {}).items():
        name = _param_name(fn, path)
        if name in constexpr:
            out[name] = getattr(value, "value", value)
    return out


def _signature(info: dict) -> Dict[str, str]:
    """Run-time arguments and the types Triton specialized them to (e.g. '*bf16', 'i32')."""
    return {k: str(v) for k, v in (info.get("signature") or {}).items() if v != "constexpr"}


def _group(cc: int, fn: JITFunction, info: dict, key: str, equivalent: bool) -> tuple:
    if not equivalent:
        return (cc, fn.cache_key, key)
    ignored = _equivalent_names(fn)
    consts = sorted(
        (repr(path), repr(v))
        for path, v in (info.get("constants") or {}).items()
        if _param_name(fn, path) not in ignored
    )
    options = tuple(info.get(k) for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion"))
    return (
        cc,
        fn.cache_key,
        repr(sorted((info.get("signature") or {}).items())),
        repr(consts),
        repr(info.get("configs")),
        options,
    )


def _options(kwargs: dict) -> str:
    return " ".join(f"{k}={kwargs[k]}" for k in ("num_warps", "num_stages", "num_ctas") if k in kwargs)


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception that `exc` was raised from or while handling."""
    seen = {id(exc)}
    while (exc.__cause__ or exc.__context__) is not None and id(exc.__cause__ or exc.__context__) not in seen:
        exc = exc.__cause__ or exc.__context__
        seen.add(id(exc))
    return exc


def format_error(exc: BaseException, limit: int = 30) -> str:
    """The compiler's message (Triton's CompilationError: source line and cause; or the tail of a ptxas /
    MLIR error), shortened to `limit` lines."""
    text = str(exc).strip() or repr(exc)
    lines = text.splitlines()
    lines[0] = f"{type(exc).__name__}: {lines[0]}"
    root = root_cause(exc)
    if root is not exc:  # Triton's CompilationError wraps the cause (a NameError, an assertion) in layers
        lines.append(f"caused by {type(root).__name__}: {' '.join(str(root).split())[:600]}")
    if len(lines) > limit:
        lines = lines[: limit // 2] + [f"... ({len(lines) - limit} lines left out) ..."] + lines[-limit // 2 :]
    return "\n".join(lines)


def outcome_of(kernel, seconds: float) -> dict:
    md = kernel.metadata
    return {
        "error": None,
        "seconds": seconds,
        "shared": md.shared,
        "num_warps": md.num_warps,
        "tmem_size": getattr(md, "tmem_size", None),
    }


def check_resources(outcome: dict) -> None:
    """What Triton checks when it loads a compiled kernel on the device (CompiledKernel._init_handles):
    raises OutOfResources as that launch would."""
    limit = DEVICES[DRIVER.cc].max_shared_mem
    if outcome["shared"] > limit:
        raise OutOfResources(outcome["shared"], limit, "shared memory")
    if outcome.get("tmem_size") is not None and outcome["tmem_size"] > 512:
        raise OutOfResources(outcome["tmem_size"], 512, "tensor memory")
    if outcome["num_warps"] * 32 > 1024:
        raise OutOfResources(outcome["num_warps"] * 32, 1024, "threads")


class Session:
    """Takes every `kernel[grid](...)` while active (see `fake_gpu`).

    Triton binds and specializes each launch as for the fake GPU; the JIT cache hook stops it before
    compiling. New specializations become `variants` (one per Triton key; `group` joins equivalent
    ones). Where `outcomes` holds the group's compile result (from the worker processes), the launch
    acts on it: a compile error makes it return None (the caller goes on, so one broken kernel hides
    no other), a kernel too big for the device raises OutOfResources as the real launch would (so the
    launcher's own retry with fewer stages runs). With `compile_missing`, a group with no outcome yet
    (such a retry) is compiled here and now.
    """

    def __init__(
        self, outcomes: Optional[Dict[tuple, dict]] = None, compile_missing: bool = False, equivalent: bool = True
    ):
        self.outcomes: Dict[tuple, dict] = outcomes if outcomes is not None else {}
        self.compile_missing = compile_missing
        self.equivalent = equivalent
        self.label = ""
        self.variants: Dict[tuple, Variant] = {}
        self.order: List[Variant] = []
        self.representatives: Dict[tuple, Variant] = {}  # group -> first variant seen
        self.kernels: Dict[tuple, Any] = {}  # group -> CompiledKernel, for those compiled here
        self.exceptions: Dict[tuple, BaseException] = {}  # group -> the compiler's exception, for those that failed

    def launch(self, fn: JITFunction, args, kwargs):
        seen: dict = {}

        def hook(*, key, compile, **_):
            seen.update(key=key, info=compile)
            seen["group"] = _group(DRIVER.cc, fn, compile, key, self.equivalent)
            return not (self.compile_missing and seen["group"] not in self.outcomes)  # True: do not compile

        import triton.knobs as knobs

        previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
        start = time.perf_counter()
        try:
            kernel = _ORIGINAL_RUN(fn, *args, grid=None, warmup=True, **kwargs)
            error = None
        except Exception as exc:  # noqa: BLE001
            if "key" not in seen:
                raise  # failed before compiling (binding, specialization): the launch code's error
            kernel, error = None, format_error(exc)
            seen["exception"] = exc
        finally:
            knobs.runtime.jit_cache_hook = previous
        if "key" not in seen:  # Triton's in-memory cache: compiled here earlier
            check_resources(outcome_of(kernel, 0.0))
            return kernel
        variant = self._variant(fn, args, kwargs, seen)
        if kernel is not None or error is not None:  # compiled (or failed) just now
            self.outcomes[variant.group] = (
                outcome_of(kernel, time.perf_counter() - start)
                if kernel
                else {"error": error, "seconds": time.perf_counter() - start}
            )
            if kernel is not None:
                self.kernels[variant.group] = kernel
            if "exception" in seen:
                self.exceptions[variant.group] = seen["exception"]
        outcome = self.outcomes.get(variant.group)
        if outcome is None or outcome["error"]:
            return None
        check_resources(outcome)
        return kernel

    def _variant(self, fn, args, kwargs, seen) -> Variant:
        ident = (DRIVER.cc, fn.cache_key, seen["key"])
        variant = self.variants.get(ident)
        if variant is None:
            info = seen["info"]
            variant = Variant(
                len(self.order),
                DRIVER.cc,
                fn,
                args,
                dict(kwargs),
                seen["key"],
                seen["group"],
                _constants(fn, info),
                _signature(info),
                _options(kwargs),
            )
            self.variants[ident] = variant
            self.order.append(variant)
            self.representatives.setdefault(variant.group, variant)
        if self.label and self.label not in variant.launched_by:
            variant.launched_by.append(self.label)
        return variant


_ACTIVE: List[Session] = []


def _run(self, *args, grid, warmup, **kwargs):
    if not _ACTIVE:
        return _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
    return _ACTIVE[-1].launch(self, args, kwargs)


@contextlib.contextmanager
def fake_gpu(cc: int, session: Session):
    """Within: the fake driver is sm_`cc`, moe_lab's device rules answer for `DEVICES[cc]` (as read on
    entry; `moe_lab.capability.assumed_device`), and every kernel launch goes to `session`; after it, Triton's
    driver is the one before. Raises ValueError for a cc not in DEVICES."""
    if cc not in DEVICES:
        raise ValueError(f"unknown target sm_{cc}; known: {sorted(DEVICES)}")
    from ..capability import assumed_device
    from ..plan import clear_layer_plans  # made for the GPU they were made on: none outlives its fake GPU

    device = DEVICES[cc]
    active = triton.runtime.driver._active  # (None until first asked for: then made on demand again)
    triton.runtime.driver.set_active(DRIVER)
    JITFunction.run = _run
    previous, DRIVER.cc = DRIVER.cc, cc
    _ACTIVE.append(session)
    clear_layer_plans()
    try:
        with assumed_device(device.name, divmod(cc, 10), device.max_shared_mem, device.sm_count):
            yield session
    finally:
        clear_layer_plans()
        _ACTIVE.pop()
        DRIVER.cc = previous
        triton.runtime.driver._active = active  # the real driver again after the block


def compile_kernel(variant: Variant):
    """Compile one variant (or load it from Triton's on-disk cache): Triton's CompiledKernel, whose `asm`
    holds the stages ("ttir", "ttgir", "llir", "ptx", "cubin"). Raises what the compiler raises."""
    triton.runtime.driver.set_active(DRIVER)
    DRIVER.cc = variant.cc
    return _ORIGINAL_RUN(variant.fn, *variant.args, grid=None, warmup=True, **variant.kwargs)


def compile_variant(variant: Variant) -> dict:
    """Compile one variant (or load it from Triton's on-disk cache); its outcome, never raises."""
    start = time.perf_counter()
    try:
        kernel = compile_kernel(variant)
        return outcome_of(kernel, time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        return {"error": format_error(exc), "seconds": time.perf_counter() - start}


def run_workload(session: Session, label: str, fn: Callable[[], Any]) -> Optional[str]:
    """Run one workload (launcher calls) in `session`; None, or the error that stopped it."""
    session.label = label
    try:
        with torch.inference_mode():
            fn()
    except Exception as exc:  # noqa: BLE001 - reported by the caller
        tb = traceback.extract_tb(exc.__traceback__)
        where = next(
            (
                f"{os.path.relpath(f.filename)}:{f.lineno}"
                for f in reversed(tb)
                if os.sep + "moe_lab" + os.sep in f.filename or "notebooks" in f.filename
            ),
            "",
        )
        return f"{type(exc).__name__}: {str(exc).strip()}" + (f" (at {where})" if where else "")
    finally:
        session.label = ""
    return None
