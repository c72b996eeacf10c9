import pytest

from moe_lab.tools.cli import main


def test_demo_small_runs_and_passes(capsys):
    assert main(["demo", "--model", "qwen3-30b-a3b", "--tokens", "0", "3", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b" in out and "all results match" in out


def test_demo_runs_gpt_oss_with_its_activation_and_biases(capsys, monkeypatch):
    """gpt-oss's preset (clamped SwiGLU on interleaved rows, biases) is a demo model: the layer and the
    reference both get its activation and biases."""
    import moe_lab.layer
    import moe_lab.reference

    seen = {}

    def spy(real, name):
        def call(*args, **kwargs):
            seen[name] = kwargs
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(moe_lab.layer, "fused_moe", spy(moe_lab.layer.fused_moe, "layer"))
    monkeypatch.setattr(moe_lab.reference, "fused_moe_reference", spy(moe_lab.reference.fused_moe_reference, "ref"))
    assert main(["demo", "--model", "GPT-OSS-20B", "--tokens", "3", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss-20b" in out and "all results match" in out
    assert sorted(seen) == ["layer", "ref"]
    for kw in seen.values():  # E = 32; H = I = 2880 / 128 -> 32
        assert kw["activation"] == moe_lab.GPT_OSS
        assert kw["w1_bias"].shape == (32, 64) and kw["w2_bias"].shape == (32, 32)


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "TMA path" in out


def test_demo_edges(capsys):
    from moe_lab import interpreter_active

    # model names in any case; T = 0 prints no empty "Why these load paths"; --scale says when it rounds
    assert main(["demo", "--model", "Qwen3-30B-A3B", "--tokens", "0", "--scale", "100"]) == 0
    out = capsys.readouterr().out
    assert "Why these load paths" not in out and "--scale 100 rounds H 2048/100 -> 32" in out
    # (From a new user's trial) without --scale, the note named a --scale that was not passed
    if interpreter_active():
        assert main(["demo", "--model", "qwen3-30b-a3b", "--tokens", "1"]) == 0
        out = capsys.readouterr().out
        assert "--scale" not in out and "the CPU's scale (64) rounds I 768/64 -> 16" in out
    # the device's TMA note once, not in every reason
    from moe_lab import tma_support

    assert main(["demo", "--model", "olmoe-1b-7b", "--tokens", "3", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    assert out.count(tma_support().reason) == 1


def test_demo_asks_before_minutes_of_interpreter(capsys):
    import pytest

    from moe_lab import interpreter_active

    if not interpreter_active():
        pytest.skip("a GPU runs large token counts without asking")
    assert main(["demo", "--tokens", "100000"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["demo", "--scale", "1"]) == 2  # full-size H and I: 4096 times the default's work
    assert "about 4096 times the work" in capsys.readouterr().err


def test_demo_without_gpu_or_interpreter_says_so_in_a_line(capsys, monkeypatch):
    from moe_lab.tools import cli

    monkeypatch.setattr(cli, "interpreter_active", lambda: False)
    monkeypatch.setattr(cli, "default_device", lambda: __import__("torch").device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "2")  # the value as it is set, not a made-up 0
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "Triton's interpreter is off (TRITON_INTERPRET='2'): the kernels cannot run here" in err


def test_demo_help_explains_every_option(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for option in ("--model", "--tokens", "--dtype", "--use-tma", "--scale", "--force"):
        line = out[out.index(option) :].split("\n--")[0]
        assert len(line.split()) > 4, f"{option} has no help"


def test_bench_help_says_what_it_times_and_where_results_go(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    description = out[: out.index("-h, --help")]
    assert "JSON and CSV to the --out folder" in description and "fp8/ folder" in description
    assert "Needs a CUDA GPU" in description


def _demo_rows(out):
    """(model, T, rel err, quant err) of each result line of `moe-lab demo --dtype fp8` (None where T = 0
    compared nothing: "-")."""

    def value(word):
        return None if word == "-" else float(word)

    rows = []
    for line in out.splitlines():
        words = line.split()
        if len(words) > 2 and words[-2] in ("ok", "FAIL", "-") and words[1].isdigit():
            rows.append((words[0], int(words[1]), value(words[-3]), value(words[-1])))
    return rows


def test_demo_fp8_reports_kernel_and_quantization_errors(capsys):
    # DeepSeek-V3's preset names its checkpoint's [128, 128] blocks; Mixtral takes the same by default
    assert (
        main(
            ["demo", "--dtype", "fp8", "--model", "deepseek-v3", "mixtral-8x7b", "--tokens", "0", "2", "--scale", "128"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[128, 128] block" in out and "the checkpoint of deepseek-v3 ships its experts" in out
    assert "quant err" in out and "rel err: the FP8 layer against the float32 PyTorch reference on the same FP8" in out
    rows = _demo_rows(out)
    assert [(m, t) for m, t, _, _ in rows] == [
        ("deepseek-v3", 0),
        ("deepseek-v3", 2),
        ("mixtral-8x7b", 0),
        ("mixtral-8x7b", 2),
    ]
    for model, tokens, kernel_err, quant_err in rows:
        if tokens:  # the kernels: about bf16 rounding; FP8 itself: several times more
            assert kernel_err < 1e-2 < quant_err < 0.2, (model, kernel_err, quant_err)
        else:  # T = 0 compares nothing
            assert kernel_err is None and quant_err is None
    assert "all results match the float32 PyTorch reference on the same FP8 operands" in out
    assert "T = 0 launches nothing: its rows show -." in out


def test_demo_fp8_refuses_where_fp8_cannot_run(capsys, monkeypatch):
    from moe_lab.capability import Fp8Support
    from moe_lab.tools import cli

    monkeypatch.setattr(cli, "fp8_support", lambda device: Fp8Support(False, "NVIDIA A100 has compute capability 8.0"))
    assert main(["demo", "--dtype", "fp8", "--tokens", "1"]) == 2
    captured = capsys.readouterr()
    assert "--dtype fp8 refused" in captured.err and "compute capability 8.0" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert main(["demo", "--model", "olmoe-1b-7b", "--tokens", "1", "--scale", "128"]) == 0  # bf16 unaffected


def test_dtype_choices(capsys):
    import pytest

    for command in ("demo", "bench", "tune"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--dtype", "fp4"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "invalid choice: 'fp4'" in err and "'fp8'" in err
    assert main(["tune", "--dtype", "fp8"]) == 2  # on a CPU: refused, like bf16 (no timing here)
    err = capsys.readouterr().err
    assert "moe-lab tune" in err and "Traceback" not in err


def test_fp8_tune_candidates_step_whole_scale_blocks():
    from moe_lab.tools.tune import candidates

    for rows_per_expert in (1, 16, 1000):
        space = candidates(rows_per_expert, 1, 227 * 1024)
        configs = [c for ups, downs in space.values() for c in ups + downs]
        # steps of one scale block, or at decode of two (one dot each: larger loads per step)
        assert configs and all(c.BLOCK_SIZE_K in ((128, 256) if rows_per_expert <= 48 else (128,)) for c in configs)
        assert all(c.BLOCK_SIZE_M * c.BLOCK_SIZE_N <= 64 * 256 for c in configs)
        # an up GEMM whose 128 output columns are one activation group, quantized in its epilogue, competes
        assert any(c.BLOCK_SIZE_N == 256 for ups, _ in space.values() for c in ups)


def test_bench_refuses_without_a_gpu(capsys):
    import pytest

    from moe_lab import interpreter_active

    if not interpreter_active():
        pytest.skip("a GPU runs the benchmark")
    for dtype in ("bf16", "fp8"):
        assert main(["bench", "--dtype", dtype, "--tokens", "1"]) == 2
        err = capsys.readouterr().err
        assert "moe-lab bench refused" in err and "Traceback" not in err


def test_deepseek_v3_preset_says_its_checkpoint_is_fp8():
    import pytest
    import torch

    from moe_lab import PRESETS, get_preset

    preset = get_preset("deepseek-v3")
    assert (preset.quantization, preset.weight_block_size) == ("fp8", (128, 128))
    assert preset.scaled(64).weight_block_size == (128, 128)
    assert all(p.quantization is None for name, p in PRESETS.items() if name != "deepseek-v3")
    assert list(PRESETS) == ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "olmoe-1b-7b", "qwen1.5-moe-a2.7b"]
    with pytest.raises(ValueError, match="unknown model preset 'deepseek-v4'; choose one of mixtral-8x7b, "):
        get_preset("deepseek-v4")
    small = preset.scaled(64)  # H 112, I 32: partial blocks
    _, w1, w2, _ = small.build(1)
    w1_fp8, w2_fp8, scales = small.quantize_fp8(w1, w2)
    assert w1_fp8.dtype == w2_fp8.dtype == torch.float8_e4m3fn and w1_fp8.shape == w1.shape
    assert scales["block_shape"] == (128, 128)
    assert scales["w1_scale"].shape == (256, 1, 1) and scales["w2_scale"].shape == (256, 1, 1)
    assert small.quantize_fp8(w1, w2, (32, 64))[2]["w1_scale"].shape == (256, 2, 2)


def test_bad_env_settings_are_said_before_any_launch(monkeypatch, capsys):
    for var, value in (("MOE_LAB_TMA", "maybe"), ("MOE_LAB_GLUON", "yes")):
        monkeypatch.setenv(var, value)
        for argv in (["demo", "--model", "qwen3-30b-a3b", "--tokens", "1", "--scale", "128"], ["info"]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"moe-lab: {var} must be") and repr(value) in err
        monkeypatch.delenv(var)


def test_version_has_one_source(capsys):
    import importlib.metadata
    import os

    import pytest

    import moe_lab

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"moe-lab {moe_lab.__version__}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml")) as f:
        pyproject = f.read()
    assert 'dynamic = ["version"]' in pyproject and 'version = { attr = "moe_lab.__version__" }' in pyproject
    assert importlib.metadata.version("moe-lab") == moe_lab.__version__  # what pip installed says the same


def test_bare_command_prints_the_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: moe-lab") and all(name in out for name in ("demo", "bench", "tune", "info", "doctor"))


def _subcommands():
    from moe_lab.tools.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    return sub.choices


def test_every_subcommand_has_a_description_and_every_option_its_default(capsys):
    from moe_lab.tools.cli import HelpFormatter

    for name, parser in _subcommands().items():
        assert parser.description and len(parser.description.split()) > 12, f"{name} has no description"
        formatter = HelpFormatter(prog=parser.prog)
        for action in parser._actions:
            if action.nargs == 0:  # -h and flags
                continue
            assert "default" in formatter._get_help_string(action), f"moe-lab {name} {action.option_strings}"
        parser.print_help()
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps
        assert name in ("info", "doctor") or "(default: bf16)" in out


def test_use_tma_choices_are_the_plans_words():
    from moe_lab.plan import USE_TMA_WORDS
    from moe_lab.tools.cli import USE_TMA_CHOICES

    assert sorted(USE_TMA_CHOICES) == sorted(USE_TMA_WORDS)


def test_the_package_imports_only_its_dependencies():
    """The library and the command (all but the workbook and the integrations, which their extras serve)
    import nothing beyond torch, Triton and numpy (the base dependencies): `pip install moe-lab` then
    `moe-lab tune` works."""
    import ast
    import os
    import sys

    import moe_lab

    package = os.path.dirname(moe_lab.__file__)
    found = set()
    for folder, _, files in os.walk(package):
        if os.path.relpath(folder, package).startswith(("workbook", "integrations")):
            continue
        for name in (f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    found.add(node.module.split(".")[0])
    assert found - set(sys.stdlib_module_names) - {"moe_lab"} <= {"torch", "triton", "numpy"}
    assert os.path.exists(os.path.join(package, "py.typed"))


def test_readme_gpu_path_installs_the_test_tools():
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    assert "pip install -e '.[notebook,test]'" in readme and "pytest -m gpu" in readme


def test_demo_use_tma_on_where_tma_cannot_be_used_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("MOE_LAB_TMA", "0")
    assert main(["demo", "--tokens", "1", "--model", "olmoe-1b-7b", "--use-tma", "on"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("moe-lab demo: --use-tma on, but TMA cannot be used here: disabled by MOE_LAB_TMA=0")


def test_demo_use_tma_on_and_a_tensor_tma_cannot_read_is_one_line(capsys, monkeypatch):
    import moe_lab.layer

    def refuse(*args, use_tma, **kwargs):
        assert use_tma is True
        raise ValueError("use_tma=True but w1 (8, 32, 16) cannot be read through a tensor descriptor: a rule")

    monkeypatch.setattr(moe_lab.layer, "fused_moe", refuse)
    assert main(["demo", "--tokens", "1", "--model", "olmoe-1b-7b", "--use-tma", "on", "--scale", "128"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "moe-lab demo: --use-tma on: use_tma=True but w1 (8, 32, 16) cannot be read through a tensor "
        "descriptor: a rule (use --use-tma auto or off)\n"
    )


def test_demo_with_t_0_only_says_nothing_was_compared(capsys):
    assert main(["demo", "--model", "olmoe-1b-7b", "--tokens", "0", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("olmoe-1b-7b")]
    assert row.split()[-2:] == ["-", "-"]  # rel err and result: nothing to show
    assert "all results match" not in out and "nothing was compared: T = 0 launches no kernel" in out


def _moe_lab(args, stdout):
    """`python -m moe_lab ARGS` writing to `stdout`; (exit status, stderr)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "moe_lab", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, timeout=120
    )
    return run.returncode, run.stderr


def test_output_cut_short_ends_quietly():
    """`moe-lab info | head -1`: the reader is gone; no traceback, status 1."""
    import os

    read, write = os.pipe()
    os.close(read)  # no reader at all: the first write fails
    try:
        status, err = _moe_lab(["info"], write)
    finally:
        os.close(write)
    assert (status, err) == (1, "")


def test_an_unknown_option_is_said_with_the_command_s_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--out", "x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "usage: moe-lab demo" in err
    assert "moe-lab demo: error: unrecognized arguments: --out x" in err
