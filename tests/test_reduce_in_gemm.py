"""The top-k reduce folded into the down GEMM (`grouped_matmul(..., reduce_out=)`, the layer at decode):
the same sum as `topk_reduce`, bit for bit, on every routing (repeated experts, dropped ids, tokens with
no slot computed here, expert maps), and clear errors for what it cannot do."""
import pytest
import torch
import triton

import moe_lab.layer as layer
from moe_lab import fused_moe, grouped_matmul, moe_align, quantize_weights_fp8, topk_reduce
from moe_lab.configs import GemmConfig, MoEConfig
from moe_lab.presets import get_preset

from .conftest import DEVICE, ON_GPU, random_layer, random_topk_ids


def bits(x):
    return x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32)


def down_gemm_both_ways(ids, num_experts, hidden, inter, dtype, config, expert_map=None):
    """(reduce_out from the fused GEMM, topk_reduce over the same GEMM's out_k), both NaN-poisoned first."""
    num_tokens, top_k = ids.shape
    local = num_experts if expert_map is None else int(expert_map.max()) + 1
    tiles = triton.cdiv(hidden, config.BLOCK_SIZE_N)
    routing = moe_align(ids, local, config.BLOCK_SIZE_M, expert_map=expert_map, reduce_tiles=tiles)
    act = torch.randn(routing.max_num_tokens_padded, inter, device=DEVICE).to(dtype)
    w2 = (torch.randn(local, hidden, inter, device=DEVICE) / inter ** 0.5).to(dtype)
    tw = torch.rand(num_tokens, top_k, device=DEVICE)
    out_k = torch.full((num_tokens * top_k, hidden), float("nan"), device=DEVICE).to(dtype)
    fused = torch.full((num_tokens, hidden), float("nan"), device=DEVICE).to(dtype)
    grouped_matmul(act, w2, routing, config, gather_a=False, scatter=True, topk_weights=tw, out=out_k,
                   reduce_out=fused, use_tma=False)
    return fused, topk_reduce(out_k, ids, local, expert_map=expert_map)


@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,dtype,config", [
    (1, 8, 2, 64, torch.bfloat16, GemmConfig(16, 32, 16)),
    (5, 6, 3, 48, torch.bfloat16, GemmConfig(16, 32, 16)),            # H not a multiple of BLOCK_SIZE_N
    (7, 5, 5, 40, torch.float16, GemmConfig(16, 16, 16)),             # top_k = E, E not a power of two
    (12, 128, 8, 64, torch.float32, GemmConfig(16, 64, 32)),
    (9, 3, 1, 32, torch.bfloat16, GemmConfig(32, 32, 16, tail_tiles=True)),  # k = 1, tail tiles
    (40, 4, 2, 32, torch.bfloat16, GemmConfig(16, 32, 16)),           # three align launches (80 slots > 64)
])
def test_bitwise_topk_reduce(num_tokens, num_experts, top_k, hidden, dtype, config):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    fused, want = down_gemm_both_ways(ids, num_experts, hidden, 24, dtype, config)
    assert not fused.isnan().any()
    assert torch.equal(bits(fused), bits(want))


def test_repeated_dropped_and_orphan_tokens():
    """A token routed twice to one expert, slots with ids out of range, and a token none of whose slots
    is computed (its sum is zero, as topk_reduce writes it)."""
    ids = random_topk_ids(6, 7, 3)
    ids[1, 1] = ids[1, 0]
    ids[2, 2] = 7 + 4
    ids[3] = -1          # an orphan: every slot dropped
    fused, want = down_gemm_both_ways(ids, 7, 48, 24, torch.bfloat16, GemmConfig(16, 32, 16))
    assert torch.equal(bits(fused), bits(want)) and torch.count_nonzero(fused[3]) == 0


def test_expert_map():
    ids = random_topk_ids(9, 8, 2)
    ids[4] = torch.tensor([1, 3], dtype=torch.int32)  # both on other ranks' experts: an orphan here
    expert_map = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32, device=DEVICE)
    fused, want = down_gemm_both_ways(ids, 8, 64, 32, torch.bfloat16, GemmConfig(16, 32, 16), expert_map)
    assert torch.equal(bits(fused), bits(want)) and torch.count_nonzero(fused[4]) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layer_is_bitwise_the_unfused_layer(monkeypatch, dtype):
    """fused_moe folds the reduce in at decode (few slots); its output is the unfused layer's, bit for bit."""
    hs, w1, w2, tw, ti = random_layer(3, 8, 2, 64, 32, dtype)
    assert layer._reduce_in_down_gemm(6, 8, MoEConfig(GemmConfig(16, 64, 32), GemmConfig(16, 64, 32)).down)
    fused = fused_moe(hs, w1, w2, tw, ti)
    monkeypatch.setattr(layer, "REDUCE_IN_DOWN_GEMM", False)
    assert torch.equal(bits(fused), bits(fused_moe(hs, w1, w2, tw, ti)))


def test_fp8_layer_is_bitwise_the_unfused_layer(monkeypatch):
    hs, w1, w2, tw, ti = random_layer(2, 4, 2, 128, 128, torch.bfloat16)
    (q1, s1), (q2, s2) = quantize_weights_fp8(w1, (128, 128)), quantize_weights_fp8(w2, (128, 128))
    kw = dict(w1_scale=s1, w2_scale=s2, block_shape=(128, 128))
    fused = fused_moe(hs, q1, q2, tw, ti, **kw)
    monkeypatch.setattr(layer, "REDUCE_IN_DOWN_GEMM", False)
    assert torch.equal(bits(fused), bits(fused_moe(hs, q1, q2, tw, ti, **kw)))


def test_not_with_a_persistent_down_gemm_or_many_slots():
    cfg = GemmConfig(16, 64, 32)
    assert not layer._reduce_in_down_gemm(6, 8, GemmConfig(16, 64, 32, persistent=True))
    assert not layer._reduce_in_down_gemm(4096 * 8, 8, cfg)
    assert not layer._reduce_in_down_gemm(0, 8, cfg)


def _args(num_tokens=3, hidden=64, config=GemmConfig(16, 32, 16), reduce_tiles=2):
    ids = random_topk_ids(num_tokens, 4, 2)
    routing = moe_align(ids, 4, 16, reduce_tiles=reduce_tiles)
    act = torch.randn(routing.max_num_tokens_padded, 16, device=DEVICE).bfloat16()
    w2 = torch.randn(4, hidden, 16, device=DEVICE).bfloat16()
    return act, w2, routing, config


@pytest.mark.parametrize("change,match", [
    (dict(scatter=False), "reduce_out needs scatter=True"),
    (dict(reduce_out=torch.empty(3, 32, dtype=torch.bfloat16)), r"reduce_out must have shape \[T, N\] = \[3, 64\]"),
    (dict(reduce_out=torch.empty(3, 64)), "reduce_out must be bfloat16"),
    (dict(reduce_out=torch.empty(64, 3).bfloat16().T), "reduce_out must have a last stride of 1"),
    (dict(reduce_tiles=0), r"moe_align\(..., reduce_tiles=2\)"),
    (dict(reduce_tiles=4), r"moe_align\(..., reduce_tiles=2\).*shape \(3, 4\)"),
    (dict(config=GemmConfig(16, 32, 16, persistent=True)), "non-persistent config"),
])
def test_bad_reduce_out(change, match):
    act, w2, routing, config = _args(config=change.pop("config", GemmConfig(16, 32, 16)),
                                     reduce_tiles=change.pop("reduce_tiles", 2))
    kw = dict(scatter=True, reduce_out=torch.empty(3, 64, dtype=torch.bfloat16))
    kw.update(change)
    if isinstance(kw["reduce_out"], torch.Tensor):
        kw["reduce_out"] = kw["reduce_out"].to(DEVICE)
    with pytest.raises((ValueError, TypeError), match=match):
        grouped_matmul(act, w2, routing, config, gather_a=False, **kw)


def test_bad_reduce_tiles():
    ids = random_topk_ids(2, 4, 2)
    with pytest.raises(ValueError, match="reduce_tiles must be >= 0"):
        moe_align(ids, 4, 16, reduce_tiles=-1)
    with pytest.raises(TypeError, match="reduce_tiles must be an int"):
        moe_align(ids, 4, 16, reduce_tiles=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"])
@pytest.mark.parametrize("num_tokens", [1, 8])
def test_gpu_layer_fused_reduce_is_bitwise_and_stable(monkeypatch, model, num_tokens):
    """At real sizes on a GPU, with the shipped configs: the layer with the reduce in its down GEMM gives
    the unfused layer's output bit for bit, in 20 runs (a race between the arriving programs would show as
    a changing or NaN row)."""
    assert ON_GPU
    p = get_preset(model)
    hs, w1, w2, (tw, ti) = p.build(num_tokens, device=DEVICE)
    first = fused_moe(hs, w1, w2, tw, ti)
    assert not first.isnan().any()
    for _ in range(20):
        assert torch.equal(bits(fused_moe(hs, w1, w2, tw, ti)), bits(first))
    monkeypatch.setattr(layer, "REDUCE_IN_DOWN_GEMM", False)
    assert torch.equal(bits(first), bits(fused_moe(hs, w1, w2, tw, ti)))
