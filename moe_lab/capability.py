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

Source: Triton's `TensorDescriptor` checks (python/triton/tools/tensor_descriptor.py) and the CUDA
driver's `cuTensorMapEncodeTiled` requirements.
"""

from __future__ import annotations

import functools
import operator
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

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


def _not_a_cuda_gpu(device_key: str) -> Optional[str]:
    """Why tensors on this device are not on a CUDA GPU (a ROCm/HIP build, another device type, no GPU
    visible), or None when they are."""
    if getattr(torch.version, "hip", None):
        return f"ROCm/HIP build of PyTorch ({torch.version.hip}): an NVIDIA feature"
    device = torch.device(device_key)
    if device.type != "cuda":
        return f"device {device} is not a CUDA GPU"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to PyTorch"
    return None


def _name_and_capability(device_key: str):
    """(name, (major, minor)) of the CUDA GPU `device_key` names (one that `_not_a_cuda_gpu` let through)."""
    device = torch.device(device_key)
    return torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)


@functools.lru_cache(maxsize=None)
def _tma_support_cached(device_key: str, override: str, interpreted: bool) -> TmaSupport:
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
    problem = _not_a_cuda_gpu(device_key)
    if problem:
        return TmaSupport(False, problem.replace("an NVIDIA feature", "TMA is an NVIDIA Hopper feature"))
    name, (major, minor) = _name_and_capability(device_key)
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
    the CPU under the interpreter), with the reason. Cached per device and setting."""
    return _tma_support_cached(_device_key(device), env_override(), interpreter_active())


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
def _fp8_support_cached(device_key: str, interpreted: bool) -> Fp8Support:
    import triton

    if interpreted:
        return Fp8Support(
            True,
            "Triton interpreter: float8 e4m3 is emulated on the CPU (checks correctness, says nothing about speed)",
            emulated=True,
        )
    problem = _not_a_cuda_gpu(device_key)
    if problem:
        return Fp8Support(
            False,
            problem.replace(
                "an NVIDIA feature",
                "moe-lab's FP8 path targets NVIDIA's float8_e4m3fn tensor cores (compute capability >= 8.9)",
            ),
        )
    name, (major, minor) = _name_and_capability(device_key)
    if (major, minor) < (8, 9):
        return Fp8Support(
            False, f"{name} has compute capability {major}.{minor}; FP8 tensor cores need >= 8.9 (Ada, Hopper)"
        )
    return Fp8Support(True, f"{name}, compute capability {major}.{minor}, Triton {triton.__version__}")


def fp8_support(device: Optional[torch.device | str] = None) -> Fp8Support:
    """Whether FP8 (float8_e4m3fn) kernels can run for tensors on `device` (default: the current CUDA
    device, or the CPU under the interpreter), with the reason. Cached per device. Source: NVIDIA's FP8
    tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper); Triton's float8e4nv type
    compiles only there ("fp8e4nv not supported" below)."""
    return _fp8_support_cached(_device_key(device), interpreter_active())


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
def _gluon_fp8_support_cached(device_key: str, interpreted: bool) -> Optional[str]:
    problem = _gluon_problem()
    if problem:
        return problem
    if interpreted:
        return "the Triton interpreter is on: Gluon kernels compile for a GPU and are not interpreted"
    problem = _not_a_cuda_gpu(device_key)
    if problem:
        return problem.replace("an NVIDIA feature", "the Gluon FP8 kernel is written for NVIDIA Hopper (sm_90)")
    name, (major, minor) = _name_and_capability(device_key)
    if (major, minor) != (9, 0):
        return f"{name} has compute capability {major}.{minor}; the Gluon FP8 kernel uses Hopper's wgmma (sm_90 only)"
    return None


def gluon_fp8_support(device: Optional[torch.device | str] = None) -> Optional[str]:
    """None if the warp-specialized Gluon FP8 grouped GEMM (`moe_lab.gluon_fp8`) can run for tensors on
    `device` (default: the current CUDA device, or the CPU under the interpreter), else why not in words:
    no Gluon or no `warp_specialize` in this Triton, the interpreter, not a CUDA GPU, not sm_90 (its wgmma
    and register layouts are Hopper's). Cached per device. The Triton FP8 kernel runs wherever this says no."""
    return _gluon_fp8_support_cached(_device_key(device), interpreter_active())


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
def shared_memory_limit(device: Optional[torch.device | str] = None) -> int:
    """Bytes of shared memory one program may use on a CUDA device (default: the current one)."""
    import triton

    device = torch.device(device if device is not None else "cuda")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device: Optional[torch.device | str] = None) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H200): the grid of a persistent kernel."""
    import triton

    device = torch.device(device if device is not None else "cuda")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"])
