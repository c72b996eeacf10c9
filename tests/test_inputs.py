"""Bad input gets a clear error naming the argument: devices, flags, buffers, configs, small launchers."""

import pytest
import torch

import moe_lab
from moe_lab import FusedMoE, GemmConfig, fused_moe, fused_moe_reference, relative_error
from moe_lab.configs import fit_to_shared_memory

from .conftest import DEVICE, ON_GPU, TOL, random_layer, random_topk_ids, small_layer

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def test_mixed_devices_are_named():
    if DEVICE.type != "cuda":
        pytest.skip("needs a second device type")
    hs, w1, w2, tw, ti = random_layer(4, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="one device"):
        fused_moe(hs.cpu(), w1, w2, tw, ti)


@pytest.mark.parametrize("use_tma", [0, 1, None, "yes", "true"])
def test_use_tma_takes_only_bools_and_auto(use_tma):
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(ValueError, match="use_tma must be True, False or 'auto'"):
        fused_moe(hs, w1, w2, tw, ti, use_tma=use_tma)
    with pytest.raises(ValueError, match="use_tma must be"):
        fused_moe(hs[:0], w1, w2, tw[:0], ti[:0], use_tma=use_tma)  # also when there is nothing to do
    with pytest.raises(ValueError, match="use_tma must be"):
        FusedMoE(w1, w2, use_tma=use_tma)


def test_overlapping_out_rows_are_refused():
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(ValueError, match="out's entries overlap"):
        fused_moe(hs, w1, w2, tw, ti, out=torch.zeros(1, 32, device=DEVICE).expand(8, 32))


def test_inference_only_is_said():
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(ValueError, match="w1 requires grad: fused_moe is inference-only"):
        fused_moe(hs, w1.clone().requires_grad_(), w2, tw, ti)
    with pytest.raises(ValueError, match="hidden_states requires grad: fused_moe is inference-only"):
        fused_moe(hs.requires_grad_(), w1, w2, tw, ti)
    bias = torch.zeros(w2.shape[0], w2.shape[1], device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="w2_bias requires grad: fused_moe is inference-only"):
        fused_moe(hs.detach(), w1, w2, tw, ti, w2_bias=bias)
    with torch.no_grad():
        fused_moe(hs, w1, w2, tw, ti)


@pytest.mark.parametrize("sparse", ["hidden_states", "w1"])
def test_sparse_tensors_are_named(sparse):
    hs, w1, w2, tw, ti = small_layer()
    args = dict(hidden_states=hs, w1=w1, w2=w2)
    args[sparse] = args[sparse].to_sparse()
    with pytest.raises(TypeError, match=f"{sparse} must be a dense \\(strided\\) tensor .*got layout torch.sparse_coo"):
        fused_moe(args["hidden_states"], args["w1"], args["w2"], tw, ti)


def test_small_launchers_validate():
    from moe_lab import silu_and_mul, topk_reduce

    with pytest.raises(ValueError, match="even last dimension"):
        silu_and_mul(torch.randn(5, 15, device=DEVICE))
    with pytest.raises(TypeError, match="routing must be an AlignedRouting"):
        silu_and_mul(torch.randn(5, 16, device=DEVICE), routing=3)
    ids = torch.tensor([[0, 1]], device=DEVICE)
    with pytest.raises(ValueError, match="num_experts must be >= 1"):
        topk_reduce(torch.randn(2, 4, device=DEVICE), ids, 0)
    with pytest.raises(TypeError, match="expert_map must be int32 or int64"):
        topk_reduce(torch.randn(2, 4, device=DEVICE), ids, 2, expert_map=torch.zeros(4, device=DEVICE))
    out_k = torch.randn(2, 4, device=DEVICE)
    with pytest.raises(ValueError, match="out shares memory with out_k"):
        topk_reduce(out_k, ids, 2, out=out_k[:1])
    with pytest.raises(ValueError, match="all tensors must be on one device, got out_k on .*, out on meta"):
        topk_reduce(out_k, ids, 2, out=torch.empty(1, 4, device="meta"))


@pytest.mark.skipif(ON_GPU, reason="meta tensors are refused under the interpreter (a GPU run compiles them)")
def test_meta_tensors_are_named_not_crashed():
    """Tensors on the meta device hold no data: a clear ValueError, not a copy error from inside a kernel."""
    from moe_lab import moe_align, topk_reduce

    ids = torch.zeros(1, 2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"the tensors \(topk_ids\) are on the meta device"):
        moe_align(ids, 2, 16)
    with pytest.raises(ValueError, match=r"the tensors \(out_k, topk_ids, out\) are on the meta device"):
        topk_reduce(torch.zeros(2, 4, device="meta"), ids, 2)


def test_cpu_tensors_where_kernels_run_on_the_gpu_are_named(monkeypatch):
    """On a machine with a GPU (the interpreter off) CPU tensors get a ValueError saying what to do, not Triton's
    'cannot be accessed from Triton (cpu tensor?)' from inside the launch."""
    from moe_lab import _validate, moe_align, quantize_activations_fp8

    monkeypatch.setattr(_validate, "interpreter_active", lambda: False)
    ids = torch.zeros(1, 2, dtype=torch.int32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"the tensors \(topk_ids\) are on the CPU, but kernels compile for the GPU"):
        moe_align(ids, 2, 16)
    with pytest.raises(ValueError, match=r"the tensors \(x\) are on the CPU, but kernels compile for the GPU"):
        quantize_activations_fp8(torch.ones(2, 128))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # TRITON_INTERPRET=0 on a machine without one
    with pytest.raises(ValueError, match="TRITON_INTERPRET is off and no CUDA GPU is visible: unset it, or set"):
        moe_align(ids, 2, 16)


def test_config_errors_name_the_key():
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(TypeError, match="config.BLOCK_SIZE_M must be an int"):
        fused_moe(hs, w1, w2, tw, ti, config={"BLOCK_SIZE_M": "32"})
    with pytest.raises(TypeError, match="takes no other keys"):
        fused_moe(hs, w1, w2, tw, ti, config={"up": {}, "bogus": 1})
    with pytest.raises(ValueError, match="<= 256"):
        GemmConfig(16, 2**20, 16)
    out = fused_moe(hs, w1, w2, tw, ti, config={"up": {"BLOCK_SIZE_N": 32}})  # merged onto the default
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]


def test_empty_expert_map_is_named():
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(ValueError, match=r"expert_map must have one entry per global expert \[E_global\]"):
        fused_moe(hs, w1, w2, tw, ti, expert_map=torch.zeros(0, dtype=torch.int32, device=DEVICE))


def test_config_takes_numpy_ints():
    """Sizes read from a numpy array or a JSON loader work as ints do, stored as Python ints (the kernels
    specialize on them); numpy floats and bools are still refused."""
    import numpy as np

    hs, w1, w2, tw, ti = small_layer()
    cfg = GemmConfig(np.int64(16), np.int32(32), np.int64(16), np.int64(1), np.int64(4), np.int64(2))
    assert all(type(v) is int for v in (cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.num_stages))
    assert cfg == GemmConfig(16, 32, 16, 1, 4, 2)
    out = fused_moe(hs, w1, w2, tw, ti, config={"BLOCK_SIZE_M": np.int64(16)})
    assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[torch.float32]
    with pytest.raises(TypeError, match="config.BLOCK_SIZE_N must be an int, got numpy.float64"):
        GemmConfig(16, np.float64(32))
    with pytest.raises(TypeError, match="config.num_warps must be an int, got bool"):
        GemmConfig(16, 32, num_warps=True)
    for flag in (np.True_, torch.tensor(True)):  # operator.index would take these as 1
        with pytest.raises(TypeError, match="config.num_stages must be an int, got .*bool"):
            GemmConfig(16, 32, num_stages=flag)
    # (from a breaker's trial) a huge GROUP_SIZE_M overflowed the kernel's int32 tile arithmetic into wrong
    # output; a huge num_stages made fitting to shared memory take one step per stage
    with pytest.raises(ValueError, match="config.GROUP_SIZE_M must be a power of two >= 1 and <= 1024, got 2048"):
        GemmConfig(GROUP_SIZE_M=2048)
    with pytest.raises(ValueError, match="config.num_stages must be <= 16, got 10000000"):
        GemmConfig(num_stages=10**7)


def test_align_takes_numpy_ints():
    """moe_align and its reference use the checked Python ints (a numpy int used to reach the kernel)."""
    import numpy as np

    from moe_lab import moe_align, moe_align_reference

    ids = random_topk_ids(5, 4, 2)
    for align in (moe_align, moe_align_reference):
        got, want = align(ids, np.int64(4), np.int32(16)), align(ids, 4, 16)
        assert type(got.block_size_m) is int and type(got.num_experts) is int
        assert torch.equal(got.sorted_token_ids, want.sorted_token_ids)
        assert torch.equal(got.expert_ids, want.expert_ids)
    with pytest.raises(TypeError, match="num_experts must be an int, got a 0-d bool tensor"):
        moe_align(ids, torch.tensor(True), 16)


def test_config_that_does_not_fit_is_clamped_or_refused():
    big = GemmConfig(128, 256, 128, 8, 8, 6)
    fitted = fit_to_shared_memory(big, 2, 232448)
    assert fitted.num_stages < 6 and fitted.shared_memory_bytes(2) <= 232448
    with pytest.raises(ValueError, match="shared memory even with one stage"):
        fit_to_shared_memory(big, 4, 64 * 1024)


def test_fused_moe_module_checks_weights_at_construction():
    with pytest.raises(ValueError, match="even, non-zero 2I"):
        FusedMoE(torch.randn(2, 5, 8, device=DEVICE), torch.randn(2, 8, 2, device=DEVICE))
    with pytest.raises(TypeError, match="the dtype of w1"):
        FusedMoE(torch.randn(2, 4, 8, device=DEVICE), torch.randn(2, 8, 2, device=DEVICE, dtype=torch.float16))
    # its expert_map too, once, as fused_moe would refuse it at the first forward
    w1, w2 = torch.randn(2, 4, 8, device=DEVICE), torch.randn(2, 8, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"expert_map must hold local experts in \[0, 2\) or -1, got values from 10"):
        FusedMoE(w1, w2, expert_map=torch.arange(4, device=DEVICE) + 10)
    with pytest.raises(ValueError, match="shared_w1 with expert_map is not supported"):
        FusedMoE(w1, w2, expert_map=torch.arange(2, device=DEVICE), shared_w1=w1[:1], shared_w2=w2[:1])


def test_a_routing_built_by_hand_is_checked():
    """AlignedRouting is public: one built by hand (another engine's align output) with a float or list schedule
    or float sizes gets a TypeError naming the field, not an error from inside a kernel."""
    import dataclasses

    from moe_lab import grouped_matmul, moe_align, permute_tokens

    ids = torch.randint(0, 4, (8, 2), dtype=torch.int32, device=DEVICE)
    routing = moe_align(ids, 4, 16)
    x, w = torch.randn(8, 32, device=DEVICE), torch.randn(4, 32, 32, device=DEVICE)
    for field, value, words in (
        ("sorted_token_ids", routing.sorted_token_ids.float(), "routing.sorted_token_ids must be int32 or int64"),
        ("sorted_token_ids", routing.sorted_token_ids.tolist(), "routing.sorted_token_ids must be a torch.Tensor"),
        ("num_tokens_post_padded", 64, r"routing.num_tokens_post_padded must be a torch.Tensor \[1\], got int"),
        ("expert_ids", routing.expert_ids[None], r"routing.expert_ids must have 1 dimension \[max_num_m_blocks\]"),
        ("block_size_m", 16.0, "routing.block_size_m must be an int, got float"),
    ):
        bad = dataclasses.replace(routing, **{field: value})
        with pytest.raises((TypeError, ValueError), match=words):
            grouped_matmul(x, w, bad, GemmConfig(16, 32, 32), gather_a=True)
        with pytest.raises((TypeError, ValueError), match=words):
            permute_tokens(x, bad)


def test_mixed_float_dtypes_name_both():
    """float16 hidden_states with float32 weights: neither is wrong alone, so the message names both."""
    hs, w1, w2, tw, ti = small_layer()
    with pytest.raises(TypeError, match="hidden_states is float16 but w1 is float32: the layer computes in one dtype"):
        fused_moe(hs.half(), w1, w2, tw, ti)
    with pytest.raises(TypeError, match=r"w2 must be float16 \(the dtype of w1\), got float32"):
        fused_moe(hs.half(), w1.half(), w2, tw, ti)


@pytest.mark.parametrize("num_tokens", [0, 3])
def test_strict_tma_refuses_unaligned_weights_whatever_the_batch(num_tokens):
    """use_tma=True holds at T = 0 (an idle rank) as at T > 0: no surprise when traffic arrives."""
    if not moe_lab.tma_support().available:
        pytest.skip("no TMA path on this device")
    hs, w1, w2, tw, ti = random_layer(num_tokens, 2, 1, 511, 32, torch.bfloat16)  # rows of 1022 bytes
    with pytest.raises(ValueError, match="use_tma=True but w1 "):
        fused_moe(hs, w1, w2, tw, ti, use_tma=True)
    hs, w1, w2, tw, ti = random_layer(num_tokens, 2, 1, 512, 33, torch.bfloat16)  # w2's rows of 66 bytes
    with pytest.raises(ValueError, match="use_tma=True but w2 "):
        fused_moe(hs, w1, w2, tw, ti, use_tma=True)


def test_no_experts_is_named_as_such():
    from moe_lab import fused_moe

    with pytest.raises(ValueError, match="w1 must have shape .* with at least one expert, got \\(0, 64, 32\\)"):
        fused_moe(
            torch.randn(2, 32, device=DEVICE),
            torch.randn(0, 64, 32, device=DEVICE),
            torch.randn(0, 32, 32, device=DEVICE),
            torch.ones(2, 1, device=DEVICE),
            torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
        )


def test_launchers_refuse_an_out_over_what_they_read():
    from moe_lab import grouped_matmul, silu_and_mul
    from moe_lab.align import slot_order_routing

    x = torch.randn(8, 64, device=DEVICE)
    with pytest.raises(ValueError, match="out shares memory with x"):
        silu_and_mul(x, out=x.view(-1)[256:].view(8, 32))
    hs, w1, w2, tw, ti = random_layer(1, 8, 4, 32, 32, torch.float32)
    routing = slot_order_routing(ti.int(), 8, 16)
    act = torch.randn(routing.max_num_tokens_padded, 32, device=DEVICE)
    buf = torch.empty(4 + 4 * 32, device=DEVICE)  # topk_weights in row 0 of out
    buf[:4] = tw.reshape(-1)
    with pytest.raises(ValueError, match="out shares memory with topk_weights"):
        grouped_matmul(
            act,
            w2,
            routing,
            GemmConfig(16, 32, 32, 1),
            gather_a=False,
            scatter=True,
            topk_weights=buf[:4].view(1, 4),
            out=buf[:128].view(4, 32),
        )
    buf = torch.zeros(4 * 32, device=DEVICE)  # the ids (slot order's block map) in row 0 of out
    ids = buf[:4].view(torch.int32).view(1, 4)
    ids.copy_(ti)
    with pytest.raises(ValueError, match="out shares memory with expert_ids"):
        grouped_matmul(
            act,
            w2,
            slot_order_routing(ids, 8, 16),
            GemmConfig(16, 32, 32, 1),
            gather_a=False,
            scatter=True,
            out=buf.view(4, 32),
        )


def test_the_reference_names_bad_routing_as_fused_moe_does():
    """fused_moe_reference is the check users compare with: experts out of range would add nothing (a zero
    output that looks like a result), and a [T, k] mismatch would fail deep in torch."""
    hs, w1, w2 = torch.randn(4, 48), torch.randn(4, 32, 48), torch.randn(4, 48, 16)
    ids, weights = torch.zeros(4, 2, dtype=torch.int32), torch.ones(4, 2)
    with pytest.raises(ValueError, match=r"topk_ids must hold experts in \[0, 4\), got values from 4 to 4"):
        fused_moe_reference(hs, w1, w2, weights, ids + 4)
    with pytest.raises(ValueError, match=r"topk_weights must have shape \[T, k\]"):
        fused_moe_reference(hs, w1, w2, weights[:2], ids)


def test_the_reference_names_bad_weights_as_fused_moe_does():
    """w1 not [E, 2I, H], w2 not [E, H, I], or the two (or hidden_states) disagreeing on E, H or I: a
    ValueError naming the argument and the shapes, the words of fused_moe's own check."""
    hs, w1, w2 = torch.randn(4, 48), torch.randn(4, 32, 48), torch.randn(4, 48, 16)
    ids, weights = torch.zeros(4, 2, dtype=torch.int32), torch.ones(4, 2)
    for bad_w1, bad_w2, says in (
        (w1[..., :40], w2, r"w1 must have shape \[E, 2I, H\] with H = 48 \(the last dimension of hidden_states\), got"),
        (w1[:, :31], w2, r"w1 must have shape \[E, 2I, H\] with an even, non-zero 2I, got \(4, 31, 48\)"),
        (w1, w2[:3], r"w2 must have shape \[E, H, I\] = \[4, 48, 16\], got \(3, 48, 16\)"),
        (w1, w2[:, :, :8], r"w2 must have shape \[E, H, I\] = \[4, 48, 16\], got \(4, 48, 8\)"),
        (w1, w2.transpose(1, 2), r"w2 .* = \[4, 48, 16\], got \(4, 16, 48\): stored \[E, I, H\]\? Pass w2.transpose"),
        (w1[:, :16], w2, r"w1 must have shape \[E, 2I, H\] \(gate rows, then up rows\) = \[4, 32, 48\]"),
    ):
        with pytest.raises(ValueError, match=says):
            fused_moe_reference(hs, bad_w1, bad_w2, weights, ids)
        with pytest.raises(ValueError, match=says):
            fused_moe(hs, bad_w1, bad_w2, weights, ids)
    with pytest.raises(ValueError, match=r"shared_w2 must have shape \[S, H, I_s\]"):
        fused_moe_reference(hs, w1, w2, weights, ids, shared_w1=w1[:1], shared_w2=w2[:1, :, :4])


def test_weights_stored_transposed_are_named_with_the_view_to_pass():
    """w1 stored [E, H, 2I] (transformers' is_transposed layout): w1 is blamed, not w2, with the view to pass,
    in fused_moe (H from hidden_states) and in FusedMoE (H from w2)."""
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 16, 4, torch.float32)  # H = 16, 2I = 8 (2I = H tells nothing)
    stored = w1.transpose(1, 2).contiguous()  # [E, H, 2I]
    with pytest.raises(ValueError, match=r"w1 must have shape \[E, 2I, H\], got \(4, 16, 8\): stored \[E, H, 2I\]"):
        fused_moe(hs, stored, w2, tw, ti)
    with pytest.raises(ValueError, match=r"Pass w1.transpose\(1, 2\)"):
        FusedMoE(stored, w2)
    with pytest.raises(ValueError, match=r"Pass w1.transpose\(1, 2\)"):  # both stored transposed: w1 first
        FusedMoE(stored, w2.transpose(1, 2).contiguous())
    fused_moe(hs, stored.transpose(1, 2), w2, tw, ti)  # the view runs
    # a shared w1 whose H is wrong, with 2I_s = H: not taken for transposed where its w2 does not fit that
    with pytest.raises(ValueError, match=r"shared_w1 must have shape \[S, 2I_s, H\] with H = 16 \(the last dimension"):
        fused_moe(
            hs,
            w1,
            w2,
            tw,
            ti,
            shared_w1=torch.randn(1, 16, 8, device=DEVICE),
            shared_w2=torch.randn(1, 8, 8, device=DEVICE),
        )


def test_ids_past_an_expert_map_name_its_length():
    """An expert_map shorter than the global experts the call implies is named, not topk_ids: by the ids' values
    (read on the CPU, or with check_ids=True) and by their k columns; negative ids are still topk_ids'."""
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 16, 8, torch.float32)
    short = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    check = None if DEVICE.type == "cpu" else True
    with pytest.raises(
        ValueError,
        match=r"expert_map must have one entry per global expert \[E_global\]: topk_ids "
        r"name experts up to 3 \(E_global >= 4\), got shape \(3,\)",
    ):
        fused_moe(hs, w1, w2, tw, torch.full_like(ti, 3), expert_map=short, check_ids=check)
    with pytest.raises(ValueError, match=r"expert_map must have one entry per global expert \[E_global\]: topk_ids"):
        fused_moe_reference(hs, w1, w2, tw, torch.full_like(ti, 3), expert_map=short)
    with pytest.raises(ValueError, match=r"expert_map must .* E_global >= k=2 \(topk_ids' columns\), got shape \(1,\)"):
        fused_moe(hs, w1, w2, tw, ti, expert_map=short[:1])
    negative = torch.full_like(ti, 3)
    negative[0, 0] = -1
    with pytest.raises(ValueError, match=r"topk_ids must hold experts in \[0, 3\) \(E_global: expert_map's length\)"):
        fused_moe(hs, w1, w2, tw, negative, expert_map=short, check_ids=check)


def test_repeated_expert_map_entries_are_refused():
    """Two global experts on one local weight is a mistake in the map: refused where its values are read (the
    CPU, or check_ids=True; on a GPU by default no check reads them back)."""
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 16, 8, torch.float32)
    twice = torch.tensor([0, 1, -1, 1], dtype=torch.int32, device=DEVICE)
    check = None if DEVICE.type == "cpu" else True
    match = r"expert_map must map each local expert to at most one global expert .* got global experts \[1, 3\] all"
    with pytest.raises(ValueError, match=match + r" mapped to local expert 1"):
        fused_moe(hs, w1[:2], w2[:2], tw, ti, expert_map=twice, check_ids=check)
    with pytest.raises(ValueError, match=match):
        fused_moe_reference(hs, w1[:2], w2[:2], tw, ti, expert_map=twice)
    fused_moe(hs, w1[:2], w2[:2], tw, ti, expert_map=twice, check_ids=False)  # unchecked: as asked
    several_elsewhere = torch.tensor([-1, 1, -1, 0], dtype=torch.int32, device=DEVICE)  # -1 may repeat
    out = fused_moe(hs, w1[:2], w2[:2], tw, ti, expert_map=several_elsewhere, check_ids=check)
    ref = fused_moe_reference(hs, w1[:2], w2[:2], tw, ti, expert_map=several_elsewhere)
    assert relative_error(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("variable", ["MOE_LAB_TMA", "MOE_LAB_GLUON"])
def test_bad_environment_setting_is_shown_as_set(variable, monkeypatch):
    from moe_lab import capability, plan

    setting = {"MOE_LAB_TMA": capability.env_override, "MOE_LAB_GLUON": plan.gluon_setting}[variable]
    monkeypatch.setenv(variable, " YES")
    with pytest.raises(ValueError, match=rf"{variable} must be 0, 1 or auto, got ' YES'"):
        setting()
    monkeypatch.setenv(variable, " Auto ")  # read case- and space-insensitively, as before
    assert setting() == "auto"


def test_references_take_cpu_tensors_where_kernels_run_on_the_gpu(monkeypatch):
    """The pure-torch references check devices but launch nothing: CPU tensors stay fine with the interpreter off."""
    from moe_lab import _validate, moe_align_reference

    monkeypatch.setattr(_validate, "interpreter_active", lambda: False)
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    assert moe_align_reference(ids, 2, 16).num_tokens_post_padded.item() == 32


@pytest.mark.parametrize("var", ["MOE_LAB_TMA", "MOE_LAB_GLUON"])
def test_an_empty_environment_setting_counts_as_unset(monkeypatch, var):
    from moe_lab.capability import env_override
    from moe_lab.plan import gluon_setting

    monkeypatch.setenv(var, " ")
    assert (env_override if var == "MOE_LAB_TMA" else gluon_setting)() == "auto"


def test_negated_views_are_refused_where_kernels_read_memory():
    """torch's lazy negation bit (x.conj().imag, torch._neg_view) leaves memory holding -x: a kernel would read
    the wrong sign, so every kernel input and output refuses it by name; topk_routing (torch ops) takes it."""
    hs, w1, w2, tw, ti = small_layer()
    neg = torch._neg_view
    fused_moe(hs, w1, w2, tw, ti)  # a plan cached for these shapes must not let the bit through
    for args, name in (
        ((neg(hs), w1, w2, tw, ti), "hidden_states"),
        ((hs, neg(w1), w2, tw, ti), "w1"),
        ((hs, w1, neg(w2), tw, ti), "w2"),
        ((hs, w1, w2, neg(tw), ti), "topk_weights"),
    ):
        with pytest.raises(ValueError, match=f"{name} is a negated view .*pass {name}.resolve_neg"):
            fused_moe(*args)
    with pytest.raises(ValueError, match="out is a negated view"):
        fused_moe(hs, w1, w2, tw, ti, out=neg(torch.empty_like(hs)))
    with pytest.raises(ValueError, match="x is a negated view"):
        moe_lab.silu_and_mul(neg(torch.randn(4, 64, device=DEVICE)))
    with pytest.raises(ValueError, match="out_k is a negated view"):
        moe_lab.topk_reduce(neg(torch.randn(ti.numel(), hs.shape[1], device=DEVICE)), ti, w1.shape[0])
    with pytest.raises(ValueError, match="w1 is a negated view"):
        FusedMoE(neg(w1), w2)
    logits = torch.randn(5, 8, device=DEVICE)
    got, want = moe_lab.topk_routing(neg(logits), 2), moe_lab.topk_routing(-logits, 2)
    assert torch.equal(got.topk_ids, want.topk_ids) and torch.equal(got.topk_weights, want.topk_weights)
    assert relative_error(neg(logits), logits) == 2.0  # torch ops honour the bit


def test_outputs_whose_entries_share_memory_are_refused():
    hs, w1, w2, tw, ti = small_layer()
    t, h = hs.shape
    with pytest.raises(ValueError, match="out's entries overlap in memory"):  # rows half a row apart
        fused_moe(
            hs, w1, w2, tw, ti, out=torch.empty(t * h, device=DEVICE, dtype=hs.dtype).as_strided((t, h), (h // 2, 1))
        )
    roomy = torch.empty(t, 2 * h, device=DEVICE, dtype=hs.dtype)[:, :h]  # rows apart, not dense: fine
    assert relative_error(fused_moe(hs, w1, w2, tw, ti, out=roomy), fused_moe_reference(hs, w1, w2, tw, ti)) < 1e-2


def test_shared_experts_of_a_dtype_the_module_cannot_run_are_refused_when_built():
    hs, w1, w2, tw, ti = small_layer()
    other = torch.float64
    with pytest.raises(TypeError, match=f"shared_w1 must be {str(w1.dtype)[6:]} \\(the dtype of w1\\), got float64"):
        FusedMoE(w1, w2, shared_w1=w1[:1].to(other), shared_w2=w2[:1].to(other))


def test_relative_error_refuses_meta_and_does_not_overflow():
    with pytest.raises(TypeError, match="out must be a tensor with data, got one on meta"):
        relative_error(torch.zeros(2, device="meta"), torch.zeros(2))
    big = torch.full((2,), 1e308, dtype=torch.float64)
    assert relative_error(big, big / 2) == pytest.approx(1.0)
    tiny = torch.full((2,), 1e-308, dtype=torch.float64)  # squares underflow: the norms would read 0
    assert relative_error(tiny, tiny / 2) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (-1, ValueError, "num_tokens must be >= 0, got -1"),
        (1.5, TypeError, "num_tokens must be an int, got float 1.5"),
        (True, TypeError, "num_tokens must be an int, got bool True"),
    ],
)
def test_preset_flops_checks_num_tokens(bad, error, message):
    with pytest.raises(error, match=message):
        moe_lab.get_preset("mixtral-8x7b").flops(bad)
