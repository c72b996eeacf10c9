"""moe_lab.viz.performance: results loading, cost model, plots, and the guarded block-size widget."""
import json
import os

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.viz import performance as perf  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return perf.load_results()


def test_load_results_reads_newest_committed_file(results):
    assert os.path.dirname(results["path"]) == perf.results_dir()
    assert {"copy_tbps", "bf16_matmul_tflops"} <= set(results["ceilings"])
    assert results["rows"] and {"model", "T", "impl", "gemms_ms"} <= set(results["rows"][0])
    assert "committed data" in perf.describe_results(results)


def test_load_results_picks_newest_by_date(tmp_path, monkeypatch):
    row = dict(model="m", T=1, impl="moe-lab pointer", gemms_ms=1.0)
    for name, date in (("b-old.json", "2026-01-01"), ("a-new.json", "2026-12-31")):
        (tmp_path / name).write_text(json.dumps(dict(environment=dict(date=date), ceilings={}, rows=[row])))
    monkeypatch.setattr(perf, "results_dir", lambda: str(tmp_path))
    assert perf.load_results()["path"].endswith("a-new.json")
    monkeypatch.setattr(perf, "results_dir", lambda: str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        perf.load_results()


def test_layer_cost_matches_preset_flops():
    p = moe_lab.get_preset("mixtral-8x7b")
    c = perf.layer_cost(p, 64, experts_used=8)
    assert c["flops"] == p.flops(64)
    assert c["bytes"] > 2 * 8 * 3 * p.hidden_size * p.intermediate_size
    assert c["intensity"] == pytest.approx(c["flops"] / c["bytes"])
    assert perf.expected_experts_used(8, 2, 1) == pytest.approx(2.0)
    assert "MFLOP/token" in perf.cost_table(["mixtral-8x7b"], [1, 64])


def test_plots_return_figures(results):
    assert isinstance(perf.plot_roofline(results["ceilings"], results=results, presets=["qwen3-30b-a3b"]), Figure)
    assert isinstance(perf.plot_roofline(results["ceilings"]), Figure)
    fig = perf.plot_time_vs_tokens(results, "qwen3-30b-a3b", metric="layer_ms")
    assert "whole layer time (ms)" == fig.axes[0].get_ylabel()
    grid = perf.plot_time_grid(results)
    assert len(grid.axes) == len({r["model"] for r in results["rows"]})
    ax = Figure().add_subplot()
    assert perf.plot_bars([("a", 1.0), ("b (live)", 2.0)], title="t", ax=ax) is ax.figure


def test_compare_table_has_speedups(results):
    text = perf.compare_table(results, models=["qwen3-30b-a3b"])
    assert "speedup" in text and "qwen3-30b-a3b" in text and text.count("x") >= 3


@pytest.mark.skipif(not moe_lab.interpreter_active(), reason="checks the refusal under the interpreter")
def test_time_layer_refuses_under_interpreter():
    with pytest.raises(RuntimeError, match="interpreter"):
        perf.time_layer(moe_lab.get_preset("qwen3-30b-a3b"), 8, moe_lab.GemmConfig())


@pytest.mark.skipif(not moe_lab.interpreter_active(), reason="checks the refusal under the interpreter")
def test_block_size_widget_refuses_and_shows_committed(results):
    w = perf.block_size_widget("qwen3-30b-a3b", 512, results=results)
    assert "Not timing" in w.summary.value and "interpreter" in w.summary.value
    assert "committed" in w.summary.value
    assert w.timings == []
    before_fig, before_text = w.figure, w.summary.value
    model, tokens = w.children[0].children
    bm, bn, bk = w.children[1].children
    bm.value = 128
    assert "M128" in w.summary.value and w.summary.value != before_text
    tokens.value = 4096
    assert w.figure is not before_fig
    assert "T=4096" in w.summary.value
    assert w.timings == []
