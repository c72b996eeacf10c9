"""Notebook 10's warp-specialized TMA copy in Gluon: the given consumer and entry kernel, and the child process
that compiles (or runs) them with a learner's producer.

    ws_copy_kernel(src_desc, dst_ptr, M, N, stride_dm, STAGES, num_warps)

copies src [M, N] (read through a host descriptor of BLOCK_M x BLOCK_N boxes) into dst [M, N]. Program p
of P walks the tiles p, p + P, ... (tile t: row block t // cdiv(N, BLOCK_N), column block t % cdiv(N,
BLOCK_N)). Two partitions share a ring of STAGES shared-memory boxes and two barriers per stage:
- `load_partition` (one warp; the learner's exercise) waits until a stage is empty, makes its `ready` barrier
  expect the box's bytes and issues the TMA load into it;
- `_copy_consumer` (the kernel's num_warps warps) waits until the stage is ready, reads the box into
  registers, signals the stage `empty` and stores the box to dst (masked at M and N).
The stage and its phase come from a step count that runs on across the program's tiles, as in
`moe_lab/_kernels/gluon_fp8.py`.

Gluon has no interpreter: `python -m moe_lab.workbook.exercises.ws_copy_kernels MODE FILE NAME` (with
TRITON_INTERPRET=0) imports the producer NAME from the Python file FILE, makes it `load_partition`, and with
MODE "compile" compiles the kernel for sm_90 on any machine (`moe_lab.tools.compile_only`), with MODE "run"
runs it on this machine's GPU at the checker's sizes and compares the copy bit for bit. It prints one line,
"RESULT {json}". `moe_lab.workbook.exercises.ws_copy` starts it and reads the line.
"""

import json
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

# The TMA load is `async_load` from Triton 3.8 on (3.9 removed the old name).
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# (M, N, row stride of src, BLOCK_M, BLOCK_N, STAGES, programs): ragged sizes, a view with wider rows, and
# several rounds of the ring per program. Boxes 32 float32 wide: 128 bytes, one swizzled TMA row.
CASES = ((60, 84, 100, 16, 32, 3, 2), (300, 200, 256, 32, 32, 2, 5), (1000, 1000, 1024, 64, 32, 4, 7))

load_partition = None  # the producer; set by the child process before the first compile


@gluon.jit
def _copy_consumer(dst_ptr, bufs, ready, empty, M, N, stride_dm, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = bufs.type.shape[1]
    BLOCK_N: gl.constexpr = bufs.type.shape[2]
    STAGES: gl.constexpr = bufs.type.shape[0]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    num_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for t in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * num_n, gl.num_programs(0)):
        stage = step % STAGES
        mbarrier.wait(ready.index(stage), (step // STAGES) & 1)  # the box of this step has landed
        box = bufs.index(stage).load(layout)
        fence_async_shared()  # these reads come before the TMA (the async proxy) writes the stage again
        mbarrier.arrive(empty.index(stage), count=1)  # the producer may refill the stage
        rows = (t // num_n) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = (t % num_n) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        gl.store(dst_ptr + rows[:, None].to(gl.int64) * stride_dm + cols[None, :], box, mask=inside)
        step += 1


@gluon.jit
def ws_copy_kernel(src_desc, dst_ptr, M, N, stride_dm, STAGES: gl.constexpr, num_warps: gl.constexpr):
    bufs = gl.allocate_shared_memory(src_desc.dtype, [STAGES] + src_desc.block_type.shape, src_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (_copy_consumer, (dst_ptr, bufs, ready, empty, M, N, stride_dm, num_warps)),
            (load_partition, (src_desc, bufs, ready, empty, M, N)),
        ],
        [1],
        [24],
    )


def _descriptor(src, block_m: int, block_n: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_n], gl.float32)
    return TensorDescriptor(src, list(src.shape), list(src.stride()), [block_m, block_n], layout)


def _learner_line(exc: BaseException) -> dict:
    """Where the compile failed in the producer: the innermost CompilationError's line ("where": line N of the
    function, its text), its cause ("cause") and, where the cause is a Python builtin the kernel calls, its name
    ("builtin"); {} when no CompilationError has a line."""
    import ast
    import builtins

    from triton.compiler.errors import CompilationError

    from ...tools.compile_only import root_cause

    inner, seen, e = None, set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, CompilationError) and getattr(e, "src", None) and getattr(e, "node", None) is not None:
            inner = e
        e = e.__cause__ or e.__context__
    if inner is None or not hasattr(inner.node, "lineno"):
        return {}
    lines = inner.src.splitlines()
    head = next((line for line in lines if line.lstrip().startswith("def ")), "")
    name = head.split("def ", 1)[-1].split("(", 1)[0].strip() or "the producer"
    text = lines[inner.node.lineno - 1].strip() if inner.node.lineno <= len(lines) else ""
    root = root_cause(exc)
    said = root.error_message if isinstance(root, CompilationError) else root  # without the source again
    cause = f"{type(root).__name__}: {' '.join(str(said).split())[:400]}"
    node = inner.node.func if isinstance(inner.node, ast.Call) else inner.node
    runs = ("range", "len", "int", "float", "min", "max", "isinstance", "getattr", "hasattr")  # Triton runs these
    builtin = node.id if isinstance(node, ast.Name) and node.id in vars(builtins) and node.id not in runs else None
    if isinstance(root, NameError) and str(root).split(" ", 1)[0] in vars(builtins):
        builtin = str(root).split(" ", 1)[0]
    where = f"`{text}` (line {inner.node.lineno} of {name}, its def line 1)"
    return {"where": where, "cause": cause, "builtin": builtin}


def compile_for_sm90() -> dict:
    """Compile the kernel for sm_90 on meta tensors (no GPU): what its TTGIR and PTX show."""
    import torch

    from ...tools import compile_only as co

    m, n, row_stride, block_m, block_n, stages, programs = CASES[0]
    src = torch.empty(m, row_stride, device="meta")[:, :n]
    dst = torch.empty(m, n, device="meta")
    session = co.Session(compile_missing=True)
    with co.fake_gpu(90, session):
        ws_copy_kernel[(programs,)](_descriptor(src, block_m, block_n), dst, m, n, n, STAGES=stages, num_warps=4)
    (outcome,) = session.outcomes.values()
    if outcome["error"]:
        (exc,) = session.exceptions.values() or (None,)
        return {"error": outcome["error"], **(_learner_line(exc) if exc is not None else {})}
    (kernel,) = session.kernels.values()
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    return {
        "error": None,
        "warp_specialize": "ttg.warp_specialize" in ttgir,
        "mbarrier_waits": ptx.count("mbarrier.try_wait"),
        "tma_loads": ptx.count("cp.async.bulk.tensor"),
    }


def run_on_gpu() -> dict:
    """Run the copy at every size of CASES on this machine's GPU; the first that is not bitwise right."""
    import torch

    for m, n, row_stride, block_m, block_n, stages, programs in CASES:
        src = torch.randn(m, row_stride, device="cuda")[:, :n]
        dst = torch.full((m, n), float("nan"), device="cuda")
        ws_copy_kernel[(programs,)](_descriptor(src, block_m, block_n), dst, m, n, n, STAGES=stages, num_warps=4)
        torch.cuda.synchronize()
        if not torch.equal(dst, src):
            wrong = (dst != src) | torch.isnan(dst)
            return {
                "error": None,
                "case": [m, n, block_m, block_n, stages, programs],
                "wrong": int(wrong.sum()),
                "unwritten": int(torch.isnan(dst).sum()),
                "first": wrong.nonzero()[0].tolist(),
            }
    return {"error": None, "wrong": 0}


def main(argv) -> int:
    import importlib.util
    import traceback

    mode, path, name = argv
    global load_partition
    try:
        spec = importlib.util.spec_from_file_location("ws_copy_learner", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        load_partition = getattr(module, name)
        result = compile_for_sm90() if mode == "compile" else run_on_gpu()
    except Exception as exc:  # noqa: BLE001 - a learner's producer may raise anything; it is reported
        from ...tools.compile_only import root_cause

        root = root_cause(exc)  # the compiler's own error (a NameError, ...) under its CompilationError's layers
        lines = [line for line in traceback.format_exception_only(type(exc), exc) if line.strip()]
        if root is not exc:
            lines += [line for line in traceback.format_exception_only(type(root), root) if line.strip()]
        result = {"error": " ".join(line.strip() for line in lines)[-1500:]}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
