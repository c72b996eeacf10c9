"""Folded tails (GemmConfig.fold_tail_rows): an expert's last M-block of at most that many valid rows is
computed by the block before it. Every valid row written, the same bits as without folding, the rows the
fold skips (padding) never written, and the plan turning it off where it does not apply."""

import pytest
import torch

from moe_lab import (
    GemmConfig,
    MoEConfig,
    fused_moe,
    fused_moe_reference,
    get_preset,
    grouped_matmul,
    moe_align,
    relative_error,
)
from moe_lab.align import slot_order_routing

from .conftest import DEVICE, TOL
from .test_grouped_matmul import PATHS, per_expert_reference

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def _routing(block_m, fold):
    # Last blocks of fold - 1, fold and fold + 1 valid rows after full blocks (the first two fold, the third
    # does not), an expert of one partial block, an empty one, one of whole blocks, and several in a row.
    sizes = [block_m + fold - 1, 2 * block_m + fold, block_m + fold + 1, 3, 0, 2 * block_m, block_m + 1, block_m + 2]
    ids = torch.cat([torch.full((s,), e, dtype=torch.int32) for e, s in enumerate(sizes)])
    ids = ids[torch.randperm(ids.numel())].reshape(-1, 1).to(DEVICE)
    return ids, moe_align(ids, len(sizes), block_m)


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("block_m,fold", [(32, 16), (64, 16), (64, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_tails_match_unfolded_bit_for_bit(use_tma, block_m, fold, dtype):
    ids, routing = _routing(block_m, fold)
    num_experts, n, k = routing.num_experts, 32, 40  # K not a multiple of BLOCK_SIZE_K
    a = torch.randn(ids.shape[0], k, device=DEVICE).to(dtype)
    w = torch.randn(num_experts, n, k, device=DEVICE).to(dtype)
    a_sorted = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE).to(dtype)
    weights = torch.rand(ids.shape[0], 1, device=DEVICE)
    valid = (routing.sorted_token_ids < routing.num_slots).cpu()
    outs = {}
    for rows in (0, fold):
        cfg = GemmConfig(block_m, 32, 16, 2, 4, 1, fold_tail_rows=rows)
        up = torch.full((routing.max_num_tokens_padded, n), float("nan"), dtype=dtype, device=DEVICE)
        _, plan = grouped_matmul(a, w, routing, cfg, gather_a=True, out=up, use_tma=use_tma, return_plan=True)
        assert plan.fold_m == rows
        down = torch.full((routing.num_slots, n), float("nan"), dtype=dtype, device=DEVICE)
        grouped_matmul(
            a_sorted, w, routing, cfg, gather_a=False, scatter=True, topk_weights=weights, out=down, use_tma=use_tma
        )
        swiglu = grouped_matmul(a, w, routing, cfg, gather_a=True, swiglu=True, use_tma=use_tma)
        assert not up.cpu()[valid].isnan().any() and not down.isnan().any(), f"fold_tail_rows={rows}: rows unwritten"
        outs[rows] = (up.cpu()[valid], down.cpu(), swiglu.cpu()[valid])
    assert relative_error(outs[fold][0], per_expert_reference(a, w, routing, gather_a=True)[valid]) < TOL[dtype]
    for unfolded, folded in zip(outs[0], outs[fold]):
        assert torch.equal(unfolded, folded)


def test_folded_blocks_leave_padding_rows_unwritten():
    ids, routing = _routing(32, 16)
    a = torch.randn(ids.shape[0], 32, device=DEVICE)
    w = torch.randn(routing.num_experts, 32, 32, device=DEVICE)
    out = torch.full((routing.max_num_tokens_padded, 32), float("nan"), device=DEVICE)
    grouped_matmul(
        a, w, routing, GemmConfig(32, 32, 32, 1, 4, 1, tail_tiles=False, fold_tail_rows=16), gather_a=True, out=out
    )
    used = routing.num_tokens_post_padded.item()
    valid = (routing.sorted_token_ids < routing.num_slots).cpu()[:used]
    written = ~out.cpu()[:used].isnan().any(dim=1)
    assert torch.equal(written[valid], torch.ones_like(written[valid]))
    assert not written[~valid].all(), "no padding row was skipped: nothing was folded"


def test_the_plan_folds_only_where_it_applies():
    ids, routing = _routing(32, 16)
    a = torch.randn(ids.shape[0], 32, device=DEVICE)
    w = torch.randn(routing.num_experts, 32, 32, device=DEVICE)
    _, plan = grouped_matmul(
        a,
        w,
        routing,
        GemmConfig(32, 32, 32, 1, 4, 1, persistent=True, fold_tail_rows=16),
        gather_a=True,
        return_plan=True,
    )
    assert plan.persistent and plan.fold_m == 0  # the persistent kernel runs every tile whole
    one = torch.tensor([[1, 3]], dtype=torch.int32, device=DEVICE)
    _, plan = grouped_matmul(
        a[:1],
        w,
        slot_order_routing(one, routing.num_experts, 32),
        GemmConfig(32, 32, 32, 1, 4, 1, fold_tail_rows=16),
        gather_a=True,
        return_plan=True,
    )
    assert plan.fold_m == 0  # slot order: blocks are slots, not an expert's rows


@pytest.mark.parametrize(
    "rows,error,match",
    [
        (8, ValueError, ">= 16, got 8"),
        (48, ValueError, "power of two"),
        (64, ValueError, "at most BLOCK_SIZE_M/2 = 32"),
        (True, TypeError, "fold_tail_rows"),
        ("16", TypeError, "fold_tail_rows"),
    ],
)
def test_bad_fold_tail_rows_are_refused(rows, error, match):
    with pytest.raises(error, match=match):
        GemmConfig(64, 32, 32, fold_tail_rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("use_tma", [False, "auto"])
def test_folded_tails_at_deepseek_shapes_on_the_gpu(use_tma):
    """The layer at DeepSeek-V3's expert shape (32 of its experts, 128 rows per expert: a third of the
    M-blocks are small tails) with 64 folded rows: bitwise the same without folding, and < 1e-2 from the
    float32 reference."""
    from moe_lab.routing import uniform_routing

    p = get_preset("deepseek-v3")
    gen = torch.Generator(device="cuda").manual_seed(3)
    e, t = 32, 512
    hs = torch.randn(t, p.hidden_size, generator=gen, device="cuda").to(torch.bfloat16)
    w1 = (
        torch.randn(e, 2 * p.intermediate_size, p.hidden_size, generator=gen, device="cuda") * p.hidden_size**-0.5
    ).to(torch.bfloat16)
    w2 = (
        torch.randn(e, p.hidden_size, p.intermediate_size, generator=gen, device="cuda") * p.intermediate_size**-0.5
    ).to(torch.bfloat16)
    tw, ti = uniform_routing(t, e, p.top_k, seed=5)
    outs = []
    for rows in (0, 64):
        cfg = GemmConfig(128, 256, 64, 8, 8, 4, fold_tail_rows=rows)
        outs.append(fused_moe(hs, w1, w2, tw, ti, config=MoEConfig(cfg, cfg), use_tma=use_tma))
    assert torch.equal(outs[0], outs[1])
    assert relative_error(outs[1], fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_fold_tail_rows_on_a_block_too_small_to_fold_names_the_block():
    with pytest.raises(ValueError, match="needs BLOCK_SIZE_M >= 32"):
        GemmConfig(16, 32, 32, fold_tail_rows=16)


def test_an_unused_fold_costs_no_pipeline_stage_and_a_new_block_size_drops_the_defaults_fold():
    from moe_lab.configs import as_moe_config, fit_to_shared_memory
    from moe_lab.plan import plan_gemm as plan_launch

    ids, routing = _routing(128, 64)
    a = torch.randn(ids.shape[0], 128, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(routing.num_experts, 128, 128, device=DEVICE).to(torch.bfloat16)
    for rows in (0, 64):  # the persistent kernel never folds: its config, fitted to an H200, keeps 3 stages
        plan = plan_launch(
            a, w, routing, GemmConfig(128, 128, 128, 8, 8, 3, persistent=True, fold_tail_rows=rows), gather_a=True
        )
        assert (plan.fold_m, plan.config.fold_tail_rows) == (0, 0)
        assert fit_to_shared_memory(plan.config, 2, 232448).num_stages == 3
    folded = GemmConfig(128, 256, 64, 8, 8, 4, fold_tail_rows=64)
    merged = as_moe_config({"BLOCK_SIZE_M": 64}, MoEConfig(folded, folded))
    assert merged.up.BLOCK_SIZE_M == 64 and merged.up.fold_tail_rows == 0
    assert (
        as_moe_config({"BLOCK_SIZE_M": 64, "fold_tail_rows": 32}, MoEConfig(folded, folded)).down.fold_tail_rows == 32
    )
