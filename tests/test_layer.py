import dataclasses

import pytest
import torch

from moe_lab import (
    GemmConfig,
    fused_moe,
    fused_moe_reference,
    get_preset,
    relative_error,
)
from moe_lab.plan import GluonFp8Plan, GluonLayerPlan

from .conftest import DEVICE, TOL, random_layer

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@pytest.mark.parametrize("use_tma", [False, "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_reference(dtype, use_tma):
    hs, w1, w2, tw, ti = random_layer(27, 6, 2, 64, 48, dtype)
    out = fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma)
    assert out.shape == hs.shape and out.dtype == dtype
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[dtype]


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 1, 1), (7, 5, 5), (19, 3, 1), (3, 64, 8), (40, 10, 3)])
def test_edge_shapes(num_tokens, num_experts, top_k):
    hs, w1, w2, tw, ti = random_layer(num_tokens, num_experts, top_k, 32, 32, torch.float32)
    out = fused_moe(hs, w1, w2, tw, ti)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]


def test_zero_tokens_returns_empty():
    hs, w1, w2, tw, ti = random_layer(0, 4, 2, 32, 16, torch.bfloat16)
    out = fused_moe(hs, w1, w2, tw, ti)
    assert out.shape == (0, 32)


def test_all_tokens_on_one_expert_others_empty():
    ids = torch.full((30, 1), 2, dtype=torch.int32)
    hs, w1, w2, tw, ti = random_layer(30, 5, 1, 32, 32, torch.float16, ids=ids)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_preset_build_draws_one_expert_at_a_time_with_the_same_values():
    """Weights drawn per expert (no float32 copy of a whole w1) are the values of one draw of the whole tensor
    (the CPU generator's stream), so the stored notebook outputs stand."""
    preset = get_preset("qwen3-30b-a3b").scaled(64)
    gen = torch.Generator().manual_seed(3)
    torch.randn((4, preset.hidden_size), generator=gen)
    shape = (preset.num_experts, 2 * preset.intermediate_size, preset.hidden_size)
    want = torch.rand(shape, generator=gen).mul_(2).sub_(1).div_(preset.hidden_size**0.5).to(torch.bfloat16)
    assert torch.equal(preset.build(4, seed=3)[1], want)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(num_tokens=-1), ValueError, "num_tokens must be >= 0, got -1"),
        (dict(num_tokens=2.5), TypeError, "num_tokens must be an int, got float"),
        (dict(num_tokens="4"), TypeError, "num_tokens must be an int, got str"),
        (dict(num_tokens=2, device="gpu"), ValueError, "device must be a torch.device or a name"),
        (dict(num_tokens=2, device=3.5), TypeError, "device must be a torch.device or a name"),
        (dict(num_tokens=2, dtype=torch.float8_e4m3fn), TypeError, r"for FP8 build in bfloat16, then .*quantize_fp8"),
        (dict(num_tokens=2, dtype=torch.int8), TypeError, r"dtype must be a floating torch.dtype.*int8$"),
        (dict(num_tokens=2, seed=1.5), TypeError, "seed must be an int, got float"),
        (dict(num_tokens=2, seed=-1), ValueError, "seed must be >= 0, got -1"),
        (dict(num_tokens=2, seed=2**64), ValueError, r"seed must be < 2\*\*64"),
    ],
)
def test_preset_build_names_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        get_preset("mixtral-8x7b").scaled(64).build(**kwargs)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "gpt-oss-20b"])  # without biases, and with
@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(dtype=torch.int8), TypeError, r"dtype must be a floating torch.dtype.*int8$"),
        (dict(device="gpu"), ValueError, "device must be a torch.device or a name"),
        (dict(seed=True), TypeError, "seed must be an int, got bool"),
    ],
)
def test_preset_expert_kind_names_bad_arguments(name, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        get_preset(name).expert_kind(**kwargs)


def test_preset_scaled_and_quantize_fp8_name_bad_arguments():
    preset = get_preset("mixtral-8x7b").scaled(64)
    with pytest.raises(TypeError, match="divisor must be an int, got float"):
        preset.scaled(2.0)
    with pytest.raises(ValueError, match="divisor must be >= 1, got 0"):
        preset.scaled(0)
    _, w1, w2, _ = preset.build(2)
    with pytest.raises(ValueError, match=r"w1 must have shape \[E, 2I, H\]"):
        preset.quantize_fp8(w2, w1)
    with pytest.raises(TypeError, match="w2 must be float16 or bfloat16 or float32, got float64"):
        preset.quantize_fp8(w1, w2.double())
    with pytest.raises(TypeError, match="block_shape must be a tuple or list of two ints"):
        preset.quantize_fp8(w1, w2, block_shape=0)  # not read as "the default"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_preset_build_on_cuda_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="device is 'cuda' but this machine has no CUDA GPU"):
        get_preset("mixtral-8x7b").scaled(64).build(2, device="cuda")


def test_output_poisoned_with_nan_is_fully_written():
    hs, w1, w2, tw, ti = random_layer(23, 4, 2, 32, 32, torch.float32)
    out = torch.full_like(hs, float("nan"))
    fused_moe(hs, w1, w2, tw, ti, out=out)
    assert torch.isfinite(out).all()


def test_noncontiguous_inputs():
    hs, w1, w2, tw, ti = random_layer(17, 4, 2, 48, 32, torch.float32)
    hs_t = hs.t().contiguous().t()
    w1_view = torch.stack([w1, w1], dim=-1)[..., 0]  # same values, last stride 2
    w2_nc = w2.transpose(1, 2).contiguous().transpose(1, 2)  # K-major strides
    assert w1_view.stride(-1) == 2 and not hs_t.is_contiguous()
    out = fused_moe(hs_t, w1_view, w2_nc, tw.t().contiguous().t(), ti.t().contiguous().t())
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(16, 16, 16, 1),
        GemmConfig(32, 64, 32, 4),
        {"BLOCK_SIZE_M": 64},
        {"up": GemmConfig(16, 32, 64).to_dict(), "down": GemmConfig(16, 64, 16).to_dict()},
    ],
)
def test_configs(config):
    hs, w1, w2, tw, ti = random_layer(20, 6, 2, 64, 40, torch.float32)  # I = 40: ragged BLOCK_SIZE_K
    out = fused_moe(hs, w1, w2, tw, ti, config=config)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]


def test_misaligned_hidden_size_falls_back_and_is_right():
    hs, w1, w2, tw, ti = random_layer(9, 4, 2, 511, 24, torch.bfloat16)  # H = 511: rows of 1022 bytes
    out, info = fused_moe(hs, w1, w2, tw, ti, return_info=True)
    assert not info.up_path.w_tma and "not a multiple of 16" in info.up_path.reason
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2
    with pytest.raises(ValueError, match="use_tma=True"):
        fused_moe(hs, w1, w2, tw, ti, use_tma=True)


def test_printed_info_is_a_few_lines_naming_each_gemm():
    hs, w1, w2, tw, ti = random_layer(9, 4, 2, 64, 32, torch.float32)
    _, info = fused_moe(hs, w1, w2, tw, ti, return_info=True)
    lines = str(info).splitlines()
    assert lines[:2] == [f"FusedMoEInfo: config from {info.config_source}", f"  kernels: {info.gemm_reason}"]
    c = info.up_plan.config
    path, _, note = info.up_path.reason.partition(" [")  # the device's note on TMA, once at the end
    assert lines[2].startswith(f"  up:   BLOCK_SIZE_M/N/K {c.BLOCK_SIZE_M}/{c.BLOCK_SIZE_N}/{c.BLOCK_SIZE_K}, ")
    assert lines[2].endswith(f"{info.up_plan.grid} programs; {path}") and lines[3].startswith("  down: ")
    assert lines[4:] == [f"  TMA here: {note[:-1]}", f"  routing: {info.routing!r}"]
    _, empty = fused_moe(hs[:0], w1, w2, tw[:0], ti[:0], return_info=True)
    assert str(empty).splitlines()[1:] == ["  kernels: triton", "  nothing launched (T = 0)"]
    gluon = GluonLayerPlan(128, *(GluonFp8Plan(GemmConfig(128, 128, 128), 132, 240, 1) for _ in "ud"))
    text = str(dataclasses.replace(info, gemm_kernel="gluon", gemm_reason="gluon GEMMs: why", gluon_plan=gluon))
    assert "  kernels: gluon GEMMs: why\n  up:   BLOCK_SIZE_M/N/K 128/128/128, GROUP_SIZE_M 8, num_warps 4, " in text
    assert "num_stages 3, 132 programs; tma (the Gluon kernel loads by TMA alone)\n  down: " in text


def test_expert_map_computes_local_experts_only():
    hs, w1, w2, tw, ti = random_layer(25, 8, 2, 32, 32, torch.float32)
    expert_map = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32, device=DEVICE)
    local = [0, 2, 4, 6]
    out = fused_moe(hs, w1[local], w2[local], tw, ti, expert_map=expert_map)
    ref = fused_moe_reference(hs, w1[local], w2[local], tw, ti, expert_map=expert_map)
    assert relative_error(out, ref) < TOL[torch.float32]


def test_scaled_preset_deepseek():
    preset = get_preset("deepseek-v3").scaled(128)
    hs, w1, w2, (tw, ti) = preset.build(6, dtype=torch.bfloat16, device=DEVICE)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (lambda a: a.update(hidden_states=a["hidden_states"].int()), TypeError, "hidden_states must be float16"),
        (lambda a: a.update(hidden_states=a["hidden_states"].double()), TypeError, "hidden_states must be"),
        (lambda a: a.update(w1=a["w1"][:, :, :-1]), ValueError, r"w1 must have shape \[E, 2I, H\]"),
        (lambda a: a.update(w2=a["w2"][:-1]), ValueError, r"w2 must have shape \[E, H, I\]"),
        # w1 of I rows (the up half missing): named as w1's error, not as a wrong w2 (I is read from w1)
        (
            lambda a: a.update(w1=a["w1"][:, : a["w1"].shape[1] // 2]),
            ValueError,
            r"w1 must have shape \[E, 2I, H\] \(gate rows, then up rows\).*only one of the gate and up",
        ),
        (lambda a: a.update(w1=a["w1"].half()), TypeError, "hidden_states is float32 but w1 is float16"),
        (lambda a: a.update(topk_weights=a["topk_weights"][:, :1]), ValueError, "topk_weights must have shape"),
        (lambda a: a.update(topk_ids=a["topk_ids"].float()), TypeError, "topk_ids must be int32 or int64"),
        (lambda a: a.update(topk_ids=a["topk_ids"][:3]), ValueError, "topk_ids must have shape"),
        (lambda a: a.update(hidden_states=a["hidden_states"][0]), ValueError, "hidden_states must have 2 dimensions"),
        (lambda a: a.update(w2=a["w2"].half()), TypeError, r"w2 must be float32 \(the dtype of w1\)"),
        (lambda a: a.update(return_info="yes"), TypeError, "return_info must be True or False"),
    ],
)
def test_bad_input(mutate, exc, match):
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 16, torch.float32)
    args = dict(hidden_states=hs, w1=w1, w2=w2, topk_weights=tw, topk_ids=ti)
    mutate(args)
    with pytest.raises(exc, match=match):
        fused_moe(**args)


def test_bad_config():
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="BLOCK_SIZE_N must be a power of two"):
        fused_moe(hs, w1, w2, tw, ti, config={"BLOCK_SIZE_N": 48})
    with pytest.raises(TypeError, match=r"unknown key.* \(or only 'up' and 'down', each a dict of these\)"):
        fused_moe(hs, w1, w2, tw, ti, config={"BLOCK_M": 16})
    with pytest.raises(ValueError, match=r"fold_tail_rows must be 0 \(off\) or a power of two >= 16, got 4"):
        fused_moe(hs, w1, w2, tw, ti, config={"fold_tail_rows": 4})
    with pytest.raises(ValueError, match=r"got BLOCK_SIZE_M=16 \(config\['up'\] changes the default GemmConfig\("):
        fused_moe(hs, w1, w2, tw, ti, config={"up": {"fold_tail_rows": 16}})  # 16 rows: the default's, said so
    with pytest.raises(TypeError, match="config must be"):
        fused_moe(hs, w1, w2, tw, ti, config=16)


def test_relative_error_refuses_to_broadcast():
    with pytest.raises(ValueError, match="same shape"):
        relative_error(torch.ones(4, 1), torch.ones(4, 3))
    with pytest.raises(TypeError, match="out must be a real tensor, got complex64"):  # not the real parts alone
        relative_error(torch.tensor([1 + 1j]), torch.tensor([1 - 5j]))


def test_uneven_expert_loads_with_empty_experts():
    counts = [40, 0, 97, 21, 0, 5]  # the shape of 162, 0, 2577, 446, 0, 83, scaled for the interpreter
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].view(-1, 1).int()
    hs, w1, w2, tw, ti = random_layer(ids.shape[0], len(counts), 1, 32, 32, torch.bfloat16, ids=ids)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_a_single_expert():
    hs, w1, w2, tw, ti = random_layer(9, 1, 1, 32, 32, torch.float16)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_chunking_gives_the_same_bits():
    hs, w1, w2, tw, ti = random_layer(50, 6, 2, 32, 32, torch.float32)
    cfg = GemmConfig(16, 32, 32, 1)
    whole = fused_moe(hs, w1, w2, tw, ti, config=cfg)
    chunked = fused_moe(hs, w1, w2, tw, ti, config=cfg, chunk_size=16)
    assert torch.equal(whole, chunked)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        fused_moe(hs, w1, w2, tw, ti, chunk_size=0)


def test_two_runs_are_bitwise_equal():
    hs, w1, w2, tw, ti = random_layer(40, 8, 3, 32, 32, torch.bfloat16)
    assert torch.equal(fused_moe(hs, w1, w2, tw, ti), fused_moe(hs, w1, w2, tw, ti))


def test_out_may_be_hidden_states_but_no_other_overlap():
    hs, w1, w2, tw, ti = random_layer(9, 4, 2, 32, 32, torch.float32)
    want = fused_moe_reference(hs, w1, w2, tw, ti)
    inplace = hs.clone()
    assert fused_moe(inplace, w1, w2, tw, ti, out=inplace, chunk_size=2) is inplace  # in place, chunk by chunk
    assert relative_error(inplace, want) < TOL[torch.float32]
    buf = torch.cat([hs, torch.zeros(1, 32, device=DEVICE)])
    with pytest.raises(ValueError, match="out shares memory with hidden_states"):  # shifted by one row
        fused_moe(buf[:-1], w1, w2, tw, ti, out=buf[1:], chunk_size=1)
    w1_rows = w1.clone()
    with pytest.raises(ValueError, match="out shares memory with w1"):
        fused_moe(hs, w1_rows, w2, tw, ti, out=w1_rows[0, :9])
    assert torch.equal(w1_rows, w1)  # refused before anything ran
    with pytest.raises(ValueError, match="all tensors must be on one device, got hidden_states on .*, out on meta"):
        fused_moe(hs, w1, w2, tw, ti, out=torch.empty(9, 32, device="meta"))
    one = hs[:1].clone()  # in place at T = 1 through a view whose unused row stride differs
    fused_moe(one, w1, w2, tw[:1], ti[:1], out=one.as_strided((1, 32), (7, 1)))
    assert relative_error(one, want[:1]) < TOL[torch.float32]
    halves = torch.empty(18, 32, device=DEVICE)  # two views of one buffer that do not overlap
    halves[:9] = hs
    out = fused_moe(halves[:9], w1, w2, tw, ti, out=halves[9:])
    assert relative_error(out, want) < TOL[torch.float32]


@pytest.mark.parametrize(
    "config", [None, GemmConfig(16, 32, 16, 1, tail_tiles=False), GemmConfig(32, 32, 16, 1, persistent=True)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_in_slot_order_is_bitwise_the_aligned_schedule(config, dtype):
    from moe_lab.align import slot_order_routing

    hs, w1, w2, tw, ti = random_layer(1, 6, 4, 32, 32, dtype)
    out, info = fused_moe(hs, w1, w2, tw, ti, config=config, return_info=True)
    assert not info.routing.expert_sorted and info.routing.counts is None
    assert info.routing.max_num_m_blocks == 4 and not info.up_plan.persistent  # one block per slot
    identity = torch.arange(6, device=DEVICE)  # an expert map takes the align
    aligned, info_aligned = fused_moe(hs, w1, w2, tw, ti, config=config, expert_map=identity, return_info=True)
    assert info_aligned.routing.expert_sorted
    assert torch.equal(out, aligned)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[dtype]
    # a repeated expert (never from top-k routing) stays right: each block reads its weights again
    twice = torch.tensor([[2, 2, 5, 0]], dtype=torch.int32, device=DEVICE)
    assert (
        relative_error(fused_moe(hs, w1, w2, tw, twice, config=config), fused_moe_reference(hs, w1, w2, tw, twice))
        < TOL[dtype]
    )
    # int64 ids (torch.topk's) too, bit for bit
    out64, info64 = fused_moe(hs, w1, w2, tw, ti.long(), config=config, return_info=True)
    assert not info64.routing.expert_sorted and torch.equal(out64, out)
    # more tokens, a map or strided ids: no slot order
    assert slot_order_routing(ti.expand(2, 4), 6, 16) is None
    assert slot_order_routing(ti, 6, 16, expert_map=identity) is None
    assert slot_order_routing(torch.stack([ti, ti], -1)[..., 0], 6, 16) is None
