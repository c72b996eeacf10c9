"""The SwiGLU epilogue of the up GEMM (`grouped_matmul(..., swiglu=True)`, `GemmConfig.fuse_swiglu`):
silu(gate) * up from the float32 accumulators, checked against a float64 reference."""

import pytest
import torch
import torch.nn.functional as F

from moe_lab import GemmConfig, fused_moe, fused_moe_reference, grouped_matmul, moe_align, relative_error

from .conftest import DEVICE, TOL, random_topk_ids, small_layer
from .test_grouped_matmul import PATHS, per_expert_reference

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def swiglu_reference(a, w1, routing):
    """Row r of the padded sorted order -> silu(gate) * up in float64; padding rows zero."""
    gate_up = per_expert_reference(a, w1, routing, gather_a=True)
    inter = w1.shape[1] // 2
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,inter,k,block_n",
    [
        (9, 4, 2, 32, 64, 32),  # I a multiple of BLOCK_SIZE_N/2
        (33, 7, 3, 40, 40, 64),  # I = 40 not a multiple of 32, K not a multiple of BLOCK_SIZE_K
        (5, 3, 3, 16, 32, 64),  # I smaller than the half tile: the gate box reaches into the up rows
    ],
)
def test_swiglu_epilogue_matches_the_reference(use_tma, dtype, num_tokens, num_experts, top_k, inter, k, block_n):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE).to(dtype)
    w1 = (torch.randn(num_experts, 2 * inter, k, device=DEVICE) * k**-0.5).to(dtype)
    out = torch.full((routing.max_num_tokens_padded, inter), float("nan"), dtype=dtype, device=DEVICE)
    cfg = GemmConfig(16, block_n, 32, 2, 4, 1, tail_tiles=False)
    _, plan = grouped_matmul(
        a, w1, routing, cfg, gather_a=True, swiglu=True, out=out, use_tma=use_tma, return_plan=True
    )
    assert plan.swiglu and plan.tile_n == block_n // 2
    used = routing.num_tokens_post_padded.item()
    assert not out[:used].isnan().any(), "rows in use left unwritten"
    assert relative_error(out[:used], swiglu_reference(a, w1, routing)[:used]) < TOL[dtype]


@pytest.mark.parametrize("use_tma", PATHS)
def test_swiglu_epilogue_with_tail_tiles(use_tma):
    sizes = [1, 5, 9, 19, 0, 40]  # last blocks of 32 rows hold <= 1/4, <= 1/2 and more of their rows
    ids = torch.cat([torch.full((s,), e, dtype=torch.int32) for e, s in enumerate(sizes)])
    ids = ids[torch.randperm(ids.numel())].reshape(-1, 1).to(DEVICE)
    routing = moe_align(ids, len(sizes), 32)
    a = torch.randn(ids.shape[0], 48, device=DEVICE)
    w1 = torch.randn(len(sizes), 48, 48, device=DEVICE) * 48**-0.5
    ref = swiglu_reference(a, w1, routing)
    valid = routing.sorted_token_ids.cpu() < routing.num_slots
    for cfg in (GemmConfig(32, 32, 16, 1, 4, 1), GemmConfig(32, 64, 16, 1, 4, 1)):
        out = grouped_matmul(a, w1, routing, cfg, gather_a=True, swiglu=True, use_tma=use_tma)
        assert relative_error(out.cpu()[valid], ref[valid]) < TOL[torch.float32], cfg


def test_swiglu_bad_arguments_name_what_is_wrong():
    ids = random_topk_ids(4, 3, 2)
    routing = moe_align(ids, 3, 16)
    a = torch.randn(4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="even, non-zero 2I"):
        grouped_matmul(
            a, torch.randn(3, 33, 32, device=DEVICE), routing, GemmConfig(16, 32, 32), gather_a=True, swiglu=True
        )
    with pytest.raises(ValueError, match="BLOCK_SIZE_N >= 32"):
        grouped_matmul(
            a, torch.randn(3, 32, 32, device=DEVICE), routing, GemmConfig(16, 16, 32), gather_a=True, swiglu=True
        )
    with pytest.raises(TypeError, match="swiglu must be a bool"):
        grouped_matmul(
            a, torch.randn(3, 32, 32, device=DEVICE), routing, GemmConfig(16, 32, 32), gather_a=True, swiglu="yes"
        )
    sorted_a = torch.randn(routing.max_num_tokens_padded, 32, device=DEVICE)
    with pytest.raises(ValueError, match="scatter=True is not supported"):
        grouped_matmul(
            sorted_a,
            torch.randn(3, 32, 32, device=DEVICE),
            routing,
            GemmConfig(16, 32, 32),
            gather_a=False,
            scatter=True,
            swiglu=True,
        )
    with pytest.raises(ValueError, match="out shares memory with a"):  # I == K: a has the output's shape
        sorted_a = torch.randn(routing.max_num_tokens_padded, 16, device=DEVICE)
        grouped_matmul(
            sorted_a,
            torch.randn(3, 32, 16, device=DEVICE),
            routing,
            GemmConfig(16, 32, 16),
            gather_a=False,
            swiglu=True,
            out=sorted_a,
        )
    odd = torch.zeros(3, 48, 17, device=DEVICE)[:, :, :16]
    with pytest.raises(ValueError, match=r"viewed as \[E, 2, I, K\] \(3, 2, 24, 16\) for the SwiGLU epilogue"):
        grouped_matmul(a[:, :16], odd, routing, GemmConfig(16, 32, 16), gather_a=True, swiglu=True, use_tma=True)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        hs, w1, w2, tw, ti = small_layer()
        fused_moe(hs, w1, w2, tw, ti, out=[[0.0]])
    with pytest.raises(ValueError, match=r"out must have shape.*\[rows, I\]"):
        grouped_matmul(
            a,
            torch.randn(3, 32, 32, device=DEVICE),
            routing,
            GemmConfig(16, 32, 32),
            gather_a=True,
            swiglu=True,
            out=torch.empty(routing.max_num_tokens_padded, 32, device=DEVICE),
        )


@pytest.mark.parametrize("fuse", [True, False])
def test_layer_fuses_where_the_config_says(fuse):
    hs, w1, w2, tw, ti = small_layer()
    cfg = GemmConfig(16, 32, 32, 1, 4, 1, fuse_swiglu=fuse)
    out, info = fused_moe(hs, w1, w2, tw, ti, config=cfg, return_info=True)
    assert info.up_plan.swiglu == fuse
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[hs.dtype]
    # A 16-column tile cannot be halved: it runs unfused whatever fuse_swiglu says.
    _, info = fused_moe(hs, w1, w2, tw, ti, config=GemmConfig(16, 16, 32, 1, 4, 1, fuse_swiglu=fuse), return_info=True)
    assert not info.up_plan.swiglu


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's sigmoid of -1e5: exp(1e5)
@pytest.mark.parametrize("use_tma", PATHS)
def test_float16_pre_activation_past_65504_gives_the_right_answer(use_tma):
    """gate = 1e5 and up = 1e-3 make silu(gate) * up = 100, well inside float16, although the gate itself is
    not: the fused epilogue computes it from the float32 accumulators, where a float16 [rows, 2I]
    intermediate would hold inf (and a gate of -1e5 would give -inf * 0 = NaN instead of 0).
    With I = 16 and w2 = 0.01 the layer's output is 16 (gate 1e5) and 0 (gate -1e5)."""
    hidden, inter, num_experts = 32, 16, 2
    x = torch.zeros(2, hidden)
    x[:, 0], x[:, 1] = 316.25, 1e-3  # 316.25^2 = 100014: the gate pre-activation
    x[1, 0] = -316.25
    w1 = torch.zeros(num_experts, 2 * inter, hidden)
    w1[:, :inter, 0] = 316.25  # gate rows read x[0]
    w1[:, inter:, 1] = 1.0  # up rows read x[1]
    w2 = torch.full((num_experts, hidden, inter), 0.01)
    ti = torch.tensor([[0], [1]], dtype=torch.int32)
    tw = torch.ones(2, 1)
    args = [t.to(DEVICE) for t in (x.half(), w1.half(), w2.half(), tw, ti)]
    ref = fused_moe_reference(*args)
    assert torch.allclose(ref[0].float(), torch.full((hidden,), 16.0, device=DEVICE), rtol=2e-2)
    assert not ref[1].any()
    out, info = fused_moe(*args, config=GemmConfig(16, 32, 32, 1, 4, 1), use_tma=use_tma, return_info=True)
    assert info.up_plan.swiglu
    assert torch.isfinite(out).all(), out
    assert torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=1e-3)
