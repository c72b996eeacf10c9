"""FP8 with block scales: a float A quantized by the GEMM as it loads it (`GemmConfig.quantize_on_load`)
gives the quantization kernel's float8 values and scales, so the GEMM's output is bit for bit the one of
quantizing first; the layer with it is the layer without it."""
import pytest
import torch

from moe_lab import (GemmConfig, MoEConfig, fused_moe, fused_moe_reference, grouped_matmul, moe_align,
                     quantize_activations_fp8, quantize_weights_fp8, relative_error)

from .conftest import DEVICE, random_topk_ids
from .test_fp8 import fp8_layer
from .test_grouped_matmul import PATHS

FP8 = torch.float8_e4m3fn


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.cpu().view(torch.int16 if x.element_size() == 2 else torch.int32),
                       y.cpu().view(torch.int16 if y.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("swiglu", [False, True])
def test_up_gemm_quantizing_on_load_is_quantizing_first(use_tma, swiglu):
    num_tokens, num_experts, top_k, n, k = 9, 4, 2, 128, 200  # K = 200: the last group is partial
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE).bfloat16()
    a[3, 70] = 300.0  # one large value: its group's scale differs from its row's other group
    w_q, w_scale = quantize_weights_fp8(torch.randn(num_experts, n, k, device=DEVICE) * k ** -0.5, (64, 64))
    cfg = GemmConfig(16, 64, 64, 1, 4, 1)  # one K step per scale group, as quantizing on load needs
    args = dict(gather_a=True, swiglu=swiglu, use_tma=use_tma, w_scale=w_scale, block_shape=(64, 64),
                out_dtype=torch.float32)
    a_q, a_scale = quantize_activations_fp8(a, group_size=64)
    first = grouped_matmul(a_q, w_q, routing, cfg, a_scale=a_scale, **args)
    on_load, plan = grouped_matmul(a, w_q, routing, cfg, return_plan=True, **args)
    assert plan.quantize_a and plan.scales == "block"
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert same_bits(on_load[:used][valid], first[:used][valid])


@pytest.mark.parametrize("use_tma", PATHS)
def test_down_gemm_quantizing_float32_rows_on_load_is_quantizing_first(use_tma):
    num_tokens, num_experts, top_k, n, k = 11, 5, 2, 96, 128
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE)  # float32, as the SwiGLU output
    w_q, w_scale = quantize_weights_fp8(torch.randn(num_experts, n, k, device=DEVICE) * k ** -0.5, (128, 128))
    topk_weights = torch.rand(num_tokens, top_k, device=DEVICE)
    cfg = GemmConfig(16, 32, 128, 1, 4, 1, persistent=True)
    args = dict(gather_a=False, scatter=True, topk_weights=topk_weights, use_tma=use_tma, w_scale=w_scale,
                block_shape=(128, 128), out_dtype=torch.bfloat16)
    a_q, a_scale = quantize_activations_fp8(a, group_size=128)
    first = grouped_matmul(a_q, w_q, routing, cfg, a_scale=a_scale, **args)
    on_load = grouped_matmul(a, w_q, routing, cfg, **args)
    assert same_bits(on_load, first)


@pytest.mark.parametrize("up,down", [(True, False), (False, True), (True, True)])
def test_layer_quantizing_on_load_is_the_layer_quantizing_first(up, down):
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(13, 5, 2, 160, 96, "block")
    scales["block_shape"] = (32, 32)
    w1_q, scales["w1_scale"] = quantize_weights_fp8(w1_q.float(), (32, 32))
    w2_q, scales["w2_scale"] = quantize_weights_fp8(w2_q.float(), (32, 32))
    base = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1), GemmConfig(16, 32, 32, 1, 4, 1))
    cfg = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1, quantize_on_load=up),
                    GemmConfig(16, 32, 32, 1, 4, 1, quantize_on_load=down))
    want = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=base, **scales)
    got, info = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=cfg, return_info=True, **scales)
    assert info.up_plan.quantize_a == up and info.down_plan.quantize_a == down
    assert same_bits(got, want)
    assert relative_error(got, fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales)) < 1e-2


def test_layer_quantizing_on_load_wins_over_the_quantizing_epilogue_and_keeps_nan():
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(7, 4, 2, 64, 96, "block")
    w1_q, s1 = quantize_weights_fp8(w1_q.float(), (32, 32))
    w2_q, s2 = quantize_weights_fp8(w2_q.float(), (32, 32))
    scales = dict(w1_scale=s1, w2_scale=s2, block_shape=(32, 32))
    x[2, 5] = float("nan")
    epilogue = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1), GemmConfig(16, 32, 32, 1, 4, 1))  # 32 columns: fused
    on_load = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1, quantize_on_load=True),
                        GemmConfig(16, 32, 32, 1, 4, 1, quantize_on_load=True))
    a, info_a = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=epilogue, return_info=True, **scales)
    b, info_b = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=on_load, return_info=True, **scales)
    assert info_a.up_plan.out_quant_group == 32 and info_b.up_plan.out_quant_group == 0
    assert info_b.down_plan.quantize_a
    assert b[2].isnan().all() and not b[[0, 1, 3]].isnan().any()
    assert relative_error(b[[0, 1, 3, 4, 5, 6]], a[[0, 1, 3, 4, 5, 6]]) < 3e-3


def test_layer_quantizing_on_load_other_schemes_and_no_tokens():
    """quantize_on_load is for block scales: per-channel and per-tensor layers quantize first as before;
    T = 0 launches nothing."""
    for scheme in ("per_channel", "per_tensor"):
        x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(6, 4, 2, 64, 96, scheme)
        cfg = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1, quantize_on_load=True),
                        GemmConfig(16, 32, 32, 1, 4, 1, quantize_on_load=True))
        out, info = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=cfg, return_info=True, **scales)
        assert not info.up_plan.quantize_a and not info.down_plan.quantize_a
        ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales)
        assert relative_error(out, ref) < 1e-2
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(0, 4, 2, 128, 96, "block")
    cfg = MoEConfig(GemmConfig(16, 64, 128, 1, 4, 1, quantize_on_load=True),
                    GemmConfig(16, 32, 128, 1, 4, 1, quantize_on_load=True))
    assert fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=cfg, **scales).shape == (0, 128)


def test_quantizing_on_load_takes_one_group_per_k_step():
    """BLOCK_SIZE_K is raised to block_k (each step's product is scaled apart: a different K step is a
    different float32 sum, so the layer's FP8 configs keep BLOCK_SIZE_K = block_k either way)."""
    routing = moe_align(random_topk_ids(4, 3, 2), 3, 16)
    w_q, w_scale = quantize_weights_fp8(torch.randn(3, 64, 256, device=DEVICE), (128, 128))
    _, plan = grouped_matmul(torch.randn(4, 256, device=DEVICE), w_q, routing, GemmConfig(16, 32, 32, 1, 4, 1),
                             gather_a=True, w_scale=w_scale, block_shape=(128, 128), return_plan=True)
    assert plan.quantize_a and plan.config.BLOCK_SIZE_K == 128


def test_quantizing_on_load_bad_arguments():
    ids = random_topk_ids(4, 3, 2)
    routing = moe_align(ids, 3, 16)
    a = torch.randn(4, 96, device=DEVICE)
    w_q, w_block = quantize_weights_fp8(torch.randn(3, 64, 96, device=DEVICE), (32, 32))
    _, w_channel = quantize_weights_fp8(torch.randn(3, 64, 96, device=DEVICE), None, per_channel=True)
    cfg = GemmConfig(16, 32, 32, 1, 4, 1)
    with pytest.raises(ValueError, match="quantize a first .* or pass block_shape"):
        grouped_matmul(a, w_q, routing, cfg, gather_a=True, w_scale=w_channel)
    with pytest.raises(ValueError, match="a_scale is for float8_e4m3fn a"):
        grouped_matmul(a, w_q, routing, cfg, gather_a=True, w_scale=w_block, block_shape=(32, 32),
                       a_scale=torch.ones(4, 3, device=DEVICE))
    _, w_odd = quantize_weights_fp8(torch.randn(3, 64, 96, device=DEVICE), (32, 48))
    with pytest.raises(ValueError, match="power of two up to 256"):
        grouped_matmul(a, w_q, routing, cfg, gather_a=True, w_scale=w_odd, block_shape=(32, 48))
    with pytest.raises(TypeError, match="a must be float8_e4m3fn or float16"):
        grouped_matmul(a.to(torch.int32), w_q, routing, cfg, gather_a=True, w_scale=w_block, block_shape=(32, 32))
    with pytest.raises(TypeError, match="quantize_on_load must be a bool"):
        GemmConfig(16, 32, 32, 1, 4, 1, quantize_on_load=1)
