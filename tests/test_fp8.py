"""FP8 (float8_e4m3fn) w8a8 GEMMs and layer: block-scaled (DeepSeek-V3's [128, 128]), per-channel with
per-token activations, per-tensor; checked against float64 math on the dequantized operands, so the
kernels' error is measured apart from the quantization's."""

import dataclasses

import pytest
import torch

from moe_lab import (
    GemmConfig,
    MoEConfig,
    dequantize_fp8,
    fused_moe,
    fused_moe_reference,
    grouped_matmul,
    moe_align,
    quantize_activations_fp8,
    quantize_weights_fp8,
    relative_error,
)
from moe_lab.reference import fake_quantize_activations

from .conftest import DEVICE, random_topk_ids
from .test_grouped_matmul import PATHS, per_expert_reference
from .test_swiglu_epilogue import swiglu_reference

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

FP8 = torch.float8_e4m3fn
# (weight layout, block_shape): activations follow (per token group, per token, per tensor)
SCHEMES = {
    "block": dict(block_shape=(128, 128)),
    "per_channel": dict(per_channel=True),
    "per_tensor": dict(),
}


def quantized(scheme, a, w, *, static_a=False):
    """float8 a and w with their scales as the layer makes them, and their dequantized float64 values."""
    opts = SCHEMES[scheme]
    block_shape = opts.get("block_shape")
    w_q, w_scale = quantize_weights_fp8(w, block_shape, per_channel=opts.get("per_channel", False))
    if block_shape is not None:
        a_q, a_scale = quantize_activations_fp8(a, group_size=block_shape[1])
    elif static_a:
        a_q, a_scale = quantize_activations_fp8(a, scale=(a.abs().max() / 448).float().reshape(1))
    else:
        a_q, a_scale = quantize_activations_fp8(a, group_size=None)
    a_deq = a_q.double() * (
        a_scale.repeat_interleave(block_shape[1], 1)[:, : a.shape[1]].double()
        if block_shape is not None
        else a_scale.double().reshape(-1, 1)
    )
    w_deq = dequantize_fp8(w_q, w_scale, block_shape).double()
    return a_q, a_scale, w_q, w_scale, block_shape, a_deq, w_deq


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("num_tokens,num_experts,top_k,n,k", [(9, 4, 2, 144, 200), (5, 3, 3, 64, 128)])
def test_fp8_up_projection_matches_dequantized_math(use_tma, scheme, num_tokens, num_experts, top_k, n, k):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w = torch.randn(num_experts, n, k, device=DEVICE) * k**-0.5
    a_q, a_scale, w_q, w_scale, block_shape, a_deq, w_deq = quantized(scheme, a, w)
    out = torch.full((routing.max_num_tokens_padded, n), float("nan"), device=DEVICE)
    _, plan = grouped_matmul(
        a_q,
        w_q,
        routing,
        GemmConfig(16, 64, 64, 2, 4, 1),
        gather_a=True,
        out=out,
        use_tma=use_tma,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
        return_plan=True,
    )
    assert plan.scales == ("block" if scheme == "block" else "outer")
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    ref = per_expert_reference(a_deq, w_deq, routing, gather_a=True)[:used]
    assert relative_error(out.cpu()[:used][valid], ref[valid]) < 1e-5


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_fp8_down_projection_scatters_weighted_rows(use_tma, scheme):
    num_tokens, num_experts, top_k, n, k = 11, 5, 2, 96, 160
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE)
    w = torch.randn(num_experts, n, k, device=DEVICE) * k**-0.5
    topk_weights = torch.rand(num_tokens, top_k, device=DEVICE)
    a_q, a_scale, w_q, w_scale, block_shape, a_deq, w_deq = quantized(scheme, a, w, static_a=scheme == "per_tensor")
    out = torch.full((num_tokens * top_k, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    grouped_matmul(
        a_q,
        w_q,
        routing,
        GemmConfig(16, 32, 64, 1, 4, 1),
        gather_a=False,
        scatter=True,
        topk_weights=topk_weights,
        out=out,
        use_tma=use_tma,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
    )
    ref = per_expert_reference(a_deq, w_deq, routing, gather_a=False, topk_weights=topk_weights)
    ids_sorted = routing.sorted_token_ids.long().cpu()
    expected = torch.zeros(num_tokens * top_k, n, dtype=torch.float64)
    real = ids_sorted < routing.num_slots
    expected[ids_sorted[real]] = ref[real]
    assert relative_error(out, expected) < 1e-2  # bfloat16 output


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("block_k,step_k,dots", [(96, 32, 1), (32, 64, 2)])
def test_fp8_swiglu_epilogue_and_a_lowered_block_size_k(use_tma, block_k, step_k, dots):
    """Scale blocks of 96 channels: the config's BLOCK_SIZE_K = 64 is lowered to 32 (the largest power of
    two dividing 96); of 32: it stays, each step a dot per scale block."""
    num_tokens, num_experts, top_k, inter, k = 7, 3, 2, 40, 96
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w1 = torch.randn(num_experts, 2 * inter, k, device=DEVICE) * k**-0.5
    block_shape = (16, block_k)
    w_q, w_scale = quantize_weights_fp8(w1, block_shape)
    a_q, a_scale = quantize_activations_fp8(a, group_size=block_k)
    out, plan = grouped_matmul(
        a_q,
        w_q,
        routing,
        GemmConfig(16, 64, 64, 1, 4, 1, tail_tiles=False),
        gather_a=True,
        swiglu=True,
        use_tma=use_tma,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
        out_dtype=torch.float32,
        return_plan=True,
    )
    assert plan.config.BLOCK_SIZE_K == step_k and plan.dots_per_step == dots and plan.swiglu
    a_deq = a_q.double() * a_scale.repeat_interleave(block_k, 1)[:, :k].double()
    ref = swiglu_reference(a_deq, dequantize_fp8(w_q, w_scale, block_shape).double(), routing)
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert relative_error(out.cpu()[:used][valid], ref[:used][valid]) < 1e-5


def fp8_layer(num_tokens, num_experts, top_k, hidden, inter, scheme, dtype=torch.bfloat16):
    x = torch.randn(num_tokens, hidden, device=DEVICE).to(dtype)
    w1 = torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, device=DEVICE) * inter**-0.5
    opts = SCHEMES[scheme]
    w1_q, w1_scale = quantize_weights_fp8(w1, opts.get("block_shape"), per_channel=opts.get("per_channel", False))
    w2_q, w2_scale = quantize_weights_fp8(w2, opts.get("block_shape"), per_channel=opts.get("per_channel", False))
    logits = torch.randn(num_tokens, num_experts, device=DEVICE)
    topk_weights, topk_ids = torch.softmax(logits, -1).topk(top_k, -1)
    scales = dict(w1_scale=w1_scale, w2_scale=w2_scale, block_shape=opts.get("block_shape"))
    return x, (w1, w2), (w1_q, w2_q), topk_weights, topk_ids.int(), scales


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(13, 5, 2), (4, 3, 3), (6, 4, 1)])
def test_fp8_layer_matches_the_dequantized_reference(scheme, num_tokens, num_experts, top_k):
    x, (w1, w2), (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(
        num_tokens, num_experts, top_k, 160, 96, scheme
    )
    out = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert relative_error(out, ref) < 1e-2
    # quantization's own error, against the float layer: reported by the bench, bounded loosely here
    assert relative_error(out, fused_moe_reference(x, w1, w2, topk_weights, topk_ids)) < 0.1


def test_fp8_layer_static_scales_unfused_activation_chunks_and_expert_map():
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(9, 4, 2, 64, 48, "per_tensor")
    static = dict(a1_scale=torch.tensor([0.02], device=DEVICE), a2_scale=torch.tensor([0.004], device=DEVICE))
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales, **static)
    out = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales, **static, chunk_size=4)
    assert relative_error(out, ref) < 1e-2
    unfused = MoEConfig(GemmConfig(16, 64, 64, 1, 4, 1, fuse_swiglu=False), GemmConfig(16, 32, 64, 1, 4, 1))
    out = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales, **static, config=unfused)
    assert relative_error(out, ref) < 1e-2
    # expert parallelism: global experts 0..7, this rank holds 1, 3, 4 and 6 as local 0..3
    expert_map = torch.full((8,), -1, dtype=torch.int32, device=DEVICE)
    expert_map[torch.tensor([1, 3, 4, 6])] = torch.arange(4, dtype=torch.int32, device=DEVICE)
    global_ids = torch.stack([torch.randperm(8, device=DEVICE)[:2] for _ in range(9)]).int()
    out = fused_moe(x, w1_q, w2_q, topk_weights, global_ids, expert_map=expert_map, **scales)
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, global_ids, expert_map=expert_map, **scales)
    assert relative_error(out, ref) < 1e-2


def test_fp8_zero_dim_static_scales_are_the_one_element_ones():
    """A 0-d static scale (as checkpoints may store it) is taken as shape [1], by the layer and the GEMM."""
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(9, 4, 2, 64, 48, "per_tensor")
    one = dict(a1_scale=torch.tensor([0.02], device=DEVICE), a2_scale=torch.tensor([0.004], device=DEVICE))
    zero_dim = dict(a1_scale=torch.tensor(0.02, device=DEVICE), a2_scale=torch.tensor(0.004, device=DEVICE))
    out_one = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales, **one)
    out_zero_dim = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales, **zero_dim)
    assert torch.equal(out_zero_dim, out_one)
    routing = moe_align(topk_ids, 4, 16)
    a_q, a_scale = quantize_activations_fp8(x, scale=one["a1_scale"])
    gemm = dict(gather_a=True, w_scale=scales["w1_scale"], out_dtype=torch.float32)
    want = grouped_matmul(a_q, w1_q, routing, GemmConfig(16, 32, 64), a_scale=a_scale, **gemm)
    got = grouped_matmul(a_q, w1_q, routing, GemmConfig(16, 32, 64), a_scale=a_scale.reshape(()), **gemm)
    used = routing.num_tokens_post_padded.item()
    assert torch.equal(got[:used], want[:used])
    with pytest.raises(ValueError, match=r"a_scale must have shape \[1\] or \[\] \(per tensor\) or \[rows, 1\]"):
        grouped_matmul(a_q, w1_q, routing, GemmConfig(16, 32, 64), a_scale=torch.ones(2, device=DEVICE), **gemm)


def test_fp8_layer_edges():
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(0, 4, 2, 160, 96, "block")
    assert fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales).shape == (0, 160)
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(3, 3, 3, 144, 80, "block", torch.float16)
    strided = torch.randn(3, 2 * 144, device=DEVICE).half()[:, ::2]  # non-contiguous hidden_states
    out = fused_moe(strided, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert out.dtype == torch.float16
    ref = fused_moe_reference(strided, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert relative_error(out, ref) < 1e-2


def test_fake_quantized_activations_are_the_kernels():
    x = torch.randn(7, 200, device=DEVICE) * 3
    q, s = quantize_activations_fp8(x, group_size=128)
    deq = q.float() * s.repeat_interleave(128, 1)[:, :200]
    assert torch.equal(deq.cpu(), fake_quantize_activations(x, 128).cpu())
    # a group wider than the row is the row, without padding the row to the group's width (2**30 floats)
    assert torch.equal(fake_quantize_activations(x, 2**30), fake_quantize_activations(x, None))


def test_fp8_bad_arguments_name_what_is_wrong():
    x, (w1, w2), (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(4, 3, 2, 256, 64, "block")
    with pytest.raises(ValueError, match="need w1_scale"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids)
    with pytest.raises(ValueError, match="scales are for float8_e4m3fn weights"):
        fused_moe(x, w1.bfloat16(), w2.bfloat16(), topk_weights, topk_ids, w1_scale=scales["w1_scale"])
    with pytest.raises(ValueError, match=r"w2_scale must have shape \[E, ceil\(N/block_n\)"):
        fused_moe(
            x,
            w1_q,
            w2_q,
            topk_weights,
            topk_ids,
            w1_scale=scales["w1_scale"],
            w2_scale=scales["w1_scale"],
            block_shape=(128, 128),
        )
    with pytest.raises(TypeError, match="w1_scale must be float32"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, w1_scale=scales["w1_scale"].half()))
    with pytest.raises(ValueError, match="a1_scale must be None with block_shape"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **scales, a1_scale=torch.ones(1, device=DEVICE))
    with pytest.raises(ValueError, match="block_shape must hold two ints"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, block_shape=(128,)))
    with pytest.raises(ValueError, match="block_k. must be a multiple of 32"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, block_shape=(128, 40)))
    with pytest.raises(TypeError, match="hidden_states must be"):
        fused_moe(x.to(FP8), w1_q, w2_q, topk_weights, topk_ids, **scales)
    per_tensor = dict(w1_scale=torch.ones(3, device=DEVICE), w2_scale=torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match=r"a2_scale must have shape \[1\]"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **per_tensor, a2_scale=torch.ones(2, device=DEVICE))
    routing = moe_align(topk_ids, 3, 16)
    a_q, a_scale = quantize_activations_fp8(x, group_size=128)
    with pytest.raises(ValueError, match="need a_scale and w_scale"):
        grouped_matmul(a_q, w1_q, routing, GemmConfig(16, 64, 64), gather_a=True)
    with pytest.raises(TypeError, match=r"a must be float8_e4m3fn \(the dtype of w\)"):
        grouped_matmul(
            x,
            w1_q,
            routing,
            GemmConfig(16, 64, 64),
            gather_a=True,
            a_scale=a_scale,
            w_scale=scales["w1_scale"],
            block_shape=(128, 128),
        )
    with pytest.raises(ValueError, match=r"a_scale must have shape \[rows, ceil\(K/block_k\)\]"):
        grouped_matmul(
            a_q,
            w1_q,
            routing,
            GemmConfig(16, 64, 64),
            gather_a=True,
            a_scale=a_scale[:, :0],
            w_scale=scales["w1_scale"],
            block_shape=(128, 128),
        )
    with pytest.raises(TypeError, match="out_dtype must be float16, bfloat16, float32, float8_e4m3fn, got int8"):
        grouped_matmul(
            a_q,
            w1_q,
            routing,
            GemmConfig(16, 64, 64),
            gather_a=True,
            a_scale=a_scale,
            w_scale=scales["w1_scale"],
            block_shape=(128, 128),
            out_dtype=torch.int8,
        )


@pytest.mark.parametrize("use_tma", PATHS)
def test_fp8_output_quantized_in_the_swiglu_epilogue_is_the_quantization_kernels(use_tma):
    num_tokens, num_experts, top_k, inter, k = 9, 3, 2, 80, 64  # I = 80: the last group of 32 is partial
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w1 = torch.randn(num_experts, 2 * inter, k, device=DEVICE) * k**-0.5
    block_shape = (32, 32)
    w_q, w_scale = quantize_weights_fp8(w1, block_shape)
    a_q, a_scale = quantize_activations_fp8(a, group_size=32)
    cfg = GemmConfig(16, 64, 32, 1, 4, 1)  # a program writes 32 columns: one group
    args = dict(gather_a=True, swiglu=True, use_tma=use_tma, a_scale=a_scale, w_scale=w_scale, block_shape=block_shape)
    act = grouped_matmul(a_q, w_q, routing, cfg, out_dtype=torch.float32, **args)
    (q, s), plan = grouped_matmul(a_q, w_q, routing, cfg, out_dtype=FP8, return_plan=True, **args)
    assert plan.out_quant_group == 32 and q.dtype == FP8 and s.shape == (routing.max_num_tokens_padded, 3)
    want_q, want_s = quantize_activations_fp8(act, group_size=32)
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert torch.equal(q.cpu()[:used][valid].view(torch.uint8), want_q.cpu()[:used][valid].view(torch.uint8))
    assert torch.equal(s.cpu()[:used][valid], want_s.cpu()[:used][valid])
    with pytest.raises(ValueError, match="multiple of 32"):
        grouped_matmul(a_q, w_q, routing, GemmConfig(16, 32, 32, 1, 4, 1), out_dtype=FP8, **args)


def block_scaled_up(num_tokens, num_experts, top_k, n, k, block_shape, swiglu):
    """An up projection's block-scaled FP8 inputs: routing (BLOCK_SIZE_M 16), a_q, a_scale, w_q, w_scale
    (w [E, 2n or n, k])."""
    routing = moe_align(random_topk_ids(num_tokens, num_experts, top_k), num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w = torch.randn(num_experts, 2 * n if swiglu else n, k, device=DEVICE) * k**-0.5
    w_q, w_scale = quantize_weights_fp8(w, block_shape)
    a_q, a_scale = quantize_activations_fp8(a, group_size=block_shape[1])
    return routing, a_q, a_scale, w_q, w_scale


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize(
    "swiglu,n,block_shape,block_n,per_tile",
    [
        (False, 80, (32, 32), 32, True),  # the last tile's columns past N wrap to group 0, and are dropped
        (False, 80, (64, 32), 32, True),  # two tiles per scale block
        (False, 80, (32, 32), 64, False),  # a tile spans two scale blocks: a scale per column
        (True, 96, (64, 32), 64, True),  # I = 96: the up half of a tile starts inside a scale block
        (True, 80, (32, 32), 64, False),  # I = 80: an up half of 32 rows would straddle two blocks
        (True, 96, (32, 32), 128, False),  # halves of 64 rows span two blocks of 32
    ],
)
def test_fp8_block_scales_one_per_tile_or_one_per_column(use_tma, swiglu, n, block_shape, block_n, per_tile):
    k = 96
    routing, a_q, a_scale, w_q, w_scale = block_scaled_up(9, 3, 2, n, k, block_shape, swiglu)
    out, plan = grouped_matmul(
        a_q,
        w_q,
        routing,
        GemmConfig(16, block_n, 32, 1, 4, 1),
        gather_a=True,
        swiglu=swiglu,
        use_tma=use_tma,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
        out_dtype=torch.float32,
        return_plan=True,
    )
    assert plan.w_scale_per_tile == per_tile
    a_deq = a_q.double() * a_scale.repeat_interleave(block_shape[1], 1)[:, :k].double()
    w_deq = dequantize_fp8(w_q, w_scale, block_shape).double()
    if swiglu:
        ref = swiglu_reference(a_deq, w_deq, routing)
    else:
        ref = per_expert_reference(a_deq, w_deq, routing, gather_a=True)
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert relative_error(out.cpu()[:used][valid], ref[:used][valid]) < 1e-5


@pytest.mark.parametrize("swiglu", [False, True])
def test_fp8_per_tile_scales_are_bitwise_the_per_column_loop(monkeypatch, swiglu):
    """A ragged K (100) in steps of 32 under scale blocks of 64 (two steps per group, the last one short),
    with tail tiles: the per-tile loop gives the per-column loop's bits."""
    from moe_lab import gemm as gm_module

    num_tokens, num_experts, top_k, n, k, block_shape = 9, 3, 2, 64, 100, (64, 64)
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 64)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w_q, w_scale = quantize_weights_fp8(torch.randn(num_experts, 2 * n if swiglu else n, k, device=DEVICE), block_shape)
    a_q, a_scale = quantize_activations_fp8(a, group_size=block_shape[1])
    cfg = GemmConfig(64, 64, 32, 1, 4, 1, tail_tiles=True)
    args = dict(
        gather_a=True,
        swiglu=swiglu,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
        out_dtype=torch.float32,
        return_plan=True,
    )
    per_tile, plan = grouped_matmul(a_q, w_q, routing, cfg, **args)
    assert plan.w_scale_per_tile
    plan_launch = gm_module.plan_gemm
    monkeypatch.setattr(
        gm_module, "plan_gemm", lambda *a, **kw: dataclasses.replace(plan_launch(*a, **kw), w_scale_per_tile=False)
    )
    per_column, plan = grouped_matmul(a_q, w_q, routing, cfg, **args)
    assert not plan.w_scale_per_tile
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert torch.equal(per_tile.cpu()[:used][valid], per_column.cpu()[:used][valid])


def test_fp8_layer_with_the_quantizing_epilogue_matches_the_separate_quantization():
    x, (w1, w2), _, topk_weights, topk_ids, _ = fp8_layer(11, 4, 2, 64, 96, "block")
    (w1_q, s1), (w2_q, s2) = quantize_weights_fp8(w1, (32, 32)), quantize_weights_fp8(w2, (32, 32))
    scales = dict(w1_scale=s1, w2_scale=s2, block_shape=(32, 32))
    fused = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1), GemmConfig(16, 32, 32, 1, 4, 1))  # 32 columns: fused
    apart = MoEConfig(GemmConfig(16, 32, 32, 1, 4, 1), GemmConfig(16, 32, 32, 1, 4, 1))  # 16 columns: a kernel
    out_fused = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=fused, **scales)
    out_apart = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=apart, **scales)
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert relative_error(out_fused, ref) < 1e-2 and relative_error(out_apart, ref) < 1e-2
    assert relative_error(out_fused, out_apart) < 3e-3  # the same float8 input to the down GEMM


@pytest.mark.parametrize("use_tma", PATHS)
def test_fp8_persistent_kernel_is_the_per_tile_kernel(use_tma):
    x, (w1, w2), _, topk_weights, topk_ids, _ = fp8_layer(13, 5, 2, 64, 96, "block")
    (w1_q, s1), (w2_q, s2) = quantize_weights_fp8(w1, (32, 32)), quantize_weights_fp8(w2, (32, 32))
    scales = dict(w1_scale=s1, w2_scale=s2, block_shape=(32, 32))
    per_tile = MoEConfig(GemmConfig(16, 64, 32, 1, 4, 1), GemmConfig(16, 32, 32, 1, 4, 1))
    persistent = MoEConfig(
        GemmConfig(16, 64, 32, 1, 4, 1, persistent=True), GemmConfig(16, 32, 32, 1, 4, 1, persistent=True)
    )
    a = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=per_tile, use_tma=use_tma, **scales)
    b = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, config=persistent, use_tma=use_tma, **scales)
    assert torch.equal(a, b)


def test_fp8_after_a_breaker_trial():
    x, (w1, w2), (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(4, 3, 2, 256, 64, "block")
    bad = x.clone()
    bad[2, 5] = float("nan")  # a NaN reaches its token's output (Triton's max skips NaN; the scale must not)
    out = fused_moe(bad, w1_q, w2_q, topk_weights, topk_ids, **scales)
    assert out[2].isnan().any() and not out[[0, 1, 3]].isnan().any()
    import numpy as np  # int-like block shapes (read from a config through numpy)

    out = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, block_shape=(np.int64(128), np.int64(128))))
    assert relative_error(out, fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, **scales)) < 1e-2
    q, s = quantize_activations_fp8(x, group_size=2**21)  # wider than K: per token
    assert s.shape == (4, 1) and torch.equal(s, quantize_activations_fp8(x, group_size=None)[1])
    with pytest.raises(ValueError, match="w1_scale requires grad: fused_moe is inference-only"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, w1_scale=scales["w1_scale"].requires_grad_()))
    scales["w1_scale"].requires_grad_(False)
    with pytest.raises(ValueError, match="w2_scale on meta"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **dict(scales, w2_scale=scales["w2_scale"].to("meta")))
    from moe_lab import FusedMoE

    module = FusedMoE(w1_q, w2_q, w1_scale=scales["w1_scale"], w2_scale=scales["w2_scale"], block_shape=(128, 128))
    with pytest.raises(TypeError, match=r"module.to\(dtype\) cast them"):
        module.to(torch.bfloat16)(x, topk_weights, topk_ids)
    # A checkpoint's scales read wrong (NaN, zero, negative): the module says so once, when it is built.
    for value, shown in ((float("nan"), "nan"), (0.0, "0.0"), (-0.5, "-0.5")):
        bad = scales["w2_scale"].clone()
        bad[1, 0, 0] = value
        with pytest.raises(
            ValueError, match=rf"w2_scale must be finite and positive, got w2_scale\[1, 0, 0\] = {shown}"
        ):
            FusedMoE(w1_q, w2_q, w1_scale=scales["w1_scale"], w2_scale=bad, block_shape=(128, 128))


def test_fp8_newcomer_mistakes_are_named():
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(4, 3, 2, 256, 64, "block")
    with pytest.raises(TypeError, match="w1_scale must be a torch.Tensor"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=0.01, w2_scale=0.01)
    with pytest.raises(ValueError, match="a 3-D scale is one per weight block, pass block_shape"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=scales["w1_scale"], w2_scale=scales["w2_scale"])
    per_expert = dict(w1_scale=torch.ones(3, device=DEVICE), w2_scale=torch.ones(3, device=DEVICE))
    with pytest.raises(TypeError, match="a1_scale must be a torch.Tensor"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **per_expert, a1_scale=0.01)
    with pytest.raises(TypeError, match="a1_scale must be float32, got float16"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **per_expert, a1_scale=torch.tensor(0.01).half())


@pytest.mark.skipif(DEVICE.type != "cpu", reason="values are checked on CPU tensors only (no host sync on a GPU)")
@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_fp8_scale_values_are_checked_on_the_cpu(bad):
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(6, 4, 2, 128, 96, "per_tensor")
    for name in ("w1_scale", "w2_scale"):
        broken = dict(scales, **{name: scales[name].clone().fill_(bad)})
        with pytest.raises(ValueError, match=rf"{name} must be finite and positive, got {name}\[0\] = "):
            fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, **broken)
    static = torch.tensor([bad])
    with pytest.raises(ValueError, match=r"a2_scale must be finite and positive"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, a1_scale=torch.tensor(0.01), a2_scale=static, **scales)
    with pytest.raises(ValueError, match=r"scale must be finite and positive, got scale\[0\]"):
        quantize_activations_fp8(x, scale=static)


def test_fp8_after_a_second_breaker_trial():
    """Meta tensors, a NaN through a static activation scale (the interpreter reads e4m3's NaN as 480),
    weights that carry autograd, a block larger than the tensor, and out_scale buffers that overlap."""
    x, _, (w1_q, w2_q), topk_weights, topk_ids, scales = fp8_layer(6, 4, 2, 128, 96, "per_tensor")
    x[1, 5] = float("nan")
    out = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, a1_scale=torch.tensor(0.01, device=DEVICE), **scales)
    assert out[1].isnan().all() and not out[[0, 2, 3, 4, 5]].isnan().any()
    nan_scale = torch.tensor(float("nan"), device=DEVICE)
    if DEVICE.type == "cpu":  # values checked where free; on a GPU taken as given (no host sync)
        with pytest.raises(ValueError, match="a1_scale must be finite and positive, got a1_scale = nan"):
            fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, a1_scale=nan_scale, **scales)
    else:
        assert fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, a1_scale=nan_scale, **scales).isnan().all()
    w = torch.nn.Parameter(torch.randn(2, 40, 72, device=DEVICE))
    q, s = quantize_weights_fp8(w)
    assert not q.requires_grad and not s.requires_grad
    _, huge = quantize_weights_fp8(w.detach(), (10**9, 10**9))
    assert torch.equal(huge, quantize_weights_fp8(w.detach(), (64, 128))[1])  # one block either way
    a = torch.randn(6, 64, device=DEVICE)
    with pytest.raises(ValueError, match="out_scale's entries overlap"):
        quantize_activations_fp8(a, group_size=32, out_scale=torch.zeros(1, 2, device=DEVICE).expand(6, 2))
    with pytest.raises(ValueError, match="out_scale's entries overlap"):  # rows one scale apart, two scales wide
        quantize_activations_fp8(a, group_size=32, out_scale=torch.zeros(9, device=DEVICE).as_strided((6, 2), (1, 1)))
    with pytest.raises(ValueError, match="out_scale shares memory with x"):
        quantize_activations_fp8(a, group_size=32, out_scale=a[:, :2])
    assert quantize_activations_fp8(a, group_size=__import__("numpy").int64(32))[1].shape == (6, 2)
    if DEVICE.type == "cpu":  # the interpreter cannot read meta tensors; a GPU run compiles on them
        with pytest.raises(ValueError, match="meta device"):
            quantize_activations_fp8(a.to("meta"))
    from moe_lab import FusedMoE

    module = FusedMoE(w1_q, w2_q, **scales).to("meta")
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        module(x, topk_weights, topk_ids)
    assert module(x.to("meta"), topk_weights.to("meta"), topk_ids.to("meta")).device.type == "meta"


@pytest.mark.parametrize("block_n", [16, 32])  # BLOCK_SIZE_N = 32: one scale per column, one per tile
def test_fp8_block_scales_with_no_k_or_no_tokens(block_n):
    # K = 0: the scales have no K groups; the per-tile path's first scales (loaded before the K loop) must
    # not be read from them (an empty tensor's pointer: a segfault under the interpreter).
    routing = moe_align(random_topk_ids(5, 2, 1), 2, 16)
    a, w = torch.zeros(5, 0, device=DEVICE).to(FP8), torch.zeros(2, 64, 0, device=DEVICE).to(FP8)
    out = grouped_matmul(
        a,
        w,
        routing,
        GemmConfig(16, 32, 32, 1, 4, 1),
        gather_a=True,
        a_scale=torch.ones(5, 0, device=DEVICE),
        w_scale=torch.ones(2, 64 // block_n, 0, device=DEVICE),
        block_shape=(block_n, 32),
        out_dtype=torch.float32,
    )
    assert not out[: routing.num_tokens_post_padded.item()].any()
    # T = 0: a and out are both empty (data_ptr 0 on the CPU), which is no aliasing
    routing = moe_align(random_topk_ids(0, 2, 1), 2, 16)
    w_q, w_scale = quantize_weights_fp8(torch.randn(2, 64, 64, device=DEVICE), (block_n, 32))
    a_q, a_scale = quantize_activations_fp8(
        torch.randn(0, 64, device=DEVICE), group_size=32, out=torch.empty(0, 64, dtype=FP8, device=DEVICE)
    )
    out = grouped_matmul(
        a_q,
        w_q,
        routing,
        GemmConfig(16, 32, 32, 1, 4, 1),
        gather_a=True,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=(block_n, 32),
    )
    assert out.shape == (0, 64)


def test_fp8_block_shape_past_int32_is_named():
    routing = moe_align(random_topk_ids(5, 2, 1), 2, 16)
    w = torch.randn(2, 64, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"block_shape entries must be below 2\*\*31"):
        quantize_weights_fp8(w, (2**31, 32))
    w_q, w_scale = w.to(torch.float8_e4m3fn), torch.ones(2, 1, 2, device=DEVICE)  # one block in N
    a_q, a_scale = quantize_activations_fp8(torch.randn(5, 64, device=DEVICE), group_size=32)
    with pytest.raises(ValueError, match=r"block_shape entries must be below 2\*\*31"):
        grouped_matmul(
            a_q,
            w_q,
            routing,
            GemmConfig(16, 32, 32, 1, 4, 1),
            gather_a=True,
            a_scale=a_scale,
            w_scale=w_scale,
            block_shape=(2**31, 32),
        )


def test_fp8_layer_with_no_channels_returns_an_empty_output_as_bf16_does():
    """H = 0 (after a new-user trial): the output [T, 0] holds nothing; FP8 used to refuse it with an error
    naming quantize_activations_fp8's `x`."""
    e, t, i = 4, 3, 128
    x, topk_weights = torch.randn(t, 0, device=DEVICE).bfloat16(), torch.rand(t, 2, device=DEVICE)
    topk_ids = random_topk_ids(t, e, 2)
    w1, w2 = torch.zeros(e, 2 * i, 0, device=DEVICE), torch.zeros(e, 0, i, device=DEVICE)
    assert fused_moe(x, w1.bfloat16(), w2.bfloat16(), topk_weights, topk_ids).shape == (t, 0)
    out = fused_moe(
        x,
        w1.to(FP8),
        w2.to(FP8),
        topk_weights,
        topk_ids,
        w1_scale=torch.ones(e, 2, 0, device=DEVICE),
        w2_scale=torch.ones(e, 0, 1, device=DEVICE),
        block_shape=(128, 128),
    )
    assert out.shape == (t, 0)


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize(
    "swiglu,block_n,block_k,k,persistent",
    [
        (False, 32, 64, 96, False),  # two dots per step; the last step's second dot lies past K
        (False, 64, 128, 100, False),  # four dots per step, one scale per column, a ragged last group
        (True, 32, 64, 128, False),  # SwiGLU halves with one scale each, K a multiple of the step
        (True, 64, 128, 200, True),  # the persistent kernel, a step past K's last group
    ],
)
def test_fp8_steps_of_several_scale_blocks_are_bitwise_one_block_steps(
    use_tma, swiglu, block_n, block_k, k, persistent
):
    """BLOCK_SIZE_K a multiple of the scale block's K: each step runs one dot per scale block (larger loads
    per step, FP8 decode), in the order steps of one block run them: the same bits."""
    block_shape = (32, 32)
    routing, a_q, a_scale, w_q, w_scale = block_scaled_up(9, 3, 2, 64, k, block_shape, swiglu)
    args = dict(
        gather_a=True,
        swiglu=swiglu,
        use_tma=use_tma,
        a_scale=a_scale,
        w_scale=w_scale,
        block_shape=block_shape,
        out_dtype=torch.float32,
        return_plan=True,
    )
    wide, plan = grouped_matmul(
        a_q, w_q, routing, GemmConfig(16, block_n, block_k, 1, 4, 2, persistent=persistent), **args
    )
    assert plan.dots_per_step == block_k // 32 and plan.box_k == 32 and plan.config.BLOCK_SIZE_K == block_k
    narrow, plan = grouped_matmul(
        a_q, w_q, routing, GemmConfig(16, block_n, 32, 1, 4, 2, persistent=persistent), **args
    )
    assert plan.dots_per_step == 1
    used = routing.num_tokens_post_padded.item()
    valid = routing.sorted_token_ids.cpu()[:used] < routing.num_slots
    assert torch.equal(wide.cpu()[:used][valid], narrow.cpu()[:used][valid])
    a_deq = a_q.double() * a_scale.repeat_interleave(block_shape[1], 1)[:, :k].double()
    w_deq = dequantize_fp8(w_q, w_scale, block_shape).double()
    ref = (swiglu_reference if swiglu else lambda *x: per_expert_reference(*x, gather_a=True))(a_deq, w_deq, routing)
    assert relative_error(wide.cpu()[:used][valid], ref[:used][valid]) < 1e-5


def test_fp8_dots_take_at_least_32_channels():
    """NVIDIA's 8-bit mma and wgmma take K = 32: a config's BLOCK_SIZE_K of 16 is raised to 32 for float8
    (every scale scheme), and a block_k that only 16 divides is refused before anything compiles."""
    num_tokens, num_experts, top_k, n, k = 5, 3, 2, 32, 64
    routing = moe_align(random_topk_ids(num_tokens, num_experts, top_k), num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w = torch.randn(num_experts, n, k, device=DEVICE)
    for scheme in SCHEMES:
        a_q, a_scale, w_q, w_scale, block_shape, a_deq, w_deq = quantized(scheme, a, w)
        out, plan = grouped_matmul(
            a_q,
            w_q,
            routing,
            GemmConfig(16, 32, 16, 1, 4, 1),
            gather_a=True,
            a_scale=a_scale,
            w_scale=w_scale,
            block_shape=block_shape,
            out_dtype=torch.float32,
            return_plan=True,
        )
        assert plan.config.BLOCK_SIZE_K == 32
    with pytest.raises(ValueError, match=r"block_shape\[1\] \(block_k\) must be a multiple of 32.*got 48"):
        quantize_weights_fp8(w, (16, 48))  # no weights in blocks the GEMM cannot run
    w_q = w.to(torch.float8_e4m3fn)
    w_scale = torch.ones(num_experts, n // 16, -(-k // 48), device=DEVICE)
    a_q, a_scale = quantize_activations_fp8(a, group_size=48)
    with pytest.raises(ValueError, match=r"block_shape\[1\] \(block_k\) must be a multiple of 32.*got 48"):
        grouped_matmul(
            a_q,
            w_q,
            routing,
            GemmConfig(16, 32, 64, 1, 4, 1),
            gather_a=True,
            a_scale=a_scale,
            w_scale=w_scale,
            block_shape=(16, 48),
        )


def test_reference_checks_its_fp8_arguments_as_the_layer_does():
    """(From a breaker's trial) fused_moe_reference took a block_k the layer refuses and named
    dequantize_fp8's arguments (q, scale) for a w1_scale that does not fit."""
    e, t, h, i = 3, 4, 64, 32
    x = torch.randn(t, h, device=DEVICE)
    (w1_q, w1_s), (w2_q, w2_s) = (
        quantize_weights_fp8(torch.randn(e, n, k, device=DEVICE), (32, 32)) for n, k in ((2 * i, h), (h, i))
    )
    topk_weights, topk_ids = torch.rand(t, 2, device=DEVICE), random_topk_ids(t, e, 2)
    with pytest.raises(ValueError, match=r"w1_scale must have shape \[E, ceil\(N/block_n\), ceil\(K/block_k\)\]"):
        fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=w1_s, w2_scale=w2_s, block_shape=(64, 64))
    with pytest.raises(ValueError, match=r"block_k\) must be a multiple of 32.*got 48"):
        fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=w1_s, w2_scale=w2_s, block_shape=(32, 48))
    with pytest.raises(ValueError, match=r"a1_scale must have shape \[1\] or \[\]"):
        fused_moe_reference(
            x,
            w1_q,
            w2_q,
            topk_weights,
            topk_ids,
            w1_scale=w1_s[:, 0, 0].contiguous(),
            w2_scale=w2_s[:, 0, 0].contiguous(),
            a1_scale=torch.ones(2, device=DEVICE),
        )
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=w1_s, w2_scale=w2_s, block_shape=(32, 32))
    assert ref.shape == (t, h) and torch.isfinite(ref).all()


def test_reference_refuses_scales_for_float_weights_and_a_dtype_that_is_not_one():
    """(From a new user's trial) fused_moe_reference ignored scales given with bfloat16 weights, which fused_moe
    refuses, and `dtype="float32"` failed inside torch."""
    e, t, h, i = 3, 4, 64, 32
    x = torch.randn(t, h, device=DEVICE)
    w1, w2 = torch.randn(e, 2 * i, h, device=DEVICE), torch.randn(e, h, i, device=DEVICE)
    topk_weights, topk_ids = torch.rand(t, 2, device=DEVICE), random_topk_ids(t, e, 2)
    with pytest.raises(ValueError, match=r"w1_scale, w2_scale given, but w1 and w2 are float32: scales are for"):
        fused_moe_reference(x, w1, w2, topk_weights, topk_ids, w1_scale=torch.ones(e), w2_scale=torch.ones(e))
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype .*got 'float32'"):
        fused_moe_reference(x, w1, w2, topk_weights, topk_ids, dtype="float32")


def test_reference_without_quantized_inputs_is_exact_math_on_the_dequantized_weights():
    """quantize_inputs=False: the float8 layer's whole error (docs/experiments.md, "FP8 at decode: which
    reference"), the same as the reference on the dequantized float weights; the default quantizes both GEMMs'
    inputs."""
    from moe_lab.quantize import dequantize_fp8

    e, t, h, i = 3, 5, 256, 128
    x = torch.randn(t, h, device=DEVICE)
    (w1_q, w1_s), (w2_q, w2_s) = (
        quantize_weights_fp8(torch.randn(e, n, k, device=DEVICE), (128, 128)) for n, k in ((2 * i, h), (h, i))
    )
    topk_weights, topk_ids = torch.rand(t, 2, device=DEVICE), random_topk_ids(t, e, 2)
    scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=(128, 128))
    exact = fused_moe_reference(
        x, w1_q, w2_q, topk_weights, topk_ids, dtype=torch.float64, quantize_inputs=False, **scales
    )
    w1, w2 = dequantize_fp8(w1_q, w1_s, (128, 128)), dequantize_fp8(w2_q, w2_s, (128, 128))
    assert torch.allclose(exact, fused_moe_reference(x, w1, w2, topk_weights, topk_ids, dtype=torch.float64))
    default = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, dtype=torch.float64, **scales)
    assert 1e-3 < relative_error(default, exact) < 1e-1  # float8 inputs
    with pytest.raises(TypeError, match=r"quantize_inputs must be a bool, got str 'no'"):
        fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, quantize_inputs="no", **scales)


def test_one_weight_scale_for_every_expert_says_how_to_pass_it():
    e, t, h, i = 3, 4, 64, 32
    x = torch.randn(t, h, device=DEVICE)
    (w1_q, w1_s), (w2_q, w2_s) = (
        quantize_weights_fp8(torch.randn(e, n, k, device=DEVICE), None) for n, k in ((2 * i, h), (h, i))
    )
    topk_weights, topk_ids = torch.rand(t, 2, device=DEVICE), random_topk_ids(t, e, 2)
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match=r"got shape \(1,\): one scale for every expert is w1_scale.expand\(3\)"):
        fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=one, w2_scale=w2_s)
    got = fused_moe(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=one.expand(e), w2_scale=w2_s)
    ref = fused_moe_reference(x, w1_q, w2_q, topk_weights, topk_ids, w1_scale=one.expand(e), w2_scale=w2_s)
    assert relative_error(got, ref) < 1e-2
