from moe_lab.cli import main


def test_demo_small_runs_and_passes(capsys):
    assert main(["demo", "--model", "qwen3-30b-a3b", "--tokens", "0", "3", "--scale", "128"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b" in out and "all results match" in out


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "triton" in out and "TMA path" in out
