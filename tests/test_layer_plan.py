"""The layer plan and its cache: one plan per key, a new key for every change a plan or a check depends on,
the same output with and without the cache, and every check that the key cannot decide still made."""

import pytest
import torch

from moe_lab import GemmConfig, fused_moe, tuned
from moe_lab import plan as plan_module
from moe_lab.plan import cached_layer_plan, layer_key, layer_plan_cache

from .conftest import DEVICE, random_layer

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@pytest.fixture(autouse=True)
def _fresh_plans():
    plan_module.clear_layer_plans()
    yield
    plan_module.clear_layer_plans()


def _key(hs, w1, w2, tw, ti, **kw):
    return layer_key(hs, w1, w2, tw, ti, **kw)


def test_equal_keys_share_one_plan_and_the_plan_is_what_ran():
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 32, 32, torch.float32)
    _, info = fused_moe(hs, w1, w2, tw, ti, return_info=True)
    plan = cached_layer_plan(_key(hs, w1, w2, tw, ti))
    assert plan is not None and plan.chunks[0][2].up is info.up_plan
    # Fresh tensors of the same facts (new values, new memory): the same key, the same plan.
    hs2, w1b, w2b, tw2, ti2 = random_layer(3, 4, 2, 32, 32, torch.float32)
    assert _key(hs2, w1b, w2b, tw2, ti2) == plan.key
    _, info2 = fused_moe(hs2, w1b, w2b, tw2, ti2, return_info=True)
    assert info2.up_plan is info.up_plan and cached_layer_plan(plan.key) is plan


def test_every_field_changes_the_key_and_the_plan_follows():
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 32, 32, torch.float32)
    base = _key(hs, w1, w2, tw, ti)
    w1_strided = torch.stack([w1, w1], dim=-1)[..., 0]  # same values, last stride 2: no descriptor
    changed = {
        "T": _key(hs[:2], w1, w2, tw[:2], ti[:2]),
        "w1 strides": _key(hs, w1_strided, w2, tw, ti),
        "w1 alignment": _key(hs, torch.empty(w1.numel() + 1, device=DEVICE)[1:].view(w1.shape), w2, tw, ti),
        "dtype": _key(hs.half(), w1.half(), w2.half(), tw, ti),
        "id dtype": _key(hs, w1, w2, tw, ti.long()),
        "use_tma": _key(hs, w1, w2, tw, ti, use_tma=False),
        "config": _key(hs, w1, w2, tw, ti, config=GemmConfig(16, 32, 32)),
        "config dict": _key(hs, w1, w2, tw, ti, config={"BLOCK_SIZE_N": 32}),
        "config dict, a bool for an int": _key(hs, w1, w2, tw, ti, config={"tma": 1}),
        "expert_map": _key(hs, w1, w2, tw, ti, expert_map=torch.arange(4, device=DEVICE)),
        "out": _key(hs, w1, w2, tw, ti, out=torch.empty_like(hs)),
        "chunk_size": _key(hs, w1, w2, tw, ti, chunk_size=2),
        "requires_grad": _key(hs.requires_grad_(True), w1, w2, tw, ti),
    }
    hs.requires_grad_(False)
    assert _key(hs, w1, w2, tw, ti, config={"tma": True}) != changed["config dict, a bool for an int"]
    with torch.no_grad():
        changed["grad mode"] = _key(hs, w1, w2, tw, ti)
    for field, key in changed.items():
        assert key is not None and key != base, field
    # The plans differ where they depend on the field.
    ran = {}
    for name, kw in (("base", {}), ("use_tma", dict(use_tma=False)), ("config", dict(config=GemmConfig(16, 32, 32)))):
        ran[name] = fused_moe(hs, w1, w2, tw, ti, return_info=True, **kw)[1]
    ran["w1 strides"] = fused_moe(hs, w1_strided, w2, tw, ti, return_info=True)[1]
    ran["T"] = fused_moe(hs[:1], w1, w2, tw[:1], ti[:1], return_info=True)[1]
    assert ran["base"].up_path.w_tma and not ran["use_tma"].up_path.w_tma
    assert not ran["w1 strides"].up_path.w_tma and "stride" in ran["w1 strides"].up_path.reason
    assert ran["config"].up_plan.config.BLOCK_SIZE_N == 32 != ran["base"].up_plan.config.BLOCK_SIZE_N
    assert ran["T"].routing.expert_sorted is False and ran["base"].routing.expert_sorted  # slot order at T = 1
    assert len(plan_module._layer_plans) == 5


def test_the_cache_changes_no_bit_and_holds_its_bound(monkeypatch):
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 32, torch.bfloat16)
    first = fused_moe(hs, w1, w2, tw, ti, chunk_size=2)
    cached = fused_moe(hs, w1, w2, tw, ti, chunk_size=2)
    plan = cached_layer_plan(_key(hs, w1, w2, tw, ti, chunk_size=2))
    assert [c[:2] for c in plan.chunks] == [(0, 2), (2, 4), (4, 5)] and plan.chunks[0][2] is plan.chunks[1][2]
    with layer_plan_cache(False):
        plan_module.clear_layer_plans()
        uncached = fused_moe(hs, w1, w2, tw, ti, chunk_size=2)
        assert not plan_module._layer_plans
    assert torch.equal(first, cached) and torch.equal(first, uncached)
    monkeypatch.setattr(plan_module, "LAYER_PLANS", 2)
    for num_tokens in (1, 2, 3):
        fused_moe(hs[:num_tokens], w1, w2, tw[:num_tokens], ti[:num_tokens])
    assert len(plan_module._layer_plans) == 2
    tuned.clear_cache()  # a new tuned table may choose other configs: the plans go too
    assert not plan_module._layer_plans


def test_checks_the_key_cannot_decide_run_on_every_call():
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 32, 32, torch.float32)
    out = torch.empty_like(hs)
    fused_moe(hs, w1, w2, tw, ti, out=out)
    # Same key, values and places differ: ids out of range (checked on the CPU), out over an input.
    bad_ids = ti.clone()
    bad_ids[1, 0] = 4
    if DEVICE.type == "cpu":
        with pytest.raises(ValueError, match=r"topk_ids must hold experts in \[0, 4\)"):
            fused_moe(hs, w1, w2, tw, bad_ids, out=out)
    rows = torch.cat([hs, hs[:1]])
    assert _key(rows[:3], w1, w2, tw, ti, out=rows[1:]) == _key(hs, w1, w2, tw, ti, out=out)
    with pytest.raises(ValueError, match="out shares memory with hidden_states"):
        fused_moe(rows[:3], w1, w2, tw, ti, out=rows[1:])
    # A new key is checked before it is planned: a cached plan never lets a bad call through.
    with pytest.raises(ValueError, match="inference-only"):
        fused_moe(hs.requires_grad_(True), w1, w2, tw, ti)
    with pytest.raises(ValueError, match="use_tma must be"):
        fused_moe(hs.detach(), w1, w2, tw, ti, use_tma=1)
    with pytest.raises(TypeError, match="config.tma must be a bool"):
        fused_moe(hs.detach(), w1, w2, tw, ti, config={"tma": 1})


def _plan_of(hs, w1, w2, tw, ti, **kw):
    return cached_layer_plan(_key(hs, w1, w2, tw, ti, **kw))


@pytest.mark.parametrize("num_tokens", [1, 6])  # slot order (no align buffers) and the align
def test_a_kept_workspace_serves_the_next_calls_of_its_key_bit_for_bit(num_tokens):
    hs, w1, w2, tw, ti = random_layer(num_tokens, 5, 2, 32, 32, torch.bfloat16)
    if num_tokens == 1:
        ti = ti.to(torch.int32)
    expected = fused_moe(hs, w1, w2, tw, ti)  # the first call plans and allocates
    again = fused_moe(hs, w1, w2, tw, ti)  # the second keeps its buffers
    plan = _plan_of(hs, w1, w2, tw, ti)
    (workspace,) = plan.workspaces.values()
    assert torch.equal(again, expected)
    # New inputs of the same key, and other weights (another layer of the model): the same buffers, written anew.
    hs2, w1b, w2b, tw2, ti2 = random_layer(num_tokens, 5, 2, 32, 32, torch.bfloat16)
    ti2 = ti2.to(ti.dtype)
    with layer_plan_cache(False):
        fresh = fused_moe(hs2, w1b, w2b, tw2, ti2)
    kept = fused_moe(hs2, w1b, w2b, tw2, ti2)
    assert torch.equal(kept, fresh) and list(plan.workspaces.values()) == [workspace]
    assert not any(t is not None and t.data_ptr() == kept.data_ptr() for t in (workspace.act, workspace.out_k))
    # return_info's routing outlives the call: never the workspace's.
    _, info = fused_moe(hs, w1, w2, tw, ti, return_info=True)
    if workspace.align is not None:
        assert info.routing.sorted_token_ids.data_ptr() != workspace.align[0].data_ptr()


def test_workspaces_are_per_thread_and_within_their_budget(monkeypatch):
    import threading

    hs, w1, w2, tw, ti = random_layer(4, 4, 2, 32, 32, torch.float32)
    expected = fused_moe(hs, w1, w2, tw, ti)
    fused_moe(hs, w1, w2, tw, ti)
    results = []
    thread = threading.Thread(target=lambda: results.append(fused_moe(hs, w1, w2, tw, ti)))
    thread.start()
    thread.join()
    plan = _plan_of(hs, w1, w2, tw, ti)
    assert len(plan.workspaces) == 2 and torch.equal(results[0], expected)
    assert plan_module._workspace_bytes == sum(w.nbytes for w in plan.workspaces.values()) > 0
    plan_module.clear_layer_plans()
    assert plan_module._workspace_bytes == 0
    monkeypatch.setattr(plan_module, "WORKSPACE_BUDGET", 0)  # past the budget: buffers per call, as before
    fused_moe(hs, w1, w2, tw, ti)
    assert torch.equal(fused_moe(hs, w1, w2, tw, ti), expected)
    assert not _plan_of(hs, w1, w2, tw, ti).workspaces and plan_module._workspace_bytes == 0
