"""`moe-lab doctor`: facts, findings, exit status."""

import os

import pytest

from moe_lab.tools import doctor
from moe_lab.tools.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_doctor_reports_versions_device_and_widgets(capsys):
    status = main(["doctor"])
    out = capsys.readouterr().out
    for key in ("torch", "triton", "numpy", "device", "TMA path", "ipywidgets", "front end"):
        assert key in out
    assert status == (1 if "PROBLEM" in out else 0)


def test_doctor_names_a_torch_triton_mismatch_and_its_fix(monkeypatch):
    monkeypatch.setattr(doctor, "_torch_wants_triton", lambda: "9.9.9")
    rep = doctor.report()
    (problem,) = [f for f in rep.problems if "Triton 9.9.9" in f.what]
    assert "pip install 'triton==9.9.9'" in problem.fix
    assert "1 problem(s) found." in rep.text()


def test_doctor_says_how_to_get_the_notebook_extras(monkeypatch):
    """A library-only install (a terminal): a note, exit 0; in a Jupyter kernel, where notebooks run: a problem."""
    import sys

    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda dist: None if dist == "ipywidgets" else real(dist))
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    rep = doctor.report()
    (note,) = [f for f in rep.findings if "moe-lab[notebook]" in f.fix]
    assert note.level == "note" and "ipywidgets" in note.what and note not in rep.problems
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # any module: a Jupyter kernel runs this Python
    assert any("moe-lab[notebook]" in f.fix for f in doctor.report().problems)


def test_doctor_notes_ipywidgets_7_beside_jupyterlab_4(monkeypatch):
    versions = {"ipywidgets": "7.7.1", "jupyterlab": "4.2.0", "matplotlib": "3.9.0"}
    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda dist: versions[dist] if dist in versions else real(dist))
    notes = [f for f in doctor.report().findings if f.level == "note"]
    assert any("ipywidgets 8" in f.what for f in notes)


def test_doctor_names_a_cpu_without_the_interpreter(monkeypatch):
    import torch

    if torch.cuda.is_available():
        return
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert any("TRITON_INTERPRET" in f.what for f in doctor.report().problems)


def test_doctor_reports_a_bad_tma_setting_instead_of_crashing(monkeypatch):
    monkeypatch.setenv("MOE_LAB_TMA", "maybe")
    assert any("MOE_LAB_TMA" in f.what for f in doctor.report().problems)


def test_doctor_reports_a_bad_gluon_setting(monkeypatch):
    monkeypatch.setenv("MOE_LAB_GLUON", "yes")
    assert any("MOE_LAB_GLUON" in f.what for f in doctor.report().problems)


def test_cache_problem(tmp_path):
    assert doctor.cache_problem(str(tmp_path / "new" / "cache")) is None  # created on first use
    (tmp_path / "file").write_text("x")
    assert "is a file" in doctor.cache_problem(str(tmp_path / "file" / "cache"))
    if os.path.isdir("/proc"):  # writable to os.access as root, yet nothing can be made there
        assert doctor.cache_problem("/proc/triton-cache") == "cannot be created: /proc is not writable"


def test_doctor_without_triton(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda module: None if module == "triton" else "2.3.5")
    rep = doctor.report()
    (problem,) = [f for f in rep.problems if "Triton is not installed" in f.what]
    assert "pip install 'triton" in problem.fix
    assert ("triton", "not installed") in rep.facts and ("TMA path", "unknown: Triton is not installed") in rep.facts


def test_doctor_names_numpy_too_new_for_triton_3_6s_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(doctor, "_version", {"triton": "3.6.0", "numpy": "2.4.6"}.get)
    (problem,) = [f for f in doctor.report().problems if "numpy 2.4.6" in f.what]
    assert problem.fix.startswith("pip install 'numpy<2.4'") and "restart" in problem.fix


# The real states, in a fresh Python each: `import moe_lab` succeeds, a name of the package raises the
# explanation, `moe-lab demo` refuses in one line, and `moe-lab doctor` runs and names the problem (exit 1).
BROKEN = {
    "no Triton": "",  # run on a copy of site-packages without Triton (below)
    "Triton 3.6, numpy 2.4": "import os, numpy, triton; os.environ['TRITON_INTERPRET'] = '1'; "
    "triton.__version__ = '3.6.0'; numpy.__version__ = '2.4.6'",
}


def _site_without_triton(folder) -> dict:
    """The environment of a Python whose packages are this one's but Triton: site-packages' entries linked
    into `folder`, Triton's left out, and no site processing (-S) so that only `folder` and the repository
    are on the path, as where Triton was never installed."""
    import site

    (packages,) = [p for p in site.getsitepackages() if os.path.isdir(os.path.join(p, "torch"))]
    for entry in os.listdir(packages):
        if not entry.lower().startswith("triton"):
            os.symlink(os.path.join(packages, entry), os.path.join(folder, entry))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), ROOT]))


@pytest.mark.parametrize("state", sorted(BROKEN))
def test_the_doctor_runs_where_the_kernels_cannot(state, tmp_path):
    import subprocess
    import sys

    script = (
        BROKEN[state]
        + """
import moe_lab
from moe_lab.tools.cli import main

try:
    moe_lab.fused_moe
except RuntimeError as exc:
    print("RAISED", exc)
print("DEMO", main(["demo"]))
print("DOCTOR", main(["doctor"]))
"""
    )
    command, env = [sys.executable, "-c", script], None
    if state == "no Triton":
        command, env = [sys.executable, "-S", "-c", script], _site_without_triton(tmp_path)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "RAISED moe_lab.fused_moe cannot be used here" in out and "DEMO 2" in out and "DOCTOR 1" in out
    assert "Traceback" not in run.stderr and "moe-lab demo: " in run.stderr
    assert ("Triton is not installed" if state == "no Triton" else "numpy < 2.4") in out.split("PROBLEM: ")[1]


def test_doctor_reports_an_unusable_cache_under_the_interpreter_too(monkeypatch, tmp_path):
    """The interpreter caches nothing, but look_inside (notebooks 05 and 10) compiles for a GPU here: a note;
    with the interpreter off (a GPU) a problem."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "file" / "cache"))
    for interpreted, level in ((True, "note"), (False, "problem")):
        monkeypatch.setattr(doctor, "interpreter_active", lambda: interpreted)
        (finding,) = [f for f in doctor.report().findings if "cache folder" in f.what]
        assert finding.level == level and "is a file" in finding.what and "TRITON_CACHE_DIR" in finding.fix
        assert ("notebooks 05 and 10" in finding.what) == interpreted
