"""The persistent kernel's output tiles stored through a tensor descriptor (LaunchPlan.c_tma, behind the
switch grouped_matmul.TMA_STORE, off by default: slower on an H200): where the plan takes it, and the same
bits as the pointer store, with and without the SwiGLU epilogue, columns past N clipped."""
import sys

import pytest
import torch

from moe_lab import GemmConfig, grouped_matmul, moe_align, relative_error
from moe_lab.quantize import quantize_activations_fp8, quantize_weights_fp8

from .conftest import DEVICE, TOL, random_topk_ids
from .test_grouped_matmul import per_expert_reference

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

gm = sys.modules["moe_lab.grouped_matmul"]

CONFIGS = {
    "32 x 64": GemmConfig(32, 64, 16, 2, 4, 2, persistent=True),
    "16 x 32": GemmConfig(16, 32, 32, 1, 4, 1, persistent=True),
}
PER_TILE = GemmConfig(32, 64, 16, 2, 4, 2)


def _problem(dtype, n=80, k=40):
    """70 tokens, top-2 of 5 experts; N = 80 is not a multiple of the 64 (32 with SwiGLU) columns a program
    writes, so the last column box runs past N; K = 40 is not a multiple of BLOCK_SIZE_K."""
    ids = random_topk_ids(70, 5, 2)
    a = torch.randn(70, k, device=DEVICE).to(dtype)
    w = (torch.randn(5, n, k, device=DEVICE) / k ** 0.5).to(dtype)
    return ids, a, w


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tma_store_writes_the_pointer_stores_bits(monkeypatch, name, swiglu, dtype):
    cfg = CONFIGS[name]
    ids, a, w = _problem(dtype)
    routing = moe_align(ids, w.shape[0], cfg.BLOCK_SIZE_M)
    valid = (routing.sorted_token_ids < routing.num_slots).cpu()
    outs = {}
    for store in (True, False):
        monkeypatch.setattr(gm, "TMA_STORE", store)
        cols = w.shape[1] // 2 if swiglu else w.shape[1]
        out = torch.full((routing.max_num_tokens_padded, cols), float("nan"), dtype=dtype, device=DEVICE)
        _, plan = grouped_matmul(a, w, routing, cfg, gather_a=True, swiglu=swiglu, out=out, use_tma=True,
                                 return_plan=True)
        assert plan.c_tma == store
        assert not out.cpu()[valid].isnan().any(), "a valid row was left unwritten"
        outs[store] = out.cpu()[valid]
    assert torch.equal(outs[True], outs[False])
    if not swiglu:
        assert relative_error(outs[True], per_expert_reference(a, w, routing, gather_a=True)[valid]) < TOL[dtype]


def test_the_tma_store_is_off_by_default():
    ids, a, w = _problem(torch.float32)
    routing = moe_align(ids, w.shape[0], 32)
    assert not gm.TMA_STORE
    assert not grouped_matmul(a, w, routing, CONFIGS["32 x 64"], gather_a=True, use_tma=True, return_plan=True)[1].c_tma


def test_the_plan_stores_by_pointer_where_a_descriptor_cannot_write_the_output(monkeypatch):
    monkeypatch.setattr(gm, "TMA_STORE", True)
    ids, a, w = _problem(torch.float32)
    cfg = CONFIGS["32 x 64"]
    routing = moe_align(ids, w.shape[0], cfg.BLOCK_SIZE_M)
    sorted_a = torch.randn(routing.max_num_tokens_padded, w.shape[2], device=DEVICE)

    def plan(**kwargs):
        return grouped_matmul(kwargs.pop("a", a), w, routing, cfg, return_plan=True, **kwargs)[1]

    assert plan(gather_a=True).c_tma
    assert plan(gather_a=False, a=sorted_a).c_tma  # sorted rows in, sorted rows out
    # A program per tile would wait for its bulk copy before it ends (slower on an H200): pointer stores.
    assert not grouped_matmul(a, w, routing, PER_TILE, gather_a=True, return_plan=True)[1].c_tma
    assert not plan(gather_a=False, a=sorted_a, scatter=True).c_tma  # rows go to their slots: no box
    assert not plan(gather_a=True, use_tma=False).c_tma
    # A row stride of 84 bytes breaks the 16-byte rule: pointer stores, the same values.
    wide = torch.full((routing.max_num_tokens_padded, 81), float("nan"), device=DEVICE)
    out = wide[:, :80]
    p = plan(gather_a=True, out=out)
    assert not p.c_tma and p.path.w_tma
    valid = routing.sorted_token_ids < routing.num_slots
    assert torch.equal(out[valid], grouped_matmul(a, w, routing, cfg, gather_a=True, use_tma=True)[valid])


def test_float8_output_is_stored_by_pointer(monkeypatch):
    monkeypatch.setattr(gm, "TMA_STORE", True)
    ids, a, w = _problem(torch.float32, n=256, k=128)
    routing = moe_align(ids, w.shape[0], 32)
    w8, w_scale = quantize_weights_fp8(w, (128, 128))
    a8, a_scale = quantize_activations_fp8(a, group_size=128)
    _, plan = grouped_matmul(a8, w8, routing, GemmConfig(32, 256, 128, 1, 4, 2, persistent=True), gather_a=True,
                             swiglu=True, a_scale=a_scale, w_scale=w_scale, block_shape=(128, 128),
                             out_dtype=torch.float8_e4m3fn, return_plan=True)
    assert plan.out_quant_group == 128 and not plan.c_tma
