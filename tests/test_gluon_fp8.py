"""The warp-specialized Gluon FP8 grouped GEMM (moe_lab.gluon_fp8): where it may run and what it refuses (here),
where `fused_moe` runs it (`moe_lab.plan.gluon_applies`), and its results against the dequantized float32
product and the fused layer against its reference and the Triton FP8 layer (on an H200:
`pytest -m gpu tests/test_gluon_fp8.py`)."""

import pytest
import torch

import moe_lab
from moe_lab import GPT_OSS, fused_moe, moe_align, quantize_activations_fp8, quantize_weights_fp8
from moe_lab import plan as plan_module
from moe_lab.capability import assumed_device, gluon_fp8_support
from moe_lab.configs import GemmConfig
from moe_lab.expert_kind import SILU
from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
from moe_lab.plan import BlockSchedule, gluon_applies, gluon_group_size_m, gluon_programs, plan_gluon_fp8
from moe_lab.reference import relative_error
from moe_lab.runtime import interpreter_active

pytestmark = pytest.mark.kernels

FP8 = torch.float8_e4m3fn


# Argument and plan checks built on CPU tensors: where kernels run under the interpreter (a GPU machine compiles
# for the GPU and refuses CPU tensors); the GPU tests below run the kernel itself.
ON_CPU_TENSORS = pytest.mark.skipif(not interpreter_active(), reason="CPU tensors: checks under the interpreter")


def _operands(t=6, e=4, k=2, n=256, kk=256, block_m=64, device="cpu"):
    ids = torch.randint(0, e, (t, k), dtype=torch.int32, device=device)
    routing = moe_align(ids, e, block_m)
    w = torch.randn(e, n, kk, device=device).to(FP8)
    w_s = torch.ones(e, -(-n // 128), -(-kk // 128), device=device)
    a = torch.randn(t, kk, device=device).to(FP8)
    a_s = torch.ones(t, -(-kk // 128), device=device)
    return a, a_s, w, w_s, routing


@pytest.mark.skipif(not interpreter_active(), reason="the interpreter's answer")
def test_support_says_why_not_under_the_interpreter():
    reason = gluon_fp8_support()
    assert reason is not None and ("interpreter" in reason or "Gluon" in reason)


@pytest.mark.skipif(gluon_fp8_support() is None, reason="runs here")
def test_refuses_where_it_cannot_run_with_the_reason():
    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(RuntimeError, match="Gluon FP8 grouped GEMM cannot run here"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s)


@ON_CPU_TENSORS
def test_bad_arguments_are_named_before_anything_runs():
    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(TypeError, match="a must be float8_e4m3fn"):
        grouped_matmul_fp8_gluon(a.float(), w, routing, gather_a=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="block_shape must be given"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, block_shape=None)
    with pytest.raises(ValueError, match="topk_weights needs scatter=True"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, topk_weights=torch.ones(6, 2))
    with pytest.raises(ValueError, match="w_scale must have shape"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s[:, :1])
    with pytest.raises(ValueError, match=r"w must view as one \[E \* N, K\] matrix"):
        experts_inner = w.transpose(0, 1).contiguous().transpose(0, 1)  # strides (K, E * K, 1)
        grouped_matmul_fp8_gluon(a, experts_inner, routing, gather_a=True, a_scale=a_s, w_scale=w_s)


@ON_CPU_TENSORS
def test_the_weight_and_block_shape_rules_are_checked_before_the_device():
    """What Triton's TensorDescriptor.from_tensor asserts of w's [E * N, K] view (16-byte aligned base and row
    stride, last stride 1), K and the block shape: a ValueError naming the argument (`moe_lab.plan`'s
    gluon_*_problem, shared with plan_gluon_fp8 and gluon_applies), before the kernel's device is asked."""
    a, a_s, w, w_s, routing = _operands()
    e, n, kk = w.shape
    misaligned = torch.empty(e * n * kk + 16, dtype=FP8)[1 : 1 + e * n * kk].view(e, n, kk).copy_(w)
    with pytest.raises(ValueError, match="w must start at a 16-byte aligned address .* got an address 1 bytes past"):
        grouped_matmul_fp8_gluon(a, misaligned, routing, gather_a=True, a_scale=a_s, w_scale=w_s)
    padded_rows = torch.empty(e, n, kk + 8, dtype=FP8)[:, :, :kk].copy_(w)  # stride(1) = 264 bytes
    with pytest.raises(ValueError, match=r"stride\(1\) a multiple of 16 bytes.*got strides \(67584, 264, 1\)"):
        grouped_matmul_fp8_gluon(a, padded_rows, routing, gather_a=True, a_scale=a_s, w_scale=w_s)
    a, a_s, w, w_s, routing = _operands(kk=200)
    with pytest.raises(ValueError, match=r"needs w.shape\[2\] a multiple of 16 .* got w.shape\[2\]=200"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s)
    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(ValueError, match=r"block_shape \[block_n, 128\] \(its K step\), got \[128, 64\]"):
        w_s64 = torch.ones(w.shape[0], 2, 4)
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=torch.ones(6, 4), w_scale=w_s64,
                                 block_shape=(128, 64))  # fmt: skip
    with pytest.raises(ValueError, match="block_n=128 must be a multiple of BLOCK_SIZE_N=256"):
        config = GemmConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=256)
        grouped_matmul_fp8_gluon(a, w, routing, config, gather_a=True, a_scale=a_s, w_scale=w_s)
    # One expert: the [N, K] view does not read stride(0), so any is taken (and the device answers next).
    one = moe_align(torch.zeros(6, 1, dtype=torch.int32), 1, 64)
    lone = torch.empty(256, 2, 256, dtype=FP8).transpose(0, 1)[:1]  # stride(0) = 256, not N * stride(1)
    assert plan_module.gluon_weight_problem("w", lone) is None
    if gluon_fp8_support() is not None:
        with pytest.raises(RuntimeError, match="cannot run here"):
            grouped_matmul_fp8_gluon(a, lone, one, gather_a=True, a_scale=a_s, w_scale=w_s[:1])


@ON_CPU_TENSORS
def test_the_routings_block_size_and_the_config_are_checked_before_the_device():
    """plan_gluon_fp8 runs before the device is asked: a routing of 32-row blocks, a config of other rows than the
    routing's or of one stage is a ValueError on any machine (on a CPU it was the device's RuntimeError)."""
    a, a_s, w, w_s, _ = _operands()
    ids = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="takes BLOCK_SIZE_M 64 or 128 .* got 32"):
        grouped_matmul_fp8_gluon(a, w, moe_align(ids, 4, 32), gather_a=True, a_scale=a_s, w_scale=w_s)
    routing = moe_align(ids, 4, 64)
    with pytest.raises(ValueError, match="config.BLOCK_SIZE_M=128 must equal the routing's block_size_m=64"):
        config = GemmConfig(BLOCK_SIZE_M=128)
        grouped_matmul_fp8_gluon(a, w, routing, config, gather_a=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="leaves fewer than 2 pipeline stages"):
        config = GemmConfig(BLOCK_SIZE_M=64, num_stages=1)
        grouped_matmul_fp8_gluon(a, w, routing, config, gather_a=True, a_scale=a_s, w_scale=w_s)


@ON_CPU_TENSORS
def test_routing_and_scales_are_checked_as_grouped_matmul_checks_them():
    """One check per argument, shared with moe_lab.grouped_matmul (moe_lab.gemm.check_gemm_rows and
    check_fp8_scales): the same refusals, in the same words."""
    from dataclasses import replace

    a, a_s, w, w_s, routing = _operands()
    with pytest.raises(TypeError, match="routing must be an AlignedRouting"):
        grouped_matmul_fp8_gluon(a, w, routing.sorted_token_ids, gather_a=True, a_scale=a_s, w_scale=w_s)
    short = replace(routing, sorted_token_ids=routing.sorted_token_ids[:10])
    with pytest.raises(ValueError, match="routing.sorted_token_ids has 10 rows"):
        grouped_matmul_fp8_gluon(a, w, short, gather_a=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="gather_a=True with scatter=True is not a supported combination"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, scatter=True, a_scale=a_s, w_scale=w_s)
    with pytest.raises(ValueError, match="need a_scale and w_scale"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=None, w_scale=w_s)
    with pytest.raises(ValueError, match=r"a_scale must have shape \[rows, ceil\(K/block_k\)\]"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s[:, :1], w_scale=w_s)


@ON_CPU_TENSORS
def test_plan_refuses_what_the_kernel_cannot_run_and_fits_shared_memory():
    _, _, _, _, routing = _operands(block_m=64)
    cpu = torch.device("cpu")
    plan = plan_gluon_fp8(routing, 256, 256, (128, 128), cpu)
    assert plan.config.BLOCK_SIZE_K == 128 and plan.config.num_warps == 4 and plan.constexprs["GROUP_N"] == 128
    assert plan.maxnreg <= 248 and plan.maxnreg % 8 == 0
    with pytest.raises(ValueError, match="block_n=64"):
        plan_gluon_fp8(routing, 256, 256, (64, 128), cpu)
    with pytest.raises(ValueError, match=r"block_shape \[block_n, 128\]"):
        plan_gluon_fp8(routing, 256, 256, (128, 64), cpu)
    with pytest.raises(ValueError, match="multiple of 16"):
        plan_gluon_fp8(routing, 256, 200, (128, 128), cpu)
    with pytest.raises(ValueError, match="must equal the routing's block_size_m"):
        plan_gluon_fp8(routing, 256, 256, (128, 128), cpu, GemmConfig(BLOCK_SIZE_M=128))
    small = moe_align(torch.zeros(3, 1, dtype=torch.int32), 2, 32)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M 64 or 128"):
        plan_gluon_fp8(small, 256, 256, (128, 128), cpu)


def test_default_tile_order_is_one_m_block_at_a_time_for_up_gemms_whose_n_tiles_fit_half_a_wave():
    """plan_gluon_fp8's default GROUP_SIZE_M (`gluon_group_size_m`): 1 for the SwiGLU up GEMM where two M-blocks'
    N tiles fit one wave of programs (DeepSeek-V3's I = 2048: 16 tiles on 132 SMs), else 8 (Mixtral-8x7B's
    I = 14336: 112 tiles; the down GEMM); a config given keeps its own."""
    assert gluon_group_size_m(16, 132, swiglu=True) == 1 and gluon_group_size_m(66, 132, swiglu=True) == 1
    assert gluon_group_size_m(67, 132, swiglu=True) == 8 and gluon_group_size_m(16, 132, swiglu=False) == 8
    meta, schedule = torch.device("meta"), BlockSchedule(128, 64)
    with assumed_device("H100", (9, 0), 232448, 132):
        deepseek_up = plan_gluon_fp8(schedule, 2 * 2048, 7168, (128, 128), meta, None, 1, SILU)
        mixtral_up = plan_gluon_fp8(schedule, 2 * 14336, 4096, (128, 128), meta, None, 1, SILU)
        deepseek_down = plan_gluon_fp8(schedule, 7168, 2048, (128, 128), meta)
        config = GemmConfig(128, 128, GROUP_SIZE_M=4)
        given = plan_gluon_fp8(schedule, 2 * 2048, 7168, (128, 128), meta, config, 1, SILU)
    assert deepseek_up.config.GROUP_SIZE_M == 1 and deepseek_up.constexprs["GROUP_SIZE_M"] == 1
    assert mixtral_up.config.GROUP_SIZE_M == 8 and deepseek_down.config.GROUP_SIZE_M == 8
    assert given.config.GROUP_SIZE_M == 4


def test_the_up_gemm_launches_one_program_per_tile_where_an_experts_weights_outgrow_l2():
    """plan_gluon_fp8's grid (`gluon_programs`): one program per tile for the SwiGLU up GEMM where one expert's
    w1 takes 16 MiB or more (DeepSeek-V3: 2I x H = 4096 x 7168 bytes; Mixtral-8x7B), else one per SM at most
    (Qwen3-30B-A3B's 1536 x 2048; every down GEMM), and never 0."""
    mib = 2**20
    assert gluon_programs(2048, 132, True, 16 * mib) == 2048 and gluon_programs(2048, 132, True, 16 * mib - 1) == 132
    assert gluon_programs(2048, 132, False, 64 * mib) == 132 and gluon_programs(100, 132, False, 0) == 100
    assert gluon_programs(0, 132, True, 64 * mib) == 1 and gluon_programs(0, 132, False, 0) == 1
    meta, schedule = torch.device("meta"), BlockSchedule(128, 64)
    with assumed_device("H100", (9, 0), 232448, 132):
        deepseek_up = plan_gluon_fp8(schedule, 2 * 2048, 7168, (128, 128), meta, None, 1, SILU)
        mixtral_up = plan_gluon_fp8(schedule, 2 * 14336, 4096, (128, 128), meta, None, 1, SILU)
        qwen_up = plan_gluon_fp8(schedule, 2 * 768, 2048, (128, 128), meta, None, 1, SILU)
        deepseek_down = plan_gluon_fp8(schedule, 7168, 2048, (128, 128), meta)
    assert deepseek_up.grid == 64 * 16 and mixtral_up.grid == 64 * 112
    assert qwen_up.grid == 132 and deepseek_down.grid == 132  # 384 and 3584 tiles: one program per SM
    with assumed_device("H100", (9, 0), 232448, 132):
        assert plan_gluon_fp8(BlockSchedule(128, 4), 2 * 768, 2048, (128, 128), meta, None, 1, SILU).grid == 24


def test_the_gluon_decisions_name_a_bad_argument():
    """gluon_group_size_m, plan_gluon_fp8 and gluon_applies called directly: TypeError/ValueError naming the
    argument; a device given by name, or a meta device with no GPU assumed (one program), plans."""
    for args, error, match in (
        (("16", 132, True), TypeError, "n_tiles must be an int"),
        ((16, 0, True), ValueError, "programs must be >= 1"),
        ((16, 132, "no"), TypeError, "swiglu must be a bool"),
    ):
        with pytest.raises(error, match=match):
            gluon_group_size_m(*args)
    for args, error, match in (
        ((-1, 132, True, 0), ValueError, "tiles must be >= 0"),
        ((16, 0, True, 0), ValueError, "sms must be >= 1"),
        ((16, 132, 1, 0), TypeError, "swiglu must be a bool"),
        ((16, 132, True, 2.0**30), TypeError, "expert_w_bytes must be an int"),
        ((2**40, 132, True, 2**30), ValueError, "more than a CUDA grid holds"),
        ((torch.tensor([16]), 132, True, 0), TypeError, "tiles must be an int, got a 1-d int64 tensor"),
        ((torch.tensor(16, device="meta"), 132, True, 0), TypeError, "tiles must be an int, got a 0-d"),
    ):
        with pytest.raises(error, match=match):
            gluon_programs(*args)
    schedule, block = BlockSchedule(64, 100), (128, 128)
    for kwargs, error, match in (
        (dict(routing=None), TypeError, "routing must be an AlignedRouting"),
        (dict(n=-256), ValueError, "n must be >= 0"),
        (dict(k=256.0), TypeError, "k must be an int"),
        (dict(block_shape=(128,)), ValueError, "block_shape must hold two ints"),
        (dict(block_shape=(0, 128)), ValueError, "block_shape"),
        (dict(block_shape=None), ValueError, "block_shape must be given"),
        (dict(device=0), TypeError, "device must be a torch.device or its name"),
        (dict(device="nonsense"), ValueError, "device must be a torch.device or its name"),
        (dict(routing=BlockSchedule(100, 4)), ValueError, "routing.block_size_m must be 64 or 128, got 100"),
        (dict(routing=BlockSchedule(64, None)), TypeError, "routing.max_num_m_blocks must be an int"),
        (dict(routing=BlockSchedule(64, -1)), ValueError, "routing.max_num_m_blocks must be >= 0"),
        (dict(out_itemsize=2.0), ValueError, "out_itemsize must be 1, 2 or 4"),
        (dict(config=GemmConfig(64, 128, num_stages=1)), ValueError, "fewer than 2 pipeline stages"),
        (dict(config={"BLOCK_SIZE_M": 64}), TypeError, "config must be a GemmConfig or None"),
        (dict(out_itemsize=3), ValueError, "out_itemsize must be 1, 2 or 4"),
        (dict(activation="silu"), TypeError, "activation must be an Activation or None"),
        (dict(n=257, activation=SILU), ValueError, "n must be even"),
    ):
        args = dict(routing=schedule, n=256, k=256, block_shape=block, device="cpu") | kwargs
        with pytest.raises(error, match=match):
            plan_gluon_fp8(**args)
    assert plan_gluon_fp8(schedule, 256, 256, block, "meta").grid == 1
    assert plan_gluon_fp8(schedule, 0, 256, block, "meta", None, 2, SILU).grid == 1  # n = 0: no tiles
    if not torch.cuda.is_available():  # a CUDA device named on a machine without one plans as meta does
        assert plan_gluon_fp8(schedule, 256, 256, block, "cuda").grid == 1
    w1, w2 = torch.empty(8, 512, 256, device="meta", dtype=FP8), torch.empty(8, 256, 256, device="meta", dtype=FP8)
    for args, kwargs, error, match in (
        ((None, w2, block), {}, TypeError, "w1 must be a torch.Tensor"),
        ((w1, w2, 128), {}, TypeError, "block_shape must be a tuple or list"),
        ((w1, w2, block, "silu"), {}, TypeError, "activation must be an Activation"),
        ((w1, w2, block), dict(has_bias="no"), TypeError, "has_bias must be a bool"),
        ((w1, w2, block), dict(config_given=1), TypeError, "config_given must be a bool"),
        ((w1, w2, block), dict(rows_per_expert="300"), TypeError, "rows_per_expert must be a number"),
        ((w1, w2, block), dict(rows_per_expert=True), TypeError, "rows_per_expert must be a number"),
        ((w1, w2, block), dict(rows_per_expert=-3), ValueError, "rows_per_expert must be a finite number >= 0"),
        ((w1, w2, block), dict(rows_per_expert=float("nan")), ValueError, "rows_per_expert must be a finite"),
        ((w1, w2, block), dict(rows_per_expert=float("inf")), ValueError, "rows_per_expert must be a finite"),
    ):
        with pytest.raises(error, match=match):
            gluon_applies(*args, **kwargs)


@ON_CPU_TENSORS
def test_plan_of_the_swiglu_variant_reads_two_boxes_and_refuses_what_it_cannot_run():
    cpu = torch.device("cpu")
    schedule = BlockSchedule(128, 40)
    plan = plan_gluon_fp8(schedule, 512, 256, (128, 128), cpu, GemmConfig(128, 128), 1, SILU)
    assert plan.constexprs["SWIGLU"] == "silu" and plan.grid == 1 and plan.config.num_warps == 4
    assert plan.constexprs["CONSUMERS"] == 2  # two MMA partitions of 64 rows
    assert plan_gluon_fp8(schedule, 512, 256, (128, 128), cpu).constexprs["SWIGLU"] == "none"
    oai = plan_gluon_fp8(schedule, 512, 256, (128, 128), cpu, None, 1, moe_lab.Activation("swigluoai"))
    assert oai.constexprs["SWIGLU"] == "swigluoai"
    with pytest.raises(ValueError, match="interleaved"):
        plan_gluon_fp8(schedule, 512, 256, (128, 128), cpu, None, 1, GPT_OSS)
    with pytest.raises(ValueError, match="I=192 is not a multiple of BLOCK_SIZE_N=128"):
        plan_gluon_fp8(schedule, 384, 256, (128, 128), cpu, None, 1, SILU)
    with pytest.raises(ValueError, match="must equal the output's scale group"):
        plan_gluon_fp8(schedule, 512, 256, (128, 128), cpu, GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64), 1, SILU)
    a, a_s, w, w_s, routing = _operands(t=6, e=4, n=512, kk=256)
    with pytest.raises(ValueError, match="activation needs gather_a=True"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=False, a_scale=a_s, w_scale=w_s, activation="silu")
    with pytest.raises(ValueError, match="out_scale needs activation"):
        grouped_matmul_fp8_gluon(a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, out_scale=torch.ones(1, 1))
    rows = routing.max_num_tokens_padded
    for out_scale, message in (
        (torch.ones(rows, 3), r"out_scale must have shape"),
        (torch.ones(rows + 1).as_strided((rows, 2), (1, 1)), "out_scale's entries overlap in memory"),
    ):
        with pytest.raises(ValueError, match=message):
            grouped_matmul_fp8_gluon(
                a, w, routing, gather_a=True, a_scale=a_s, w_scale=w_s, activation="silu", out_scale=out_scale
            )


def _fp8_layer(t=4, e=4, k=2, h=256, i=256, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, h, device=device, generator=gen).bfloat16()
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device=device, generator=gen) * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device=device, generator=gen) * i**-0.5)
    logits = torch.randn(t, e, device=device, generator=gen)
    topk_weights, topk_ids = moe_lab.topk_routing(logits, k)
    scales = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=(128, 128))
    return x, w1_q, w2_q, topk_weights, topk_ids, scales


@pytest.mark.skipif(gluon_fp8_support() is None, reason="the Gluon kernel runs here")
def test_fused_moe_falls_back_to_the_triton_gemms_and_says_why():
    x, w1, w2, tw, ids, scales = _fp8_layer()
    _, info = fused_moe(x, w1, w2, tw, ids, **scales, return_info=True)
    assert info.gemm_kernel == "triton" and info.gluon_plan is None
    assert info.gemm_reason == f"triton GEMMs: {gluon_fp8_support()}"
    _, info = fused_moe(x.float(), w1.float() * 0.01, w2.float() * 0.01, tw, ids, return_info=True)
    assert info.gemm_reason == "triton GEMMs: not block-scaled float8 weights"


def test_gluon_applies_where_it_can_run_and_where_the_rule_says_faster(monkeypatch):
    monkeypatch.setattr(plan_module, "gluon_fp8_support", lambda device=None: None)  # as on an H200
    meta = dict(device="meta", dtype=FP8)
    w1, w2 = torch.empty(8, 2 * 2048, 1024, **meta), torch.empty(8, 1024, 2048, **meta)
    block = (128, 128)
    applies, why = gluon_applies(w1, w2, block, setting="auto", rows_per_expert=255.5)  # by the rows per expert
    assert not applies and "auto: 255.5 rows per expert (T * top_k / E) < 256" in why
    auto = gluon_applies(w1, w2, block, setting="auto", rows_per_expert=256)
    assert auto == (True, "MOE_LAB_GLUON=auto: 256 rows per expert (T * top_k / E) >= 256")
    assert "config given" in gluon_applies(w1, w2, block, setting="auto", rows_per_expert=4096, config_given=True)[1]
    assert not gluon_applies(w1, w2, block, setting="auto")[0]  # no T to decide by
    # large experts (w1 of 16 MiB or more each: DeepSeek-V3's 28 MiB) from full 128-row tiles
    large = torch.empty(8, 2 * 2048, 7168, **meta), torch.empty(8, 7168, 2048, **meta)
    assert gluon_applies(*large, block, setting="auto", rows_per_expert=128) == (
        True,
        "MOE_LAB_GLUON=auto: 128 rows per expert (T * top_k / E) >= 128 (large experts: w1 >= 16 MiB each)",
    )
    assert not gluon_applies(*large, block, setting="auto", rows_per_expert=127.5)[0]
    just_under = torch.empty(8, 2 * 1024, 8176, **meta), torch.empty(8, 8176, 1024, **meta)  # 16 MiB - 32 KiB
    assert (
        "128 rows per expert (T * top_k / E) < 256,"
        in gluon_applies(*just_under, block, setting="auto", rows_per_expert=128)[1]
    )
    with pytest.raises(ValueError, match="setting must be '0', '1' or 'auto'"):
        gluon_applies(w1, w2, block, setting="on", rows_per_expert=4096)
    assert gluon_applies(w1, w2, block, setting="1") == (True, "MOE_LAB_GLUON=1")
    assert gluon_applies(w1, w2, block, setting="0") == (False, "MOE_LAB_GLUON=0")
    bf16 = torch.empty(8, 2 * 2048, 1024, device="meta", dtype=torch.bfloat16)
    assert gluon_applies(bf16, w2, None, setting="0") == (False, "not block-scaled float8 weights")
    assert "interleaved" in gluon_applies(w1, w2, block, GPT_OSS, setting="1")[1]
    assert "no bias" in gluon_applies(w1, w2, block, has_bias=True, setting="1")[1]
    assert "needs block_shape [block_n, 128]" in gluon_applies(w1, w2, (128, 64), setting="1")[1]
    assert "block_n=64 must be a multiple of BLOCK_SIZE_N=128" in gluon_applies(w1, w2, (64, 128), setting="1")[1]
    odd = torch.empty(8, 2 * 192, 1024, **meta), torch.empty(8, 1024, 192, **meta)
    assert "I=192 is not a multiple" in gluon_applies(*odd, block, setting="1")[1]
    strided = torch.empty(2 * 2048, 8, 1024, **meta).transpose(0, 1)
    assert "w1 must view as one [E * N, K] matrix" in gluon_applies(strided, w2, block, setting="1")[1]
    misaligned = torch.empty(8 * 1024 * 2048 + 16, **meta)[1 : 1 + 8 * 1024 * 2048].view(8, 1024, 2048)
    assert "w2 must start at a 16-byte aligned address" in gluon_applies(w1, misaligned, block, setting="1")[1]
    narrow = torch.empty(8, 1024, 2048 + 8, **meta)[:, :, :2048]  # rows of 2056 bytes: not a multiple of 16
    assert "w2 must view as one" in gluon_applies(w1, narrow, block, setting="1")[1]
    odd_h = torch.empty(8, 2 * 2048, 1000, **meta), torch.empty(8, 1000, 2048, **meta)
    assert "needs w1.shape[2] a multiple of 16" in gluon_applies(*odd_h, block, setting="1")[1]
    # One expert: stride(0) is not read (the same answer as the public op's).
    lone = torch.empty(2 * 2048, 2, 1024, **meta).transpose(0, 1)[:1], torch.empty(1, 1024, 2048, **meta)
    assert gluon_applies(*lone, block, setting="1") == (True, "MOE_LAB_GLUON=1")
    monkeypatch.setenv("MOE_LAB_GLUON", "yes")
    with pytest.raises(ValueError, match="MOE_LAB_GLUON must be 0, 1 or auto, got 'yes'"):
        gluon_applies(w1, w2, block)


def test_layer_plan_takes_the_gluon_gemms_with_an_aligned_schedule(monkeypatch):
    monkeypatch.setattr(plan_module, "gluon_fp8_support", lambda device=None: None)  # as on an H200
    monkeypatch.setenv("MOE_LAB_GLUON", "1")
    x, w1, w2, tw, ids, scales = _fp8_layer(t=1)
    key = plan_module.layer_key(
        x, w1, w2, tw, ids, scales=(scales["w1_scale"], scales["w2_scale"], None, None), block_shape=(128, 128)
    )
    ((_, _, chunk),) = plan_module.plan_layer(key, w1, w2).chunks
    assert chunk.gluon is not None and not chunk.slot_order  # T = 1 would take slot order otherwise
    assert chunk.gemm_reason == "gluon GEMMs: MOE_LAB_GLUON=1"
    assert chunk.gluon.block_size_m == 64 and chunk.gluon.up.constexprs["SWIGLU"] == "silu"
    assert chunk.gluon.down.constexprs["SWIGLU"] == "none"


def test_auto_takes_the_gluon_gemms_where_experts_get_enough_rows(monkeypatch):
    """MOE_LAB_GLUON=auto (the default): the Gluon GEMMs for a chunk whose T * top_k / E reaches
    GLUON_AUTO_ROWS_PER_EXPERT, the Triton ones below it, with a config given, and for the chunks of a layer
    cut smaller (chunk_size)."""
    monkeypatch.setattr(plan_module, "gluon_fp8_support", lambda device=None: None)  # as on an H200
    monkeypatch.delenv("MOE_LAB_GLUON", raising=False)
    e, k = 4, 2
    t = plan_module.GLUON_AUTO_ROWS_PER_EXPERT * e // k

    def chunks(num_tokens, **kw):
        x, w1, w2, tw, ids, scales = _fp8_layer(t=num_tokens, e=e, k=k)
        key = plan_module.layer_key(
            x, w1, w2, tw, ids, scales=(scales["w1_scale"], scales["w2_scale"], None, None), block_shape=(128, 128),
            **kw,
        )  # fmt: skip
        return [chunk for _, _, chunk in plan_module.plan_layer(key, w1, w2).chunks]

    (wide,) = chunks(t)
    assert wide.gluon is not None and wide.gluon.block_size_m == 128
    assert wide.gemm_reason == "gluon GEMMs: MOE_LAB_GLUON=auto: 256 rows per expert (T * top_k / E) >= 256"
    (narrow,) = chunks(t - 2)
    assert narrow.gluon is None and "255 rows per expert" in narrow.gemm_reason
    (given,) = chunks(t, config={"up": {"num_stages": 3}})
    assert given.gluon is None and "config given" in given.gemm_reason
    (pointers,) = chunks(t, use_tma=False)  # the Gluon kernel loads by TMA alone
    assert pointers.gluon is None and "use_tma=False" in pointers.gemm_reason
    assert [chunk.gluon for chunk in chunks(t, chunk_size=t // 2)] == [None, None]
    assert [chunk.gluon is not None for chunk in chunks(t + 2, chunk_size=t)] == [True, False]  # each its own
    emap = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)  # this rank: 4 of 8 experts
    (ranked,) = chunks(t, expert_map=emap)  # T * top_k over all 8 experts: half the threshold each
    assert ranked.gluon is None and f"{t * k // 8} rows per expert" in ranked.gemm_reason


@ON_CPU_TENSORS
def test_permute_tokens_copies_float8_rows():
    a, _, _, _, routing = _operands(t=9, kk=48, block_m=16)
    rows = moe_lab.permute_tokens(a, routing)
    ids = routing.sorted_token_ids.long()[: int(routing.num_tokens_post_padded)]
    valid = ids < routing.num_slots
    assert rows.dtype == FP8
    assert torch.equal(rows[: len(ids)][valid].float(), a.float()[ids[valid] // routing.top_k])
    assert not rows[: len(ids)][~valid].float().any()


# --- on an sm_90 GPU -------------------------------------------------------------------------------------


def _reference(a32, w32, routing, gather_a, topk_weights=None):
    ids = routing.sorted_token_ids.long()
    used = int(routing.num_tokens_post_padded)
    experts = routing.expert_ids.long().repeat_interleave(routing.block_size_m)[:used]
    valid = ids[:used] < routing.num_slots
    rows = torch.arange(used, device=a32.device)[valid]
    src = ids[rows] // routing.top_k if gather_a else rows
    prod = torch.einsum("rk,rnk->rn", a32[src], w32[experts[valid]])
    if topk_weights is not None:
        prod = prod * topk_weights.reshape(-1)[ids[rows]][:, None]
    return rows, ids[rows], prod


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or gluon_fp8_support() is not None, reason="needs sm_90 + Gluon")
@pytest.mark.parametrize("block_m", [64, 128])
# K blocks per tile: up 4, 8, 2 (the last part of one), 5; down 2, 3, 2, 1 (the staggered loop's odd counts and its
# single block)
@pytest.mark.parametrize(
    "t, e, k, h, i", [(1, 8, 2, 512, 256), (300, 16, 4, 1024, 384), (77, 6, 2, 208, 192), (40, 4, 2, 640, 128)]
)
def test_gluon_pair_matches_the_dequantized_float32_product(block_m, t, e, k, h, i):
    from moe_lab.quantize import dequantize_fp8
    from moe_lab.reference import relative_error

    torch.manual_seed(0)
    x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda"), group_size=128)
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    ids = torch.randint(0, max(1, e // 2), (t, k), device="cuda", dtype=torch.int32)  # half the experts empty
    tw = torch.rand(t, k, device="cuda")
    routing = moe_align(ids, e, block_m)
    cfg = GemmConfig(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=128)
    up = torch.full((routing.max_num_tokens_padded, 2 * i), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s, out=up)
    rows, _, want = _reference(
        dequantize_fp8(x_q, x_s, (1, 128)), dequantize_fp8(w1_q, w1_s, (128, 128)), routing, True
    )
    assert relative_error(up[rows].float(), want) < 1e-2
    a_q, a_s = quantize_activations_fp8(torch.randn(routing.max_num_tokens_padded, i, device="cuda"), group_size=128)
    down = torch.full((t * k, h), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_matmul_fp8_gluon(
        a_q, w2_q, routing, cfg, gather_a=False, scatter=True, topk_weights=tw, a_scale=a_s, w_scale=w2_s, out=down
    )
    _, slots, want = _reference(
        dequantize_fp8(a_q, a_s, (1, 128)), dequantize_fp8(w2_q, w2_s, (128, 128)), routing, False, tw
    )
    assert not down.isnan().any()  # every slot written
    assert relative_error(down[slots].float(), want) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or gluon_fp8_support() is not None, reason="needs sm_90 + Gluon")
def test_gluon_down_gemm_is_bitwise_the_same_in_any_batch():
    torch.manual_seed(0)
    e, k, h, i = 8, 2, 512, 256
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    ids = torch.randint(0, e, (200, k), device="cuda", dtype=torch.int32)
    tw = torch.rand(200, k, device="cuda")
    slot_act = torch.randn(200 * k, i, device="cuda")

    def down(t):
        routing = moe_align(ids[:t], e, 64)
        sorted_ids = routing.sorted_token_ids.long().clamp(max=t * k - 1)
        a_q, a_s = quantize_activations_fp8(slot_act[sorted_ids], group_size=128)
        return grouped_matmul_fp8_gluon(
            a_q, w2_q, routing, gather_a=False, scatter=True, topk_weights=tw[:t], a_scale=a_s, w_scale=w2_s
        )

    assert torch.equal(down(3), down(200)[: 3 * k])


GPU_GLUON = pytest.mark.skipif(
    not torch.cuda.is_available() or gluon_fp8_support() is not None, reason="needs sm_90 + Gluon"
)


def _activation_reference(gate_up: torch.Tensor, activation) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return (up + 1) * gate * torch.sigmoid(1.702 * gate)


def _up_operands(t, e, k, h, i, block_m, empty):
    """Float8 tokens and w1 with their scales, a routing leaving the last `empty` experts without rows, and the
    float32 gate_up of the dequantized operands on the routed rows: (x_q, x_s, w1_q, w1_s, routing, used rows,
    gate_up)."""
    from moe_lab.quantize import dequantize_fp8

    torch.manual_seed(0)
    x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda"), group_size=128)
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    ids = torch.randint(0, e - empty, (t, k), device="cuda", dtype=torch.int32)
    routing = moe_align(ids, e, block_m)
    used, _, gate_up = _reference(
        dequantize_fp8(x_q, x_s, (1, 128)), dequantize_fp8(w1_q, w1_s, (128, 128)), routing, True
    )
    return x_q, x_s, w1_q, w1_s, routing, used, gate_up


@pytest.mark.gpu
@GPU_GLUON
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("block_m", [64, 128])
def test_gluon_swiglu_epilogue_writes_the_down_gemms_float8_input(activation, block_m):
    from moe_lab.quantize import dequantize_fp8
    from moe_lab.reference import relative_error

    i = 384
    x_q, x_s, w1_q, w1_s, routing, used, gate_up = _up_operands(200, 6, 2, 1024, i, block_m, empty=2)
    rows = routing.max_num_tokens_padded
    act = torch.full((rows, i), float("nan"), device="cuda").to(FP8)
    act_s = torch.full((rows, i // 128), float("nan"), device="cuda")
    grouped_matmul_fp8_gluon(
        x_q, w1_q, routing, gather_a=True, a_scale=x_s, w_scale=w1_s, activation=activation, out=act, out_scale=act_s
    )
    want_q, want_s = quantize_activations_fp8(_activation_reference(gate_up, activation), group_size=128)
    assert relative_error(act_s[used], want_s) < 1e-3  # the same amax/448 rule on the same sums
    got = dequantize_fp8(act[used], act_s[used], (1, 128))
    assert relative_error(got, dequantize_fp8(want_q, want_s, (1, 128))) < 1e-2
    padded = int(routing.num_tokens_post_padded)
    live = _live_half_rows(routing)  # padding rows of 64-row halves that hold routed rows are written too
    assert not act_s[:padded][live].isnan().any() and not act[:padded][live].float().isnan().any()


def _live_half_rows(routing):
    """Of rows [0, num_tokens_post_padded), those in 64-row halves whose first row is routed: what the SwiGLU up
    GEMM writes (padding comes last in an M-block; a half of padding alone is passed by)."""
    padded = int(routing.num_tokens_post_padded)
    ids = routing.sorted_token_ids[:padded]
    return ids[torch.arange(padded, device=ids.device) // 64 * 64] < routing.num_slots


@pytest.mark.gpu
@GPU_GLUON
def test_gluon_up_gemm_passes_by_halves_of_padding_and_the_down_gemm_ignores_them():
    """128-row tiles: an expert's last M-block with 64 valid rows or fewer has a second half of padding alone,
    which the SwiGLU up GEMM passes by (its rows stay as they were, NaN here). The routed rows match the
    reference, and the down GEMM's slots are bitwise those it gives when those rows are zeros."""
    from moe_lab.quantize import dequantize_fp8

    torch.manual_seed(0)
    e, h, i = 5, 512, 256
    counts = [130, 200, 64, 1, 0]  # last M-blocks of 2, 72, 64 and 1 valid rows; one expert empty
    ids = torch.cat([torch.full((c, 1), x, dtype=torch.int32) for x, c in enumerate(counts)]).cuda()
    ids = ids[torch.randperm(len(ids), device="cuda")]
    t = len(ids)
    x_q, x_s = quantize_activations_fp8(torch.randn(t, h, device="cuda"), group_size=128)
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    routing = moe_align(ids, e, 128)
    cfg = GemmConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128)
    rows = routing.max_num_tokens_padded
    act = torch.full((rows, i), float("nan"), device="cuda").to(FP8)
    act_s = torch.full((rows, i // 128), float("nan"), device="cuda")
    grouped_matmul_fp8_gluon(
        x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s, activation="silu", out=act, out_scale=act_s
    )
    used, _, gate_up = _reference(
        dequantize_fp8(x_q, x_s, (1, 128)), dequantize_fp8(w1_q, w1_s, (128, 128)), routing, True
    )
    want_q, want_s = quantize_activations_fp8(_activation_reference(gate_up, "silu"), group_size=128)
    got = dequantize_fp8(act[used], act_s[used], (1, 128))
    assert relative_error(got, dequantize_fp8(want_q, want_s, (1, 128))) < 1e-2
    padded = int(routing.num_tokens_post_padded)
    live = _live_half_rows(routing)
    assert int((~live).sum()) == 3 * 64  # the second halves of experts 0, 2 and 3
    assert act_s[:padded][~live].isnan().all() and not act_s[:padded][live].isnan().any()

    tw = torch.rand(t, 1, device="cuda")

    def down(a, a_s):
        return grouped_matmul_fp8_gluon(
            a, w2_q, routing, cfg, gather_a=False, scatter=True, topk_weights=tw, a_scale=a_s, w_scale=w2_s
        )

    cleared, cleared_s = act.clone(), act_s.clone()
    cleared.view(torch.uint8)[:padded][~live] = 0  # float8 zeros
    cleared_s[:padded][~live] = 1.0
    got = down(act, act_s)
    assert not got.isnan().any() and torch.equal(got, down(cleared, cleared_s))


@pytest.mark.gpu
@GPU_GLUON
@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("block_n", [32, 64, 128])
def test_gluon_swiglu_epilogue_with_a_bfloat16_output_at_each_tile_width(block_n, block_m):
    from moe_lab.reference import relative_error

    i = 384
    x_q, x_s, w1_q, w1_s, routing, used, gate_up = _up_operands(150, 5, 2, 640, i, block_m, empty=1)
    act = torch.full((routing.max_num_tokens_padded, i), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = GemmConfig(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n)
    grouped_matmul_fp8_gluon(
        x_q, w1_q, routing, cfg, gather_a=True, a_scale=x_s, w_scale=w1_s, activation="silu", out=act
    )
    assert relative_error(act[used].float(), _activation_reference(gate_up, "silu")) < 1e-2


def _layer_both_ways(monkeypatch, x, w1, w2, tw, ids, **kw):
    """fused_moe with the Gluon GEMMs forced on, then off: (out, info) each; outputs poisoned with NaN first."""
    results = []
    for setting in ("1", "0"):
        monkeypatch.setenv("MOE_LAB_GLUON", setting)
        plan_module.clear_layer_plans()
        out = torch.full_like(x, float("nan"))
        results.append(fused_moe(x, w1, w2, tw, ids, out=out, return_info=True, **kw))
    plan_module.clear_layer_plans()
    return results


@pytest.mark.gpu
@GPU_GLUON
@pytest.mark.parametrize(
    "t, e, k, h, i, empty, activation",
    [
        (1, 8, 2, 512, 256, 0, "silu"),
        (300, 6, 4, 1024, 384, 2, "silu"),  # E not a power of two, two experts empty
        (77, 16, 2, 208, 256, 8, "silu"),  # H not a multiple of 128
        (513, 8, 2, 2048, 1024, 3, "swigluoai"),
    ],
)
def test_fused_layer_with_gluon_matches_the_reference_and_the_triton_layer(
    monkeypatch, t, e, k, h, i, empty, activation
):
    from moe_lab.reference import fused_moe_reference, relative_error

    torch.manual_seed(0)
    x = torch.randn(t, h, device="cuda").bfloat16()
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    logits = torch.randn(t, e, device="cuda")
    logits[:, e - empty :] = -1e9
    tw, ids = moe_lab.topk_routing(logits, k)
    kw = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=(128, 128), activation=activation)
    (gluon, info), (triton_out, triton_info) = _layer_both_ways(monkeypatch, x, w1_q, w2_q, tw, ids, **kw)
    assert info.gemm_kernel == "gluon" and triton_info.gemm_kernel == "triton", (info.gemm_reason, triton_info)
    ref = fused_moe_reference(x, w1_q, w2_q, tw, ids, **kw)
    assert not gluon.isnan().any()
    assert relative_error(gluon.float(), ref) < 1e-2
    assert relative_error(gluon.float(), triton_out.float()) < 1e-2


@pytest.mark.gpu
@GPU_GLUON
def test_auto_runs_the_gluon_gemms_from_256_rows_per_expert(monkeypatch):
    """By default (MOE_LAB_GLUON unset: auto) a chunk of T * top_k / E >= GLUON_AUTO_ROWS_PER_EXPERT (256) runs
    the Gluon GEMMs and one token fewer runs the Triton ones; both within FP8's error of each other."""
    monkeypatch.delenv("MOE_LAB_GLUON", raising=False)
    plan_module.clear_layer_plans()
    e, k = 4, 2
    t = plan_module.GLUON_AUTO_ROWS_PER_EXPERT * e // k
    x, w1, w2, tw, ids, scales = _fp8_layer(t=t, e=e, k=k, device="cuda")
    wide, info = fused_moe(x, w1, w2, tw, ids, **scales, return_info=True)
    assert info.gemm_kernel == "gluon" and "auto: 256 rows per expert" in info.gemm_reason
    narrow, info = fused_moe(x[1:], w1, w2, tw[1:], ids[1:], **scales, return_info=True)
    assert info.gemm_kernel == "triton" and "< 256" in info.gemm_reason
    assert relative_error(narrow, wide[1:]) < 1e-2
    plan_module.clear_layer_plans()


@pytest.mark.gpu
@GPU_GLUON
def test_fused_layer_with_gluon_is_bitwise_the_same_in_any_batch(monkeypatch):
    torch.manual_seed(0)
    e, k, h, i = 8, 2, 1024, 512
    x = torch.randn(600, h, device="cuda").bfloat16()
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    tw, ids = moe_lab.topk_routing(torch.randn(600, e, device="cuda"), k)
    kw = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=(128, 128), return_info=True)
    monkeypatch.setenv("MOE_LAB_GLUON", "1")
    plan_module.clear_layer_plans()
    small, info_small = fused_moe(x[:3], w1_q, w2_q, tw[:3], ids[:3], **kw)
    large, info_large = fused_moe(x, w1_q, w2_q, tw, ids, **kw)  # BLOCK_SIZE_M 128 here, 64 above
    plan_module.clear_layer_plans()
    assert info_small.gemm_kernel == info_large.gemm_kernel == "gluon"
    assert info_small.gluon_plan.block_size_m == 64 and info_large.gluon_plan.block_size_m == 128
    assert torch.equal(small, large[:3])


@pytest.mark.gpu
@GPU_GLUON
def test_gluon_and_triton_layers_agree_closely(monkeypatch):
    """The Gluon layer against the Triton layer: within 1e-2, as each is of the float32 reference (bit for bit
    where the Triton up GEMM quantizes in its epilogue with 64-row tiles; not where it does not)."""
    torch.manual_seed(0)
    e, k, h, i = 8, 2, 1024, 1024
    x = torch.randn(600, h, device="cuda").bfloat16()
    w1_q, w1_s = quantize_weights_fp8(torch.randn(e, 2 * i, h, device="cuda") * h**-0.5)
    w2_q, w2_s = quantize_weights_fp8(torch.randn(e, h, i, device="cuda") * i**-0.5)
    tw, ids = moe_lab.topk_routing(torch.randn(600, e, device="cuda"), k)
    kw = dict(w1_scale=w1_s, w2_scale=w2_s, block_shape=(128, 128))
    (gluon, _), (triton_out, _) = _layer_both_ways(monkeypatch, x, w1_q, w2_q, tw, ids, **kw)
    assert relative_error(gluon, triton_out) < 1e-2
