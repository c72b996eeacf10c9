"""The torch face: the custom op (opcheck, torch.compile) and the FusedMoE module."""
import pytest
import torch

from moe_lab import FusedMoE, fused_moe_reference, relative_error

from .conftest import TOL, random_layer, small_layer


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


def test_fused_moe_module_takes_bool_use_tma():
    hs, w1, w2, tw, ti = small_layer()
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    for use_tma in (True, False, "auto"):
        assert relative_error(FusedMoE(w1, w2, use_tma=use_tma)(hs, tw, ti), ref) < TOL[torch.float32]
    with pytest.raises(TypeError, match="w1 must be a torch.Tensor"):
        FusedMoE([1, 2], w2)


def test_custom_op_takes_use_tma_as_fused_moe_does():
    hs, w1, w2, tw, ti = small_layer()
    ref = fused_moe_reference(hs, w1, w2, tw, ti)
    for use_tma in (True, False, None):  # None: "auto"
        assert relative_error(torch.ops.moe_lab.fused_moe(hs, w1, w2, tw, ti, None, use_tma), ref) < TOL[torch.float32]
