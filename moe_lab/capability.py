"""Can this device and this Triton load tiles with TMA, and if not, why not. Whether a given call uses it
is the launch plan's answer (`grouped_matmul(..., return_plan=True)`, `select_load_path`), built on
this one.

Two questions, asked at two moments:
- `tma_support(device)`: once per device (cached): does Triton have host tensor descriptors
  (`triton.tools.tensor_descriptor.TensorDescriptor`, Triton >= 3.4), is the device an NVIDIA GPU (not
  ROCm/HIP or XPU, whose version numbers are not CUDA capabilities) of compute capability >= 9.0?
  Under the interpreter descriptors are emulated on the CPU: right results, no speed.
  `MOE_LAB_TMA=0|1|auto` overrides (0 = never, 1 = whenever the tensors allow, even below 9.0, where
  Triton lowers descriptor loads to plain loads).
- `descriptor_problem(tensor, block_shape)`: per call: does this tensor meet the descriptor rules
  (16-byte aligned base and strides but the last, last stride 1, at least 16 bytes in the inner block
  dimension, no empty dimension)? Returns None or the broken rule in words.

A third, for the FP8 path: `fp8_support(device)` (cached): is the device an NVIDIA GPU of compute capability
>= 8.9 (Ada, Hopper and later: FP8 e4m3 tensor cores; Triton has no float8e4nv below that), or is the
interpreter on (e4m3 emulated on the CPU)?
`require_fp8(device, what)` raises the FP8 launchers' "cannot run here" RuntimeError with its reason.

Every rule reads the device through one function (`_device_facts`). `assumed_device(...)` makes them all,
and the shared-memory limit, budget and SM count, answer for a GPU that is not there: the compile-only check
(`moe_lab.tools.compile_only`) compiles kernels for sm_80/90/100 on meta tensors with the real rules.

Source: Triton's `TensorDescriptor` checks (python/triton/tools/tensor_descriptor.py) and the CUDA
driver's `cuTensorMapEncodeTiled` requirements.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Tuple, Union

import torch

from ._validate import is_bool
from .runtime import interpreter_active

ENV_VAR = "MOE_LAB_TMA"


@dataclass(frozen=True)
class TmaSupport:
    """`available`: the TMA path may be used on this device. `reason`: why, or why not, in words.
    `emulated`: descriptors run under the interpreter (correctness only)."""

    available: bool
    reason: str
    emulated: bool = False

    def __bool__(self) -> bool:
        return self.available


def _has_tensor_descriptor() -> bool:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def env_setting(var: str) -> str:
    """A moe-lab switch from the environment (MOE_LAB_TMA, MOE_LAB_GLUON): "0", "1" or "auto" (the default,
    also when set empty, as `VAR= cmd` does). Raises ValueError, showing the value as set, for others."""
    setting = os.environ.get(var, "")
    value = setting.strip().lower() or "auto"
    if value not in ("0", "1", "auto"):
        raise ValueError(f"{var} must be 0, 1 or auto, got {setting!r}")
    return value


def env_override() -> str:
    """The `MOE_LAB_TMA` setting (`env_setting`)."""
    return env_setting(ENV_VAR)


def _device_key(device) -> str:
    """The device asked about, as a cache key: the current CUDA device by default (the CPU under the
    interpreter or without a GPU), "cuda" made "cuda:<current index>"."""
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if (torch.cuda.is_available() and not interpreter_active())
            else torch.device("cpu")
        )
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise TypeError(f"device: expected a torch.device or a string such as 'cuda:0', got {device!r}") from exc
    if device.type == "cuda" and torch.cuda.is_available():
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} does not exist ({torch.cuda.device_count()} CUDA device(s) visible)")
    return str(device)


@dataclass(frozen=True)
class DeviceFacts:
    """An NVIDIA GPU as moe-lab's device rules read it: `name`, CUDA compute `capability` (major, minor),
    `max_shared_mem` (bytes of shared memory one program may use, opt-in) and `multiprocessor_count`."""

    name: str
    capability: Tuple[int, int]
    max_shared_mem: int
    multiprocessor_count: int

    problem = None  # not a field: an assumed device is an NVIDIA CUDA GPU (`_VisibleDevice.problem` asks)


class _VisibleDevice:
    """The device a tensor is on, as the rules read it, each fact when first asked: `problem` (why it is not an
    NVIDIA CUDA GPU, or None), `name` and `capability` (PyTorch's; ask only where `problem` is None),
    `max_shared_mem` and `multiprocessor_count` (Triton's driver, on any GPU it drives; read only by the two
    functions that answer them, so the TMA/FP8/Gluon rules never start the driver)."""

    def __init__(self, device_key: str):
        self.device = torch.device(device_key)

    @property
    def problem(self) -> Optional[str]:
        if getattr(torch.version, "hip", None):
            return f"ROCm/HIP build of PyTorch ({torch.version.hip}): an NVIDIA feature"
        if self.device.type != "cuda":
            return f"device {self.device} is not a CUDA GPU"
        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to PyTorch"
        return None

    @property
    def name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    @property
    def capability(self) -> Tuple[int, int]:
        return tuple(torch.cuda.get_device_capability(self.device))

    def _properties(self) -> dict:
        import triton

        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return triton.runtime.driver.active.utils.get_device_properties(index)

    @property
    def max_shared_mem(self) -> int:
        return int(self._properties()["max_shared_mem"])

    @property
    def multiprocessor_count(self) -> int:
        return int(self._properties()["multiprocessor_count"])


# The device every rule answers for while `assumed_device` is on; None: each asks about the real one.
# Process-wide, not per thread: the compile check assumes one fake GPU at a time.
_ASSUMED: Optional[DeviceFacts] = None


@contextlib.contextmanager
def assumed_device(
    name: str, capability: Tuple[int, int], max_shared_mem: int, multiprocessor_count: int
) -> Iterator[DeviceFacts]:
    """Within: moe-lab's device rules answer for this NVIDIA GPU, whatever device they are asked about (the
    default one, CPU or meta tensors): `tma_support`, `fp8_support`, `gluon_fp8_support`, `shared_memory_limit`,
    `multiprocessor_count` and `shared_memory_budget` (then counted for any device). For compiling kernels
    for a GPU that is not there (`moe_lab.tools.compile_only.fake_gpu`); kernels are not launched on it. The
    interpreter and `MOE_LAB_TMA` still count as they do on a real GPU. Nests: leaving restores the device
    assumed before, or none. This module's answers are cached per assumed device, so none outlives it; layer
    plans made before (`moe_lab.plan.clear_layer_plans`) are the caller's to clear. Yields the facts.
    `capability`: (major, minor), e.g. (9, 0). Raises TypeError/ValueError for a capability that is not two
    ints >= 0, or a shared-memory size or SM count that is not an int >= 1."""
    try:
        if any(is_bool(v) for v in (*capability, max_shared_mem, multiprocessor_count)):
            raise TypeError  # True would pass as 1
        major, minor = (operator.index(v) for v in capability)
        max_shared_mem, multiprocessor_count = operator.index(max_shared_mem), operator.index(multiprocessor_count)
    except (TypeError, ValueError):
        raise TypeError(
            "assumed_device: capability must be (major, minor) ints, max_shared_mem and multiprocessor_count ints; "
            f"got {capability!r}, {max_shared_mem!r}, {multiprocessor_count!r}"
        ) from None
    if major < 0 or minor < 0 or max_shared_mem < 1 or multiprocessor_count < 1:
        raise ValueError(
            f"assumed_device: capability ({major}, {minor}) must be >= 0, max_shared_mem {max_shared_mem} and "
            f"multiprocessor_count {multiprocessor_count} >= 1"
        )
    global _ASSUMED
    facts = DeviceFacts(str(name), (major, minor), max_shared_mem, multiprocessor_count)
    previous, _ASSUMED = _ASSUMED, facts
    try:
        yield facts
    finally:
        _ASSUMED = previous


def assumed_facts() -> Optional[DeviceFacts]:
    """The device `assumed_device` assumes now, or None outside it."""
    return _ASSUMED


def _asked(device, default=None) -> Tuple[str, Optional[DeviceFacts]]:
    """The cache key of a device question: the device asked about (`_device_key`; `default` for None) and the
    device assumed now (None if none), so that no answer for one is given for the other."""
    return _device_key(device if device is not None else default), _ASSUMED


def _device_facts(device_key: str, assumed: Optional[DeviceFacts]) -> Union[DeviceFacts, _VisibleDevice]:
    """The device the rules answer for: `assumed` (the `assumed_device`, whatever `device_key` names), or
    else the device `device_key` names (its facts read when asked)."""
    return assumed if assumed is not None else _VisibleDevice(device_key)


@functools.lru_cache(maxsize=None)
def _tma_support_cached(
    device_key: str, assumed: Optional[DeviceFacts], override: str, interpreted: bool
) -> TmaSupport:
    import triton

    if override == "0":
        return TmaSupport(False, f"disabled by {ENV_VAR}=0")
    if not _has_tensor_descriptor():
        return TmaSupport(
            False,
            f"Triton {triton.__version__} has no triton.tools.tensor_descriptor.TensorDescriptor (needs Triton >= 3.4)",
        )
    if interpreted:
        return TmaSupport(
            True,
            "Triton interpreter: tensor descriptors are emulated on the CPU "
            "(checks correctness, says nothing about speed)",
            emulated=True,
        )
    device = _device_facts(device_key, assumed)
    if device.problem:
        return TmaSupport(False, device.problem.replace("an NVIDIA feature", "TMA is an NVIDIA Hopper feature"))
    name, (major, minor) = device.name, device.capability
    if (major, minor) < (9, 0):
        if override == "1":
            return TmaSupport(
                True,
                f"{name} is sm_{major}{minor} (< 9.0) but {ENV_VAR}=1: Triton lowers descriptor loads to plain loads",
            )
        return TmaSupport(False, f"{name} has compute capability {major}.{minor}; TMA needs >= 9.0 (Hopper)")
    return TmaSupport(True, f"{name}, compute capability {major}.{minor}, Triton {triton.__version__}")


def tma_support(device: Optional[torch.device | str] = None) -> TmaSupport:
    """Whether the TMA path can be used for tensors on `device` (default: the current CUDA device, or
    the CPU under the interpreter; the assumed one within `assumed_device`), with the reason. Cached per
    device and setting."""
    return _tma_support_cached(*_asked(device), env_override(), interpreter_active())


@dataclass(frozen=True)
class Fp8Support:
    """`available`: FP8 (float8_e4m3fn) kernels may run on this device. `reason`: why, or why not, in
    words. `emulated`: e4m3 is emulated under the interpreter (correctness only)."""

    available: bool
    reason: str
    emulated: bool = False

    def __bool__(self) -> bool:
        return self.available


@functools.lru_cache(maxsize=None)
def _fp8_support_cached(device_key: str, assumed: Optional[DeviceFacts], interpreted: bool) -> Fp8Support:
    import triton

    if interpreted:
        return Fp8Support(
            True,
            "Triton interpreter: float8 e4m3 is emulated on the CPU (checks correctness, says nothing about speed)",
            emulated=True,
        )
    device = _device_facts(device_key, assumed)
    if device.problem:
        return Fp8Support(
            False,
            device.problem.replace(
                "an NVIDIA feature",
                "moe-lab's FP8 path targets NVIDIA's float8_e4m3fn tensor cores (compute capability >= 8.9)",
            ),
        )
    name, (major, minor) = device.name, device.capability
    if (major, minor) < (8, 9):
        return Fp8Support(
            False, f"{name} has compute capability {major}.{minor}; FP8 tensor cores need >= 8.9 (Ada, Hopper)"
        )
    return Fp8Support(True, f"{name}, compute capability {major}.{minor}, Triton {triton.__version__}")


def fp8_support(device: Optional[torch.device | str] = None) -> Fp8Support:
    """Whether FP8 (float8_e4m3fn) kernels can run for tensors on `device` (default: the current CUDA
    device, or the CPU under the interpreter; the assumed one within `assumed_device`), with the reason.
    Cached per device. Source: NVIDIA's FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0
    (Hopper); Triton's float8e4nv type compiles only there ("fp8e4nv not supported" below)."""
    return _fp8_support_cached(*_asked(device), interpreter_active())


def require_fp8(device: Optional[torch.device | str], what: str) -> None:
    """Returns if FP8 kernels can run for tensors on `device` (`fp8_support`); else raises
    RuntimeError(f"{what} cannot run here: {reason}"), `what` naming the refused inputs or kernels (e.g.
    "float8_e4m3fn weights")."""
    support = fp8_support(device)
    if not support:
        raise RuntimeError(f"{what} cannot run here: {support.reason}")


def _gluon_problem() -> Optional[str]:
    """Why this Triton cannot build moe-lab's warp-specialized Gluon kernel, or None."""
    import triton

    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
    except ImportError as exc:
        return f"Triton {triton.__version__} has no Gluon for Hopper ({exc})"
    missing = [name for name in ("warpgroup_mma", "warpgroup_mma_wait", "mbarrier", "tma") if not hasattr(hopper, name)]
    if not hasattr(gl, "warp_specialize"):
        missing.insert(0, "gluon.language.warp_specialize")
    if missing:
        return f"Triton {triton.__version__}'s Gluon lacks {', '.join(missing)}"
    return None


@functools.lru_cache(maxsize=None)
def _gluon_fp8_support_cached(device_key: str, assumed: Optional[DeviceFacts], interpreted: bool) -> Optional[str]:
    problem = _gluon_problem()
    if problem:
        return problem
    if interpreted:
        return "the Triton interpreter is on: Gluon kernels compile for a GPU and are not interpreted"
    device = _device_facts(device_key, assumed)
    if device.problem:
        return device.problem.replace("an NVIDIA feature", "the Gluon FP8 kernel is written for NVIDIA Hopper (sm_90)")
    name, (major, minor) = device.name, device.capability
    if (major, minor) != (9, 0):
        return f"{name} has compute capability {major}.{minor}; the Gluon FP8 kernel uses Hopper's wgmma (sm_90 only)"
    return None


def gluon_fp8_support(device: Optional[torch.device | str] = None) -> Optional[str]:
    """None if the warp-specialized Gluon FP8 grouped GEMM (`moe_lab.gluon_fp8`) can run for tensors on
    `device` (default: the current CUDA device, or the CPU under the interpreter; the assumed one within
    `assumed_device`), else why not in words:
    no Gluon or no `warp_specialize` in this Triton, the interpreter, not a CUDA GPU, not sm_90 (its wgmma
    and register layouts are Hopper's). Cached per device. The Triton FP8 kernel runs wherever this says no."""
    return _gluon_fp8_support_cached(*_asked(device), interpreter_active())


def descriptor_problem(tensor: torch.Tensor, block_shape: Sequence[int]) -> Optional[str]:
    """None if a tensor descriptor with `block_shape` can be built over `tensor`, else the rule it breaks.
    Checks what Triton's host TensorDescriptor asserts and what the TMA unit needs beyond it (box dims of
    at most 256 elements, at least 16 bytes in the inner one). Raises TypeError if `tensor` is not a tensor
    or `block_shape` not a sequence of ints."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    try:
        block_shape = [operator.index(b) for b in block_shape]
    except TypeError:
        raise TypeError(f"block_shape: expected a sequence of ints, got {block_shape!r}") from None
    item = tensor.element_size()
    if tensor.dim() != len(block_shape):
        return f"rank {tensor.dim()} does not match block shape {list(block_shape)}"
    if any(b < 1 or b & (b - 1) or b > 256 for b in block_shape):
        return f"block shape {list(block_shape)}: each dimension must be a power of two of at most 256 (TMA box limit)"
    if any(s == 0 for s in tensor.shape):
        return f"shape {tuple(tensor.shape)} has an empty dimension"
    if tensor.stride(-1) != 1:
        return f"last stride is {tensor.stride(-1)}, must be 1 (contiguous rows)"
    if tensor.data_ptr() % 16:
        return f"base address is not 16-byte aligned (address % 16 = {tensor.data_ptr() % 16})"
    for dim, stride in enumerate(tensor.stride()[:-1]):
        if (stride * item) % 16:
            return f"stride of dimension {dim} is {stride * item} bytes, not a multiple of 16"
    if block_shape[-1] * item < 16:
        return f"inner block dimension is {block_shape[-1] * item} bytes, must be at least 16"
    return None


@functools.lru_cache(maxsize=None)
def _limits_cached(device_key: str, assumed: Optional[DeviceFacts]) -> Tuple[int, int]:
    device = _device_facts(device_key, assumed)
    return device.max_shared_mem, device.multiprocessor_count


@functools.lru_cache(maxsize=None)
def _limits(device, assumed: Optional[DeviceFacts]) -> Tuple[int, int]:
    # keyed on the device as given: a launch's repeated question costs a cache hit, not `_device_key`
    return _limits_cached(_device_key(device if device is not None else "cuda"), assumed)


def shared_memory_limit(device: Optional[torch.device | str] = None) -> int:
    """Bytes of shared memory one program may use on a GPU (default: the current CUDA device; the assumed one
    within `assumed_device`), as Triton's driver reports it. Cached per device."""
    return _limits(device, _ASSUMED)[0]


def multiprocessor_count(device: Optional[torch.device | str] = None) -> int:
    """Streaming multiprocessors of a GPU (default: the current CUDA device; the assumed one within
    `assumed_device`): the grid of a persistent kernel. Cached per device."""
    return _limits(device, _ASSUMED)[1]


def shared_memory_budget(device: torch.device | str) -> Optional[int]:
    """Bytes of shared memory one program may use where kernels compile for a GPU: tensors on a CUDA device,
    or on any device within `assumed_device` (the compile check's meta tensors); None under the interpreter
    and elsewhere (no limit to fit)."""
    if interpreter_active() or (torch.device(device).type != "cuda" and _ASSUMED is None):
        return None
    return shared_memory_limit(device)
