"""`moe-lab doctor`: facts, findings, exit status."""

from moe_lab.tools import doctor
from moe_lab.tools.cli import main


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
    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda dist: None if dist == "ipywidgets" else real(dist))
    rep = doctor.report()
    assert any("moe-lab[notebook]" in f.fix for f in rep.problems)


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


def test_cache_problem(tmp_path):
    assert doctor.cache_problem(str(tmp_path / "new" / "cache")) is None  # created on first use
    (tmp_path / "file").write_text("x")
    assert "is a file" in doctor.cache_problem(str(tmp_path / "file" / "cache"))
