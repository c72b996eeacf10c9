"""The notebooks' one setup cell (notebooks/moe_lab_bootstrap.py): the same in every notebook, and what it
installs in each state, with pip replaced by a recorder."""

import glob
import importlib.util
import json
import os
import sys

import pytest

from moe_lab.runtime import interpreter_numpy_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")))
spec = importlib.util.spec_from_file_location(
    "moe_lab_bootstrap", os.path.join(ROOT, "notebooks", "moe_lab_bootstrap.py")
)
bootstrap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bootstrap)


def first_code_cell(path):
    """The source of the first code cell of a py:percent script or a stored notebook."""
    if path.endswith(".ipynb"):
        with open(path) as f:
            cells = json.load(f)["cells"]
        return "".join(next(c for c in cells if c["cell_type"] == "code")["source"]).strip()
    with open(path) as f:
        cells = f.read().split("\n# %%")
    return next(c for c in cells[1:] if c.startswith("\n")).strip()


def test_every_notebook_starts_with_the_same_setup_cell():
    assert len(SCRIPTS) == 12
    cells = {os.path.basename(p): first_code_cell(p) for p in SCRIPTS}
    assert len(set(cells.values())) == 1, cells
    cell = cells["00_start_here.py"]
    assert "moe_lab_bootstrap.ensure_moe_lab()" in cell and cell.endswith("# %matplotlib inline")
    assert len(cell.splitlines()) <= 15
    stored = {first_code_cell(p[: -len(".py")] + ".ipynb") for p in SCRIPTS}
    assert stored == {cell.replace("# %matplotlib inline", "%matplotlib inline")}  # the .ipynb are built from it


@pytest.mark.parametrize("triton_version", ["3.5.1", "3.6.0", "3.6.0+git1a2b", "3.7.1", "3.9.0", "dev"])
@pytest.mark.parametrize("numpy_version", ["1.26.4", "2.3.5", "2.4.0rc1", "2.4.6", "2.5.0", ""])
def test_the_numpy_rule_is_moe_labs(triton_version, numpy_version):
    assert bootstrap.needs_old_numpy(triton_version, numpy_version) == bool(
        interpreter_numpy_problem(triton_version, numpy_version)
    )


class Pip:
    """Stands in for subprocess.run: records pip's command and its constraints."""

    def __init__(self):
        self.commands, self.constraints = [], []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        with open(command[command.index("-c") + 1]) as f:
            self.constraints.append(f.read().split())
        return type("Done", (), {"returncode": 0})()


@pytest.fixture
def pip(monkeypatch):
    recorder = Pip()
    monkeypatch.setattr(bootstrap.subprocess, "run", recorder)
    return recorder


def test_installed_means_nothing_to_install(pip, capsys):
    bootstrap.ensure_moe_lab()
    assert pip.commands == []
    assert capsys.readouterr().out.startswith("moe-lab ready (")


def test_missing_moe_lab_is_installed_from_the_clone_keeping_the_hosts_versions(pip, monkeypatch, capsys):
    real = importlib.util.find_spec  # moe_lab: missing until pip has run
    monkeypatch.setattr(
        bootstrap.importlib.util, "find_spec", lambda n: real(n) if n != "moe_lab" or pip.commands else None
    )
    monkeypatch.setattr(
        bootstrap, "host_versions", lambda: {"torch": "2.11.0+cu128", "triton": "3.6.0", "numpy": "2.2.6"}
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    bootstrap.ensure_moe_lab()
    (command,) = pip.commands
    assert command[-2:] == ["-e", f"{bootstrap.CLONE}[notebook]"] and "numpy<2.4" not in command
    assert pip.constraints == [["torch==2.11.0+cu128", "triton==3.6.0", "numpy==2.2.6"]]
    out = capsys.readouterr().out
    assert "keeping torch 2.11.0+cu128, triton 3.6.0, numpy 2.2.6. A minute or two" in out and "moe-lab ready" in out
    assert sys.path[0] == bootstrap.CLONE  # this Python finds the editable install without a restart


def test_triton_3_6s_interpreter_gets_numpy_below_2_4_and_a_restart(pip, monkeypatch):
    monkeypatch.setattr(
        bootstrap, "host_versions", lambda: {"torch": "2.11.0+cpu", "triton": "3.6.0", "numpy": "2.4.6"}
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="restart the kernel"):  # numpy is loaded in this Python
        bootstrap.ensure_moe_lab()
    (command,) = pip.commands
    assert command[-1] == "numpy<2.4" and "-e" not in command
    assert pip.constraints == [["torch==2.11.0+cpu", "triton==3.6.0"]]
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU: compiled kernels keep the host's numpy
    bootstrap.ensure_moe_lab()
    assert len(pip.commands) == 1
