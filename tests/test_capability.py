import builtins
import sys

import pytest
import torch

from moe_lab import capability, descriptor_problem, fp8_support, tma_support

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@pytest.fixture
def on_gpu_world(monkeypatch):
    """Pretend the interpreter is off and a CUDA device exists; clear the cache around the test."""
    monkeypatch.setattr(capability, "interpreter_active", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU")
    monkeypatch.delenv(capability.ENV_VAR, raising=False)
    capability._tma_support_cached.cache_clear()
    yield monkeypatch
    capability._tma_support_cached.cache_clear()


def test_hopper_is_available(on_gpu_world):
    on_gpu_world.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    on_gpu_world.setattr(torch.version, "hip", None)
    support = tma_support("cuda:0")
    assert support.available and "9.0" in support.reason


def test_ampere_is_not(on_gpu_world):
    on_gpu_world.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    on_gpu_world.setattr(torch.version, "hip", None)
    support = tma_support("cuda:0")
    assert not support.available and "8.0" in support.reason and "9.0" in support.reason


def test_rocm_is_not_mistaken_for_hopper(on_gpu_world):
    on_gpu_world.setattr(torch.cuda, "get_device_capability", lambda d=None: (11, 0))  # gfx1100
    on_gpu_world.setattr(torch.version, "hip", "6.2")
    support = tma_support("cuda:0")
    assert not support.available and "ROCm" in support.reason


def test_triton_without_tensor_descriptor(on_gpu_world):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "triton.tools.tensor_descriptor":
            raise ImportError("no such module")
        return real_import(name, *args, **kwargs)

    on_gpu_world.setattr(builtins, "__import__", fake_import)
    on_gpu_world.delitem(sys.modules, "triton.tools.tensor_descriptor", raising=False)
    support = tma_support("cuda:0")
    assert not support.available and "TensorDescriptor" in support.reason and "3.4" in support.reason


def test_env_override(on_gpu_world):
    on_gpu_world.setenv(capability.ENV_VAR, "0")
    assert "MOE_LAB_TMA=0" in tma_support("cuda:0").reason
    on_gpu_world.setenv(capability.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match="MOE_LAB_TMA must be 0, 1 or auto"):
        tma_support("cuda:0")


def test_interpreter_reports_emulation(monkeypatch):
    monkeypatch.setattr(capability, "interpreter_active", lambda: True)
    monkeypatch.delenv(capability.ENV_VAR, raising=False)
    capability._tma_support_cached.cache_clear()
    support = tma_support("cpu")
    capability._tma_support_cached.cache_clear()
    assert support.available and support.emulated and "interpreter" in support.reason


def test_descriptor_rules():
    x = torch.empty(64, 64, dtype=torch.bfloat16)
    assert descriptor_problem(x, [16, 64]) is None
    assert "last stride" in descriptor_problem(x.t(), [16, 16])
    assert "not a multiple of 16" in descriptor_problem(torch.empty(8, 511, dtype=torch.bfloat16), [8, 64])
    assert "at least 16" in descriptor_problem(x, [16, 4])
    assert "16-byte aligned" in descriptor_problem(torch.empty(4097, dtype=torch.bfloat16)[1:].view(64, 64), [16, 64])
    assert "power of two" in descriptor_problem(x, [24, 64])
    assert "at most 256" in descriptor_problem(torch.empty(512, 512, dtype=torch.bfloat16), [512, 64])
    assert "empty" in descriptor_problem(torch.empty(0, 64, dtype=torch.bfloat16), [16, 64])


@pytest.fixture
def fp8_gpu_world(on_gpu_world):
    on_gpu_world.setattr(torch.version, "hip", None)
    capability._fp8_support_cached.cache_clear()
    yield on_gpu_world
    capability._fp8_support_cached.cache_clear()


@pytest.mark.parametrize(
    "cc,available", [((9, 0), True), ((8, 9), True), ((10, 0), True), ((8, 6), False), ((8, 0), False)]
)
def test_fp8_needs_compute_capability_8_9(fp8_gpu_world, cc, available):
    fp8_gpu_world.setattr(torch.cuda, "get_device_capability", lambda d=None: cc)
    support = fp8_support("cuda:0")
    assert support.available == available and f"{cc[0]}.{cc[1]}" in support.reason
    if not available:
        assert "FP8 tensor cores need >= 8.9" in support.reason


def test_fp8_not_on_rocm_or_cpu(fp8_gpu_world):
    assert not fp8_support("cpu") and "not a CUDA GPU" in fp8_support("cpu").reason
    fp8_gpu_world.setattr(torch.version, "hip", "6.2")
    capability._fp8_support_cached.cache_clear()
    assert not fp8_support("cuda:0") and "ROCm" in fp8_support("cuda:0").reason


def test_fp8_interpreter_reports_emulation(monkeypatch):
    monkeypatch.setattr(capability, "interpreter_active", lambda: True)
    capability._fp8_support_cached.cache_clear()
    support = fp8_support("cpu")
    capability._fp8_support_cached.cache_clear()
    assert support.available and support.emulated and "interpreter" in support.reason


@pytest.mark.parametrize("query", [tma_support, fp8_support, capability.gluon_fp8_support])
def test_a_device_that_is_not_one_is_named(query, on_gpu_world):
    with pytest.raises(TypeError, match="device: expected a torch.device .* got 'nope'"):
        query("nope")
    with pytest.raises(ValueError, match=r"device: cuda:3 does not exist \(1 CUDA device"):
        query("cuda:3")


@pytest.mark.parametrize(
    "tensor, block_shape, message",
    [
        (3, [16], "tensor: expected a torch.Tensor, got int"),
        (torch.ones(4, 16), 16, "block_shape: expected a sequence of ints, got 16"),
        (torch.ones(4, 16), [4, "a"], "block_shape: expected a sequence of ints"),
        (torch.ones(4, 16), [4.0, 16], "block_shape: expected a sequence of ints"),
    ],
)
def test_descriptor_problem_names_a_bad_argument(tensor, block_shape, message):
    with pytest.raises(TypeError, match=message):
        descriptor_problem(tensor, block_shape)
