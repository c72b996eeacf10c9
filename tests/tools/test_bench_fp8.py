"""`moe-lab bench --dtype fp8`: where its results go (never where readers of bf16 results look), its table,
and on a GPU one point of moe-lab FP8 against moe-lab bf16."""

import json
import os

import pytest
import torch

from moe_lab import get_preset
from moe_lab.tools import bench
from moe_lab.workbook.viz import performance as perf


def test_results_of_other_dtypes_go_to_their_own_folder():
    assert bench.results_place("results", "bench", torch.bfloat16) == ("results", "bench")
    assert bench.results_place("results", "bench", torch.float8_e4m3fn) == (os.path.join("results", "fp8"), "bench-fp8")
    assert bench.results_place("results", "bench", torch.float16) == (os.path.join("results", "fp16"), "bench-fp16")


def test_newest_fp8_results_are_not_read_as_bf16(tmp_path, monkeypatch):
    env = dict(device="NVIDIA H200", date="2026-11-30", time="10:00 UTC")
    bench._write(dict(environment=env, ceilings={}, rows=[]), str(tmp_path), "bench", env)
    folder, tag = bench.results_place(str(tmp_path), "bench", torch.float8_e4m3fn)
    newer = dict(env, date="2026-12-01")
    stem = bench._write(dict(environment=newer, ceilings={}, dtype="fp8", rows=[]), folder, tag, newer)
    assert os.path.basename(stem) == "bench-fp8-NVIDIA_H200-2026-12-01"
    with open(stem + ".json") as f:
        assert json.load(f)["dtype"] == "fp8"
    monkeypatch.setattr(perf, "results_dir", lambda: str(tmp_path))
    assert os.path.basename(perf.load_results()["path"]) == "bench-NVIDIA_H200-2026-11-30.json"


def test_fp8_table_shows_speedups_and_both_errors(capsys):
    base = dict(model="deepseek-v3", T=64, up_ms=1.0, down_ms=0.5, gemms_ms=1.5, layer_ms=2.0)
    bench.print_table(
        [
            dict(base, impl="moe-lab bf16", rel_err=3e-3, pct_roofline=80.0),
            dict(
                base,
                impl="moe-lab fp8",
                gemms_ms=0.8,
                rel_err=2e-3,
                quant_err=6e-2,
                speedup_gemms=1.875,
                speedup_layer=1.5,
            ),
        ]
    )
    header, bf16, fp8 = capsys.readouterr().out.splitlines()
    assert header.split()[-7:] == ["err", "x", "gemms", "x", "layer", "quant", "err"]
    assert fp8.split()[-3:] == ["1.88", "1.50", "6.0e-02"] and bf16.split()[-3:] == ["-", "-", "-"]


@pytest.mark.gpu
def test_fp8_point_against_bf16_on_gpu():
    preset = get_preset("qwen3-30b-a3b")
    rows = bench.bench_point_fp8(preset, 64, {"copy_tbps": 4.0, "read_tbps": 4.0, "bf16_matmul_tflops": 700.0})
    bf16, fp8 = rows
    assert (bf16["impl"], fp8["impl"], fp8["dtype"], fp8["block_shape"]) == (
        "moe-lab bf16",
        "moe-lab fp8",
        "float8_e4m3fn",
        [128, 128],
    )
    assert not bf16.get("error") and not fp8.get("error")
    assert fp8["rel_err"] < 1e-2 < fp8["quant_err"] < 0.2 and bf16["rel_err"] < 1e-2
    assert fp8["speedup_gemms"] == pytest.approx(bf16["gemms_ms"] / fp8["gemms_ms"])


def test_fp8_point_runs_its_gemms_and_layers_on_cpu(monkeypatch, capsys):
    """bench_point_fp8 with each timing replaced by one call: what it launches and checks, under the interpreter."""
    from moe_lab import interpreter_active
    from moe_lab.presets import MoEPreset

    if not interpreter_active():
        pytest.skip("the GPU test times it")
    build, routing = MoEPreset.build, bench.uniform_routing
    monkeypatch.setattr(MoEPreset, "build", lambda self, t, **kw: build(self, t, **dict(kw, device="cpu")))
    monkeypatch.setattr(bench, "uniform_routing", lambda *a, **kw: routing(*a, **dict(kw, device="cpu")))
    times = iter([1.0, 1.0, 2.0, 4.0, 1.0, 0.5, 1.0, 2.0])  # up, down, both GEMMs, layer: bf16, then fp8
    monkeypatch.setattr(bench, "graph_ms", lambda fn, **kw: (fn(), next(times))[1])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    bf16, fp8 = bench.bench_point_fp8(
        get_preset("mixtral-8x7b").scaled(128), 3, {"copy_tbps": 4.0, "read_tbps": 4.0, "bf16_matmul_tflops": 700.0}
    )
    assert not bf16.get("error") and not fp8.get("error")
    assert (fp8["speedup_gemms"], fp8["speedup_layer"]) == (2.0, 2.0) and "pct_roofline" not in fp8
    assert bf16["rel_err"] < 1e-2 and fp8["rel_err"] < 1e-2 < fp8["quant_err"] < 0.2
