"""Graded Triton kernel exercises of the workbook: one checker per exercise, one verdict format.

Each checker runs a learner's `@triton.jit` kernel with `moe_lab.workbook.guarded.run_guarded` (guarded buffers,
so an out-of-bounds access is reported, never fatal), compares its output with a float32/float64
reference, and names the mistake it sees. It prints one line,

    PASS <exercise>: ...        the kernel is right
    NOT YET <exercise>: ...     what is wrong and what usually causes it

and returns a `Verdict`. With `strict=True` (the solution cells, and tests) a wrong kernel raises
`AssertionError("FAIL <exercise>: ...")` instead. A learner's stub therefore never stops a top-to-bottom
run of a notebook.

Notebook 10's exercise is a Gluon kernel, which has no interpreter: its checker plays a model of the protocol,
compiles the kernel for sm_90 and, on a GPU, runs it in a child process with a time limit (`ws_copy`).

One module per exercise; the checkers are reached from here (`exercises.check_scale(kernel)`), and a
module is imported when its checker is first asked for.
"""

import functools
import importlib

from ..guarded import KernelMismatch, Stopped
from ._grade import Verdict, grade, report

# checker -> module, in workbook order
CHECKERS = {
    "check_scale": "scale",  # 00: a masked kernel
    "check_renormalize": "renormalize",  # 01: top-k weights renormalised per token
    "check_expert_histogram": "histogram",  # 02: tokens per expert, with atomics
    "check_gather_rows": "gather",  # 03: the gathered A tile of the grouped GEMM
    "check_descriptor_copy": "descriptor_copy",  # 04: a 2-D copy through a host TensorDescriptor
    "check_device_descriptor_copy": "descriptor_copy",  # 04: the same with tl.make_tensor_descriptor
    "check_expert_tile": "expert_tile",  # 05: a 3-D weight descriptor at [expert, n0, k0]
    "check_topk_reduce": "topk_reduce",  # 06: the weighted sum of each token's k rows
    "check_pipelined_matmul": "pipelined_matmul",  # 07: a K loop with num_stages
    "check_persistent_copy": "persistent_walk",  # 08: a persistent grid walking the tiles in use
    "check_quantize_rows": "quantize_rows",  # 09: FP8 quantization, one scale per row per group
    "check_ws_copy": "ws_copy",  # 10: the producer of a warp-specialized TMA copy (Gluon: model, sm_90 compile, GPU)
    "check_capstone_up": "capstone",  # 05b: the whole grouped GEMM of the up projection (A gathered, W by TMA)
    "check_capstone_down": "capstone",  # 05b: the whole grouped GEMM of the down projection (both by TMA)
}

__all__ = ["CHECKERS", "Verdict", "grade", "report", *CHECKERS]


def __getattr__(name):
    if name in CHECKERS:
        module = importlib.import_module(f"{__name__}.{CHECKERS[name]}")
        # the label of its verdicts: the exercise's kernel name where the module names it (EXERCISES: one per
        # checker, in a module of several)
        label = getattr(module, "EXERCISES", {}).get(name) or getattr(module, "EXERCISE", name.removeprefix("check_"))
        return _verdict_for_any_kernel(getattr(module, name), label)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _verdict_for_any_kernel(checker, exercise: str):
    """The checker, answering NOT YET (not a traceback) when handed something that is not a kernel taking
    the exercise's arguments: None, a plain function, kernel[grid], renamed parameters (labelled with the
    learner's function's name, or `exercise` where there is none: None, kernel[grid]); and when the learner
    stops a check that runs too long (a keyboard interrupt, labelled the same way, saying where the kernel was;
    with `strict`, it propagates)."""

    @functools.wraps(checker)
    def checked(kernel, *args, strict: bool = False, **kwargs):
        name = getattr(kernel, "__name__", None)
        label = exercise if name in (None, "<lambda>") else name
        try:
            return checker(kernel, *args, strict=strict, **kwargs)
        except KernelMismatch as mismatch:
            return report(label, str(mismatch), "", strict)
        except KeyboardInterrupt as stop:  # Jupyter's stop button: say where, not a bare traceback
            if strict:
                raise
            why = (
                str(stop) if isinstance(stop, Stopped) else "stopped by a keyboard interrupt before the check finished"
            )
            return report(label, why, "", strict)

    return checked
