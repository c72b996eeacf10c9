from moe_lab.cli import main


def test_demo_small_runs_and_passes(capsys):
    assert main(["demo", "--model", "qwen3-30b-a3b", "--tokens", "0", "3", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b" in out and "all results match" in out


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "TMA path" in out


def test_demo_edges(capsys):
    # model names in any case; T = 0 prints no empty "Why these load paths"; --scale says when it rounds
    assert main(["demo", "--model", "Qwen3-30B-A3B", "--tokens", "0", "--scale", "100"]) == 0
    out = capsys.readouterr().out
    assert "Why these load paths" not in out and "rounds H 2048/100 -> 32" in out
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


def test_demo_help_explains_every_option(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for option in ("--model", "--tokens", "--dtype", "--use-tma", "--scale", "--force"):
        line = out[out.index(option):].split("\n--")[0]
        assert len(line.split()) > 4, f"{option} has no help"
