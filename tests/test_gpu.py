"""GPU-only tests (marker `gpu`): real model sizes, large offsets, CUDA graphs. Run on an H200 with
`pytest -m gpu`; they skip cleanly elsewhere."""

import pytest
import torch

from moe_lab import fused_moe, fused_moe_reference, get_preset, relative_error, tma_support

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("use_tma", [False, "auto"])
@pytest.mark.parametrize("num_tokens", [1, 64, 4096])
@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_real_presets(model, num_tokens, use_tma):
    hs, w1, w2, (tw, ti) = get_preset(model).build(num_tokens, dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(hs, float("nan"))
    fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma, out=out)
    err = relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti))
    print(f"{model} T={num_tokens} use_tma={use_tma}: rel err {err:.2e}")
    assert err < 1e-2


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("fuse", [True, False])
def test_unaligned_weight_rows_take_scalar_pointer_loads(fuse, persistent):
    """w1 rows H + 1 elements apart (a view into a wider buffer) cannot go through TMA, and their pointer
    loads must not be vectorized. A first SwiGLU epilogue computed its gate/up row indices in a form whose
    alignment Triton overestimated: 16-byte copies from odd addresses, "misaligned address" on an H200
    (notebook 06 §4). Its compile-only twin is in test_compile_check.py."""
    from moe_lab import GemmConfig

    hs, w1, w2, (tw, ti) = get_preset("mixtral-8x7b").scaled(8).build(256, dtype=torch.bfloat16, device="cuda")
    e, two_i, h = w1.shape
    w1_odd = torch.zeros(e, two_i, h + 1, dtype=w1.dtype, device="cuda")[:, :, :h]
    w1_odd.copy_(w1)
    cfg = GemmConfig(128, 256, 64, 8, 8, 3, fuse_swiglu=fuse, persistent=persistent)
    out, info = fused_moe(hs, w1_odd, w2, tw, ti, config=cfg, return_info=True)
    torch.cuda.synchronize()
    assert not info.up_plan.path.w_tma and info.up_plan.swiglu == fuse
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_tma_is_available_on_hopper():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("not a Hopper GPU")
    assert tma_support("cuda").available


def test_offsets_past_2_31():
    """T*k*H = 100000*6*4096 > 2^31: token offsets must be int64."""
    num_tokens, top_k, hidden, inter, num_experts = 100_000, 6, 4096, 128, 8
    assert num_tokens * top_k * hidden > 2**31
    torch.manual_seed(0)
    hs = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w1 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda") / hidden**0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden, inter, device="cuda") / inter**0.5).bfloat16()
    ti = torch.rand(num_tokens, num_experts, device="cuda").topk(top_k, dim=1).indices.int()
    tw = torch.softmax(torch.randn(num_tokens, top_k, device="cuda"), -1)
    out = fused_moe(hs, w1, w2, tw, ti)
    rows = torch.arange(num_tokens - 2000, num_tokens, device="cuda")  # the far end of the offsets
    ref = fused_moe_reference(hs[rows], w1, w2, tw[rows], ti[rows])
    assert relative_error(out[rows], ref) < 1e-2
    assert torch.isfinite(out).all()


def test_cuda_graph_capture_and_replay_with_new_inputs():
    preset = get_preset("qwen3-30b-a3b")
    hs, w1, w2, (tw, ti) = preset.build(64, dtype=torch.bfloat16, device="cuda", seed=1)
    out = torch.empty_like(hs)
    fused_moe(hs, w1, w2, tw, ti, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe(hs, w1, w2, tw, ti, out=out)
    hs2, _, _, (tw2, ti2) = preset.build(64, dtype=torch.bfloat16, device="cuda", seed=2)
    hs.copy_(hs2), tw.copy_(tw2), ti.copy_(ti2)
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, fused_moe_reference(hs2, w1, w2, tw2, ti2)) < 1e-2


def test_no_host_sync():
    hs, w1, w2, (tw, ti) = get_preset("olmoe-1b-7b").build(32, dtype=torch.bfloat16, device="cuda")
    fused_moe(hs, w1, w2, tw, ti)  # warm up (compilation may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused_moe(hs, w1, w2, tw, ti)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_new_token_counts_do_not_recompile():
    """40 different T with one config: the kernels compile a bounded set of variants, not one per T."""
    from moe_lab import GemmConfig
    from moe_lab._kernels.align import count_kernel, prefix_kernel, scatter_kernel
    from moe_lab._kernels.grouped_matmul import grouped_matmul_kernel

    kernels = (count_kernel, prefix_kernel, scatter_kernel, grouped_matmul_kernel)
    preset = get_preset("olmoe-1b-7b")
    cfg = GemmConfig(16, 64, 128, 1, 4, 3)

    def compiled():
        dev = torch.cuda.current_device()
        return sum(len(k.device_caches[dev][0]) for k in kernels)

    hs, w1, w2, (tw, ti) = preset.build(48, dtype=torch.bfloat16, device="cuda")
    fused_moe(hs, w1, w2, tw, ti, config=cfg)
    before = compiled()
    for num_tokens in range(1, 200, 5):  # 40 token counts
        fused_moe(hs[:num_tokens], w1, w2, tw[:num_tokens], ti[:num_tokens], config=cfg)
    grown = compiled() - before
    print(f"compiled variants added over 40 token counts: {grown}")
    assert grown <= 4


def test_one_token_in_slot_order_neither_syncs_nor_recompiles():
    """T = 1 takes slot order: its first call makes the schedule's rows on the device (no host sync), and
    a token's ids at any offset (k = 3: rows 12 bytes apart) reuse the kernels compiled for the first."""
    from moe_lab import GemmConfig
    from moe_lab._kernels.grouped_matmul import grouped_matmul_kernel

    preset = get_preset("olmoe-1b-7b")
    cfg = GemmConfig(16, 64, 128, 1, 4, 3)
    hs, w1, w2, (tw, ti) = preset.build(8, dtype=torch.bfloat16, device="cuda")
    tw, ti = tw[:, :3].contiguous(), ti[:, :3].contiguous()
    fused_moe(hs, w1, w2, tw, ti, config=cfg)  # compiles the GEMMs at T = 8
    fused_moe(hs[:1], w1, w2, tw[:1], ti[:1], config=cfg, expert_map=torch.arange(64, device="cuda"))
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    before = len(grouped_matmul_kernel.device_caches[dev][0])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for row in range(8):
            out, info = fused_moe(
                hs[row : row + 1], w1, w2, tw[row : row + 1], ti[row : row + 1], config=cfg, return_info=True
            )
            assert not info.routing.expert_sorted
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(grouped_matmul_kernel.device_caches[dev][0]) == before
    assert relative_error(out, fused_moe_reference(hs[7:], w1, w2, tw[7:], ti[7:])) < 1e-2


def test_oversized_config_is_clamped_not_crashing():
    from moe_lab import GemmConfig

    hs, w1, w2, (tw, ti) = get_preset("qwen3-30b-a3b").build(256, dtype=torch.bfloat16, device="cuda")
    big = GemmConfig(128, 256, 128, 8, 8, 8)  # 8 stages of 96 KB: far past 227 KB
    out = fused_moe(hs, w1, w2, tw, ti, config=big)
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_chunked_large_batch_matches():
    hs, w1, w2, (tw, ti) = get_preset("olmoe-1b-7b").build(3000, dtype=torch.bfloat16, device="cuda")
    whole = fused_moe(hs, w1, w2, tw, ti)
    chunked = fused_moe(hs, w1, w2, tw, ti, chunk_size=1024)
    assert relative_error(chunked, whole) < 1e-2
    assert relative_error(whole, fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_determinism_bitwise():
    hs, w1, w2, (tw, ti) = get_preset("qwen3-30b-a3b").build(1024, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(fused_moe(hs, w1, w2, tw, ti), fused_moe(hs, w1, w2, tw, ti))


def test_check_ids_on_gpu_when_asked():
    hs, w1, w2, (tw, ti) = get_preset("olmoe-1b-7b").build(8, dtype=torch.bfloat16, device="cuda")
    ti[0, 0] = 64
    with pytest.raises(ValueError, match="topk_ids must hold experts"):
        fused_moe(hs, w1, w2, tw, ti, check_ids=True)


def test_torch_compile_on_gpu():
    from moe_lab import FusedMoE

    hs, w1, w2, (tw, ti) = get_preset("olmoe-1b-7b").build(64, dtype=torch.bfloat16, device="cuda")
    module = FusedMoE(w1, w2)
    compiled = torch.compile(module, fullgraph=True)
    assert relative_error(compiled(hs, tw, ti), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_expert_parallel_two_gpus():
    """examples/expert_parallel.py on two GPUs of one host (NCCL), both modes, checked against one GPU."""
    import os
    import subprocess
    import sys

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            os.path.join(root, "examples", "expert_parallel.py"),
            "--tokens",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    print(run.stdout[-2000:], run.stderr[-2000:])
    assert run.returncode == 0 and "ok" in run.stdout


FP8_POINTS = [
    ("qwen3-30b-a3b", 1),
    ("qwen3-30b-a3b", 64),
    ("qwen3-30b-a3b", 4096),
    ("mixtral-8x7b", 8),
    ("mixtral-8x7b", 4096),
    ("deepseek-v3", 1),
    ("deepseek-v3", 64),
]


@pytest.mark.parametrize("use_tma", [False, "auto"])
@pytest.mark.parametrize("model,num_tokens", FP8_POINTS)
def test_fp8_real_presets(model, num_tokens, use_tma):
    """The FP8 layer (w8a8, [128, 128] weight blocks, as DeepSeek-V3 ships; the shipped tuned FP8 configs)
    at real shapes, both load paths, NaN-poisoned output, against float32 math on the dequantized operands
    (`fused_moe_reference` quantizes each GEMM's input as the layer does): the kernels' error alone. The
    unit tests (tests/test_fp8.py) cover every format on small shapes; this covers what only a GPU runs:
    wgmma and mma.sync float8 tiles, TMA boxes of float8, the tuned decode and prefill configs."""
    preset = get_preset(model)
    hs, w1, w2, (tw, ti) = preset.build(num_tokens, dtype=torch.bfloat16, device="cuda")
    w1_q, w2_q, scales = preset.quantize_fp8(w1, w2)
    del w1, w2
    out = torch.full_like(hs, float("nan"))
    _, info = fused_moe(hs, w1_q, w2_q, tw, ti, use_tma=use_tma, out=out, return_info=True, **scales)
    err = relative_error(out, fused_moe_reference(hs, w1_q, w2_q, tw, ti, **scales))
    torch.cuda.empty_cache()
    print(
        f"FP8 {model} T={num_tokens} use_tma={use_tma} ({info.up_path.name}, {info.down_path.name}): rel err {err:.2e}"
    )
    assert err < 1e-2
    if use_tma is False:
        assert not (info.up_path.w_tma or info.down_path.w_tma)


@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_per_channel_and_per_tensor_at_a_real_shape(per_channel):
    """Per-channel weights with per-token activations, and per-tensor scales, on Qwen3-30B-A3B at T = 256:
    the scales enter once, after the K loop."""
    from moe_lab import quantize_weights_fp8

    hs, w1, w2, (tw, ti) = get_preset("qwen3-30b-a3b").build(256, dtype=torch.bfloat16, device="cuda")
    (w1_q, w1_s), (w2_q, w2_s) = (quantize_weights_fp8(w, None, per_channel=per_channel) for w in (w1, w2))
    scales = dict(w1_scale=w1_s, w2_scale=w2_s)
    out = fused_moe(hs, w1_q, w2_q, tw, ti, **scales)
    assert relative_error(out, fused_moe_reference(hs, w1_q, w2_q, tw, ti, **scales)) < 1e-2
