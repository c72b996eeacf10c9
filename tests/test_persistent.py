"""The persistent grouped GEMM (`GemmConfig.persistent`): the same tiles walked by one program per SM (a
few programs under the interpreter), bitwise equal to the one-program-per-tile kernel."""

from dataclasses import replace

import pytest
import torch

from moe_lab import GemmConfig, fused_moe, grouped_matmul, moe_align
from moe_lab import plan as gm
from moe_lab.runtime import interpreter_active

from .conftest import DEVICE, random_layer, random_topk_ids
from .test_grouped_matmul import PATHS

BASE = GemmConfig(16, 32, 32, 2, 4, 1, tail_tiles=False)

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 4, 2), (9, 4, 2), (33, 7, 3), (40, 5, 5)])
def test_persistent_matches_per_tile_kernel_bitwise(use_tma, dtype, num_tokens, num_experts, top_k):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    routing = moe_align(ids, num_experts, 16)
    k, n = 40, 48
    a = torch.randn(num_tokens, k, device=DEVICE).to(dtype)
    w1 = torch.randn(num_experts, 2 * n, k, device=DEVICE).to(dtype)
    w2 = torch.randn(num_experts, n, k, device=DEVICE).to(dtype)
    sorted_a = torch.randn(routing.max_num_tokens_padded, k, device=DEVICE).to(dtype)
    weights = torch.rand(num_tokens, top_k, device=DEVICE)
    used = routing.num_tokens_post_padded.item()

    def up(swiglu):
        def call(cfg):
            out = torch.full(
                (routing.max_num_tokens_padded, n if swiglu else 2 * n), float("nan"), dtype=dtype, device=DEVICE
            )
            return grouped_matmul(
                a, w1, routing, cfg, gather_a=True, swiglu=swiglu, out=out, use_tma=use_tma, return_plan=True
            )

        return call

    def down(cfg):
        out = torch.full((routing.num_slots, n), float("nan"), dtype=dtype, device=DEVICE)
        return grouped_matmul(
            sorted_a,
            w2,
            routing,
            cfg,
            gather_a=False,
            scatter=True,
            topk_weights=weights,
            out=out,
            use_tma=use_tma,
            return_plan=True,
        )

    for name, call in (("up", up(False)), ("up swiglu", up(True)), ("down", down)):
        (out, _), (out_p, plan) = call(BASE), call(replace(BASE, persistent=True))
        assert plan.persistent and plan.grid <= (
            gm.INTERPRETER_PROGRAMS if interpreter_active() else gm.multiprocessor_count(a.device)
        ), name
        rows = slice(0, used) if name.startswith("up") else slice(None)
        assert not out_p[rows].isnan().any(), f"{name}: rows in use left unwritten"
        assert torch.equal(out_p[rows], out[rows]), name


def test_persistent_layer_is_the_same_layer_and_handles_no_tokens():
    hs, w1, w2, tw, ti = random_layer(24, 6, 2, 32, 48, torch.float32)
    cfg = GemmConfig(16, 32, 32, 1, 4, 1)
    out = fused_moe(hs, w1, w2, tw, ti, config=cfg)
    out_p, info = fused_moe(hs, w1, w2, tw, ti, config=replace(cfg, persistent=True), return_info=True)
    assert info.up_plan.persistent and info.down_plan.persistent
    assert torch.equal(out_p, out)
    empty = fused_moe(hs[:0], w1, w2, tw[:0], ti[:0], config=replace(cfg, persistent=True))
    assert empty.shape == (0, hs.shape[1])
