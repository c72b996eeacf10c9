"""The notebooks' own kernels, with the arguments the notebooks launch them with.

Kernels: every top-level `@triton.jit` function of notebooks/[0-9]*.py (the py:percent twins of the
.ipynb files), read from the script's source with `ast` and defined again here as real JITFunctions
(same file name and line numbers, so Triton's errors point into the notebook). A changed kernel is
picked up as it is; nothing in the notebooks is edited or needs marking.

Arguments: each script is run once under Triton's interpreter, as `make test` runs the notebooks (in a
child process, TRITON_INTERPRET=1, matplotlib's Agg backend), and every launch of one of its kernels is
recorded: tensors as dtype, shape, strides and address alignment, host TensorDescriptors with their
fields, scalars and constexprs as values, launch options (num_warps, ...). Recordings are cached by
the content of the script, of moe_lab and of this file, and by the torch version, not the Triton version:
the launch arguments are the notebook's (its Python and torch), so the Tritons of `make compile-check`
share one recording (the first records, the others replay it).
The replay launches the kernel with meta tensors of the recorded layout, so Triton specializes exactly
as for the recorded launch.

Limits: the arguments are those of the CPU run (a notebook on a GPU may pick other sizes; constexprs
derived from sizes change with them); a kernel the run never launches (or launches only after the
script stopped with an error) is reported and not compiled; kernels defined inside functions are not
found.

Run as a script, it records one notebook: `python notebook_kernels.py record SCRIPT OUT.json`.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JIT_DECORATOR = re.compile(r"^(triton\.)?jit\b")


# --- finding the kernels -----------------------------------------------------------------------------


@dataclass
class KernelDef:
    name: str
    line: int  # of the first decorator: what the function's code object reports as its first line
    end_line: int


def notebook_scripts(paths: Optional[List[str]] = None) -> List[str]:
    """The notebook scripts to check: those given, or every notebooks/[0-9]*.py that has a @triton.jit."""
    if paths is None:
        paths = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")))
    return [os.path.abspath(p) for p in paths if find_kernels(p)]


def _is_jit(decorator: ast.expr) -> bool:
    return bool(JIT_DECORATOR.match(ast.unparse(decorator)))


def find_kernels(path: str) -> List[KernelDef]:
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    return [
        KernelDef(node.name, node.decorator_list[0].lineno, node.end_lineno)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.decorator_list and any(map(_is_jit, node.decorator_list))
    ]


def _bound_names(node: ast.stmt) -> set:
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def load_kernels(path: str) -> Dict[Tuple[str, int], object]:
    """Define the script's kernels as JITFunctions (TRITON_INTERPRET must be 0 by now), keyed by
    (name, line). Also defined: the imports and top-level constants the kernels use."""
    from triton.runtime.jit import JITFunction

    with open(path) as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    lines = source.splitlines(keepends=True)
    kernels = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.decorator_list and any(map(_is_jit, n.decorator_list))
    ]
    used = {n.id for k in kernels for n in ast.walk(k) if isinstance(n, ast.Name)}
    stem = os.path.splitext(os.path.basename(path))[0]
    ns = {"__name__": f"notebook_{re.sub(r'[^0-9a-zA-Z_]', '_', stem)}", "__file__": path}

    def run(node):
        start = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
        code = "\n" * (start - 1) + "".join(lines[start - 1 : node.end_lineno])
        exec(compile(code, path, "exec"), ns)

    defined = set(dir(builtins)) | {k.name for k in kernels}
    for node in tree.body:  # imports the kernels need, in the script's order
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _bound_names(node) & used:
            run(node)
            defined |= _bound_names(node)
    for node in tree.body:  # top-level constants the kernels read (the last assignment wins, as in a run)
        names = _bound_names(node) if isinstance(node, (ast.Assign, ast.AnnAssign)) else set()
        if names & (used - defined):
            try:
                run(node)
            except Exception:  # noqa: BLE001 - a constant that needs the notebook's state: left undefined
                pass
    out = {}
    for node in kernels:
        run(node)
        kernel = ns[node.name]
        while not isinstance(kernel, JITFunction) and hasattr(kernel, "fn"):  # @triton.autotune etc.: the kernel
            kernel = kernel.fn
        out[(node.name, node.decorator_list[0].lineno)] = kernel
    return out


# --- recording launches (in a child process, under the interpreter) --------------------------------


def encode(value):
    """A launch argument as JSON: what Triton's specialization looks at, and nothing else."""
    import torch
    import triton.language as tl

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        TensorDescriptor = ()
    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, torch.Tensor):
        return {
            "tensor": str(value.dtype).replace("torch.", ""),
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "align": value.data_ptr() % 16,
        }
    if TensorDescriptor and isinstance(value, TensorDescriptor):
        if not dataclasses.is_dataclass(value):
            return {"descriptor": {n: encode(v) for n, v in vars(value).items()}}
        # Fields at their default are left out, so a recording replays under a Triton whose TensorDescriptor
        # lacks a newer field (3.6 has no round_f32_to_tf32); a field set otherwise still must exist there.
        fields = [
            f
            for f in dataclasses.fields(value)
            if not (f.default is not dataclasses.MISSING and getattr(value, f.name) == f.default)
        ]
        return {"descriptor": {f.name: encode(getattr(value, f.name)) for f in fields}}
    if isinstance(value, tl.dtype):
        return {"tl_dtype": str(value)}
    if isinstance(value, (list, tuple)):  # torch.Size too
        return {"list" if isinstance(value, list) else "tuple": [encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"unsupported": type(value).__name__}


def decode(spec):
    """The inverse of `encode`, with meta tensors (a CPU tensor where the address was not 16-byte aligned)."""
    import torch
    import triton.language as tl

    if "tensor" in spec:
        dtype = getattr(torch, spec["tensor"])
        shape, stride, align = spec["shape"], spec["stride"], spec["align"]
        if align == 0:
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        item = torch.empty((), dtype=dtype).element_size()
        offset = align // item
        size = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0)
        return torch.empty(size, dtype=dtype).as_strided(shape, stride, offset)
    if "descriptor" in spec:
        from triton.tools.tensor_descriptor import TensorDescriptor

        return TensorDescriptor(**{k: decode(v) for k, v in spec["descriptor"].items()})
    if "tl_dtype" in spec:
        return tl.dtype(spec["tl_dtype"])
    if "list" in spec:
        return [decode(v) for v in spec["list"]]
    if "tuple" in spec:
        return tuple(decode(v) for v in spec["tuple"])
    if "value" in spec:
        return spec["value"]
    raise TypeError(f"cannot replay an argument of type {spec.get('unsupported')}")


def record(script: str, out_path: str) -> None:
    """Run `script` under Triton's interpreter; write its kernels' launches to `out_path`."""
    import inspect
    import runpy
    import traceback

    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    script = os.path.abspath(script)
    from triton.runtime.interpreter import InterpretedFunction

    launches, seen = [], set()
    original_run = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = getattr(self, "fn", None)
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == script:
            params = list(inspect.signature(fn).parameters)
            named = dict(zip(params, args))
            named.update({k: v for k, v in kwargs.items() if k in params})
            launch = {
                "name": fn.__name__,
                "line": code.co_firstlineno,
                "args": {k: encode(v) for k, v in named.items()},
                "options": {k: encode(v) for k, v in kwargs.items() if k not in params},
            }
            text = json.dumps(launch, sort_keys=True)
            if text not in seen:
                seen.add(text)
                launches.append(launch)
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    if not hasattr(builtins, "display"):  # Jupyter's display(), which a notebook may call without importing it
        try:
            from IPython.display import display

            builtins.display = display
        except ImportError:
            pass
    start, error = time.perf_counter(), None
    os.chdir(os.path.dirname(script))  # as Jupyter runs a notebook: from its folder
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == script]
        where = f" at line {frames[-1].lineno}" if frames else ""
        error = f"{type(exc).__name__}{where}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    with open(out_path, "w") as f:
        json.dump(
            {"script": script, "launches": launches, "error": error, "seconds": round(time.perf_counter() - start, 2)},
            f,
        )


# --- driving the recordings from the check ---------------------------------------------------------


@dataclass
class NotebookRun:
    script: str
    launches: List[dict] = field(default_factory=list)
    error: Optional[str] = None
    cached: bool = False
    kernels: Dict[Tuple[str, int], object] = field(default_factory=dict)


def cache_dir() -> str:
    import triton

    path = os.environ.get("MOE_LAB_COMPILE_CHECK_CACHE") or os.path.join(
        triton.knobs.cache.dir, "moe_lab_compile_check"
    )
    return os.path.abspath(path)  # the recording child runs in the notebook's folder


def _recording_key(script: str) -> str:
    """The script's, moe_lab's and this file's contents and torch's version; not Triton's: the arguments a
    notebook passes its kernels come from its Python code and torch, so one recording serves every Triton
    (each still compiles it; `make compile-check` records under the first and replays under the others)."""
    import torch

    h = hashlib.sha256(f"torch {torch.__version__}".encode())
    files = [script, os.path.abspath(__file__)] + sorted(
        glob.glob(os.path.join(ROOT, "moe_lab", "**", "*.py"), recursive=True)
    )
    for path in files:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + f.read())
    return h.hexdigest()[:32]


class Recordings:
    """The child processes recording the notebooks (at most `jobs` at a time); `wait()` gives the runs."""

    def __init__(self, scripts: List[str], jobs: int):
        os.makedirs(cache_dir(), exist_ok=True)
        self.pending = []
        self.runs: Dict[str, NotebookRun] = {}
        self.jobs = max(1, jobs)
        self.running: List[tuple] = []
        for script in scripts:
            path = os.path.join(cache_dir(), f"{os.path.basename(script)}-{_recording_key(script)}.json")
            if os.path.exists(path):
                self.runs[script] = self._load(script, path, cached=True)
            else:
                self.pending.append((script, path))
        self._start()

    def _start(self):
        while self.pending and len(self.running) < self.jobs:
            script, path = self.pending.pop(0)
            tmp = f"{path}.{os.getpid()}.tmp"
            env = dict(os.environ, TRITON_INTERPRET="1", MPLBACKEND="Agg")
            with open(f"{tmp}.err", "w") as err:  # a file, not a pipe: nobody need read it while it runs
                proc = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "record", script, tmp],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            self.running.append((script, path, tmp, proc))

    @staticmethod
    def _load(script, path, cached=False) -> NotebookRun:
        with open(path) as f:
            data = json.load(f)
        return NotebookRun(script, data["launches"], data["error"], cached)

    def wait(self) -> List[NotebookRun]:
        while self.running:
            done = [r for r in self.running if r[3].poll() is not None]  # whichever finished: its slot refills now
            if not done:
                time.sleep(0.05)
                continue
            self.running.remove(done[0])
            script, path, tmp, proc = done[0]
            with open(f"{tmp}.err") as err:
                stderr = err.read()
            os.remove(f"{tmp}.err")
            if proc.returncode == 0 and os.path.exists(tmp):
                run = self._load(script, tmp)
                if run.error is None:
                    os.replace(tmp, path)  # cache only complete runs
                else:
                    os.remove(tmp)
            else:
                tail = (stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
                run = NotebookRun(script, error=f"the recording process failed: {tail[0]}")
            self.runs[script] = run
            self._start()
        return [self.runs[s] for s in sorted(self.runs)]


def start_recordings(scripts: List[str], jobs: int) -> Recordings:
    return Recordings(scripts, jobs)


def _kernel_for(kernels: Dict[Tuple[str, int], object], launch: dict):
    """The kernel a recorded launch ran: same name and line, else the only kernel of that name."""
    kernel = kernels.get((launch["name"], launch["line"]))
    same_name = [k for (name, _), k in kernels.items() if name == launch["name"]]
    return kernel if kernel is not None else (same_name[0] if len(same_name) == 1 else None)


def _raise(error: Exception):
    raise error


def _uses_float8(args: dict) -> bool:
    import torch

    return any(isinstance(v, torch.Tensor) and v.element_size() == 1 and v.is_floating_point() for v in args.values())


def _fake_gpu_has_fp8() -> bool:
    import moe_lab  # its fp8_support answers for the fake GPU (assumed by moe_lab.tools.compile_only.fake_gpu)

    return bool(moe_lab.fp8_support())


def replays(runs: List[NotebookRun]):
    """(label, callable) per recorded launch: the kernel, defined from the script's source, launched
    (compile-only) with arguments of the recorded layout."""
    out = []
    for run in runs:
        name = os.path.basename(run.script)
        try:
            run.kernels = load_kernels(run.script)
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot even be defined: a failure
            error = RuntimeError(f"the kernels of {name} cannot be defined: {type(exc).__name__}: {exc}")
            out.append((f"notebook {name}", functools.partial(_raise, error)))
            continue
        for launch in run.launches:
            kernel = _kernel_for(run.kernels, launch)
            if kernel is None:
                continue  # reported by `report`

            def go(kernel=kernel, launch=launch):
                args = {k: decode(v) for k, v in launch["args"].items()}
                options = {k: decode(v) for k, v in launch["options"].items()}
                if _uses_float8(args) and not _fake_gpu_has_fp8():
                    return  # below sm_89 Triton has no e4m3 type; the notebook's FP8 cells need such a GPU
                kernel[(1,)](**args, **options)

            out.append((f"notebook {name}:{launch['line']} {launch['name']}", go))
    return out


def report(runs: List[NotebookRun]) -> List[str]:
    """Lines about what could not be checked: scripts that stopped, kernels never launched."""
    lines = []
    for run in runs:
        name = os.path.basename(run.script)
        if run.error:
            lines.append(
                f"WARN notebook {name} stopped under the interpreter ({run.error}); kernels it launches "
                "after that point are not checked (make test shows the notebook's own failure)"
            )
        replayed = {id(_kernel_for(run.kernels, launch)) for launch in run.launches}
        for (kname, line), kernel in sorted(run.kernels.items(), key=lambda kv: kv[0][1]):
            if id(kernel) not in replayed:
                lines.append(f"WARN notebook {name}:{line} {kname} was not launched by the notebook run: not compiled")
        for kname, line in sorted(
            {(l["name"], l["line"]) for l in run.launches if _kernel_for(run.kernels, l) is None}
        ):
            lines.append(
                f"WARN notebook {name}:{line} {kname} is launched but is not a top-level @triton.jit "
                "function of the script: not compiled"
            )
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "record":
        sys.exit(f"usage: {sys.argv[0]} record SCRIPT OUT.json")
    record(sys.argv[2], sys.argv[3])
