"""Expert kinds beyond SwiGLU of halves: biases on both projections, gpt-oss's clamped SwiGLU ("swigluoai") and
interleaved gate/up rows (`moe_lab.Activation`), shared experts; in the grouped matmul's epilogue on both load
paths, in `silu_and_mul` (the unfused path) and in the layer, against float64 references. The `gpu` tests run
gpt-oss-20b's real shape on an H200 (`pytest -m gpu tests/test_expert_kinds.py`)."""

import numpy as np
import pytest
import torch

from moe_lab import (
    GPT_OSS,
    Activation,
    FusedMoE,
    GemmConfig,
    fused_moe,
    fused_moe_reference,
    get_preset,
    grouped_matmul,
    moe_align,
    quantize_weights_fp8,
    relative_error,
    silu_and_mul,
    tma_support,
    topk_routing,
)
from moe_lab.reference import gated_activation_reference

from .conftest import DEVICE, TOL, random_layer, random_topk_ids
from .test_grouped_matmul import PATHS, per_expert_reference

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

KINDS = [
    Activation(),
    Activation("swigluoai"),
    Activation("silu", "interleaved"),
    Activation("swigluoai", "interleaved", alpha=1.25, limit=1.5),  # small limit: the clamps bite
]


@pytest.mark.parametrize("activation", KINDS, ids=lambda a: a.kernel_name)
def test_the_kernels_read_the_activation_name_as_the_host_reads_the_activation(activation):
    """The kernels' gate/up layout and function, taken apart from the name they are given
    (`moe_lab._kernels.common`), agree with the host's (`moe_lab.plan.gate_up_halves`, the Activation)."""
    from moe_lab._kernels import common
    from moe_lab.plan import gate_up_halves

    assert common.gate_up_halves(activation.kernel_name) == gate_up_halves(True, activation)
    assert common.activation_kind(activation.kernel_name) == activation.kind
    assert not common.gate_up_halves("none") and not gate_up_halves(False, activation)


def _biases(num_experts, inter, hidden, dtype=torch.float32):
    """w1_bias [E, 2I] (stored transposed: any strides) and w2_bias [E, H]."""
    w1_bias = torch.randn(2 * inter, num_experts, device=DEVICE).to(dtype).T
    return w1_bias, torch.randn(num_experts, hidden, device=DEVICE).to(dtype)


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("activation", KINDS, ids=lambda a: f"{a.kind}-{a.gate_up_layout}")
def test_up_gemm_epilogue_bias_and_activation(activation, use_tma):
    """I = 40 (not a multiple of the half tile), K = 40 (not of BLOCK_SIZE_K), E = 5, a bias per weight row."""
    num_tokens, num_experts, top_k, inter, k = 11, 5, 2, 40, 40
    routing = moe_align(random_topk_ids(num_tokens, num_experts, top_k), num_experts, 16)
    a = torch.randn(num_tokens, k, device=DEVICE)
    w1 = torch.randn(num_experts, 2 * inter, k, device=DEVICE) * 2 * k**-0.5
    w1_bias, _ = _biases(num_experts, inter, k)
    out = torch.full((routing.max_num_tokens_padded, inter), float("nan"), device=DEVICE)
    cfg = GemmConfig(16, 32, 32, 2, 4, 1, tail_tiles=False)
    _, plan = grouped_matmul(
        a,
        w1,
        routing,
        cfg,
        gather_a=True,
        swiglu=activation,
        w_bias=w1_bias,
        out=out,
        use_tma=use_tma,
        return_plan=True,
    )
    assert plan.swiglu and plan.activation == activation
    assert plan.constexprs["SWIGLU"] == activation.kernel_name
    if use_tma == "auto":
        assert plan.path.w_tma, plan.path.reason
    valid = routing.sorted_token_ids.cpu() < routing.num_slots
    gate_up = per_expert_reference(a, w1, routing, gather_a=True)
    experts = routing.expert_ids.long().cpu().repeat_interleave(16)
    gate_up += w1_bias.double().cpu()[experts.clamp(min=0)]
    ref = gated_activation_reference(gate_up, activation)
    got = out.cpu()[valid]
    assert not got.isnan().any(), "rows in use left unwritten"
    if activation.kind == "swigluoai":
        assert (gate_up[valid].abs() > activation.limit).any()  # the clamps are exercised
    assert relative_error(got, ref[valid]) < 1e-5


@pytest.mark.parametrize("activation", KINDS[1:], ids=lambda a: f"{a.kind}-{a.gate_up_layout}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_and_mul_computes_the_same_function(activation, dtype):
    x = (torch.randn(7, 2 * 24, device=DEVICE) * 3).to(dtype)
    out = silu_and_mul(x, activation=activation)
    ref = gated_activation_reference(x.double().cpu(), activation)
    assert relative_error(out, ref) < TOL[dtype]


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_gpt_oss_layer_matches_the_reference(fuse, use_tma):
    """The whole layer of gpt-oss's kind (clamped SwiGLU on interleaved rows, both biases), in bf16, with the
    activation in the up GEMM's epilogue or in silu_and_mul."""
    hs, w1, w2, tw, ti = random_layer(13, 5, 2, 48, 40, torch.bfloat16)
    w1 = w1 * 3  # pre-activations past the limit
    w1_bias, w2_bias = _biases(5, 40, 48, torch.bfloat16)
    out = torch.full_like(hs, float("nan"))
    cfg = GemmConfig(16, 32, 32, 1, 4, 1, fuse_swiglu=fuse)
    _, info = fused_moe(
        hs, w1, w2, tw, ti, activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias, config=cfg, use_tma=use_tma,
        out=out, return_info=True,
    )  # fmt: skip
    assert info.up_plan.swiglu == fuse
    kw = dict(activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias, dtype=torch.float64)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, **kw)) < TOL[torch.bfloat16]


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k",
    [(0, 4, 2), (1, 3, 1), (6, 3, 3)],
    ids=["T=0", "one token, top_k=1", "top_k=E"],
)
def test_gpt_oss_layer_at_the_edges(num_tokens, num_experts, top_k):
    hs, w1, w2, tw, ti = random_layer(num_tokens, num_experts, top_k, 32, 32, torch.float32)
    w1_bias, w2_bias = _biases(num_experts, 32, 32)
    kw = dict(activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias)
    out = torch.full_like(hs, float("nan"))
    fused_moe(hs, w1, w2, tw, ti, out=out, **kw)
    assert out.shape == (num_tokens, 32)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, dtype=torch.float64, **kw)) < 1e-5


@pytest.mark.parametrize("block_n", [128, 256], ids=["scale per tile", "quantized by the epilogue"])
def test_fp8_gpt_oss_layer_matches_the_reference(block_n):
    """Block-scaled float8 weights with interleaved rows: a tile of 128 rows in a row lies in one scale block
    (one weight scale per tile); a tile of 256 writes 128 columns, whole groups that its epilogue quantizes
    for the down GEMM. float32 biases."""
    hs, w1, w2, tw, ti = random_layer(9, 4, 2, 128, 64, torch.bfloat16)
    (w1, s1), (w2, s2) = quantize_weights_fp8(w1 * 3, (128, 128)), quantize_weights_fp8(w2, (128, 128))
    w1_bias, w2_bias = _biases(4, 64, 128)
    kw = dict(w1_scale=s1, w2_scale=s2, block_shape=(128, 128), activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias)
    out, info = fused_moe(hs, w1, w2, tw, ti, config=GemmConfig(16, block_n, 128, 1, 4, 1), return_info=True, **kw)
    assert (info.up_plan.w_scale_per_tile, info.up_plan.out_quant_group) == (
        (True, 0) if block_n == 128 else (False, 128)
    )
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, dtype=torch.float64, **kw)) < 2e-2


def test_a_tokens_output_is_bitwise_the_same_in_any_batch():
    hs, w1, w2, tw, ti = random_layer(9, 5, 2, 48, 40, torch.bfloat16)
    kw = dict(activation=GPT_OSS, w1_bias=_biases(5, 40, 48)[0], w2_bias=_biases(5, 40, 48)[1])
    batch = fused_moe(hs, w1, w2, tw, ti, **kw)
    for t in (0, 4):
        assert torch.equal(fused_moe(hs[t : t + 1], w1, w2, tw[t : t + 1], ti[t : t + 1], **kw)[0], batch[t])


@pytest.mark.parametrize("use_tma", PATHS)
@pytest.mark.parametrize("weighted", [False, True], ids=["weight 1", "shared_weights"])
def test_shared_experts(weighted, use_tma):
    """Two shared experts of I_s = 24 beside routed experts of I = 40 (DeepSeek: weight 1; Qwen2-MoE: a
    sigmoid gate per token); out=hidden_states computes in place."""
    hs, w1, w2, tw, ti = random_layer(10, 6, 2, 32, 40, torch.float32)
    shared_w1 = torch.randn(2, 48, 32, device=DEVICE) / 32**0.5
    shared_w2 = torch.randn(2, 32, 24, device=DEVICE) / 24**0.5
    gate = torch.sigmoid(torch.randn(10, 2, device=DEVICE)) if weighted else None
    kw = dict(shared_w1=shared_w1, shared_w2=shared_w2, shared_weights=gate)
    ref = fused_moe_reference(hs, w1, w2, tw, ti, dtype=torch.float64, **kw)
    out = fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma, out=hs, **kw)
    assert out.data_ptr() == hs.data_ptr()
    assert relative_error(out, ref) < 1e-5


def test_fp8_layer_with_shared_experts_matches_the_reference():
    """float8 routed experts beside bfloat16 shared experts: the shared ones read hidden_states unquantized, in the
    layer and in the reference (which once fed them the float8-rounded rows: 2.8e-2 apart)."""
    hs, w1, w2, tw, ti = random_layer(12, 4, 2, 128, 64, torch.bfloat16)
    (q1, s1), (q2, s2) = quantize_weights_fp8(w1, (64, 64)), quantize_weights_fp8(w2, (64, 64))
    kw = dict(w1_scale=s1, w2_scale=s2, block_shape=(64, 64), shared_w1=w1[:1], shared_w2=w2[:1])
    ref = fused_moe_reference(hs, q1, q2, tw, ti, dtype=torch.float64, **kw)
    assert relative_error(fused_moe(hs, q1, q2, tw, ti, **kw), ref) < 1e-2


def test_fused_moe_module_with_every_expert_kind():
    hs, w1, w2, tw, ti = random_layer(7, 4, 2, 32, 32, torch.float32)
    w1_bias, w2_bias = _biases(4, 32, 32)
    shared = dict(
        shared_w1=torch.randn(1, 64, 32, device=DEVICE) / 8, shared_w2=torch.randn(1, 32, 32, device=DEVICE) / 8
    )
    module = FusedMoE(w1, w2, activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias, **shared)
    gate = torch.rand(7, 1, device=DEVICE)
    out = module(hs, tw, ti, gate)
    kw = dict(activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias, shared_weights=gate, **shared)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, dtype=torch.float64, **kw)) < 1e-5


def test_bad_expert_kinds_name_what_is_wrong():
    with pytest.raises(ValueError, match="activation kind must be one of 'silu', 'swigluoai', got 'gelu'"):
        Activation("gelu")
    with pytest.raises(ValueError, match="gate_up_layout must be one of 'halves', 'interleaved', got 'rows'"):
        Activation("silu", "rows")
    with pytest.raises(ValueError, match="kind 'silu' takes neither, got alpha=1.702, limit=3.0"):
        Activation("silu", limit=3.0)
    with pytest.raises(ValueError, match="activation limit must be > 0, got 0.0"):
        Activation("swigluoai", limit=0)
    with pytest.raises(ValueError, match="activation alpha must be a finite number, got nan"):
        Activation("swigluoai", alpha=float("nan"))
    with pytest.raises(
        ValueError, match=r"alpha must be a finite number, got 1e\+39 \(the kernels take it as a float32"
    ):
        Activation("swigluoai", alpha=1e39)  # finite in Python, inf in the kernels
    assert Activation("swigluoai", alpha=np.float32(1.5), limit=np.int64(3)) == Activation(
        "swigluoai", alpha=1.5, limit=3.0
    )
    with pytest.raises(TypeError, match="activation alpha must be a finite number, got str '1'"):
        Activation("swigluoai", alpha="1")
    hs, w1, w2, tw, ti = random_layer(4, 3, 2, 32, 32, torch.bfloat16)
    with pytest.raises(
        TypeError, match="activation must be a moe_lab.Activation, 'silu', 'swigluoai' or None, got int"
    ):
        fused_moe(hs, w1, w2, tw, ti, activation=3)
    with pytest.raises(ValueError, match="^activation kind must be one of"):
        fused_moe(hs, w1, w2, tw, ti, activation="relu")
    with pytest.raises(ValueError, match=r"w1_bias must have shape \[E, 2I\] = \[3, 64\], got \(3, 32\)"):
        fused_moe(hs, w1, w2, tw, ti, w1_bias=torch.zeros(3, 32, device=DEVICE))
    with pytest.raises(TypeError, match="w2_bias must be bfloat16 or float32 .*, got float16"):
        fused_moe(hs, w1, w2, tw, ti, w2_bias=torch.zeros(3, 32, dtype=torch.float16, device=DEVICE))
    shared_w1, shared_w2 = torch.zeros(2, 16, 32, dtype=torch.bfloat16), torch.zeros(2, 32, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shared_w1 and shared_w2 go together"):
        fused_moe(hs, w1, w2, tw, ti, shared_w1=shared_w1.to(DEVICE))
    with pytest.raises(ValueError, match="shared_weights given without shared_w1 and shared_w2"):
        fused_moe(hs, w1, w2, tw, ti, shared_weights=torch.ones(4, 2, device=DEVICE))
    shared = dict(shared_w1=shared_w1.to(DEVICE), shared_w2=shared_w2.to(DEVICE))
    with pytest.raises(ValueError, match=r"shared_weights must have shape \[T, S\] = \[4, 2\], got \(4, 1\)"):
        fused_moe(hs, w1, w2, tw, ti, shared_weights=torch.ones(4, 1, device=DEVICE), **shared)
    with pytest.raises(ValueError, match="shared_w1 with expert_map is not supported"):
        fused_moe(hs, w1, w2, tw, ti, expert_map=torch.arange(3, device=DEVICE), **shared)
    with pytest.raises(TypeError, match=r"shared_w2 must be bfloat16 \(the dtype of shared_w1\), got float32"):
        fused_moe(hs, w1, w2, tw, ti, shared_w1=shared["shared_w1"], shared_w2=shared_w2.float().to(DEVICE))
    routing = moe_align(ti, 3, 16)
    with pytest.raises(TypeError, match="swiglu must be a bool or a moe_lab.Activation, got 'swigluoai'"):
        grouped_matmul(hs, w1, routing, GemmConfig(16, 32, 32), gather_a=True, swiglu="swigluoai")


def test_gpt_oss_presets():
    for name, experts in (("gpt-oss-20b", 32), ("gpt-oss-120b", 128)):
        p = get_preset(name)
        assert (p.num_experts, p.top_k, p.hidden_size, p.intermediate_size) == (experts, 4, 2880, 2880)
        assert p.activation == GPT_OSS and p.biases


# --- On an H200: gpt-oss-20b's real shape, both load paths. ---


def _gpt_oss_layer(name, num_tokens, seed=0):
    hs, w1, w2, (tw, ti) = get_preset(name).build(num_tokens, dtype=torch.bfloat16, device="cuda", seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    e, two_i, h = w1.shape
    w1_bias = (torch.randn(e, two_i, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
    w2_bias = (torch.randn(e, h, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
    return hs, w1 * 8, w2, tw, ti, dict(activation=GPT_OSS, w1_bias=w1_bias, w2_bias=w2_bias)  # w1 * 8: clamps bite


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("use_tma", [False, "auto"])
@pytest.mark.parametrize("num_tokens", [1, 64, 4096])
def test_gpu_gpt_oss_20b(num_tokens, use_tma, fuse):
    hs, w1, w2, tw, ti, kw = _gpt_oss_layer("gpt-oss-20b", num_tokens)
    out = torch.full_like(hs, float("nan"))
    config = None if fuse else {"up": {"fuse_swiglu": False}}
    _, info = fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma, out=out, config=config, return_info=True, **kw)
    torch.cuda.synchronize()
    assert info.up_plan.swiglu == fuse
    if use_tma == "auto" and tma_support(hs.device).available:
        assert info.up_plan.path.w_tma and info.down_plan.path.w_tma, info.up_plan.path.reason
    err = relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, **kw))
    print(f"gpt-oss-20b T={num_tokens} use_tma={use_tma} fuse={fuse}: rel err {err:.2e}")
    assert err < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("use_tma", [False, "auto"])
def test_gpu_gpt_oss_batch_invariance_and_120b(use_tma):
    hs, w1, w2, tw, ti, kw = _gpt_oss_layer("gpt-oss-120b", 512)
    batch = fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma, **kw)
    assert relative_error(batch, fused_moe_reference(hs, w1, w2, tw, ti, **kw)) < 1e-2
    for t in (0, 511):
        row = fused_moe(hs[t : t + 1], w1, w2, tw[t : t + 1], ti[t : t + 1], use_tma=use_tma, **kw)
        assert torch.equal(row[0], batch[t])


@pytest.mark.gpu
def test_gpu_deepseek_v2_lite_block_with_shared_experts():
    """DeepSeek-V2-Lite's MoE block (E=64, k=6, H=2048, I=1408, two shared experts) as one call."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    hs, w1, w2, _, _ = random_layer(1024, 64, 6, 2048, 1408, torch.bfloat16, device="cuda")
    tw, ti = topk_routing(torch.randn(1024, 64, generator=gen, device="cuda"), 6, renormalize=False)
    shared = dict(
        shared_w1=(torch.randn(2, 2816, 2048, generator=gen, device="cuda") / 2048**0.5).to(torch.bfloat16),
        shared_w2=(torch.randn(2, 2048, 1408, generator=gen, device="cuda") / 1408**0.5).to(torch.bfloat16),
    )
    out = fused_moe(hs, w1, w2, tw, ti, **shared)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti, **shared)) < 1e-2


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16 weights", "fp8 weights"])
def test_bias_dtypes_follow_one_rule_for_float_and_fp8_weights(fp8):
    """w1_bias / w2_bias: hidden_states' dtype or float32, whatever the weights' dtype (fused_moe and FusedMoE)."""
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 32, 32, torch.bfloat16)
    kw = {}
    if fp8:
        (w1, s1), (w2, s2) = quantize_weights_fp8(w1, (32, 32)), quantize_weights_fp8(w2, (32, 32))
        kw = dict(w1_scale=s1, w2_scale=s2, block_shape=(32, 32))
    for dtype in (torch.bfloat16, torch.float32):
        w1_bias, w2_bias = _biases(4, 32, 32, dtype)
        out = fused_moe(hs, w1, w2, tw, ti, w1_bias=w1_bias, w2_bias=w2_bias, **kw)
        ref = fused_moe_reference(hs, w1, w2, tw, ti, w1_bias=w1_bias, w2_bias=w2_bias, **kw)
        assert relative_error(out, ref) < 2e-2, dtype
    w1_bias, w2_bias = _biases(4, 32, 32, torch.float16)
    says = r"must be bfloat16 or float32 \(the dtype of the activations, or float32\), got float16"
    with pytest.raises(TypeError, match="w1_bias " + says):
        fused_moe(hs, w1, w2, tw, ti, w1_bias=w1_bias, **kw)
    with pytest.raises(TypeError, match="w2_bias " + says):
        FusedMoE(w1, w2, w2_bias=w2_bias, **kw)(hs, tw, ti)  # float8 weights: refused at the call
