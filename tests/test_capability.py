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


@pytest.fixture
def no_interpreter(monkeypatch):
    """The rules as on a GPU machine (the interpreter answers first otherwise), with MOE_LAB_TMA unset."""
    monkeypatch.setattr(capability, "interpreter_active", lambda: False)
    monkeypatch.delenv(capability.ENV_VAR, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "cc, tma, fp8, gluon", [((8, 0), False, False, False), ((9, 0), True, True, True), ((10, 0), True, True, False)]
)
def test_an_assumed_device_is_what_every_rule_answers_for(no_interpreter, cc, tma, fp8, gluon):
    """Within assumed_device the real rules answer for it, whatever device they are asked about; after it,
    for the real device again (no cached answer carried over either way)."""
    devices = [None, "cpu", "meta", torch.device("meta")]
    before = [(tma_support(d).available, fp8_support(d).available, capability.gluon_fp8_support(d)) for d in devices]
    assert capability.shared_memory_budget("meta") is None  # not a GPU: nothing to fit
    with capability.assumed_device("Fake GPU", cc, 1000 * cc[0], 10 * cc[0]):
        for device in devices:
            assert tma_support(device).available == tma and "Fake GPU" in tma_support(device).reason
            assert fp8_support(device).available == fp8
            problem = capability.gluon_fp8_support(device)
            assert (problem is None) == (gluon and capability._gluon_problem() is None), problem
            assert capability.shared_memory_limit(device) == 1000 * cc[0]
            assert capability.multiprocessor_count(device) == 10 * cc[0]
            assert capability.shared_memory_budget(device or "cpu") == 1000 * cc[0]
        with capability.assumed_device("Other GPU", (8, 9), 7, 3):  # nests
            assert fp8_support("meta").available and "Other GPU" in fp8_support("meta").reason
            assert capability.shared_memory_limit() == 7 and capability.multiprocessor_count("meta") == 3
        assert "Fake GPU" in fp8_support("meta").reason
    after = [(tma_support(d).available, fp8_support(d).available, capability.gluon_fp8_support(d)) for d in devices]
    assert after == before
    assert capability.shared_memory_budget("meta") is None


def test_an_assumed_device_obeys_moe_lab_tma(no_interpreter):
    with capability.assumed_device("Fake A100", (8, 0), 166912, 108):
        no_interpreter.setenv(capability.ENV_VAR, "1")
        assert tma_support("meta").available and "MOE_LAB_TMA=1" in tma_support("meta").reason
        with capability.assumed_device("Fake H200", (9, 0), 232448, 132):
            no_interpreter.setenv(capability.ENV_VAR, "0")
            assert not tma_support("meta").available


@pytest.mark.parametrize(
    "args, error",
    [
        (("x", (9,), 1, 1), TypeError),
        (("x", (9, 0), 1.5, 1), TypeError),
        (("x", (9, 0), 0, 1), ValueError),
        (("x", (9, 0), 232448, True), TypeError),
        (("x", (True, 0), 232448, 132), TypeError),
    ],
)
def test_assumed_device_refuses_bad_facts(args, error):
    with pytest.raises(error, match="assumed_device"):
        with capability.assumed_device(*args):
            pass
    assert capability.shared_memory_budget("meta") is None  # nothing assumed: meta tensors compile for no GPU


def test_require_fp8_names_what_cannot_run(no_interpreter):
    with capability.assumed_device("NVIDIA A100-SXM4-80GB", (8, 0), 166912, 108):
        with pytest.raises(
            RuntimeError, match=r"^float8_e4m3fn weights cannot run here: NVIDIA A100-SXM4-80GB has compute capability"
        ):
            capability.require_fp8("meta", "float8_e4m3fn weights")
    with capability.assumed_device("NVIDIA H200", (9, 0), 232448, 132):
        assert capability.require_fp8("meta", "float8_e4m3fn weights") is None


def test_a_visible_gpu_s_limits_come_from_triton_s_driver_per_device(on_gpu_world):
    """The real-device path of shared_memory_limit / multiprocessor_count / shared_memory_budget: Triton's
    driver asked for the device's own index (the current one by default), and the answer cached."""
    import triton

    asked = []

    class Utils:
        @staticmethod
        def get_device_properties(index):
            asked.append(index)
            return {"max_shared_mem": 232448 - 1024 * index, "multiprocessor_count": 132 - index}

    class Driver:
        utils = Utils()

    on_gpu_world.setattr(torch.cuda, "device_count", lambda: 2)
    on_gpu_world.setattr(capability, "interpreter_active", lambda: False)
    capability._limits.cache_clear()
    capability._limits_cached.cache_clear()
    on_gpu_world.setattr(triton.runtime.driver, "_active", Driver())  # (set_active's; restored after)
    try:
        assert capability.shared_memory_limit() == 232448 and capability.multiprocessor_count("cuda") == 132
        assert capability.shared_memory_limit(torch.device("cuda", 1)) == 231424
        assert capability.multiprocessor_count("cuda:1") == 131
        assert capability.shared_memory_budget("cuda:0") == 232448 and capability.shared_memory_budget("cpu") is None
        assert sorted(set(asked)) == [0, 1] and len(asked) <= 4  # read once per device and question, then cached
    finally:
        capability._limits.cache_clear()
        capability._limits_cached.cache_clear()
