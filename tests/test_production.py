"""What an inference engine relies on: clear errors, degenerate inputs, chunking, determinism, the custom
op under torch.compile, and configs clamped to the device."""
import pytest
import torch

from moe_lab import FusedMoE, GemmConfig, fused_moe, fused_moe_reference, relative_error
from moe_lab.configs import fit_to_shared_memory

from .conftest import DEVICE, TOL, random_layer


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


def test_mixed_devices_are_named():
    if DEVICE.type != "cuda":
        pytest.skip("needs a second device type")
    hs, w1, w2, tw, ti = random_layer(4, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="one device"):
        fused_moe(hs.cpu(), w1, w2, tw, ti)


def test_experts_with_no_tokens_layer():
    counts = [40, 0, 97, 21, 0, 5]  # the shape of 162, 0, 2577, 446, 0, 83, scaled for the interpreter
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].view(-1, 1).int()
    hs, w1, w2, tw, ti = random_layer(ids.shape[0], len(counts), 1, 32, 32, torch.bfloat16, ids=ids)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_single_expert():
    hs, w1, w2, tw, ti = random_layer(9, 1, 1, 32, 32, torch.float16)
    assert relative_error(fused_moe(hs, w1, w2, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_chunking_gives_the_same_bits():
    hs, w1, w2, tw, ti = random_layer(50, 6, 2, 32, 32, torch.float32)
    cfg = GemmConfig(16, 32, 32, 1)
    whole = fused_moe(hs, w1, w2, tw, ti, config=cfg)
    chunked = fused_moe(hs, w1, w2, tw, ti, config=cfg, chunk_size=16)
    assert torch.equal(whole, chunked)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        fused_moe(hs, w1, w2, tw, ti, chunk_size=0)


def test_two_runs_are_bitwise_equal():
    hs, w1, w2, tw, ti = random_layer(40, 8, 3, 32, 32, torch.bfloat16)
    assert torch.equal(fused_moe(hs, w1, w2, tw, ti), fused_moe(hs, w1, w2, tw, ti))


def test_custom_op_and_module_under_torch_compile():
    hs, w1, w2, tw, ti = random_layer(8, 4, 2, 32, 16, torch.float32)
    module = FusedMoE(w1, w2)
    eager = module(hs, tw, ti)
    assert relative_error(eager, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")  # no C++ toolchain needed
    assert torch.equal(compiled(hs, tw, ti), eager)


def test_custom_op_opcheck():
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 16, torch.float32)
    torch.library.opcheck(torch.ops.moe_lab.fused_moe.default, (hs, w1, w2, tw, ti),
                          test_utils=("test_schema", "test_faketensor"))


def test_config_that_does_not_fit_is_clamped_or_refused():
    big = GemmConfig(128, 256, 128, 8, 8, 6)
    fitted = fit_to_shared_memory(big, 2, 232448)
    assert fitted.num_stages < 6 and fitted.shared_memory_bytes(2) <= 232448
    with pytest.raises(ValueError, match="shared memory even with one stage"):
        fit_to_shared_memory(big, 4, 64 * 1024)


# --- Regressions from trying to break it -------------------------------------------------------------

def _layer(num_tokens=8, num_experts=4, top_k=2, dtype=torch.float32):
    return random_layer(num_tokens, num_experts, top_k, 32, 32, dtype)


@pytest.mark.parametrize("bad_id", [4, 2 ** 30, -2 ** 30, 2 ** 32 + 1, -1])
def test_out_of_range_ids_with_expert_map_are_dropped_not_read(bad_id):
    hs, w1, w2, tw, ti = _layer()
    expert_map = torch.tensor([0, -1, 1, -1], dtype=torch.int32, device=DEVICE)
    ids = ti.long().clone()
    ids[0, 0] = bad_id
    out = fused_moe(hs, w1[[0, 2]], w2[[0, 2]], tw, ids, expert_map=expert_map, check_ids=False)
    keep = tw.clone()
    keep[0, 0] = 0
    ref = fused_moe_reference(hs, w1[[0, 2]], w2[[0, 2]], keep, ti, expert_map=expert_map)
    assert relative_error(out, ref) < TOL[torch.float32]


def test_int64_ids_past_2_32_do_not_wrap_around():
    hs, w1, w2, tw, ti = _layer()
    ids = ti.long().clone()
    ids[0, 0] = 2 ** 32 + 1  # would read as expert 1 if narrowed to int32
    out = fused_moe(hs, w1, w2, tw, ids, check_ids=False)
    keep = tw.clone()
    keep[0, 0] = 0
    assert relative_error(out, fused_moe_reference(hs, w1, w2, keep, ti)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="topk_ids must hold experts"):
        fused_moe(hs, w1, w2, tw, ids)  # checked by default on CPU tensors


def test_noncontiguous_expert_map():
    hs, w1, w2, tw, ti = _layer()
    strided = torch.tensor([0, 9, -1, 9, 1, 9, -1, 9], dtype=torch.int32, device=DEVICE)[::2]
    dense = strided.contiguous()
    local = [0, 2]
    out = fused_moe(hs, w1[local], w2[local], tw, ti, expert_map=strided)
    assert relative_error(out, fused_moe_reference(hs, w1[local], w2[local], tw, ti, expert_map=dense)) < 2e-3


def test_custom_op_checks_ids_on_cpu():
    if DEVICE.type != "cpu":
        pytest.skip("ids are checked on CPU tensors only by default")
    hs, w1, w2, tw, ti = _layer()
    ti[0, 0] = 7
    with pytest.raises(ValueError, match="topk_ids must hold experts"):
        torch.ops.moe_lab.fused_moe(hs, w1, w2, tw, ti)


@pytest.mark.parametrize("use_tma", [0, 1, None, "yes", "true"])
def test_use_tma_takes_only_bools_and_auto(use_tma):
    hs, w1, w2, tw, ti = _layer()
    with pytest.raises(ValueError, match="use_tma must be True, False or 'auto'"):
        fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma)
    with pytest.raises(ValueError, match="use_tma must be"):
        fused_moe(hs[:0], w1, w2, tw[:0], ti[:0], use_tma=use_tma)  # also when there is nothing to do
    with pytest.raises(ValueError, match="use_tma must be"):
        FusedMoE(w1, w2, use_tma=use_tma)


def test_fused_moe_module_takes_bool_use_tma():
    hs, w1, w2, tw, ti = _layer()
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    for use_tma in (True, False, "auto"):
        assert relative_error(FusedMoE(w1, w2, use_tma=use_tma)(hs, tw, ti), ref) < TOL[torch.float32]
    with pytest.raises(TypeError, match="w1 must be a torch.Tensor"):
        FusedMoE([1, 2], w2)


def test_overlapping_out_rows_are_refused():
    hs, w1, w2, tw, ti = _layer()
    with pytest.raises(ValueError, match="out rows overlap"):
        fused_moe(hs, w1, w2, tw, ti, out=torch.zeros(1, 32, device=DEVICE).expand(8, 32))


def test_inference_only_is_said():
    hs, w1, w2, tw, ti = _layer()
    with pytest.raises(ValueError, match="inference-only"):
        fused_moe(hs.requires_grad_(), w1, w2, tw, ti)
    with torch.no_grad():
        fused_moe(hs, w1, w2, tw, ti)


def test_small_launchers_validate():
    from moe_lab import silu_and_mul, topk_reduce
    with pytest.raises(ValueError, match=r"num_rows must have shape \[1\]"):
        silu_and_mul(torch.randn(5, 16, device=DEVICE), num_rows=torch.tensor([], dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="num_rows must be a torch.Tensor"):
        silu_and_mul(torch.randn(5, 16, device=DEVICE), num_rows=3)
    ids = torch.tensor([[0, 1]], device=DEVICE)
    with pytest.raises(ValueError, match="num_experts must be >= 1"):
        topk_reduce(torch.randn(2, 4, device=DEVICE), ids, 0)
    with pytest.raises(TypeError, match="expert_map must be int32 or int64"):
        topk_reduce(torch.randn(2, 4, device=DEVICE), ids, 2, expert_map=torch.zeros(4, device=DEVICE))


def test_config_errors_name_the_key():
    hs, w1, w2, tw, ti = _layer()
    with pytest.raises(TypeError, match="config.BLOCK_SIZE_M must be an int"):
        fused_moe(hs, w1, w2, tw, ti, config={"BLOCK_SIZE_M": "32"})
    with pytest.raises(TypeError, match="takes no other keys"):
        fused_moe(hs, w1, w2, tw, ti, config={"up": {}, "bogus": 1})
    with pytest.raises(ValueError, match="<= 256"):
        GemmConfig(16, 2 ** 20, 16)
    out = fused_moe(hs, w1, w2, tw, ti, config={"up": {"BLOCK_SIZE_N": 32}})  # merged onto the default
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]


def test_bad_expert_map_entries_and_flags():
    hs, w1, w2, tw, ti = _layer()
    with pytest.raises(ValueError, match=r"expert_map must hold local experts in \[0, 2\) or -1"):
        fused_moe(hs, w1[:2], w2[:2], tw, ti, expert_map=torch.tensor([0, -1, 5, -1], dtype=torch.int32))
    with pytest.raises(ValueError, match="out requires grad"):
        fused_moe(hs, w1, w2, tw, ti, out=torch.zeros(8, 32, requires_grad=True))
    from moe_lab import grouped_matmul, moe_align, topk_routing
    with pytest.raises(TypeError, match="gather_a must be a bool"):
        grouped_matmul(hs, w1, moe_align(ti, 4, 16), GemmConfig(16, 32, 32), gather_a="no")
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        topk_routing(torch.randn(4, 8), 2, renormalize="no")
