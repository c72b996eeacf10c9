"""`moe-lab doctor`: what this environment is, whether moe-lab and its workbook will work in it, and what
to fix where they will not.

A report is two lists: facts (versions, device, TMA support, tuned table, notebook front end) and
findings, each a `Finding(level, what, fix)` with level "problem" (something will fail) or "note" (works,
but worth knowing). `report()` builds it without printing; `main()` prints it and returns 1 if any
problem was found, else 0. Nothing here imports Jupyter, ipywidgets or matplotlib, nor Triton unless it is
installed, nor moe_lab's kernels: the doctor runs in the states it diagnoses (Triton missing, Triton 3.6's
interpreter under numpy >= 2.4, no GPU, a library-only install without the notebook extras).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import os
import platform
import sys
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from .. import __version__
from ..capability import tma_support
from ..runtime import default_device, interpreter_active, interpreter_numpy_problem, version_tuple

SUPPORTED_TRITON = ((3, 6), (3, 9))  # inclusive, major.minor; CI tests each of them


@dataclass(frozen=True)
class Finding:
    """level: "problem" (something will fail) or "note"; what: what was found; fix: what to do about it."""

    level: str
    what: str
    fix: str = ""


@dataclass
class Report:
    facts: List[Tuple[str, str]] = field(default_factory=list)
    findings: List[Finding] = field(default_factory=list)

    @property
    def problems(self) -> List[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    def text(self) -> str:
        width = max(len(k) for k, _ in self.facts)
        lines = [f"{key:<{width}}  {value}" for key, value in self.facts]
        if self.findings:
            lines.append("")
            for finding in self.findings:
                lines.append(f"{finding.level.upper()}: {finding.what}")
                if finding.fix:
                    lines.append(f"  fix: {finding.fix}")
        lines.append("")
        lines.append(
            f"{len(self.problems)} problem(s) found."
            if self.problems
            else "No problems found: moe-lab and the notebooks should run here."
        )
        return "\n".join(lines)


def _installed(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _version(module: str) -> Optional[str]:
    """The version of Triton or numpy as moe_lab.runtime reads it (the module's `__version__`, whatever its
    distribution is called), or None where it is not installed."""
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module).__version__


def _torch_wants_triton() -> Optional[str]:
    """The Triton version this torch wheel pins (PyPI's Linux wheels do; CPU builds pin none)."""
    for req in metadata.requires("torch") or []:
        name, _, rest = req.partition("==")
        if name.strip() == "triton" and rest:
            return rest.split(";")[0].strip()
    return None


def front_end() -> str:
    """Where this Python runs, as far as a kernel can tell: a hosted notebook, a Jupyter kernel, or a shell."""
    if "google.colab" in sys.modules:
        return "Google Colab notebook"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "Kaggle notebook"
    if "ipykernel" in sys.modules:
        return "Jupyter kernel (JupyterLab, Notebook, VS Code or a hosted notebook)"
    return "terminal (no Jupyter kernel)"


def cache_problem(path: str) -> Optional[str]:
    """None if Triton can write its cache at `path` (the folder, or the nearest existing folder above it
    where the rest would be created), else what stands in the way."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"cannot be created: {probe} is a file"
    writable = os.access(probe, os.W_OK | os.X_OK)
    if writable:  # tried for real: os.access says yes to root even where nothing can be made (/proc)
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError:
            writable = False
    if not writable:
        return "is not writable" if probe == os.path.abspath(path) else f"cannot be created: {probe} is not writable"
    return None


def report() -> Report:
    rep = Report()
    fact, find = rep.facts.append, rep.findings.append
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    triton_version, numpy_version = _version("triton"), _version("numpy")

    fact(("moe-lab", f"{__version__} ({package})"))
    fact(("python", f"{platform.python_version()} on {platform.system()} {platform.machine()}"))
    fact(("torch", torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")))
    fact(("triton", triton_version or "not installed"))
    fact(("numpy", numpy_version or "not installed"))

    # Versions.
    wanted = _torch_wants_triton()
    low, high = SUPPORTED_TRITON
    if triton_version is None:
        find(
            Finding(
                "problem",
                "Triton is not installed: moe_lab's kernels cannot be defined (torch's CPU builds do not bring it)",
                f"pip install 'triton=={wanted}'"
                if wanted
                else "pip install 'triton>=3.6' (Linux), then restart Python",
            )
        )
    elif not low <= version_tuple(triton_version)[:2] <= high:
        find(
            Finding(
                "note",
                f"Triton {triton_version} is outside the tested range 3.6 to 3.9",
                "use the Triton your torch pins (torch 2.10/2.11 -> 3.6, 2.12/2.13 -> 3.7, 2.14 -> 3.8, 2.15 -> 3.9)",
            )
        )
    if wanted and triton_version and wanted != triton_version:
        find(
            Finding(
                "problem",
                f"torch {torch.__version__} was built for Triton {wanted}, but Triton {triton_version} is installed",
                f"pip install 'triton=={wanted}'",
            )
        )
    numpy_problem = interpreter_numpy_problem(triton_version, numpy_version) if interpreter_active() else None
    if numpy_problem:
        find(Finding("problem", numpy_problem, "pip install 'numpy<2.4', then restart the kernel or Python"))

    # Device and load paths.
    device = default_device()
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        fact(("device", f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}, {gib:.0f} GiB"))
    else:
        fact(("device", "CPU: kernels run under Triton's interpreter (small shapes; no timings)"))
        if torch.cuda.is_available():
            find(
                Finding(
                    "note",
                    "a CUDA GPU is visible but TRITON_INTERPRET=1 keeps kernels on the CPU",
                    "unset TRITON_INTERPRET (before importing moe_lab) to run on the GPU",
                )
            )
    fact(("interpreter", "on (TRITON_INTERPRET=1)" if interpreter_active() else "off"))
    if device.type == "cpu" and not interpreter_active():
        find(
            Finding(
                "problem",
                f"no CUDA GPU and TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r}: "
                "every kernel launch fails (Triton finds no driver)",
                "unset TRITON_INTERPRET (moe_lab then switches the interpreter on) or set it to 1",
            )
        )
    support = None
    try:
        support = tma_support(device) if triton_version else None
    except ValueError as exc:  # a bad MOE_LAB_TMA
        find(Finding("problem", str(exc), "export MOE_LAB_TMA=auto (or 0, or 1)"))
    try:
        if triton_version:  # (moe_lab.plan needs Triton)
            from ..plan import gluon_setting

            gluon_setting()
    except ValueError as exc:  # a bad MOE_LAB_GLUON: every fused_moe call would raise it
        find(Finding("problem", str(exc), "export MOE_LAB_GLUON=auto (or 0, or 1)"))
    if triton_version is None:
        fact(("TMA path", "unknown: Triton is not installed"))
    elif support is not None:
        fact(("TMA path", f"{'available' if support.available else 'not available'}: {support.reason}"))
    if device.type == "cuda" and torch.version.cuda and support is not None and not support.available:
        find(Finding("note", "this GPU runs the pointer path only (TMA needs compute capability >= 9.0)"))
    table = None
    if triton_version:  # the tables are per Triton version
        from ..tuned import table_for_device

        table = table_for_device(device)
        fact(("tuned table", table.reason))
    if device.type == "cuda" and table is not None and not table:
        find(
            Finding(
                "note",
                "no tuned launch table for this GPU's architecture: heuristic configs are used",
                "moe-lab tune writes one (docs/tuning.md)",
            )
        )

    # Workbook extras and front end.
    widgets, lab = _installed("ipywidgets"), _installed("jupyterlab")
    fact(("ipywidgets", widgets or "not installed"))
    fact(("matplotlib", _installed("matplotlib") or "not installed"))
    fact(("jupyterlab", lab or "not installed"))
    fact(("front end", front_end()))
    missing = [dist for dist in ("ipywidgets", "matplotlib") if not _installed(dist)]
    if missing:  # a problem in a notebook; a library-only install (kernels, demo, bench, tune) needs neither
        in_jupyter = "ipykernel" in sys.modules
        find(
            Finding(
                "problem" if in_jupyter else "note",
                f"the notebooks' pictures and widgets need {' and '.join(missing)}, not installed"
                + ("" if in_jupyter else " (the library and the command need neither)"),
                "pip install 'moe-lab[notebook]' (keeps a host's ipywidgets 7.7 or 8)",
            )
        )
    elif lab and version_tuple(lab)[:1] >= (4,) and version_tuple(widgets)[:1] < (8,):
        find(
            Finding(
                "note",
                f"JupyterLab {lab} draws ipywidgets 8 only; ipywidgets {widgets} is installed beside it (a hosted "
                "notebook's own front end, built for 7.7, draws them: there, change nothing)",
                "only if you work in this JupyterLab itself: pip install 'ipywidgets>=8'",
            )
        )

    # Triton's compile cache must be writable, or every kernel compiles again in every process (and
    # `moe_lab.tools.look_inside`, which compiles with the interpreter off, fails).
    cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache"
    )
    fact(("triton cache", cache))
    problem = cache_problem(cache)
    if problem:  # the interpreter caches nothing, but look_inside compiles for a GPU (interpreter off) here too
        find(
            Finding(
                "note" if interpreter_active() else "problem",
                f"Triton's cache folder {cache} {problem}"
                + (
                    ": the interpreter needs none, but notebooks 05 and 10's compile-for-a-GPU cells "
                    "(moe_lab.tools.look_inside) do"
                    if interpreter_active()
                    else ""
                ),
                "export TRITON_CACHE_DIR=/tmp/triton-cache (or another writable folder)",
            )
        )
    return rep


def main() -> int:
    rep = report()
    print(rep.text())
    return 1 if rep.problems else 0
