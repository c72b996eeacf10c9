"""What the first cell of every notebook runs: make moe-lab importable here, keeping the host's torch, Triton,
numpy and ipywidgets. Standard library only, and it loads neither torch nor numpy: it runs before moe-lab is
installed, and before numpy is loaded (so that a numpy it replaces needs no restart).

`ensure_moe_lab()`:
- moe-lab and the notebook extras importable (`make lab`, a shared hub, a second run): installs nothing and
  says where moe-lab is, in about a second;
- else (a hosted notebook): `pip install -e <this clone>[notebook]` with the host's versions of KEEP handed to
  pip as constraints, so pip keeps them: a minute or two, once per runtime;
- where Triton <= 3.6 runs its interpreter (no GPU) beside numpy >= 2.4, which fails inside every kernel with
  a loop (`moe_lab.runtime.interpreter_numpy_problem`, the same rule): numpy < 2.4 in the same pip call; where
  this Python had loaded numpy already, it then asks for a restart.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

KEEP = ("torch", "triton", "numpy", "ipywidgets")  # the host's: handed to pip as constraints
EXTRAS = ("ipywidgets", "matplotlib")  # what the notebook extra brings, by module
OLD_NUMPY = "numpy<2.4"
CLONE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this file is <clone>/notebooks/


def host_versions() -> Dict[str, str]:
    """The installed versions of KEEP (those that are installed)."""
    versions = {}
    for dist in KEEP:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _release(version: str) -> tuple:
    """ "3.6.0+git1a2b" -> (3, 6), "2.4.0rc1" -> (2, 4), "dev" -> ()."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:2])


def needs_old_numpy(triton_version: Optional[str], numpy_version: Optional[str]) -> bool:
    """Triton <= 3.6's interpreter beside numpy >= 2.4 (versions it cannot read: no)."""
    triton_release, numpy_release = _release(triton_version or ""), _release(numpy_version or "")
    return bool(triton_release and numpy_release) and triton_release <= (3, 6) and numpy_release >= (2, 4)


def interpreter_will_run() -> bool:
    """Whether `import moe_lab` will run kernels under Triton's interpreter: TRITON_INTERPRET as Triton reads
    it, or, unset, no CUDA GPU visible to torch (asked in a child process: this one must not load numpy)."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is not None:
        return value.strip().lower() in ("1", "true", "on", "yes", "y")
    check = [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"]
    return subprocess.run(check, capture_output=True, text=True).stdout.strip() != "True"


def pip_command(constraints: str, install_moe_lab: bool, old_numpy: bool) -> List[str]:
    """The one pip call: moe-lab from this clone (editable, with the notebook extras) and/or numpy < 2.4,
    under the constraints file `constraints`."""
    command = [sys.executable, "-m", "pip", "install", "-q", "-c", constraints]
    if install_moe_lab:
        command += ["-e", f"{CLONE}[notebook]"]
    if old_numpy:
        command.append(OLD_NUMPY)
    return command


def ensure_moe_lab() -> None:
    """Install what is missing (see the module's docstring), then say where moe-lab is and which torch,
    Triton and numpy it runs with. Raises RuntimeError where a restart is needed, or pip failed."""
    start = time.monotonic()
    versions = host_versions()
    install_moe_lab = not all(importlib.util.find_spec(m) for m in ("moe_lab", *EXTRAS))
    old_numpy = needs_old_numpy(versions.get("triton"), versions.get("numpy")) and interpreter_will_run()
    if install_moe_lab or old_numpy:
        if old_numpy:
            del versions["numpy"]
        what = ["moe-lab with its notebook extras from " + CLONE] if install_moe_lab else []
        what += [f"{OLD_NUMPY} (Triton {versions['triton']}'s interpreter fails under numpy 2.4)"] if old_numpy else []
        kept = ", ".join(f"{dist} {version}" for dist, version in versions.items()) or "nothing"
        print(f"installing {' and '.join(what)}; keeping {kept}. A minute or two, once per runtime.", flush=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
            constraints.write("".join(f"{dist}=={version}\n" for dist, version in versions.items()))
        if subprocess.run(pip_command(constraints.name, install_moe_lab, old_numpy)).returncode:
            raise RuntimeError("pip failed (its messages are above); docs/hosted.md says what moe-lab needs")
        if install_moe_lab:
            sys.path.insert(0, CLONE)  # new Pythons see the editable install; this one needs the path now
        importlib.invalidate_caches()
        if old_numpy and "numpy" in sys.modules:
            raise RuntimeError(
                f"{OLD_NUMPY} is installed, but this Python loaded numpy {sys.modules['numpy'].__version__} "
                "already: restart the kernel (or the runtime) and run this cell again."
            )
    where = os.path.dirname(importlib.util.find_spec("moe_lab").origin)
    where = os.path.relpath(where) if where.startswith(CLONE + os.sep) else where  # "../moe_lab" in a clone
    versions = host_versions()
    print(
        f"moe-lab ready ({where}); torch {versions.get('torch')}, Triton "
        f"{versions.get('triton', 'not installed')}, numpy {versions.get('numpy')}; this cell took "
        f"{time.monotonic() - start:.1f} s"
    )
