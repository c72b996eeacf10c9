"""Where Triton kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

The interpreter must be switched on before any `@triton.jit` function is defined, so `import moe_lab`
calls `select_backend()` before it imports its kernels: with no CUDA device and `TRITON_INTERPRET` unset,
it sets `TRITON_INTERPRET=1`. Set `TRITON_INTERPRET` yourself to decide either way. Where `triton` was
imported first, Triton's own `@triton.jit` helpers (`tl.max`, `tl.sum`, `tl.cdiv`, ...) were made for a
GPU; `select_backend` remakes them for the interpreter and warns that the caller's earlier kernels must be
defined again.
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import warnings
from typing import Optional

import torch


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes", "y")  # as Triton reads it


def select_backend() -> None:
    """Switch the interpreter on when no CUDA device exists and the user has not chosen.
    Raises RuntimeError where the interpreter would then fail inside every kernel with a loop
    (see `interpreter_numpy_problem`)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_active():
        import numpy
        import triton
        problem = interpreter_numpy_problem(triton.__version__, numpy.__version__)
        if problem:
            raise RuntimeError(problem)
        if _interpret_triton_language():
            warnings.warn("triton was imported before Triton's interpreter was switched on (TRITON_INTERPRET=1; "
                          "moe_lab sets it where no CUDA GPU is visible). moe_lab remade triton.language's helpers for the interpreter; "
                          "any @triton.jit kernel of yours defined before `import moe_lab` was made for a GPU and "
                          "cannot run here: define it again (run its cell again). Next time import moe_lab first, "
                          "or set TRITON_INTERPRET=1 before importing triton.", stacklevel=3)


def _interpret_triton_language() -> bool:
    """Remake triton.language's `@triton.jit` helpers as interpreted functions where they were made before
    the interpreter was on (a kernel running under the interpreter cannot call a compiled helper: "Cannot
    call @triton.jit'd outside of the scope of a kernel"). Returns whether any was."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    remade = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):  # one object is re-exported by several modules: remade once
                setattr(module, attr, remade.setdefault(id(value), InterpretedFunction(value.fn)))
    return bool(remade)


def version_tuple(text: str) -> tuple:
    """"3.6.0+git1a2b" -> (3, 6, 0), "2.4.0rc1" -> (2, 4, 0): the leading numeric release parts."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def interpreter_numpy_problem(triton_version: str, numpy_version: str) -> Optional[str]:
    """None, or what to install: Triton <= 3.6's interpreter fails on every loop with a run-time bound
    under numpy >= 2.4 ("only 0-dimensional arrays can be converted to Python scalars"; fixed in Triton
    3.7). Only the interpreter needs numpy at all, so numpy is not pinned: this check says it instead."""
    triton_release, numpy_release = version_tuple(triton_version or ""), version_tuple(numpy_version or "")
    if not triton_release or not numpy_release:  # a version we cannot read ("dev"): let it run
        return None
    if triton_release[:2] <= (3, 6) and numpy_release[:2] >= (2, 4):
        return (f"Triton {triton_version}'s interpreter (TRITON_INTERPRET=1, used without a GPU) cannot run "
                f"kernels with loops under numpy {numpy_version}. Install numpy < 2.4 "
                "(pip install 'numpy<2.4'), or Triton >= 3.7 (it comes with torch >= 2.12).")
    return None


def default_device() -> torch.device:
    """The device tensors should live on: CUDA if it runs kernels, else the CPU (interpreter)."""
    if torch.cuda.is_available() and not interpreter_active():
        return torch.device("cuda")
    return torch.device("cpu")


def require_gpu_timing(what: str = "timing") -> None:
    """Raise `RuntimeError` where timings would mean nothing: under the interpreter or with no GPU."""
    if interpreter_active():
        raise RuntimeError(
            f"{what} refused: Triton's interpreter is on (TRITON_INTERPRET=1), which runs kernels on the CPU "
            "one program at a time; its timings say nothing about a GPU. Run on a CUDA GPU without "
            "TRITON_INTERPRET, or look at the committed H200 results in benchmarks/results/.")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} refused: no CUDA GPU is visible to PyTorch.")


_INTERPRETER_LOCK = threading.RLock()


def interpreter_serialized(fn):
    """Decorate a launcher: under Triton's interpreter its calls take one process-wide (re-entrant) lock.
    The interpreter is not thread-safe (concurrent launches from several threads raise interpreter errors);
    compiled kernels need no lock and take none."""
    @functools.wraps(fn)
    def serialized(*args, **kwargs):
        if not interpreter_active():
            return fn(*args, **kwargs)
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)
    return serialized
