"""The torch face: the custom op (opcheck, torch.compile) and the FusedMoE module."""

import inspect

import pytest
import torch

from moe_lab import FusedMoE, fused_moe_reference, relative_error
from moe_lab.layer import _fused_moe_fake

from .conftest import TOL, random_layer, small_layer

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def test_custom_op_and_module_under_torch_compile():
    hs, w1, w2, tw, ti = random_layer(8, 4, 2, 32, 16, torch.float32)
    module = FusedMoE(w1, w2)
    assert "FusedMoE(E=4, H=32, I=16, dtype=float32, use_tma='auto')" == repr(module)
    eager = module(hs, tw, ti)
    assert relative_error(eager, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")  # no C++ toolchain needed
    assert torch.equal(compiled(hs, tw, ti), eager)


def test_custom_op_refuses_grad_in_the_forward_eager_and_compiled():
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 16, torch.float32)
    message = "hidden_states requires grad: fused_moe is inference-only"
    with pytest.raises(ValueError, match=message):  # the op's body sees no grad: its autograd says so
        torch.ops.moe_lab.fused_moe(hs.requires_grad_(), w1, w2, tw, ti)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=message):  # Dynamo wraps the op's error, and quotes it
        torch.compile(FusedMoE(w1, w2), fullgraph=True, backend="aot_eager")(hs, tw, ti)
    with torch.no_grad():
        torch.ops.moe_lab.fused_moe(hs, w1, w2, tw, ti)
    with pytest.raises(ValueError, match="w2 requires grad: fused_moe is inference-only"):  # named by position
        torch.ops.moe_lab.fused_moe(hs.detach(), w1, w2.requires_grad_(), tw, ti)
    # the refusal names the op's arguments from its fake's signature: the same names, in the same order
    schema = [argument.name for argument in torch.ops.moe_lab.fused_moe.default._schema.arguments]
    assert list(inspect.signature(_fused_moe_fake).parameters) == schema


def test_custom_op_opcheck():
    hs, w1, w2, tw, ti = random_layer(5, 4, 2, 32, 16, torch.float32)
    torch.library.opcheck(
        torch.ops.moe_lab.fused_moe.default, (hs, w1, w2, tw, ti), test_utils=("test_schema", "test_faketensor")
    )


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


def test_fp8_module_and_custom_op():
    from moe_lab import quantize_weights_fp8

    hs, w1, w2, tw, ti = random_layer(6, 4, 2, 160, 96, torch.bfloat16)
    (w1_q, s1), (w2_q, s2) = quantize_weights_fp8(w1), quantize_weights_fp8(w2)
    module = FusedMoE(w1_q, w2_q, w1_scale=s1, w2_scale=s2, block_shape=(128, 128))
    ref = fused_moe_reference(hs, w1_q, w2_q, tw, ti, w1_scale=s1, w2_scale=s2, block_shape=(128, 128))
    eager = module(hs, tw, ti)
    assert relative_error(eager, ref) < 1e-2
    torch._dynamo.reset()
    assert torch.equal(torch.compile(module, fullgraph=True, backend="aot_eager")(hs, tw, ti), eager)
    # the fake implementation only (PyTorch's schema check multiplies inputs, which float8 CPU tensors cannot)
    torch.library.opcheck(
        torch.ops.moe_lab.fused_moe.default,
        (hs, w1_q, w2_q, tw, ti, None, None, s1, s2, [128, 128]),
        test_utils=("test_faketensor",),
    )
    with pytest.raises(ValueError, match="need w2_scale"):
        FusedMoE(w1_q, w2_q, w1_scale=s1)


def test_custom_op_keeps_no_buffers():
    """The op may run on a CUDA graph's memory pool (torch.compile's cudagraph trees warm a graph up eagerly on
    it, and refuse tensors left there): its calls keep no workspace and make no slot-order rows, where fused_moe
    called directly keeps both."""
    from moe_lab import align as align_module
    from moe_lab import plan as plan_module
    from moe_lab.runtime import keeping_no_buffers, keeps_buffers

    plan_module.clear_layer_plans()
    align_module._SLOT_ORDER_ROWS.clear()
    for num_tokens in (1, 6):  # slot order at T = 1, the align's schedule above
        hs, w1, w2, tw, ti = random_layer(num_tokens, 4, 2, 32, 16, torch.float32)
        ref = fused_moe_reference(hs, w1, w2, tw, ti)
        for _ in range(3):
            assert relative_error(torch.ops.moe_lab.fused_moe(hs, w1, w2, tw, ti), ref) < TOL[torch.float32]
    assert not any(plan.workspaces for plan in plan_module._layer_plans.values())
    assert not align_module._SLOT_ORDER_ROWS
    assert keeps_buffers()
    with keeping_no_buffers():
        assert not keeps_buffers()
    from moe_lab import fused_moe

    for _ in range(2):
        fused_moe(hs, w1, w2, tw, ti)
    assert any(plan.workspaces for plan in plan_module._layer_plans.values())
    plan_module.clear_layer_plans()
