"""Which tuned table serves a device (exact, same device nearest Triton, same architecture), never across
architectures, where a layer's config came from, and that lookups read no file after the first.
CPU only: the device name, capability and Triton version are monkeypatched, the tables are fake."""

import builtins
import json
import os

import pytest
import torch
import triton

import moe_lab
from moe_lab import tuned
from moe_lab.configs import GemmConfig, MoEConfig, heuristic_config
from moe_lab.tuned import default_config

from .conftest import DEVICE, ON_GPU, random_layer

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
A100 = "NVIDIA A100-SXM4-80GB"
SHAPE = dict(num_experts=8, top_k=2, hidden_size=4096, intermediate_size=14336, dtype=torch.bfloat16)
KEY = tuned.shape_key(8, 2, 4096, 14336, torch.bfloat16)


def _entry(block_n: int, block_m: int = 16) -> dict:
    cfg = GemmConfig(block_m, block_n, 64, 1, 4, 3).to_dict()
    return {"up": cfg, "down": cfg, "ms": 1.0, "heuristic_ms": 1.1}


def write_table(directory, device, triton_version, capability=(9, 0), *, block_n=64, shapes=None, with_capability=True):
    """A fake table as `moe-lab tune` writes it; its entries carry `block_n` so a test can tell tables apart."""
    table = {
        "device": device,
        "triton": triton_version,
        "shapes": shapes if shapes is not None else {KEY: {"1": _entry(block_n), "64": _entry(block_n, 32)}},
    }
    if with_capability:
        table["capability"] = list(capability) if capability is not None else None
    path = os.path.join(str(directory), f"{device.replace(' ', '_')}__triton-{triton_version}.json")
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    return path


@pytest.fixture
def gpu_world(monkeypatch, tmp_path):
    """A pretend CUDA machine: `world(name, capability, triton)` sets what device 0 is; tables go in tmp_path."""
    facts = {0: (H200, (9, 0))}

    def world(name=H200, capability=(9, 0), triton_version="3.6.0", devices=None):
        facts.clear()
        facts.update(devices or {0: (name, capability)})
        monkeypatch.setattr(triton, "__version__", triton_version)
        tuned.clear_cache()
        return tmp_path

    monkeypatch.setattr(tuned, "interpreter_active", lambda: False)
    monkeypatch.setattr(tuned, "CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: facts[d if isinstance(d, int) else 0][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: facts[d if isinstance(d, int) else 0][1])
    monkeypatch.setattr(torch.version, "hip", None)
    tuned.clear_cache()
    yield world
    tuned.clear_cache()


def test_exact_table(gpu_world):
    d = gpu_world(H200, (9, 0), "3.6.0")
    exact = write_table(d, H200, "3.6.0")
    write_table(d, H200, "3.8.0")
    write_table(d, H100, "3.6.0")
    table = tuned.table_for_device()
    assert table and table.exact and table.path == exact
    assert (table.device, table.triton, table.capability) == (H200, "3.6.0", (9, 0))
    assert table.reason == "tuned on NVIDIA H200 with Triton 3.6.0: this device and this Triton version (exact table)"
    assert table.summary == "NVIDIA H200, Triton 3.6.0 (exact)"


def test_same_device_nearest_triton_beats_other_device_of_exact_triton(gpu_world):
    d = gpu_world(H200, (9, 0), "3.9.0")
    write_table(d, H200, "3.6.0")
    nearest = write_table(d, H200, "3.8.0")
    write_table(d, H100, "3.9.0")
    table = tuned.table_for_device()
    assert table.path == nearest and not table.exact
    assert table.reason == (
        "tuned on NVIDIA H200 with Triton 3.8.0; this is NVIDIA H200 with Triton 3.9.0: "
        "same device, nearest Triton version"
    )


def test_triton_tie_goes_to_the_newer(gpu_world):
    d = gpu_world(H200, (9, 0), "3.7.0")
    write_table(d, H200, "3.6.0")
    newer = write_table(d, H200, "3.8.0")
    assert tuned.table_for_device().path == newer


def test_other_device_of_same_architecture(gpu_world):
    d = gpu_world(H100, (9, 0), "3.9.0")
    write_table(d, H200, "3.6.0")
    nearest = write_table(d, H200, "3.8.0")
    write_table(d, A100, "3.9.0", (8, 0))  # exact Triton, other architecture: never
    table = tuned.table_for_device()
    assert table.path == nearest and not table.exact and table.capability == (9, 0)
    assert table.reason == (
        "tuned on NVIDIA H200 with Triton 3.8.0; this is NVIDIA H100 80GB HBM3 with Triton "
        "3.9.0: nearest table of the same architecture (sm_90)"
    )
    assert table.summary == "NVIDIA H200, Triton 3.8.0 (nearest table of sm_90)"


def test_never_another_architecture(gpu_world):
    d = gpu_world(A100, (8, 0), "3.6.0")
    write_table(d, H200, "3.6.0", (9, 0))
    write_table(d, "NVIDIA L4", "3.6.0", (8, 9))  # 8.9 is not 8.0 either
    table = tuned.table_for_device()
    assert not table and table.path is None and not table.exact
    assert table.reason.startswith(f"no tuned table for {A100} (sm_80) with Triton 3.6.0")
    assert "NVIDIA H200 / Triton 3.6.0 (sm_90)" in table.reason
    choice = tuned.choose_config(64, **SHAPE)
    assert choice.source == "heuristic (no tuned table for this device)"
    assert choice.config == heuristic_config(64, **SHAPE)


def test_table_without_capability_serves_its_own_device_name_only(gpu_world):
    d = gpu_world(H200, (9, 0), "3.9.0")
    old = write_table(d, H200, "3.6.0", with_capability=False)
    table = tuned.table_for_device()
    assert table.path == old and table.capability is None
    gpu_world(H100, (9, 0), "3.6.0")
    assert not tuned.table_for_device()


def test_same_name_with_another_capability_is_refused(gpu_world):
    d = gpu_world(H200, (9, 0), "3.6.0")
    write_table(d, H200, "3.6.0", (10, 0))
    assert not tuned.table_for_device()


def test_hip_matches_by_name_only(gpu_world, monkeypatch):
    d = gpu_world("AMD Instinct MI210", (9, 0), "3.6.0")  # ROCm reports gfx90a as (9, 0)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    write_table(d, H200, "3.6.0", (9, 0))
    assert not tuned.table_for_device()
    mine = write_table(d, "AMD Instinct MI210", "3.5.0", None)
    tuned.clear_cache()
    assert tuned.table_for_device().path == mine


def test_select_table_answers_for_any_device(tmp_path):
    write_table(tmp_path, H200, "3.6.0")
    table = tuned.select_table(H100, [9, 0], "3.9.0", str(tmp_path))
    assert table and table.device == H200 and not table.exact
    assert not tuned.select_table(A100, (8, 0), "3.6.0", str(tmp_path))
    tuned.clear_cache()


def test_shipped_table_records_its_capability_and_serves_an_h100():
    path = tuned.config_path(H200, "3.6.0")
    with open(path) as f:
        assert json.load(f)["capability"] == [9, 0]
    table = tuned.select_table(H100, (9, 0), "3.9.0")
    assert table.path == path and not table.exact
    assert table.reason == (
        "tuned on NVIDIA H200 with Triton 3.6.0; this is NVIDIA H100 80GB HBM3 with Triton "
        "3.9.0: nearest table of the same architecture (sm_90)"
    )


def test_choose_config_buckets_and_sources(gpu_world):
    d = gpu_world(H100, (9, 0), "3.9.0")
    write_table(d, H200, "3.6.0", block_n=128)
    choice = tuned.choose_config(2, **SHAPE)
    assert choice.config.up.BLOCK_SIZE_N == 128 and choice.config.block_size_m == 16
    assert choice.source == "tuned: NVIDIA H200, Triton 3.6.0 (nearest table of sm_90), T bucket 1"
    choice = tuned.choose_config(50, **SHAPE)
    assert choice.config.block_size_m == 32 and choice.source.endswith("T bucket 64")
    assert default_config(50, **SHAPE) == choice.config
    assert default_config(50, **SHAPE, tuned=False) == heuristic_config(50, **SHAPE)
    with pytest.raises(TypeError, match="tuned must be a bool, got str 'no'"):
        default_config(50, **SHAPE, tuned="no")

    other = dict(SHAPE, hidden_size=2048)
    missing = tuned.choose_config(50, **other)
    assert missing.source.startswith("heuristic (no tuned entry for this shape: E=8,k=2,H=2048")
    assert missing.config == heuristic_config(50, **other)

    user = MoEConfig(GemmConfig(64, 64, 64), GemmConfig(64, 64, 64))
    assert tuned.choose_config(50, **SHAPE, config=user) == tuned.ConfigChoice(user, "user config")
    changed = tuned.choose_config(50, **SHAPE, config={"num_warps": 8})
    assert changed.config.up.num_warps == 8 and changed.config.up.BLOCK_SIZE_N == 128
    assert changed.source == (
        "user config (dict) over tuned: NVIDIA H200, Triton 3.6.0 (nearest table of sm_90), T bucket 64"
    )
    with pytest.raises(TypeError, match="config must be"):
        tuned.choose_config(50, **SHAPE, config=3)


def test_lookups_read_no_file_after_the_first(gpu_world, monkeypatch):
    d = gpu_world(H200, (9, 0), "3.6.0")
    path = write_table(d, H200, "3.6.0", block_n=128)
    first = tuned.choose_config(64, **SHAPE)
    os.remove(path)

    def no_open(*args, **kwargs):
        raise AssertionError(f"file opened on the hot path: {args}")

    monkeypatch.setattr(builtins, "open", no_open)
    for num_tokens in (1, 3, 64, 1000):
        assert tuned.choose_config(num_tokens, **SHAPE).source.startswith("tuned:")
    assert tuned.choose_config(64, **SHAPE) == first
    assert tuned.table_for_device().path == path  # cached, though the file is gone


def test_each_device_its_own_table(gpu_world):
    d = gpu_world(devices={0: (H200, (9, 0)), 1: (A100, (8, 0))}, triton_version="3.6.0")
    write_table(d, H200, "3.6.0", block_n=128)
    a100 = write_table(d, A100, "3.6.0", (8, 0), block_n=32)
    assert tuned.table_for_device(1).path == a100
    assert tuned.choose_config(1, **SHAPE, device=torch.device("cuda", 1)).config.up.BLOCK_SIZE_N == 32
    assert tuned.choose_config(1, **SHAPE, device="cuda:0").config.up.BLOCK_SIZE_N == 128
    assert tuned.choose_config(1, **SHAPE).config.up.BLOCK_SIZE_N == 128
    cpu = tuned.table_for_device("cpu")
    assert not cpu and "not a CUDA GPU" in cpu.reason


def test_a_broken_file_is_skipped_with_a_warning(gpu_world):
    d = gpu_world(H200, (9, 0), "3.6.0")
    good = write_table(d, H200, "3.6.0")
    with open(os.path.join(str(d), "broken.json"), "w") as f:
        f.write("{")
    with pytest.warns(UserWarning, match="broken.json"):
        assert tuned.table_for_device().path == good


def test_a_bad_entry_raises_naming_the_file(gpu_world):
    d = gpu_world(H200, (9, 0), "3.6.0")
    bad = {KEY: {"1": {"up": {"BLOCK_SIZE_M": 24}, "down": {}}}}
    path = write_table(d, H200, "3.6.0", shapes=bad)
    with pytest.raises(ValueError, match="T bucket 1"):
        tuned.choose_config(1, **SHAPE)
    with pytest.raises(ValueError, match=os.path.basename(path)):
        tuned.choose_config(1, **SHAPE)
    good = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}
    write_table(d, H200, "3.6.0", shapes={KEY: {"abc": {"up": good, "down": good}}})  # a bucket that is no T
    tuned.clear_cache()
    with pytest.raises(ValueError, match=rf"{os.path.basename(path)}.*T bucket abc: not a valid entry"):
        tuned.choose_config(1, **SHAPE)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's heuristic source")
def test_fused_moe_info_says_where_the_config_came_from():
    assert not tuned.table_for_device() and "interpreter" in tuned.table_for_device().reason
    hs, w1, w2, tw, ti = random_layer(4, 8, 2, 32, 32, torch.float32, device=DEVICE)
    _, info = moe_lab.fused_moe(hs, w1, w2, tw, ti, return_info=True)
    assert info.config_source == "heuristic (no tuned table for this device)"
    assert info.config == heuristic_config(4, 8, 2, 32, 32, torch.float32)
    _, info = moe_lab.fused_moe(hs, w1, w2, tw, ti, return_info=True, config={"BLOCK_SIZE_N": 32})
    assert info.config_source == "user config (dict) over heuristic (no tuned table for this device)"
    assert info.config.up.BLOCK_SIZE_N == 32
    _, info = moe_lab.fused_moe(hs, w1, w2, tw, ti, return_info=True, config=GemmConfig(16, 32, 32, 1, 4, 1))
    assert info.config_source == "user config"
    _, info = moe_lab.fused_moe(hs[:0], w1, w2, tw[:0], ti[:0], return_info=True)
    assert info.config_source == "heuristic (no tuned table for this device)" and info.up_path is None


def test_heuristic_gives_full_precision_float32_tiles_that_fit_the_cuda_cores(monkeypatch):
    import moe_lab.configs as configs

    monkeypatch.setattr(configs, "interpreter_active", lambda: False)  # the GPU rules
    big = configs.heuristic_config(4096, 8, 2, 4096, 14336, torch.float32)
    assert (big.up.BLOCK_SIZE_M, big.up.BLOCK_SIZE_N, big.up.BLOCK_SIZE_K) == (64, 128, 32)
    assert configs.heuristic_config(4096, 8, 2, 4096, 14336, torch.bfloat16).up.BLOCK_SIZE_N == 256
    torch.set_float32_matmul_precision("high")  # TF32 tensor cores: the bf16 tiles again
    try:
        assert configs.heuristic_config(4096, 8, 2, 4096, 14336, torch.float32).up.BLOCK_SIZE_N == 256
    finally:
        torch.set_float32_matmul_precision("highest")


def test_heuristic_float32_tiles_fit_an_a100(monkeypatch):
    """TF32 float32 keeps the 16-bit tiles' bytes (half the K), so every heuristic config fits 166912 bytes."""
    import moe_lab.configs as configs

    monkeypatch.setattr(configs, "interpreter_active", lambda: False)
    torch.set_float32_matmul_precision("high")
    try:
        for tokens in (1, 64, 512, 16384):
            cfg = configs.heuristic_config(tokens, 8, 2, 4096, 14336, torch.float32)
            for gemm in (cfg.up, cfg.down):
                configs.fit_to_shared_memory(gemm, 4, 166912)  # raises if no depth fits
    finally:
        torch.set_float32_matmul_precision("highest")


def test_shipped_tables_carry_their_format_and_every_switch():
    for path in tuned._scan(tuned.CONFIG_DIR):
        with open(path.path) as f:
            table = json.load(f)
        assert table["format"] == tuned.FORMAT_VERSION
        for by_tokens in table["shapes"].values():
            for entry in by_tokens.values():
                for gemm in ("up", "down"):
                    assert set(entry[gemm]) == set(GemmConfig.__dataclass_fields__), (path.path, entry[gemm])


def test_a_table_of_another_format_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "X__triton-3.6.0.json").write_text(
        json.dumps({"format": 99, "device": "X", "triton": "3.6.0", "capability": [9, 0], "shapes": {}})
    )
    with pytest.warns(UserWarning, match="table format 99"):
        assert not tuned.select_table("X", (9, 0), "3.6.0", str(tmp_path))


@pytest.mark.parametrize("choose", [default_config, tuned.choose_config, heuristic_config])
def test_config_choice_names_a_bad_argument(choose):
    """The public config choosers: a string size, a negative T or H, no experts or an integer dtype is named,
    not looked up (H = 0 and top_k above E, with an expert_map, are a layer's too)."""
    for args, kwargs, error, words in (
        (("8", 4, 2, 64, 32), {}, TypeError, "num_tokens must be an int, got str"),
        ((-1, 4, 2, 64, 32), {}, ValueError, "num_tokens must be >= 0, got -1"),
        ((8, 4, 2, -1, 32), {}, ValueError, "hidden_size must be >= 0, got -1"),
        ((8, 0, 1, 64, 32), {}, ValueError, "num_experts must be >= 1, got 0"),
        ((8, 4, 0, 64, 32), {}, ValueError, "top_k must be >= 1, got 0"),
        ((8, 4, 2, 64, 32), dict(dtype=torch.int32), TypeError, "dtype must be one of float16, bfloat16"),
    ):
        with pytest.raises(error, match=words):
            choose(*args, **kwargs)
    assert default_config(0, 4, 2, 64, 32) == default_config(0, 4, 2, 64, 32, torch.bfloat16)
