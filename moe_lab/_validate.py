"""Input checks shared by the launchers: each error names the argument, what it got and what it expects."""

from __future__ import annotations

import numbers
import operator
from typing import Iterable, Optional, Sequence

import torch

from .runtime import interpreter_active

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    name: str,
    t,
    *,
    ndim: int,
    dtypes: Sequence[torch.dtype],
    shape: Optional[Sequence[Optional[int]]] = None,
    layout: str = "",
    dtype_of: str = "",
    kernel_reads: bool = True,
) -> None:
    """Raise TypeError/ValueError unless `t` is a tensor of rank `ndim`, one of `dtypes`, and `shape`
    (None entries are free), and, where a kernel reads its memory (`kernel_reads`), not a negated view. `layout`
    names the dimensions for the message, e.g. "[T, H]"; `dtype_of` names the tensor whose dtype `t` must match,
    if any."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor {layout}, got layout {t.layout}: call .to_dense()")
    if t.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimension{'s' if ndim != 1 else ''} {layout}, got shape {tuple(t.shape)}"
        )
    if t.dtype not in dtypes:
        same = f" (the dtype of {dtype_of})" if dtype_of else ""
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}{same}, got {str(t.dtype).replace('torch.', '')}")
    if shape is not None:
        for got, want in zip(t.shape, shape):
            if want is not None and got != want:
                want_s = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
                raise ValueError(f"{name} must have shape {layout} = {want_s}, got {tuple(t.shape)}")
    if kernel_reads and t.is_neg():  # torch ops honour the bit; a kernel reads memory, which holds the other sign
        raise ValueError(
            f"{name} is a negated view (torch's lazy negation bit, as .conj().imag makes): its memory holds the "
            f"values' negatives; pass {name}.resolve_neg()"
        )


def check_own_memory(name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless every element of `t` (a buffer a kernel writes) has its own memory: with the
    dimensions of more than one element sorted by stride, each stride passes the span of those before it (a
    test that may refuse a few exotic non-overlapping layouts, never accepts an overlapping one)."""
    span = 0
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    for stride, size in dims:
        if stride <= span:
            raise ValueError(
                f"{name}'s entries overlap in memory (strides {tuple(t.stride())} for shape {tuple(t.shape)}): "
                f"pass a buffer where each entry has its own memory"
            )
        span += (size - 1) * stride


def check_one_device(**tensors: Optional[torch.Tensor]) -> torch.device:
    """Raise ValueError if the named tensors (None skipped) are not all on one device; return that device."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    return first


def check_same_device(**tensors: Optional[torch.Tensor]) -> torch.device:
    """`check_one_device`, for tensors a kernel computes with: not meta under the interpreter."""
    first = check_one_device(**tensors)
    devices = [name for name, t in tensors.items() if t is not None]
    if first.type == "meta" and interpreter_active():  # (compile-only checks launch on meta tensors: no data read)
        raise ValueError(
            f"the tensors ({', '.join(devices)}) are on the meta device, which holds no data to "
            "compute with: move them to the CPU or a GPU"
        )
    return first


def check_kernel_device(**tensors: Optional[torch.Tensor]) -> torch.device:
    """`check_same_device`, for the tensors of a Triton kernel's launch: not on the CPU where kernels compile for
    the GPU (the interpreter off), where Triton would refuse the pointers without naming them."""
    first = check_same_device(**tensors)
    devices = [name for name, t in tensors.items() if t is not None]
    if first.type == "cpu" and not interpreter_active():
        if torch.cuda.is_available():
            why = "kernels compile for the GPU here (TRITON_INTERPRET is off): move them to cuda, or set"
        else:
            why = "TRITON_INTERPRET is off and no CUDA GPU is visible: unset it, or set"
        raise ValueError(
            f"the tensors ({', '.join(devices)}) are on the CPU, but {why} TRITON_INTERPRET=1 before importing "
            "moe_lab to run them on the CPU under Triton's interpreter"
        )
    return first


def type_name(value) -> str:
    """What a message says `value` is: "int", "numpy.float64", "a 0-d bool tensor" (numpy's bool is named
    "bool" too, so its module is given)."""
    if isinstance(value, torch.Tensor):
        where = " on meta (no data)" if value.is_meta else ""
        return f"a {value.dim()}-d {str(value.dtype).replace('torch.', '')} tensor{where}"
    return f"{type(value).__module__}.{type(value).__name__}".replace("builtins.", "")


def described(value) -> str:
    """`type_name`, with the value of a scalar: "float 2.5", "str '4'", "bool True", "a 1-d int64 tensor"."""
    kind = type_name(value)
    if isinstance(value, (str, numbers.Number)):
        shown = repr(value) if isinstance(value, str) else str(value)
        kind += f" {shown[:40]}" + ("..." if len(shown) > 40 else "")
    return kind


def is_bool(value) -> bool:
    """A Python, numpy or torch bool: operator.index takes numpy's and 0-d tensors' as 0 and 1."""
    return isinstance(value, bool) or "bool" in str(getattr(value, "dtype", ""))


def check_bool(name: str, value) -> bool:
    """`value` if it is a Python bool; TypeError naming `name` otherwise (a truthy 1 or "no" is no flag)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {described(value)}")
    return value


def check_int(name: str, value) -> int:
    """`value` as a Python int if it is an int or int-like (a numpy integer, a 0-d integer array or tensor:
    operator.index); bools of every kind are refused (`is_bool`), and so are arrays and tensors of one or more
    dimensions (operator.index takes one of one element) and tensors without data (meta)."""
    kind = described(value)
    try:
        if is_bool(value) or getattr(value, "ndim", 0) != 0:
            raise TypeError
        return operator.index(value)
    except (TypeError, RuntimeError):  # RuntimeError: a meta tensor has no value to read
        raise TypeError(f"{name} must be an int, got {kind}") from None


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """`value` as a Python int (`check_int`) if it is >= minimum."""
    value = check_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_power_of_two(
    name: str, value: int, minimum: int = 1, maximum: Optional[int] = None, *, zero_means: Optional[str] = None
) -> int:
    """`value` as a Python int (`check_int`) if it is a power of two in [minimum, maximum]. `zero_means` (such
    as "off"): 0 passes too, and the error says so."""
    value = check_int(name, value)
    if zero_means is not None and value == 0:
        return 0
    if value < minimum or value & (value - 1) or (maximum is not None and value > maximum):
        zero = f"0 ({zero_means}) or " if zero_means is not None else ""
        bound = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be {zero}a power of two >= {minimum}{bound}, got {value}")
    return value


def _byte_span(t: torch.Tensor) -> tuple:
    """The first byte and one past the last byte that `t`'s elements can occupy (strides may be negative
    only in theory: torch tensors' are not)."""
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def check_not_aliased(written: torch.Tensor, name: str = "out", **inputs: Optional[torch.Tensor]) -> None:
    """Raise ValueError if the bytes `written` (the argument `name`) spans, first element to last, overlap
    those of a tensor a kernel reads or writes while it writes `written`. Views of one buffer in ranges of
    their own pass; interleaved views (column halves, every other row) are refused, to be safe."""
    if written.numel() == 0 or written.device.type == "meta":  # nothing written, or no memory (data_ptr 0)
        return
    start, end = _byte_span(written)
    for other, tensor in inputs.items():
        if tensor is None or not tensor.numel() or tensor.device != written.device:
            continue
        other_start, other_end = _byte_span(tensor)
        if start < other_end and other_start < end:
            raise ValueError(
                f"{name} shares memory with {other} (their byte ranges overlap): values could be read "
                "after being overwritten; pass a separate buffer"
            )


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are the same elements of memory in the same order (an in-place call). A stride
    of a dimension of size 1 is never used, so it may differ."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and all(x == y for x, y, size in zip(a.stride(), b.stride(), a.shape) if size > 1)
    )


def output_buffer(
    out: Optional[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, device: torch.device, layout: str
) -> torch.Tensor:
    """`out` after checking its shape, dtype and last stride (1), or a new empty tensor when it is None."""
    if out is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    check_tensor("out", out, ndim=len(shape), dtypes=(dtype,), shape=tuple(shape), layout=layout)
    if out.stride(-1) != 1:
        raise ValueError(f"out must have a last stride of 1, got strides {tuple(out.stride())}")
    check_own_memory("out", out)
    return out


def check_layer_out(out: torch.Tensor, hidden_states: torch.Tensor, caller: str) -> None:
    """A layer's `out` [T, H]: hidden_states' shape, dtype and device, a last stride of 1, its own memory, and no
    grad while grad is on (`caller` writes into it without autograd). Where it lies: `check_layer_out_overlap`."""
    if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"out requires grad: {caller} writes into it without autograd (inference only)")
    output_buffer(out, tuple(hidden_states.shape), hidden_states.dtype, hidden_states.device, "[T, H]")
    check_same_device(hidden_states=hidden_states, out=out)


def check_layer_out_overlap(out: torch.Tensor, hidden_states: torch.Tensor, **inputs: Optional[torch.Tensor]) -> None:
    """A layer's `out` shares memory with none of `inputs`, nor with hidden_states unless it is the same view:
    each chunk reads its hidden states before it writes its output rows, so out=hidden_states is in place; any
    other overlap would feed written rows back in, or overwrite the weights."""
    if not same_view(out, hidden_states):
        inputs["hidden_states"] = hidden_states
    check_not_aliased(out, **inputs)
