"""FP8 quantization (moe_lab.quantize): the activation kernel bit for bit against a plain torch version
written here (float32 math, torch's own e4m3 cast), the weight layouts and their round trip, bad arguments.
Small shapes: every kernel launch runs under the interpreter on a CPU."""

import math

import pytest
import torch

from moe_lab import (
    FP8_DTYPE,
    FP8_MAX,
    capability,
    dequantize_fp8,
    quantize_activations_fp8,
    quantize_weights_fp8,
)

from .conftest import DEVICE

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def over_448(amax):
    """amax / 448 as an IEEE division. Not `amax / 448.0`: on CUDA torch divides by a Python number as a
    multiply by its rounded reciprocal, which can be one bit off."""
    return amax / torch.full_like(amax, 448.0)


TINY_SCALE = over_448(torch.tensor(1e-10, dtype=torch.float32, device=DEVICE))  # the scale of an all-zero group


def torch_quant(x, group_size):
    """Per-token-group quantization in plain torch: (q [rows, K] e4m3, scale [rows, ceil(K/g)] float32)."""
    rows, k = x.shape
    g = k if group_size is None else group_size
    groups = math.ceil(k / g)
    xf = torch.zeros(rows, groups * g, dtype=torch.float32, device=x.device)
    xf[:, :k] = x.float()
    amax = xf.abs().view(rows, groups, g).amax(dim=2)
    scale = over_448(torch.maximum(amax, torch.tensor(1e-10, device=x.device)))
    per_value = scale[:, :, None].expand(rows, groups, g).reshape(rows, groups * g)[:, :k]
    q = torch.clamp(x.float() / per_value, -448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def torch_quant_static(x, scale):
    """Static per-tensor quantization in plain torch (scale: a float32 tensor of one element on x's device)."""
    return torch.clamp(x.float() / scale.reshape(()), -448.0, 448.0).to(torch.float8_e4m3fn)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def rand(rows, k, dtype=torch.float32, spread=1.0):
    """Values over several orders of magnitude, so groups differ in scale and small values reach e4m3's
    subnormals."""
    x = torch.randn(rows, k) * torch.exp(spread * torch.randn(rows, k))
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    "rows,k,group_size",
    [
        (7, 256, 128),
        (5, 300, 128),
        (3, 2200, 128),  # K a multiple of 128 and not; several programs per row
        (4, 96, 16),
        (3, 200, 64),
        (4, 50, 7),  # small groups; a group size that is not a power of two
        (3, 300, None),
        (4, 7, None),  # per token: K not a power of two
    ],
)
def test_matches_torch_bitwise(rows, k, group_size):
    x = rand(rows, k)
    q, scale = quantize_activations_fp8(x, group_size=group_size)
    ref_q, ref_scale = torch_quant(x, group_size)
    assert q.dtype == FP8_DTYPE and scale.dtype == torch.float32
    assert scale.shape == (rows, math.ceil(k / (group_size or k)))
    assert torch.equal(scale, ref_scale)
    assert same_bits(q, ref_q)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_input_dtypes(dtype):
    x = rand(6, 320, dtype)
    q, scale = quantize_activations_fp8(x)
    ref_q, ref_scale = torch_quant(x, 128)
    assert torch.equal(scale, ref_scale) and same_bits(q, ref_q)
    rel = (dequantize_fp8(q, scale, (1, 128)) - x.float()).norm() / x.float().norm()
    assert rel < 0.04


def test_zero_rows_and_groups_get_the_tiny_scale():
    x = rand(4, 256)
    x[1] = 0.0
    x[2, 128:] = 0.0
    q, scale = quantize_activations_fp8(x)
    assert torch.equal(scale[1], TINY_SCALE.expand(2)) and scale[2, 1] == TINY_SCALE
    assert (q[1].float() == 0).all() and (q[2, 128:].float() == 0).all()
    assert same_bits(q, torch_quant(x, 128)[0])


def test_static_scale_clamps_to_448():
    x = rand(5, 200)
    scale = torch.tensor([0.002], device=DEVICE)  # most |x| / scale are past 448
    q, x_scale = quantize_activations_fp8(x, scale=scale)
    assert x_scale.shape == (1,) and x_scale.data_ptr() == scale.data_ptr()
    assert same_bits(q, torch_quant_static(x, scale))
    big = x.abs() > 448 * 0.002
    assert big.sum() > 100 and torch.equal(q.float()[big].abs(), torch.full_like(x[big], 448.0))
    q0, _ = quantize_activations_fp8(x, scale=torch.tensor(0.5, device=DEVICE))  # a 0-d scale works too
    assert same_bits(q0, torch_quant_static(x, torch.tensor(0.5, device=DEVICE)))


def test_zero_dim_static_scale_is_the_one_element_scale():
    x = rand(5, 200)
    q1, s1 = quantize_activations_fp8(x, scale=torch.tensor([0.01], device=DEVICE))
    q0, s0 = quantize_activations_fp8(x, scale=torch.tensor(0.01, device=DEVICE))
    assert same_bits(q0, q1) and s0.shape == (1,) and torch.equal(s0, s1)


def test_dynamic_per_tensor():
    x = rand(6, 300, torch.bfloat16)
    q, scale = quantize_activations_fp8(x, per_tensor=True)
    ref_scale = over_448(torch.maximum(x.float().abs().amax(), torch.tensor(1e-10, device=DEVICE)))
    assert scale.shape == (1,) and torch.equal(scale[0], ref_scale)
    assert same_bits(q, torch_quant_static(x, ref_scale))


def test_noncontiguous_inputs():
    x_t = rand(300, 6).t()  # [6, 300], strides (1, 6)
    x_step = rand(5, 520)[:, 1:501:2]  # [5, 250], last stride 2
    x_rows = rand(12, 256)[::3]  # every third row
    for x in (x_t, x_step, x_rows):
        assert not x.is_contiguous()
        q, scale = quantize_activations_fp8(x)
        ref_q, ref_scale = torch_quant(x, 128)
        assert torch.equal(scale, ref_scale) and same_bits(q, ref_q)


POISON_Q = 0x7F  # an e4m3fn NaN


@pytest.mark.parametrize("mode", ["group", "token", "static", "per_tensor"])
def test_num_rows_bound_leaves_rows_past_it_untouched(mode):
    rows, k, bound = 8, 272, 3
    x = rand(rows, k)
    x[bound:] = float("nan")  # rows past the bound: must not be read (per_tensor: not enter the amax)
    kwargs = {
        "group": {},
        "token": {"group_size": None},
        "static": {"scale": torch.tensor([0.01], device=DEVICE)},
        "per_tensor": {"per_tensor": True},
    }[mode]
    out = torch.full((rows, k), POISON_Q, dtype=torch.uint8, device=DEVICE).view(FP8_DTYPE)
    scale_shape = {"group": (rows, 3), "token": (rows, 1), "static": None, "per_tensor": (1,)}[mode]
    out_scale = None if scale_shape is None else torch.full(scale_shape, float("nan"), device=DEVICE)
    num_rows = torch.tensor([bound], dtype=torch.int32, device=DEVICE)
    q, scale = quantize_activations_fp8(x, num_rows=num_rows, out=out, out_scale=out_scale, **kwargs)
    assert q is out and (out_scale is None or scale is out_scale)
    assert (out[bound:].view(torch.uint8) == POISON_Q).all()
    if mode in ("group", "token"):
        ref_q, ref_scale = torch_quant(x[:bound], kwargs.get("group_size", 128))
        assert torch.isnan(scale[bound:]).all() and torch.equal(scale[:bound], ref_scale)
    else:
        ref_scale = kwargs["scale"] if mode == "static" else over_448(x[:bound].abs().amax())
        assert torch.equal(scale, ref_scale.reshape(1))
        ref_q = torch_quant_static(x[:bound], ref_scale)
    assert same_bits(q[:bound], ref_q)


def test_zero_rows():
    x = torch.empty(0, 300, device=DEVICE)
    for kwargs, scale_shape in (({}, (0, 3)), ({"group_size": None}, (0, 1)), ({"per_tensor": True}, (1,))):
        q, scale = quantize_activations_fp8(x, **kwargs)
        assert q.shape == (0, 300) and q.dtype == FP8_DTYPE and scale.shape == scale_shape
    assert torch.equal(quantize_activations_fp8(x, per_tensor=True)[1], TINY_SCALE.reshape(1))
    q, scale = quantize_activations_fp8(x, scale=torch.ones(1, device=DEVICE))
    assert q.shape == (0, 300) and scale.shape == (1,)


def test_fp8_unavailable_is_a_clear_error(monkeypatch):
    """On a GPU below compute capability 8.9 (capability's own rule, for an assumed A100 with the interpreter
    off where the rule asks) the launcher refuses with fp8_support's reason."""
    monkeypatch.setattr(capability, "interpreter_active", lambda: False)
    with capability.assumed_device("NVIDIA A100-SXM4-80GB", (8, 0), 166912, 108):
        with pytest.raises(
            RuntimeError,
            match=r"^FP8 \(float8_e4m3fn\) kernels cannot run here: NVIDIA A100-SXM4-80GB has compute capability "
            r"8.0; FP8 tensor cores need >= 8.9",
        ):
            quantize_activations_fp8(rand(2, 128))


# --- weights ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["block", "block64x32", "tensor", "channel"])
def test_weights_layouts_and_round_trip(layout, dtype):
    e, n, k = 3, 200, 300  # N and K not multiples of the block: partial edge blocks
    w = (torch.randn(e, n, k) / k**0.5).to(dtype).to(DEVICE)
    w[1, :128, :128] = 0.0  # an all-zero block
    args, kwargs, scale_shape = {
        "block": ((128, 128), {}, (e, 2, 3)),
        "block64x32": ([64, 32], {}, (e, 4, 10)),
        "tensor": (None, {}, (e,)),
        "channel": (None, {"per_channel": True}, (e, n)),
    }[layout]
    w_fp8, w_scale = quantize_weights_fp8(w, args, **kwargs)
    assert w_fp8.shape == (e, n, k) and w_fp8.dtype == FP8_DTYPE
    assert w_scale.shape == scale_shape and w_scale.dtype == torch.float32
    back = dequantize_fp8(w_fp8, w_scale, args if layout.startswith("block") else None)
    assert back.dtype == torch.float32 and back.shape == w.shape
    assert ((back - w.float()).norm() / w.float().norm()) < 0.04
    if layout == "block":
        assert w_scale[1, 0, 0] == TINY_SCALE and (w_fp8[1, :128, :128].float() == 0).all()
        # each scale is its block's amax / 448: the block's largest value maps to 448 exactly
        block = w[2, 128:, 256:].float().abs()
        assert w_scale[2, 1, 2] == over_448(block.max())
        assert w_fp8[2, 128:, 256:].float().abs().max() == FP8_MAX


def test_weights_per_tensor_scale_is_amax_over_448():
    w = torch.randn(2, 16, 40, device=DEVICE)
    w_fp8, w_scale = quantize_weights_fp8(w, None)
    assert torch.equal(w_scale, over_448(w.abs().amax(dim=(1, 2))))
    assert same_bits(w_fp8, torch.clamp(w / w_scale[:, None, None], -448, 448).to(torch.float8_e4m3fn))


def test_dequantize_activation_layouts():
    x = rand(5, 300)
    q, scale = quantize_activations_fp8(x, group_size=64)
    back = dequantize_fp8(q, scale, block_shape=(1, 64))
    assert torch.equal(back, q.float() * scale.repeat_interleave(64, dim=1)[:, :300])
    q, scale = quantize_activations_fp8(x, group_size=None)
    assert torch.equal(dequantize_fp8(q, scale), q.float() * scale)
    q, scale = quantize_activations_fp8(x, per_tensor=True)
    assert torch.equal(dequantize_fp8(q, scale), q.float() * scale)
    with pytest.raises(ValueError, match=r"fits no layout.*block_shape=\(1, g\)"):
        dequantize_fp8(*quantize_activations_fp8(x, group_size=64))  # block_shape missing
    with pytest.raises(ValueError, match="fits no layout"):
        dequantize_fp8(q, torch.ones(5, 4, device=DEVICE), block_shape=(1, 128))  # K = 300: 3 groups of 128


# --- bad arguments ------------------------------------------------------------------------------------


def test_bad_activation_arguments():
    x = rand(4, 256)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16 or float32, got int32"):
        quantize_activations_fp8(x.int())
    with pytest.raises(ValueError, match=r"x must have 2 dimensions \[rows, K\], got shape \(4, 256, 1\)"):
        quantize_activations_fp8(x[..., None])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        quantize_activations_fp8(x.tolist())
    with pytest.raises(ValueError, match="K >= 1"):
        quantize_activations_fp8(x[:, :0])
    for bad, error in ((0, ValueError), (-128, ValueError), (True, TypeError), (128.0, TypeError)):
        with pytest.raises(error, match="group_size must be"):
            quantize_activations_fp8(x, group_size=bad)
    with pytest.raises(ValueError, match=r"scale must have shape \[1\] or \[\] \(per tensor\), got shape \(2,\)"):
        quantize_activations_fp8(x, scale=torch.ones(2))
    with pytest.raises(ValueError, match=r"got shape \(1, 1\)"):
        quantize_activations_fp8(x, scale=torch.ones(1, 1))
    with pytest.raises(TypeError, match="scale must be float32, got bfloat16"):
        quantize_activations_fp8(x, scale=torch.ones(1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="scale must be a torch.Tensor"):
        quantize_activations_fp8(x, scale=0.5)
    with pytest.raises(ValueError, match="leave per_tensor=False"):
        quantize_activations_fp8(x, scale=torch.ones(1), per_tensor=True)
    with pytest.raises(TypeError, match="per_tensor must be a bool, got int"):
        quantize_activations_fp8(x, per_tensor=1)
    with pytest.raises(TypeError, match="num_rows must be int32, got int64"):
        quantize_activations_fp8(x, num_rows=torch.tensor([2]))
    with pytest.raises(ValueError, match=r"num_rows must have shape \[1\]"):
        quantize_activations_fp8(x, num_rows=torch.tensor([2, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="out must be float8_e4m3fn, got bfloat16"):
        quantize_activations_fp8(x, out=torch.empty(4, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out_scale must have shape \[rows, ceil\(K/group_size\)\] = \[4, 2\]"):
        quantize_activations_fp8(x, out_scale=torch.empty(4, 3))
    with pytest.raises(ValueError, match="with scale= given, x_scale is that scale"):
        quantize_activations_fp8(x, scale=torch.ones(1), out_scale=torch.empty(1))


def test_bad_weight_arguments():
    w = torch.randn(2, 64, 64)
    with pytest.raises(TypeError, match="w must be float16 or bfloat16 or float32, got float8_e4m3fn"):
        quantize_weights_fp8(w.to(FP8_DTYPE))
    with pytest.raises(ValueError, match=r"w must have 3 dimensions \[E, N, K\]"):
        quantize_weights_fp8(w[0])
    for bad, error in (
        ((128,), ValueError),
        ((128, 0), ValueError),
        ((128, -1), ValueError),
        (128, TypeError),
        ((128, 128.0), TypeError),
        ((True, 128), TypeError),
        ((128, 128, 1), ValueError),
    ):
        with pytest.raises(error, match="block_shape"):
            quantize_weights_fp8(w, bad)
    with pytest.raises(ValueError, match="per_channel=True .* takes block_shape=None"):
        quantize_weights_fp8(w, per_channel=True)
    with pytest.raises(TypeError, match="per_channel must be a bool"):
        quantize_weights_fp8(w, None, per_channel="yes")
    with pytest.raises(ValueError, match="N >= 1 and K >= 1"):
        quantize_weights_fp8(w[:, :0])
    q_meta, _ = quantize_weights_fp8(torch.empty(2, 64, 64, device="meta"))  # no values read (compile checks)
    assert q_meta.device.type == "meta"
    for bad in (float("inf"), float("nan")):
        broken = w.clone()
        broken[1, 3, 5] = bad
        with pytest.raises(ValueError, match=rf"w must be finite: w\[1, 3, 5\] = {bad}; an inf or NaN"):
            quantize_weights_fp8(broken)
    w_fp8, w_scale = quantize_weights_fp8(w)
    with pytest.raises(TypeError, match="q must be float8_e4m3fn"):
        dequantize_fp8(w, w_scale, (128, 128))
    with pytest.raises(TypeError, match="scale must be float32, got float16"):
        dequantize_fp8(w_fp8, w_scale.half(), (128, 128))
    with pytest.raises(ValueError, match=r"fits no layout of q \(2, 64, 64\).*\[E, N\] = \[2, 64\]"):
        dequantize_fp8(w_fp8, torch.ones(2, 3))
    with pytest.raises(ValueError, match="q must have 2 dimensions"):
        dequantize_fp8(w_fp8[0, 0], w_scale)


# --- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_offsets_past_2_31_and_cuda_graph():
    """rows * K = 300000 * 7168 > 2^31 (DeepSeek-V3's hidden size): row offsets must be int64. Then the
    bounded call captured in a CUDA graph and replayed with a new bound."""
    rows, k = 300_000, 7168
    assert rows * k > 2**31
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    q, scale = quantize_activations_fp8(x)
    tail = slice(rows - 500, rows)
    ref_q, ref_scale = torch_quant(x[tail], 128)
    assert torch.equal(scale[tail], ref_scale) and same_bits(q[tail], ref_q)
    del x, q, scale
    x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
    num_rows = torch.tensor([64], dtype=torch.int32, device="cuda")
    out = torch.empty(64, k, dtype=FP8_DTYPE, device="cuda")
    out_scale = torch.empty(64, k // 128, device="cuda")
    quantize_activations_fp8(x, num_rows=num_rows, out=out, out_scale=out_scale)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        quantize_activations_fp8(x, num_rows=num_rows, out=out, out_scale=out_scale)
    out.view(torch.uint8).fill_(POISON_Q)
    num_rows.fill_(10)
    graph.replay()
    torch.cuda.synchronize()
    ref_q, ref_scale = torch_quant(x[:10], 128)
    assert same_bits(out[:10], ref_q) and torch.equal(out_scale[:10], ref_scale)
    assert (out[10:].view(torch.uint8) == POISON_Q).all()
