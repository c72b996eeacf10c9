"""The notebooks in a fresh hosted runtime: each notebook alone, in a venv that holds only what a hosted
notebook comes with (torch, Triton, numpy, ipywidgets and the Jupyter kernel), never moe-lab nor its other
dependencies, so that its setup cell (notebooks/moe_lab_bootstrap.py) installs moe-lab from this clone.

Usage (with .venv's Python; `make test-fresh-host`):
    .venv/bin/python .ci/fresh_host.py [--all-cells] [-j JOBS] [NOTEBOOK ...]   (default: notebooks/[0-9]*.ipynb)

For each notebook:
1. A host venv of its own, .venv-fresh-host/<notebook>/: the distributions torch, triton, numpy, ipywidgets,
   ipykernel and pip need (their requirements, followed through .venv's metadata), hard-linked from .venv's
   site-packages: the same files pip installed there, in a second or two, without a download or a second copy
   of torch. moe-lab and matplotlib must not be among them (checked).
2. A fresh kernel of that venv (cwd notebooks/, no PYTHONPATH) runs the notebook's code cells in order (the
   stored notebook is only read): the setup cell, the import cell and on to the first cell that launches a
   Triton kernel (every cell with --all-cells; make test runs every cell of every notebook under nbval).
3. Then it checks in that kernel: moe-lab was installed by the setup cell into the host venv, from this clone
   (editable), and no path of .venv is on sys.path; torch, Triton, numpy and ipywidgets are the versions the
   host started with.
Prints one line per notebook (cells run, seconds) and exits 1 if any notebook failed.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(ROOT, ".venv-fresh-host")
HOST_DISTS = ("torch", "triton", "numpy", "ipywidgets", "ipykernel", "pip")  # what a hosted runtime has
KEPT = ("torch", "triton", "numpy", "ipywidgets")  # what the setup cell must keep
ABSENT = ("moe-lab", "matplotlib")  # what the setup cell must install
KERNEL = "fresh-host"
CELL_TIMEOUT = 600  # seconds; the setup cell's pip install is the longest


def closure(names) -> dict:
    """The installed distributions `names` need, by canonical name, following .venv's metadata."""
    found, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(name)
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def make_host(path: str) -> dict:
    """A venv at `path` with HOST_DISTS hard-linked from this Python's site-packages; returns the versions
    of KEPT in it."""
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    source = sysconfig.get_paths()["purelib"]
    python = os.path.join(path, "bin", "python")
    target = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    dists = closure(HOST_DISTS)
    present = [name for name in ABSENT if name in dists]
    if present:
        raise SystemExit(f"the host's distributions would bring {present}: the setup cell must install those")
    for dist in dists.values():
        for file in dist.files or ():
            src = os.path.normpath(dist.locate_file(file))
            if not src.startswith(source + os.sep) or not os.path.isfile(src):
                continue  # scripts and data outside site-packages (a host's kernel spec is written below)
            dst = os.path.join(target, os.path.relpath(src, source))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.link(src, dst)
    spec = os.path.join(path, "share", "jupyter", "kernels", KERNEL)
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        json.dump({"argv": argv, "display_name": "fresh host", "language": "python"}, f)
    return {name: dists[name].version for name in KEPT}


# Run in the kernel after every cell: from the cell that imported moe_lab (and so Triton, with the backend
# moe_lab chose) on, counts the kernels launched.
COUNT_LAUNCHES = """
import sys
if "moe_lab" in sys.modules and "_fresh_host_launches" not in globals():
    import triton.runtime.interpreter, triton.runtime.jit
    _fresh_host_launches = [0]
    def _fresh_host_counting(run):
        def counted(*args, **kwargs):
            _fresh_host_launches[0] += 1
            return run(*args, **kwargs)
        return counted
    for _fresh_host_class in (triton.runtime.interpreter.InterpretedFunction, triton.runtime.jit.JITFunction):
        _fresh_host_class.run = _fresh_host_counting(_fresh_host_class.run)
print(globals().get("_fresh_host_launches", [0])[0])
"""

# Run in the kernel at the end: where moe-lab came from, and the versions the notebook ran with.
REPORT = """
import importlib.metadata, json, os, sys, sysconfig
import ipywidgets, moe_lab, numpy, torch, triton
_fresh_host_site = sysconfig.get_paths()["purelib"]
_fresh_host_dist = next(iter(importlib.metadata.distributions(name="moe-lab", path=[_fresh_host_site])), None)
print(json.dumps({
    "prefix": sys.prefix,
    "moe_lab": os.path.dirname(moe_lab.__file__),
    "installed": _fresh_host_dist is not None,
    "direct_url": json.loads(_fresh_host_dist and _fresh_host_dist.read_text("direct_url.json") or "{}"),
    "sys_path": sys.path,
    "versions": {"torch": torch.__version__, "triton": triton.__version__, "numpy": numpy.__version__,
                 "ipywidgets": ipywidgets.__version__},
}))
"""


def check(report: dict, host: str, versions: dict, setup_output: str) -> list:
    """What is wrong with the end-of-notebook report (nothing: [])."""
    problems = []
    host = os.path.realpath(host)
    if "installing moe-lab" not in setup_output:
        problems.append(f"the setup cell installed nothing: {setup_output!r}")
    if os.path.realpath(report["prefix"]) != host:
        problems.append(f"the kernel ran in {report['prefix']}, not in the host venv {host}")
    if os.path.realpath(report["moe_lab"]) != os.path.join(ROOT, "moe_lab"):
        problems.append(f"moe_lab imported from {report['moe_lab']}, not from this clone")
    if not report["installed"]:
        problems.append("moe-lab is not installed in the host venv")
    url = report["direct_url"]
    if not (url.get("dir_info", {}).get("editable") and url.get("url") == "file://" + ROOT):
        problems.append(f"moe-lab is not this clone installed editable: {url}")
    main_venv = os.path.join(ROOT, ".venv") + os.sep
    leaks = [p for p in report["sys_path"] if os.path.realpath(p).startswith(main_venv)]
    if leaks:
        problems.append(f".venv is on the kernel's sys.path: {leaks}")
    for name, version in versions.items():
        if report["versions"][name] != version:
            problems.append(f"{name} {version} was replaced by {report['versions'][name]}")
    return problems


class Kernel:
    """A kernel of the host venv, driven as a front end drives it (jupyter_client's blocking client: nbclient's
    asyncio polling can miss the execute reply after a cell that opens widgets, then waits out its timeout)."""

    def __init__(self, host: str, cwd: str):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET")}
        env["PATH"] = os.path.join(host, "bin") + os.pathsep + env.get("PATH", "")
        specs = KernelSpecManager(kernel_dirs=[os.path.join(host, "share", "jupyter", "kernels")])  # make_host's
        self.manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
        for last in (False, True):  # once more if it dies at start-up, as nbval's kernels do (../conftest.py)
            self.manager.start_kernel(cwd=cwd, env=env)
            self.client = self.manager.client()
            self.client.start_channels()
            try:
                self.client.wait_for_ready(timeout=120)
                break
            except RuntimeError as error:
                self.client.stop_channels()
                if last or "died" not in str(error):
                    raise
                print(f"{os.path.basename(host)}: {error}; starting it again", file=sys.stderr, flush=True)

    def run(self, code: str, timeout: float = CELL_TIMEOUT) -> str:
        """Runs `code`; returns its stdout; raises RuntimeError with the traceback if it fails."""
        out = []

        def collect(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect, allow_stdin=False)
        if reply["content"]["status"] != "ok":
            trace = "\n".join(reply["content"].get("traceback", []))
            raise RuntimeError(re.sub(r"\x1b\[[0-9;]*m", "", trace) or reply["content"]["status"])
        return "".join(out)

    def close(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def run_notebook(path: str, all_cells: bool) -> tuple:
    """Runs one notebook in a fresh host; returns (notebook, ok, what it says)."""
    import nbformat

    start = time.monotonic()
    name = os.path.splitext(os.path.basename(path))[0]
    host = os.path.join(HOSTS, name)
    versions = make_host(host)
    built = time.monotonic() - start
    code = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
    ran, setup_output = 0, ""
    kernel = Kernel(host, os.path.dirname(path))
    try:
        for source in code:
            output = kernel.run(source)
            ran += 1
            setup_output = setup_output or output
            if int(kernel.run(COUNT_LAUNCHES).split()[-1]) and not all_cells:
                break
        else:
            if not all_cells:
                return name, False, "no cell launched a kernel"
        report = json.loads(kernel.run(REPORT).splitlines()[-1])
    except (RuntimeError, TimeoutError) as error:
        return name, False, f"code cell {ran + 1} of {len(code)} failed:\n{error}"
    finally:
        kernel.close()
    problems = check(report, host, versions, setup_output)
    took = re.search(r"this cell took (\S+ s)", setup_output)
    seconds = time.monotonic() - start
    summary = f"{ran}/{len(code)} code cells, {seconds:.0f} s (host venv {built:.1f} s, setup cell {took and took[1]})"
    return name, not problems, "; ".join(problems) or summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: notebooks/[0-9]*.ipynb")
    parser.add_argument("--all-cells", action="store_true", help="every cell, not up to the first kernel launch")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count(), help="notebooks at once")
    args = parser.parse_args()
    notebooks = args.notebooks or sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.ipynb")))
    if len(notebooks) == 1:
        name, ok, text = run_notebook(os.path.abspath(notebooks[0]), args.all_cells)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {text}", flush=True)
        return 0 if ok else 1
    # One process per notebook: each kernel gets the environment of its own host venv.
    command = [sys.executable, os.path.abspath(__file__)] + (["--all-cells"] if args.all_cells else [])
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = pool.map(lambda nb: subprocess.run(command + [nb], capture_output=True, text=True), notebooks)
        failed = 0
        for run in runs:
            print(run.stdout + (run.stderr if run.returncode else ""), end="", flush=True)
            failed += run.returncode != 0
    print(f"fresh host: {len(notebooks) - failed} of {len(notebooks)} notebooks ran", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
