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
