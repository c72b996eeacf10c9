"""`moe-lab doctor`: what this environment is, whether moe-lab and its workbook will work in it, and what
to fix where they will not.

A report is two lists: facts (versions, device, TMA support, tuned table, notebook front end) and
findings, each a `Finding(level, what, fix)` with level "problem" (something will fail) or "note" (works,
but worth knowing). `report()` builds it without printing; `main()` prints it and returns 1 if any
problem was found, else 0. Nothing here imports Jupyter, ipywidgets or matplotlib unless they are installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import triton

from ..capability import tma_support
from ..runtime import default_device, interpreter_active, version_tuple
from ..tuned import table_for_device

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
    if not os.access(probe, os.W_OK | os.X_OK):
        return "is not writable" if probe == os.path.abspath(path) else f"cannot be created: {probe} is not writable"
    return None


def report() -> Report:
    rep = Report()
    fact, find = rep.facts.append, rep.findings.append
    import moe_lab

    fact(("moe-lab", f"{moe_lab.__version__} ({os.path.dirname(moe_lab.__file__)})"))
    fact(("python", f"{platform.python_version()} on {platform.system()} {platform.machine()}"))
    fact(("torch", torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")))
    fact(("triton", triton.__version__))
    fact(("numpy", _installed("numpy") or "not installed"))

    # Versions.
    low, high = SUPPORTED_TRITON
    if not low <= version_tuple(triton.__version__)[:2] <= high:
        find(
            Finding(
                "note",
                f"Triton {triton.__version__} is outside the tested range 3.6 to 3.9",
                "use the Triton your torch pins (torch 2.10/2.11 -> 3.6, 2.12/2.13 -> 3.7, 2.14 -> 3.8, 2.15 -> 3.9)",
            )
        )
    wanted = _torch_wants_triton()
    if wanted and wanted != triton.__version__:
        find(
            Finding(
                "problem",
                f"torch {torch.__version__} was built for Triton {wanted}, but Triton "
                f"{triton.__version__} is installed",
                f"pip install 'triton=={wanted}'",
            )
        )

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
    try:
        support = tma_support(device)
    except ValueError as exc:  # a bad MOE_LAB_TMA
        find(Finding("problem", str(exc), "export MOE_LAB_TMA=auto (or 0, or 1)"))
        support = None
    if support is not None:
        fact(("TMA path", f"{'available' if support.available else 'not available'}: {support.reason}"))
    if device.type == "cuda" and torch.version.cuda and support is not None and not support.available:
        find(Finding("note", "this GPU runs the pointer path only (TMA needs compute capability >= 9.0)"))
    table = table_for_device(device)
    fact(("tuned table", table.reason))
    if device.type == "cuda" and not table:
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
    if missing:
        find(
            Finding(
                "problem",
                f"the notebooks' pictures and widgets need {' and '.join(missing)}, not installed",
                "pip install 'moe-lab[notebook]' (keeps a host's ipywidgets 7.7 or 8)",
            )
        )
    elif lab and version_tuple(lab)[:1] >= (4,) and version_tuple(widgets)[:1] < (8,):
        find(
            Finding(
                "note",
                f"JupyterLab {lab} draws ipywidgets 8 only; ipywidgets {widgets} is installed beside it",
                "in this JupyterLab: pip install 'ipywidgets>=8' (a hosted notebook "
                "with its own front end is fine with 7.7)",
            )
        )

    # Triton's compile cache must be writable, or every kernel compiles again in every process.
    cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache"
    )
    fact(("triton cache", cache))
    problem = cache_problem(cache)
    if problem and not interpreter_active():
        find(
            Finding(
                "problem",
                f"Triton's cache folder {cache} {problem}",
                "export TRITON_CACHE_DIR=/tmp/triton-cache (or another writable folder)",
            )
        )
    return rep


def main() -> int:
    rep = report()
    print(rep.text())
    return 1 if rep.problems else 0
