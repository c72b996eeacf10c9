"""`moe-lab tune` / `moe-lab bench` argument checks, on the CPU: the GPU pieces (device, compiling, timing)
are stubbed, the CLI's and tune.py's / bench.py's own path handling is what runs. Every refusal is one line,
status 2, said before any work (the stubbed timing of a point fails the test if reached)."""

import json

import pytest
import torch

from moe_lab.configs import GemmConfig, MoEConfig
from moe_lab.tools import bench, cli, tune
from moe_lab.tools.cli import main

DEVICE = "FAKE GPU"


@pytest.fixture
def gpu(monkeypatch):
    """A stand-in GPU for tune and bench; returns the list of points timed."""
    timed = []
    cfg = MoEConfig(GemmConfig(16, 64, 64), GemmConfig(16, 64, 64))

    def tune_point(preset, num_tokens, *args, **kwargs):
        timed.append((preset.name, num_tokens))
        return dict(ms=1.0, up_ms=0.5, down_ms=0.5, config=cfg, heuristic_ms=1.1, heuristic=cfg)

    def bench_point(preset, num_tokens, *args, **kwargs):
        timed.append((preset.name, num_tokens))
        return [{"model": preset.name, "T": num_tokens, "impl": "moe-lab", "ms": 1.0}]

    monkeypatch.setattr(cli, "_refused", lambda what: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: DEVICE)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    for module in (tune, bench):
        monkeypatch.setattr(module, "require_gpu_timing", lambda what: None)
    monkeypatch.setattr(tune, "shared_memory_limit", lambda: 232448)
    monkeypatch.setattr(tune, "precompile", lambda points, dtype: 0)
    monkeypatch.setattr(tune, "tune_point", tune_point)
    env = {"device": DEVICE, "date": "2026-01-01", "capability": "9.0", "torch": "x", "triton": "y"}
    monkeypatch.setattr(bench, "environment", lambda: env)
    monkeypatch.setattr(bench, "measure_ceilings", lambda: {"copy_tbps": 1, "read_tbps": 1, "bf16_matmul_tflops": 1})
    monkeypatch.setattr(bench, "bench_point", bench_point)
    monkeypatch.setattr(bench, "print_table", lambda rows: None)
    return timed


def _refusal(capsys, command):
    """The one line of a refusal of `moe-lab <command>`."""
    err = capsys.readouterr().err
    assert err.startswith(f"moe-lab {command}: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


TUNE = ["tune", "--model", "olmoe-1b-7b", "--tokens", "1"]
BENCH = ["bench", "--model", "olmoe-1b-7b", "--tokens", "1"]


def test_tune_out_a_bare_file_name_as_in_the_docs(gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*TUNE, "--out", "my-table.json"]) == 0
    assert "wrote my-table.json" in capsys.readouterr().out
    table = json.loads((tmp_path / "my-table.json").read_text())
    assert table["device"] == DEVICE and table["capability"] == [9, 0] and len(table["shapes"]) == 1
    # and into a folder not there yet
    assert main([*TUNE, "--out", "sub/t.json"]) == 0 and (tmp_path / "sub" / "t.json").exists()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("directory", "is a directory; give a .json file"),
        ("not json", "exists and is not a tuned table (JSONDecodeError"),
        ("json, no shapes", 'is not a tuned table (JSON without a "shapes" object)'),
        ("folder under a file", "cannot write a file in"),
        ("empty", "--out must be a JSON file name, got ''"),
        ("another device", "is the table of NVIDIA H200 with Triton 3.6.0; this is FAKE GPU with Triton"),
        ("another format", "is a table of format 99"),
        ("no device", 'is a table without its "device" and "triton" fields'),
    ],
)
def test_tune_out_is_checked_before_any_tuning(gpu, tmp_path, capsys, case, expected):
    import triton

    (tmp_path / "file").write_text("not json\n")
    (tmp_path / "no_shapes.json").write_text("[1, 2]")
    h200 = {"device": "NVIDIA H200", "triton": "3.6.0", "capability": [9, 0], "shapes": {"k": {}}}
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    other_format = {"device": DEVICE, "triton": triton.__version__, "format": 99, "shapes": {}}
    (tmp_path / "format.json").write_text(json.dumps(other_format))
    (tmp_path / "bare.json").write_text(json.dumps({"shapes": {}}))
    out = {
        "directory": str(tmp_path),
        "not json": str(tmp_path / "file"),
        "json, no shapes": str(tmp_path / "no_shapes.json"),
        "folder under a file": str(tmp_path / "file" / "t.json"),
        "empty": "",
        "another device": str(tmp_path / "h200.json"),
        "another format": str(tmp_path / "format.json"),
        "no device": str(tmp_path / "bare.json"),
    }[case]
    assert main([*TUNE, "--out", out]) == 2
    assert expected in _refusal(capsys, "tune")
    assert gpu == []  # nothing tuned
    assert json.loads((tmp_path / "h200.json").read_text()) == h200  # another device's table left as it was


def test_tune_merges_into_a_table_of_this_device_and_triton(gpu, tmp_path, capsys):
    import triton

    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"device": DEVICE, "triton": triton.__version__, "shapes": {"other": {"1": {}}}}))
    assert main([*TUNE, "--out", str(path)]) == 0
    shapes = json.loads(path.read_text())["shapes"]
    assert "other" in shapes and len(shapes) == 2


def test_tune_checks_its_default_table_too(gpu, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(tune, "config_path", lambda device, version: str(tmp_path / "file" / "t.json"))
    assert main(TUNE) == 2
    assert "the table (no --out)" in _refusal(capsys, "tune") and gpu == []


def test_tune_and_bench_refuse_an_empty_problem(gpu, capsys):
    for command in (TUNE, BENCH):
        for tokens in ("0", "-1"):  # one bound, said once: not ">= 0" for -1, then ">= 1" for 0
            assert main([*command[:-1], tokens]) == 2
            assert f"--tokens must be >= 1 (T = 0 is an empty problem: nothing to time), got {tokens}" in _refusal(
                capsys, command[0]
            )
    assert gpu == []
    with pytest.raises(ValueError, match="tokens must be >= 1"):  # the library refuses as well
        tune.run(["olmoe-1b-7b"], [0])


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty", "--out must be a folder name, got ''"),
        ("a file", "is a file; give a folder"),
        ("under a file", "cannot make or write the folder"),
    ],
)
def test_bench_out_is_checked_before_any_timing(gpu, tmp_path, capsys, case, expected):
    (tmp_path / "file").write_text("")
    out = {"empty": "", "a file": str(tmp_path / "file"), "under a file": str(tmp_path / "file" / "results")}[case]
    assert main([*BENCH, "--out", out]) == 2
    assert expected in _refusal(capsys, "bench")
    assert gpu == []


def test_bench_writes_into_a_new_folder(gpu, tmp_path, capsys):
    out = tmp_path / "new" / "results"
    assert main([*BENCH, "--out", str(out)]) == 0
    assert sorted(p.suffix for p in out.iterdir()) == [".csv", ".json"]
    assert bench.check_out_dir(str(out), torch.float8_e4m3fn) == str(out / "fp8")  # other dtypes: a folder in it


def test_model_and_dtype_names_in_any_case_for_every_command(gpu, tmp_path, capsys):
    """One rule: demo, bench and tune take --model (and --dtype) in any case."""
    names = ["--model", "MIXTRAL-8x7B", "--tokens", "1", "--dtype", "BF16"]
    assert main(["tune", *names, "--out", str(tmp_path / "t.json")]) == 0
    assert main(["bench", *names, "--out", str(tmp_path)]) == 0
    assert gpu == [("mixtral-8x7b", 1), ("mixtral-8x7b", 1)]
    demo = ["demo", "--model", "OLMOE-1B-7B", "--tokens", "1", "--scale", "128", "--dtype", "FP32", "--use-tma", "OFF"]
    assert main(demo) == 0


def test_a_table_under_a_file_says_the_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        tune.open_table(str(tmp_path / "file" / "sub" / "table.json"), "NVIDIA H200", "3.6.0", "--out")
