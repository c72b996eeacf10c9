"""Expert ids and expert maps: checked where asked, dropped (never read out of bounds) where not."""

import pytest
import torch

from moe_lab import GemmConfig, fused_moe, fused_moe_reference, relative_error

from .conftest import DEVICE, TOL, random_layer, small_layer

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def test_ids_outside_range_raise_on_cpu_and_when_asked():
    hs, w1, w2, tw, ti = random_layer(6, 4, 2, 32, 16, torch.float32)
    bad = ti.clone()
    bad[3, 1] = 4
    with pytest.raises(ValueError, match=r"topk_ids must hold experts in \[0, 4\), got values from 0 to 4"):
        fused_moe(hs, w1, w2, tw, bad, check_ids=True)
    bad[3, 1] = -1
    with pytest.raises(ValueError, match="from -1"):
        fused_moe(hs, w1, w2, tw, bad, check_ids=True)


def test_unchecked_out_of_range_ids_contribute_zero_never_garbage():
    hs, w1, w2, tw, ti = random_layer(6, 4, 2, 32, 16, torch.float32)
    bad = ti.clone()
    bad[:, 1] = 7
    out = fused_moe(hs, w1, w2, tw, bad, check_ids=False)
    keep = torch.zeros_like(tw)
    keep[:, 0] = tw[:, 0]
    assert relative_error(out, fused_moe_reference(hs, w1, w2, keep, ti)) < TOL[torch.float32]


@pytest.mark.parametrize("bad_id", [4, 2**30, -(2**30), 2**32 + 1, -1])
def test_out_of_range_ids_with_expert_map_are_dropped_not_read(bad_id):
    hs, w1, w2, tw, ti = small_layer()
    expert_map = torch.tensor([0, -1, 1, -1], dtype=torch.int32, device=DEVICE)
    ids = ti.long().clone()
    ids[0, 0] = bad_id
    out = fused_moe(hs, w1[[0, 2]], w2[[0, 2]], tw, ids, expert_map=expert_map, check_ids=False)
    keep = tw.clone()
    keep[0, 0] = 0
    ref = fused_moe_reference(hs, w1[[0, 2]], w2[[0, 2]], keep, ti, expert_map=expert_map)
    assert relative_error(out, ref) < TOL[torch.float32]


def test_int64_ids_past_2_32_do_not_wrap_around():
    hs, w1, w2, tw, ti = small_layer()
    ids = ti.long().clone()
    ids[0, 0] = 2**32 + 1  # would read as expert 1 if narrowed to int32
    out = fused_moe(hs, w1, w2, tw, ids, check_ids=False)
    keep = tw.clone()
    keep[0, 0] = 0
    assert relative_error(out, fused_moe_reference(hs, w1, w2, keep, ti)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="topk_ids must hold experts"):  # checked by default on CPU tensors
        fused_moe(hs, w1, w2, tw, ids, check_ids=None if DEVICE.type == "cpu" else True)


def test_noncontiguous_expert_map():
    hs, w1, w2, tw, ti = small_layer()
    strided = torch.tensor([0, 9, -1, 9, 1, 9, -1, 9], dtype=torch.int32, device=DEVICE)[::2]
    dense = strided.contiguous()
    local = [0, 2]
    out = fused_moe(hs, w1[local], w2[local], tw, ti, expert_map=strided)
    assert relative_error(out, fused_moe_reference(hs, w1[local], w2[local], tw, ti, expert_map=dense)) < 2e-3


def test_custom_op_checks_ids_on_cpu():
    if DEVICE.type != "cpu":
        pytest.skip("ids are checked on CPU tensors only by default")
    hs, w1, w2, tw, ti = small_layer()
    ti[0, 0] = 7
    with pytest.raises(ValueError, match="topk_ids must hold experts"):
        torch.ops.moe_lab.fused_moe(hs, w1, w2, tw, ti)


def test_bad_expert_map_entries_and_flags():
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(ValueError, match=r"expert_map must hold local experts in \[0, 2\) or -1"):
        fused_moe(
            hs,
            w1[:2],
            w2[:2],
            tw,
            ti,
            expert_map=torch.tensor([0, -1, 5, -1], dtype=torch.int32, device=DEVICE),
            check_ids=None if DEVICE.type == "cpu" else True,
        )
    with pytest.raises(ValueError, match="out requires grad"):
        fused_moe(hs, w1, w2, tw, ti, out=torch.zeros(8, 32, requires_grad=True, device=DEVICE))
    from moe_lab import grouped_matmul, moe_align, topk_routing

    with pytest.raises(TypeError, match="gather_a must be a bool"):
        grouped_matmul(hs, w1, moe_align(ti, 4, 16), GemmConfig(16, 32, 32), gather_a="no")
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        topk_routing(torch.randn(4, 8), 2, renormalize="no")


@pytest.mark.parametrize("bad_id", [4, 2**31 - 1, -1, -(2**31)])
def test_one_token_slot_order_skips_ids_outside_range(bad_id):
    # T = 1 runs without the align: the GEMMs read each block's expert from topk_ids itself
    hs, w1, w2, tw, ti = random_layer(1, 4, 3, 32, 16, torch.float32)
    ids = ti.int().clone()
    ids[0, 1] = bad_id
    out, info = fused_moe(hs, w1, w2, tw, ids, check_ids=False, return_info=True)
    assert not info.routing.expert_sorted
    keep = tw.clone()
    keep[0, 1] = 0
    assert relative_error(out, fused_moe_reference(hs, w1, w2, keep, ti)) < TOL[torch.float32]
    ids64 = ids.long()
    ids64[0, 1] = bad_id * 2**32 if bad_id != 4 else bad_id  # past int32 too
    out64, info = fused_moe(hs, w1, w2, tw, ids64, check_ids=False, return_info=True)
    assert not info.routing.expert_sorted  # int64 ids (torch.topk's) take slot order as well
    assert torch.equal(out64, out)
