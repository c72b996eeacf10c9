"""Where Triton kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

The interpreter must be switched on before any `@triton.jit` function is defined, so `import moe_lab`
calls `select_backend()` before it imports its kernels: with no CUDA device and `TRITON_INTERPRET` unset, it
sets `TRITON_INTERPRET=1` (set it yourself to decide either way). Where `environment_problem()` says the
kernels cannot run, it imports none. Where `triton` was imported first, `@triton.jit` functions made until
then (Triton's own helpers, `tl.max`, `tl.cdiv`, ..., and a learner's kernels) were made for a GPU;
`select_backend` remakes triton.language's and `__main__`'s for the interpreter, and warns.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import sys
import threading
import warnings
from typing import Optional

import torch


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in (
        "1",
        "true",
        "on",
        "yes",
        "y",
    )  # as Triton reads it


def select_backend() -> None:
    """Switch the interpreter on when no CUDA device exists and the user has not chosen. Raises nothing:
    where moe_lab's kernels cannot run, `environment_problem` says why (and `import moe_lab` then leaves them
    out, so that `moe-lab doctor` still runs)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_active() and environment_problem() is None:
        remade = _remake_for_the_interpreter()
        if remade is not None:
            yours = f" Your @triton.jit functions in __main__ ({', '.join(remade)}) were remade too." if remade else ""
            warnings.warn(
                "triton was imported before Triton's interpreter was switched on (TRITON_INTERPRET=1; "
                "moe_lab sets it where no CUDA GPU is visible), so its @triton.jit functions were made "
                "for a GPU. moe_lab remade triton.language's helpers for the interpreter."
                + yours
                + " A @triton.jit kernel or helper defined elsewhere before `import moe_lab` cannot run "
                "here: define it again. Next time import moe_lab first, or set TRITON_INTERPRET=1 before "
                "importing triton.",
                stacklevel=3,
            )


def environment_problem() -> Optional[str]:
    """None, or why moe_lab's kernels cannot run in this environment and what to install: Triton missing
    (torch's CPU builds do not bring it), or Triton <= 3.6's interpreter under numpy >= 2.4
    (`interpreter_numpy_problem`). Where there is one, `import moe_lab` still succeeds (`moe-lab doctor`
    must run in that state) but any use of a name of the package raises `RuntimeError` with this text."""
    if importlib.util.find_spec("triton") is None:
        return (
            "Triton is not installed, so moe_lab's kernels cannot be defined. Install it "
            "(pip install 'triton>=3.6'; on a GPU, the version your torch pins), then restart Python."
        )
    if interpreter_active():
        import numpy
        import triton

        return interpreter_numpy_problem(triton.__version__, numpy.__version__)
    return None


def _remake_for_the_interpreter() -> Optional[list]:
    """Where `@triton.jit` functions were made before the interpreter was on (a kernel running under the
    interpreter cannot call a compiled one: "Cannot call @triton.jit'd outside of the scope of a kernel"),
    remake them as interpreted functions: triton.language's helpers (`tl.max`, `tl.cdiv`, ...) and the
    caller's own in `__main__` (a script's or a notebook's namespace). Returns None where there was nothing
    to remake, else the names remade in `__main__`."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    remade, yours = {}, []
    for name, module in list(sys.modules.items()):
        if module is None or not (
            name == "__main__" or name == "triton.language" or name.startswith("triton.language.")
        ):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):  # one object is re-exported by several modules: remade once
                setattr(module, attr, remade.setdefault(id(value), InterpretedFunction(value.fn)))
                if name == "__main__":
                    yours.append(attr)
    return yours if remade else None


def version_tuple(text: str) -> tuple:
    """ "3.6.0+git1a2b" -> (3, 6, 0), "2.4.0rc1" -> (2, 4, 0): the leading numeric release parts."""
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
    3.7). Only the interpreter needs numpy at all, so numpy is not pinned: this check says it instead (and the
    notebooks' first cell pins numpy < 2.4 where it applies)."""
    triton_release, numpy_release = version_tuple(triton_version or ""), version_tuple(numpy_version or "")
    if not triton_release or not numpy_release:  # a version we cannot read ("dev"): let it run
        return None
    if triton_release[:2] <= (3, 6) and numpy_release[:2] >= (2, 4):
        return (
            f"Triton {triton_version}'s interpreter (TRITON_INTERPRET=1, used without a GPU) cannot run "
            f"kernels with loops under numpy {numpy_version}. Install numpy < 2.4 "
            "(pip install 'numpy<2.4', then restart Python), or Triton >= 3.7 (it comes with torch >= 2.12)."
        )
    return None


def default_device() -> torch.device:
    """The device tensors should live on: CUDA if it runs kernels, else the CPU (interpreter)."""
    if torch.cuda.is_available() and not interpreter_active():
        return torch.device("cuda")
    return torch.device("cpu")


def require_gpu_timing(what: str = "timing") -> None:
    """Raise `RuntimeError` where timings would mean nothing: with no GPU, or under the interpreter."""
    committed = (
        "The H200 results are committed: benchmarks/README.md, benchmarks/results/, and the tuned "
        "tables in moe_lab/configs/."
    )
    if not torch.cuda.is_available():
        here = (
            "here kernels run only under Triton's interpreter (on the CPU, one program at a time), whose timings "
            "say nothing about a GPU"
            if interpreter_active()
            else f"here no kernel runs at all (Triton's interpreter is off too: TRITON_INTERPRET="
            f"{os.environ.get('TRITON_INTERPRET', '')!r})"
        )
        raise RuntimeError(f"{what} refused: no CUDA GPU is visible to PyTorch. Timings need one: {here}. {committed}")
    if interpreter_active():
        raise RuntimeError(
            f"{what} refused: Triton's interpreter is on (TRITON_INTERPRET=1), which runs kernels on the CPU "
            "one program at a time; its timings say nothing about a GPU. Unset TRITON_INTERPRET (or set it to "
            f"0) on this GPU machine. {committed}"
        )


_INTERPRETER_LOCK = threading.RLock()
_KEEPING = threading.local()


@contextlib.contextmanager
def keeping_no_buffers():
    """Within the block (on this thread), moe_lab keeps no GPU buffer of its own past a call: no layer plan's
    workspace, no slot-order rows. For callers whose allocations must not outlive the call: torch.compile's CUDA
    graphs (cudagraph trees run a graph's first calls eagerly on the graph's memory pool, and refuse a tensor
    left in it); the custom op `torch.ops.moe_lab.fused_moe` runs in it."""
    before = getattr(_KEEPING, "off", False)
    _KEEPING.off = True
    try:
        yield
    finally:
        _KEEPING.off = before


def keeps_buffers() -> bool:
    """False inside `keeping_no_buffers()` on this thread."""
    return not getattr(_KEEPING, "off", False)


def interpreter_serialized(fn):
    """Decorate a launcher: under Triton's interpreter its calls take one process-wide (re-entrant) lock.
    The interpreter is not thread-safe (concurrent launches from several threads raise interpreter errors);
    compiled kernels need no lock and take none. Decided once, where the launcher is defined: the package's
    kernels are defined beside their launchers, and run under the interpreter exactly when it was on then
    (`select_backend`), so a compiled launcher stays undecorated, with no look-up per call."""
    if not interpreter_active():
        return fn

    @functools.wraps(fn)
    def serialized(*args, **kwargs):
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)

    return serialized
