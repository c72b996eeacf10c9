import pytest
import torch

from moe_lab import GemmConfig, grouped_matmul, moe_align, relative_error, select_load_path

from .conftest import DEVICE, TOL, random_topk_ids

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

CFG = GemmConfig(16, 32, 32, 2, 4, 1)
PATHS = [False, "auto"]  # pointer loads; TMA where it applies (emulated under the interpreter)


def per_expert_reference(a, w, routing, *, gather_a, topk_weights=None):
    """Row r of the padded sorted order -> a[row] @ w[expert(r)].T in float64; padding rows zero."""
    ids = routing.sorted_token_ids.long().cpu()
    experts = routing.expert_ids.long().cpu().repeat_interleave(routing.block_size_m)
    out = torch.zeros(ids.numel(), w.shape[1], dtype=torch.float64)
    for r in range(routing.num_tokens_post_padded.item()):
        if ids[r] >= routing.num_slots:
            continue
        row = a[ids[r] // routing.top_k] if gather_a else a[r]
        out[r] = w[experts[r]].double().cpu() @ row.double().cpu()
        if topk_weights is not None:
            out[r] *= topk_weights.reshape(-1)[ids[r]].double().cpu()
    return out


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,n,k", [(9, 4, 2, 48, 64), (33, 7, 3, 32, 40), (5, 3, 3, 64, 32)])
def test_gather_up_projection(use_tma, dtype, num_tokens, num_experts, top_k, n, k):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(num_tokens, k, device=DEVICE).to(dtype)
    w = torch.randn(num_experts, n, k, device=DEVICE).to(dtype)
    out = torch.full((routing.max_num_tokens_padded, n), float("nan"), dtype=dtype, device=DEVICE)
    grouped_matmul(a, w, routing, CFG, gather_a=True, out=out, use_tma=use_tma)
    used = routing.num_tokens_post_padded.item()
    assert not out[:used].isnan().any(), "rows in use left unwritten"
    ref = per_expert_reference(a, w, routing, gather_a=True)
    assert relative_error(out[:used], ref[:used]) < TOL[dtype]


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sorted_down_projection_with_weights_and_scatter(use_tma, dtype):
    num_tokens, num_experts, top_k, n, k = 21, 5, 2, 64, 48
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE).to(dtype)
    w = torch.randn(num_experts, n, k, device=DEVICE).to(dtype)
    weights = torch.rand(num_tokens, top_k, device=DEVICE)
    out = torch.full((num_tokens * top_k, n), float("nan"), dtype=dtype, device=DEVICE)
    grouped_matmul(a, w, routing, CFG, gather_a=False, scatter=True, topk_weights=weights, out=out, use_tma=use_tma)
    assert not out.isnan().any(), "a (token, k) slot was left unwritten"
    sorted_ref = per_expert_reference(a, w, routing, gather_a=False, topk_weights=weights)
    ref = torch.zeros(num_tokens * top_k, n, dtype=torch.float64)
    ids_sorted = routing.sorted_token_ids.long().cpu()
    real = ids_sorted < routing.num_slots
    ref[ids_sorted[real]] = sorted_ref[real]
    assert relative_error(out, ref) < TOL[dtype]


@pytest.mark.parametrize("use_tma", PATHS)
def test_padding_rows_never_reach_the_output(use_tma):
    """A block that runs past its expert's last row reads padding rows (NaN here): they must be dropped."""
    num_tokens, num_experts, top_k, n, k = 13, 3, 1, 32, 32
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE)
    a[routing.sorted_token_ids >= routing.num_slots] = float("nan")
    w = torch.randn(num_experts, n, k, device=DEVICE)
    out = grouped_matmul(a, w, routing, CFG, gather_a=False, scatter=True, use_tma=use_tma)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("use_tma", PATHS)
def test_k_not_multiple_of_block_k_and_noncontiguous(use_tma):
    num_tokens, num_experts, top_k, n, k = 11, 4, 2, 40, 50  # K = 50: ragged last K block
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(k, num_tokens, device=DEVICE).t()  # transposed view
    w = torch.randn(num_experts, n, 2 * k, device=DEVICE)[:, :, ::2]  # strided view, last stride 2
    out = grouped_matmul(a, w, routing, CFG, gather_a=True, use_tma=use_tma)
    used = routing.num_tokens_post_padded.item()
    ref = per_expert_reference(a, w, routing, gather_a=True)
    assert relative_error(out[:used], ref[:used]) < 2e-3


def test_tma_and_pointer_paths_agree():
    num_tokens, num_experts, top_k, n, k = 40, 6, 2, 64, 64
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE, dtype=torch.float16)
    w = torch.randn(num_experts, n, k, device=DEVICE, dtype=torch.float16)
    path = select_load_path(a, w, CFG, gather_a=False, use_tma="auto")
    assert path.a_tma and path.w_tma, path.reason
    for flags in (dict(gather_a=1), dict(gather_a=False, swiglu="yes")):  # a truthy value is no flag
        with pytest.raises(TypeError, match=f"{list(flags)[-1]} must be a bool, got"):
            select_load_path(a, w, CFG, use_tma="auto", **flags)
    used = routing.num_tokens_post_padded.item()
    tma = grouped_matmul(a, w, routing, CFG, gather_a=False, use_tma=True)[:used]
    ptr = grouped_matmul(a, w, routing, CFG, gather_a=False, use_tma=False)[:used]
    assert relative_error(tma, ptr) < 1e-3


def test_misaligned_strides_fall_back_under_auto_and_raise_when_forced():
    num_tokens, num_experts, top_k, n, k = 6, 3, 2, 32, 511  # bf16 rows of 1022 bytes: not 16-byte aligned
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, CFG.BLOCK_SIZE_M)
    a = torch.randn(num_tokens, k, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(num_experts, n, k, device=DEVICE, dtype=torch.bfloat16)
    path = select_load_path(a, w, CFG, gather_a=True, use_tma="auto")
    assert not path.w_tma and "not a multiple of 16" in path.reason
    out = grouped_matmul(a, w, routing, CFG, gather_a=True, use_tma="auto")
    used = routing.num_tokens_post_padded.item()
    assert relative_error(out[:used], per_expert_reference(a, w, routing, gather_a=True)[:used]) < 1e-2
    with pytest.raises(ValueError, match="use_tma=True but w .* not a multiple of 16"):
        grouped_matmul(a, w, routing, CFG, gather_a=True, use_tma=True)


def test_bad_input():
    ids = random_topk_ids(4, 3, 2)
    routing = moe_align(ids, 3, 16)
    a = torch.randn(4, 32, device=DEVICE)
    w = torch.randn(3, 16, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"w must have shape \[E, N, K\]"):
        grouped_matmul(a, w[:2], routing, CFG, gather_a=True)
    with pytest.raises(TypeError, match="a must be float32"):
        grouped_matmul(a.half(), w, routing, CFG, gather_a=True)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        grouped_matmul(a, w, routing, GemmConfig(32, 32, 32), gather_a=True)
    with pytest.raises(ValueError, match="a must have shape"):
        grouped_matmul(a[:, :16], w, routing, CFG, gather_a=True)
    with pytest.raises(ValueError, match="use_tma must be"):
        grouped_matmul(a, w, routing, CFG, gather_a=True, use_tma="yes")
    with pytest.raises(TypeError, match="routing must be an AlignedRouting"):
        grouped_matmul(a, w, ids, CFG, gather_a=True)


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("block_m", [32, 64])
def test_tail_tiles_write_every_valid_row(use_tma, block_m):
    # Expert sizes chosen so that last blocks hold <= 1/4, <= 1/2 and > 1/2 of BLOCK_SIZE_M valid rows.
    sizes = [1, block_m // 4, block_m // 4 + 1, block_m // 2 + 3, block_m + 2, 0, 2 * block_m]
    ids = torch.cat([torch.full((s,), e, dtype=torch.int32) for e, s in enumerate(sizes)])
    ids = ids[torch.randperm(ids.numel())].reshape(-1, 1).to(DEVICE)
    routing = moe_align(ids, len(sizes), block_m)
    n, k = 32, 48
    a = torch.randn(ids.shape[0], k, device=DEVICE)
    w = torch.randn(len(sizes), n, k, device=DEVICE)
    ref = per_expert_reference(a, w, routing, gather_a=True)
    valid = routing.sorted_token_ids.cpu() < routing.num_slots
    a_sorted = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE)
    down_ref = torch.zeros(routing.num_slots, n, dtype=torch.float64)
    down_ref[routing.sorted_token_ids.cpu()[valid].long()] = per_expert_reference(a_sorted, w, routing, gather_a=False)[
        valid
    ]
    for tail in (True, False):
        cfg = GemmConfig(block_m, 32, 32, 2, 4, 1, tail_tiles=tail)
        out = torch.full((routing.max_num_tokens_padded, n), float("nan"), device=DEVICE)
        grouped_matmul(a, w, routing, cfg, gather_a=True, out=out, use_tma=use_tma)
        assert not out.cpu()[valid].isnan().any(), f"tail_tiles={tail} left valid rows unwritten"
        assert relative_error(out.cpu()[valid], ref[valid]) < TOL[torch.float32]
        out_k = torch.full((routing.num_slots, n), float("nan"), device=DEVICE)  # the down projection
        grouped_matmul(a_sorted, w, routing, cfg, gather_a=False, scatter=True, out=out_k, use_tma=use_tma)
        assert relative_error(out_k.cpu(), down_ref) < TOL[torch.float32], f"tail_tiles={tail}"


def test_permute_tokens_copies_the_gathered_rows_in_expert_order():
    from moe_lab.permute import permute_tokens

    ids = random_topk_ids(23, 5, 2)
    routing = moe_align(ids, 5, 32)
    a = torch.randn(23, 48, device=DEVICE)
    used = routing.num_tokens_post_padded.item()
    real = (routing.sorted_token_ids < routing.num_slots)[:used].cpu()
    rows = permute_tokens(a, routing)[:used].cpu()
    slot = routing.sorted_token_ids[:used].long().cpu()
    assert torch.equal(rows[real], a.cpu()[slot[real] // 2]) and not rows[~real].any()
    with pytest.raises(ValueError, match="hidden_states must have shape"):
        permute_tokens(a[:5], routing)
    with pytest.raises(TypeError, match="routing must be an AlignedRouting"):
        permute_tokens(a, ids)
    buf = torch.randn(routing.max_num_tokens_padded, 48, device=DEVICE)
    with pytest.raises(ValueError, match="shares memory with hidden_states"):
        permute_tokens(buf[:23], routing, out=buf)


def test_silu_and_mul_zeroes_padding_rows_without_reading_them():
    # Also the regression test of a Triton 3.9 interpreter trap: a block mask `&` a loaded scalar
    # comparison raised "mask has unsupported dtype" (the kernel uses tl.where instead).
    from moe_lab import silu_and_mul

    ids = random_topk_ids(11, 4, 2)
    routing = moe_align(ids, 4, 16)
    x = torch.randn(routing.max_num_tokens_padded, 24, device=DEVICE)
    x[routing.sorted_token_ids >= routing.num_slots] = float("nan")  # padding rows were never written
    out = silu_and_mul(x, routing=routing)
    used = routing.num_tokens_post_padded.item()
    real = (routing.sorted_token_ids < routing.num_slots)[:used]
    g, u = x[:used, :12], x[:used, 12:]
    assert torch.allclose(out[:used][real], (torch.nn.functional.silu(g) * u)[real], rtol=1e-5, atol=1e-6)
    assert not out[:used][~real].any()
    with pytest.raises(ValueError, match="one device"):
        silu_and_mul(x, routing=routing, out=torch.empty(x.shape[0], 12, device="meta"))


def test_the_launch_plan_is_what_was_launched(monkeypatch):
    """One plan per GEMM call: select_load_path runs once, and FusedMoEInfo shows the config as launched,
    with num_stages lowered where the device's shared memory needed it."""

    from moe_lab import fused_moe
    from moe_lab import plan as gm

    from .conftest import small_layer

    gm.clear_layer_plans()  # a plan made before for this key would not be made again
    calls = []
    real_select = gm.select_load_path
    monkeypatch.setattr(gm, "select_load_path", lambda *a, **k: calls.append(1) or real_select(*a, **k))
    tile = (16 + 32) * 32 * 4  # bytes of one A+W tile at BLOCK_SIZE 16x32x32, float32
    monkeypatch.setattr(gm, "shared_memory_budget", lambda device: 2 * tile)  # the estimate's room: 2 stages
    hs, w1, w2, tw, ti = small_layer()
    cfg = GemmConfig(16, 32, 32, 1, 4, 4)
    out, info = fused_moe(hs, w1, w2, tw, ti, config=cfg, return_info=True)
    assert len(calls) == 2  # up and down, once each
    assert info.config.up.num_stages == 4  # what was asked
    assert info.up_plan.config.num_stages == info.down_plan.config.num_stages == 2  # what was launched
    assert info.up_path is info.up_plan.path and info.up_plan.gather_a and info.down_plan.scatter
    assert info.up_plan.grid == info.routing.max_num_m_blocks * 2  # 2I = 64 columns in tiles of 32


def test_unsupported_switch_combinations_are_refused():
    routing = moe_align(random_topk_ids(5, 4, 2), 4, 16)
    a = torch.randn(5, 32, device=DEVICE)
    w = torch.randn(4, 32, 32, device=DEVICE)
    with pytest.raises(ValueError, match="gather_a=True with scatter=True"):
        grouped_matmul(a, w, routing, CFG, gather_a=True, scatter=True)
    with pytest.raises(ValueError, match="topk_weights needs scatter=True"):
        grouped_matmul(a, w, routing, CFG, gather_a=True, topk_weights=torch.rand(5, 2, device=DEVICE))


def test_routing_with_too_few_sorted_rows_is_refused():
    """Each program reads its block's schedule words (tail-tile probes included) before it knows whether
    the block is in use: a hand-made routing whose sorted_token_ids is shorter than its blocks is refused."""
    from dataclasses import replace

    ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32, device=DEVICE)
    routing = moe_align(ids, 3, 16)
    short = replace(routing, sorted_token_ids=routing.sorted_token_ids[:20])
    a = torch.randn(2, 32, device=DEVICE)
    w = torch.randn(3, 16, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"routing.sorted_token_ids has 20 rows; its 3 M-blocks"):
        grouped_matmul(a, w, short, GemmConfig(16, 16, 16), gather_a=True)
