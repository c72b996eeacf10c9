"""The warp-specialized Gluon FP8 grouped GEMM (moe_lab.gluon_fp8): where it may run and what it refuses (here),
and its results against the dequantized float32 product (on an H200: `pytest -m gpu tests/test_gluon_fp8.py`)."""

import pytest
import torch

import moe_lab
from moe_lab import moe_align, quantize_activations_fp8, quantize_weights_fp8
from moe_lab.capability import gluon_fp8_support
from moe_lab.configs import GemmConfig
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
from moe_lab.plan import plan_gluon_fp8
from moe_lab.runtime import interpreter_active

pytestmark = pytest.mark.kernels

FP8 = torch.float8_e4m3fn


def _operands(t=6, e=4, k=2, n=256, kk=256, block_m=64, device="cpu"):
    ids = torch.randint(0, e, (t, k), dtype=torch.int32, device=device)
    routing = moe_align(ids, e, block_m)
    w = torch.randn(e, n, kk, device=device).to(FP8)
    w_s = torch.ones(e, -(-n // 128), -(-kk // 128), device=device)
    a = torch.randn(t, kk, device=device).to(FP8)
    a_s = torch.ones(t, -(-kk // 128), device=device)
    return a, a_s, w, w_s, routing


@pytest.mark.skipif(not interpreter_active(), reason="the interpreter's answer")
def test_support_says_why_not_under_the_interpreter():
    reason = gluon_fp8_support()
    assert reason is not None and ("interpreter" in reason or "Gluon" in reason)


@pytest.mark.skipif(gluon_fp8_support() is None, reason="runs here")
def test_refuses_where_it_cannot_run_with_the_reason():
    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(RuntimeError, match="Gluon FP8 grouped GEMM cannot run here"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s)


def test_bad_arguments_are_named_before_anything_runs():
    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(TypeError, match="a must be float8_e4m3fn"):
        grouped_matmul_fp8_gluon(a.float(), w, routing, gather_a=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="block_shape must be given"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, block_shape=None)
    with pytest.raises(ValueError, match="topk_weights needs scatter=True"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, topk_weights=torch.ones(6, 2))
    with pytest.raises(ValueError, match="w_scale must have shape"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s[:, :1])
    with pytest.raises(ValueError, match=r"w must view as one \[E \* N, K\] matrix"):
        experts_inner = w.transpose(0, 1).contiguous().transpose(0, 1)  # strides (K, E * K, 1)
        grouped_matmul_fp8_gluon(a, experts_inner, routing, gather_a=True, a_scale=a_s, w_scale=w_s)


def test_routing_and_scales_are_checked_as_grouped_matmul_checks_them():
    """One check per argument, shared with moe_lab.grouped_matmul (moe_lab.gemm.check_gemm_rows and
    check_fp8_scales): the same refusals, in the same words."""
    from dataclasses import replace

    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(TypeError, match="routing must be an AlignedRouting"):
        grouped_matmul_fp8_gluon(a, w, routing.sorted_token_ids, gather_a=True, a_scale=a_s, w_scale=w_s)
    short = replace(routing, sorted_token_ids=routing.sorted_token_ids[:10])
    with pytest.raises(ValueError, match="routing.sorted_token_ids has 10 rows"):
        grouped_matmul_fp8_gluon(a, w, short, gather_a=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="gather_a=True with scatter=True is not a supported combination"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, scatter=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="need a_scale and w_scale"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=None, w_scale=w_s)
    with pytest.raises(ValueError, match=r"a_scale must have shape \[rows, ceil\(K/block_k\)\]"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s[:, :1], w_scale=w_s)


def test_plan_refuses_what_the_kernel_cannot_run_and_fits_shared_memory():
    _, _, _, _, routing = _operands(block_m=64)
    cpu = torch.device("cpu")
    plan = plan_gluon_fp8(routing, 256, 256, (128, 128), cpu)
    assert plan.config.BLOCK_SIZE_K == 128 and plan.config.num_warps == 4 and plan.constexprs["GROUP_N"] == 128
    assert plan.maxnreg <= 248 and plan.maxnreg % 8 == 0
    with pytest.raises(ValueError, match="block_n=64"):
        plan_gluon_fp8(routing, 256, 256, (64, 128), cpu)
    with pytest.raises(ValueError, match=r"block_shape \[block_n, 128\]"):
        plan_gluon_fp8(routing, 256, 256, (128, 64), cpu)
    with pytest.raises(ValueError, match="multiple of 16"):
        plan_gluon_fp8(routing, 256, 200, (128, 128), cpu)
    with pytest.raises(ValueError, match="must equal the routing's block_size_m"):
        plan_gluon_fp8(routing, 256, 256, (128, 128), cpu, GemmConfig(BLOCK_SIZE_M=128))
    small = moe_align(torch.zeros(3, 1, dtype=torch.int32), 2, 32)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M 64 or 128"):
        plan_gluon_fp8(small, 256, 256, (128, 128), cpu)


def test_permute_tokens_copies_float8_rows():
    a, _, _, _, routing = _operands(t=9, kk=48, block_m=16)
    rows = moe_lab.permute_tokens(a, routing)
    ids = routing.sorted_token_ids.long()[: int(routing.num_tokens_post_padded)]
    valid = ids < routing.num_slots
    assert rows.dtype == FP8
    assert torch.equal(rows[: len(ids)][valid].float(), a.float()[ids[valid] // routing.top_k])
    assert not rows[: len(ids)][~valid].float().any()


# --- on an sm_90 GPU -------------------------------------------------------------------------------------


def _reference(a32, w32, routing, gather_a, topk_weights=None):
    ids = routing.sorted_token_ids.long()
    used = int(routing.num_tokens_post_padded)
    experts = routing.expert_ids.long().repeat_interleave(routing.block_size_m)[:used]
    valid = ids[:used] < routing.num_slots
    rows = torch.arange(used, device=a32.device)[valid]
    src = ids[rows] // routing.top_k if gather_a else rows
    prod = torch.einsum("rk,rnk->rn", a32[src], w32[experts[valid]])
    if topk_weights is not None:
        prod = prod * topk_weights.reshape(-1)[ids[rows]][:, None]
    return rows, ids[rows], prod


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or gluon_fp8_support() is not None, reason="needs sm_90 + Gluon")
@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("t, e, k, h, i", [(1, 8, 2, 512, 256), (300, 16, 4, 1024, 384), (77, 6, 2, 208, 192)])
def test_gluon_pair_matches_the_dequantized_float32_product(block_m, t, e, k, h, i):
    from moe_lab.quantize import dequantize_fp8
    from moe_lab.reference import relative_error

    torch.manual_seed(0)
    x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda"), group_size=128)
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    ids = torch.randint(0, max(1, e // 2), (t, k), device="cuda", dtype=torch.int32)  # half the experts empty
    tw = torch.rand(t, k, device="cuda")
    routing = moe_align(ids, e, block_m)
    cfg = GemmConfig(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=128)
    up = torch.full((routing.max_num_tokens_padded, 2 * i), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s, out=up)
    rows, _, want = _reference(
        dequantize_fp8(x_q, x_s, (1, 128)), dequantize_fp8(w1_q, w1_s, (128, 128)), routing, True
    )
    assert relative_error(up[rows].float(), want) < 1e-2
    a_q, a_s = quantize_activations_fp8(torch.randn(routing.max_num_tokens_padded, i, device="cuda"), group_size=128)
    down = torch.full((t * k, h), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(
        a_q, w2_q, routing, cfg, gather_a=False, scatter=True, topk_weights=tw, a_scale=a_s, w_scale=w2_s, out=down
    )
    _, slots, want = _reference(
        dequantize_fp8(a_q, a_s, (1, 128)), dequantize_fp8(w2_q, w2_s, (128, 128)), routing, False, tw
    )
    assert not down.isnan().any()  # every slot written
    assert relative_error(down[slots].float(), want) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or gluon_fp8_support() is not None, reason="needs sm_90 + Gluon")
def test_gluon_down_gemm_is_bitwise_the_same_in_any_batch():
    torch.manual_seed(0)
    e, k, h, i = 8, 2, 512, 256
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    ids = torch.randint(0, e, (200, k), device="cuda", dtype=torch.int32)
    tw = torch.rand(200, k, device="cuda")
    slot_act = torch.randn(200 * k, i, device="cuda")

    def down(t):
        routing = moe_align(ids[:t], e, 64)
        sorted_ids = routing.sorted_token_ids.long().clamp(max=t * k - 1)
        a_q, a_s = quantize_activations_fp8(slot_act[sorted_ids], group_size=128)
        return grouped_matmul_fp8_gluon(
            a_q, w2_q, routing, gather_a=False, scatter=True, topk_weights=tw[:t], a_scale=a_s, w_scale=w2_s
        )

    assert torch.equal(down(3), down(200)[: 3 * k])
