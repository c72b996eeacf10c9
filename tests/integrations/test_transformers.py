"""moe-lab as transformers' experts implementation (moe_lab.integrations.transformers): tiny random models
built from configs (no downloads), their experts and whole-model logits against transformers' eager experts,
the registration, and the experts it refuses. The `gpu` tests run real sizes on an H200."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface, use_experts_implementation  # noqa: E402

import moe_lab.integrations.transformers as moe_tf  # noqa: E402
from moe_lab import fused_moe_reference, quantize_weights_fp8, relative_error  # noqa: E402
from tests.conftest import DEVICE, random_topk_ids  # noqa: E402

# Tiny shapes: the interpreter runs every expert GEMM. E is not a power of two in three of the six.
COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
MODELS = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=6)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(moe_intermediate_size=16, num_experts=6, num_experts_per_tok=3, head_dim=8)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=16, num_experts=5, num_experts_per_tok=2)),
    "deepseek_v2": ("DeepseekV2Config", dict(MLA, moe_intermediate_size=16, n_routed_experts=6, num_experts_per_tok=2,
                                             n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None)),
    "deepseek_v3": ("DeepseekV3Config", dict(MLA, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                                             n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=16, n_group=2,
                                             topk_group=1)),
}  # fmt: skip


def tiny_model(name, dtype=torch.float32, **changes):
    config_class, sizes = MODELS[name] if name in MODELS else (name, {})
    config = getattr(transformers, config_class)(**{**COMMON, **sizes, **changes})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager", dtype=dtype)
    return model.to(DEVICE).eval()


def experts_of(model):
    return next(m for m in model.modules() if hasattr(m, "gate_up_proj"))


@pytest.fixture
def calls(monkeypatch):
    """How many times the integration called fused_moe (so a match cannot come from transformers' own code)."""
    count = [0]
    real = moe_tf.fused_moe

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(moe_tf, "fused_moe", counted)
    return count


# -- registration ---------------------------------------------------------------------------------------------


def test_import_registers_moe_lab():
    assert ALL_EXPERTS_FUNCTIONS["moe_lab"] is moe_tf.experts_forward
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    assert fp8.ALL_FP8_EXPERTS_FUNCTIONS["moe_lab"] is moe_tf.experts_forward


def test_experts_modules_lists_what_the_registry_dispatches():
    model = tiny_model("mixtral")
    names = [name for name, _ in moe_tf.experts_modules(model)]
    assert len(names) == model.config.num_hidden_layers and all(name.endswith("experts") for name in names)
    llama4 = tiny_model(
        "Llama4TextConfig", intermediate_size=16, intermediate_size_mlp=16, num_local_experts=4, head_dim=8
    )
    assert moe_tf.experts_modules(llama4) == []  # its experts keep their own code: the setting changes nothing
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        moe_tf.experts_modules("mixtral")
    # A subclass whose forward calls the decorated one (transformers' ErgoExperts): reached, so listed.
    experts = model.model.layers[0].mlp.experts

    class Subclassed(type(experts)):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    experts.__class__ = Subclassed
    assert [name for name, _ in moe_tf.experts_modules(model)] == names


def test_register_is_idempotent_and_checks_its_name():
    assert moe_tf.register() == "moe_lab" and moe_tf.register() == "moe_lab"
    try:
        assert moe_tf.register("moe_lab_test") == "moe_lab_test"
        assert moe_tf.register("moe_lab_test") == "moe_lab_test"
        assert ALL_EXPERTS_FUNCTIONS["moe_lab_test"] is moe_tf.experts_forward
    finally:
        for registry in (ExpertsInterface, moe_tf.FP8ExpertsInterface):
            if registry is not None:
                registry._global_mapping.pop("moe_lab_test", None)
    with pytest.raises(ValueError, match="'grouped_mm' is already transformers' experts implementation"):
        moe_tf.register("grouped_mm")
    with pytest.raises(TypeError, match="name must be a str, got int"):
        moe_tf.register(3)
    with pytest.raises(ValueError, match="non-empty name other than 'eager'"):
        moe_tf.register("")


# -- models against transformers' eager experts --------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_experts_module_matches_eager(name, calls):
    """One experts module, random routing (top_k of the config; E = 5, 6 not powers of two)."""
    model = tiny_model(name)
    experts = experts_of(model)
    num_experts, top_k = experts.gate_up_proj.shape[0], model.config.num_experts_per_tok
    hidden = torch.randn(7, model.config.hidden_size, device=DEVICE)
    ids = random_topk_ids(7, num_experts, top_k).long()
    weights = torch.softmax(torch.randn(7, top_k, device=DEVICE), dim=-1)
    with torch.no_grad():
        ref = experts(hidden, ids, weights)
        model.set_experts_implementation("moe_lab")
        out = experts(hidden, ids, weights)
    assert calls[0] == 1
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("name", list(MODELS))
def test_model_logits_match_eager_float32(name, calls):
    model = tiny_model(name)
    input_ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    with torch.no_grad():
        ref = model(input_ids).logits
        model.set_experts_implementation("moe_lab")
        out = model(input_ids).logits
    assert calls[0] == sum(1 for m in model.modules() if hasattr(m, "gate_up_proj"))
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3"])
def test_model_logits_match_eager_bfloat16(name, calls):
    model = tiny_model(name, dtype=torch.bfloat16)
    input_ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    with torch.no_grad():
        ref = model(input_ids).logits
        model.set_experts_implementation("moe_lab")
        out = model(input_ids).logits
    assert calls[0] > 0 and out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 2e-2


def test_from_config_and_generate():
    """experts_implementation="moe_lab" at construction; greedy decoding (T = 1 per step) as eager's."""
    model = tiny_model("qwen3_moe")
    input_ids = torch.randint(0, 64, (1, 4), device=DEVICE)
    ref = model.generate(input_ids, max_new_tokens=3, do_sample=False)
    ours = AutoModelForCausalLM.from_config(model.config, experts_implementation="moe_lab").to(DEVICE).eval()
    ours.load_state_dict(model.state_dict())
    assert ours.config._experts_implementation == "moe_lab"
    assert torch.equal(ours.generate(input_ids, max_new_tokens=3, do_sample=False), ref)


@pytest.mark.parametrize("name", ["qwen3_moe", "GptOssConfig"])
def test_sparse_block_under_torch_compile_is_one_graph(name, calls):
    """Under torch.compile the experts go through the custom op: the MoE block compiles as one graph (no break
    at fused_moe's Python) and gives eager's output; gpt-oss's activation and biases cross the op's schema."""
    model = tiny_model(name, **(GPT_OSS_SIZES if name == "GptOssConfig" else {}))
    block = next(m for m in model.modules() if any(c is experts_of(model) for c in m.children()))
    hidden = torch.randn(1, 7, model.config.hidden_size, device=DEVICE)
    with torch.no_grad():
        ref = block(hidden)
        model.set_experts_implementation("moe_lab")
        torch._dynamo.reset()
        out = torch.compile(block, fullgraph=True, backend="aot_eager")(hidden)  # no C++ toolchain needed
    ref, out = (r[0] if isinstance(r, tuple) else r for r in (ref, out))
    assert calls[0] == 0  # (the op ran fused_moe, not the integration's own call)
    assert relative_error(out, ref) < 1e-5


def test_edges_empty_batch_all_experts_strided_input_other_dtype_and_sentinels(calls):
    model = tiny_model("qwen3_moe")  # E = 6
    model.set_experts_implementation("moe_lab")
    experts = experts_of(model)
    num_experts, hidden_size = experts.gate_up_proj.shape[0], model.config.hidden_size

    with torch.no_grad():
        empty = experts(
            torch.randn(0, hidden_size, device=DEVICE), torch.zeros(0, 3, dtype=torch.long), torch.ones(0, 3)
        )
        assert empty.shape == (0, hidden_size)
        # top_k = E, hidden_states a strided view
        wide = torch.randn(5, 2 * hidden_size, device=DEVICE)
        hidden = wide[:, ::2]
        ids = torch.stack([torch.randperm(num_experts) for _ in range(5)]).to(DEVICE)
        weights = torch.softmax(torch.randn(5, num_experts, device=DEVICE), dim=-1)
        ref = fused_moe_reference(hidden.contiguous(), experts.gate_up_proj, experts.down_proj, weights, ids)
        assert relative_error(experts(hidden, ids, weights), ref) < 1e-5
        # float64 hidden states with float32 weights: computed in the weights' dtype, returned in the input's
        out = experts(hidden.double(), ids, weights)
        assert out.dtype == torch.float64 and relative_error(out, ref) < 1e-5
        # expert parallelism's sentinels (ids >= E, zero weight) contribute zero
        ids = torch.tensor([[0, 6, 2], [6, 6, 6], [1, 3, 5]], device=DEVICE)
        weights = torch.rand(3, 3, device=DEVICE)
        out = experts(hidden[:3], ids, weights)
        kept = torch.where(ids < num_experts, weights, torch.zeros_like(weights))
        ref = fused_moe_reference(hidden[:3].contiguous(), experts.gate_up_proj, experts.down_proj, kept, ids % 6)
        assert relative_error(out, ref) < 1e-5 and not out[1].any()
        # and so under torch.compile (the custom op, told not to check the ids)
        torch._dynamo.reset()
        compiled = torch.compile(experts, fullgraph=True, backend="aot_eager")(hidden[:3], ids, weights)
        assert relative_error(compiled, ref) < 1e-5 and not compiled[1].any()


def experts_class(**traits):
    """A minimal experts module of transformers' kind, with the given decorator traits (is_transposed, ...)."""

    @use_experts_implementation(**traits)
    class TinyExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
            shapes = ((e, h, 2 * i), (e, i, h)) if traits.get("is_transposed") else ((e, 2 * i, h), (e, h, i))
            self.num_experts = e
            self.gate_up_proj = torch.nn.Parameter(torch.randn(*shapes[0]) / h**0.5)
            self.down_proj = torch.nn.Parameter(torch.randn(*shapes[1]) / i**0.5)
            self.act_fn = ACT2FN[config.hidden_act]

        def forward(self, hidden_states, top_k_index, top_k_weights):
            raise AssertionError("eager is not what this test compares with")

    return TinyExperts


def tiny_config(**changes):
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=5, **changes)
    config._experts_implementation = "moe_lab"
    return config


def test_transposed_weights_are_read_as_views(calls):
    """is_transposed=True (Aria's layout, [E, H, 2I] and [E, I, H]): against transformers' batched_mm."""
    config = tiny_config()
    experts = experts_class(is_transposed=True)(config).to(DEVICE)
    hidden, ids = torch.randn(6, 32, device=DEVICE), random_topk_ids(6, 5, 2)
    weights = torch.rand(6, 2, device=DEVICE)
    with torch.no_grad():
        out = experts(hidden, ids, weights)
        config._experts_implementation = "batched_mm"
        ref = experts(hidden, ids.long(), weights)
    assert calls[0] == 1 and relative_error(out, ref) < 1e-5


# -- refusals ---------------------------------------------------------------------------------------------------


GPT_OSS_SIZES = dict(intermediate_size=16, num_local_experts=5, num_experts_per_tok=2, head_dim=8)


def test_gpt_oss_experts_and_logits_match_eager(calls):
    """GptOssExperts: transposed weights with interleaved gate/up columns, biases, the clamped SwiGLU (a small
    limit, so the clamps bite), as `fused_moe(activation=Activation("swigluoai", "interleaved"), w1_bias=,
    w2_bias=)`."""
    model = tiny_model("GptOssConfig", swiglu_limit=0.5, **GPT_OSS_SIZES)
    experts = experts_of(model)
    with torch.no_grad():
        for p in (experts.gate_up_proj, experts.gate_up_proj_bias, experts.down_proj_bias):
            p.normal_(0, 0.5)
    hidden = torch.randn(7, 32, device=DEVICE)
    ids, weights = random_topk_ids(7, 5, 2).long(), torch.softmax(torch.randn(7, 2, device=DEVICE), dim=-1)
    input_ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    with torch.no_grad():
        ref, ref_logits = experts(hidden, ids, weights), model(input_ids).logits
        model.set_experts_implementation("moe_lab")
        out, logits = experts(hidden, ids, weights), model(input_ids).logits
    assert calls[0] == 1 + model.config.num_hidden_layers
    assert relative_error(out, ref) < 1e-5 and relative_error(logits, ref_logits) < 1e-5


@pytest.mark.parametrize(
    "traits,config_changes,trait",
    [
        (dict(), dict(hidden_act="gelu"), "an activation other than SiLU"),
        (dict(has_post_expert_norm=True), dict(), "a post-expert norm"),
        (dict(has_gate=False), dict(), "no gate projection"),
    ],
)
def test_refusals_are_cached_on_the_module(traits, config_changes, trait, calls):
    if (
        "has_post_expert_norm" in traits
        and "has_post_expert_norm" not in use_experts_implementation.__code__.co_varnames
    ):
        pytest.skip("this transformers has no post-expert norm")
    experts = experts_class(**traits)(tiny_config(**config_changes))
    hidden, ids, weights = torch.randn(2, 32), random_topk_ids(2, 5, 2, device="cpu"), torch.rand(2, 2)
    with pytest.raises(NotImplementedError, match=f"moe-lab cannot run TinyExperts .*{trait}"):
        experts(hidden, ids, weights)
    cached = experts.__dict__["_moe_lab_verdict"]
    with pytest.raises(NotImplementedError):
        experts(hidden, ids, weights)
    assert experts.__dict__["_moe_lab_verdict"] is cached and calls[0] == 0


def test_verdict_is_made_once_per_dtype():
    experts = experts_class()(tiny_config()).to(DEVICE)
    hidden, ids, weights = torch.randn(3, 32, device=DEVICE), random_topk_ids(3, 5, 2), torch.rand(3, 2, device=DEVICE)
    with torch.no_grad():
        experts(hidden, ids, weights)
        first = experts.__dict__["_moe_lab_verdict"]
        experts(hidden, ids, weights)
        assert experts.__dict__["_moe_lab_verdict"] is first
        experts.to(torch.float64)
        with pytest.raises(NotImplementedError, match="weights of dtype float64"):
            experts(hidden, ids, weights)


def test_grad_on_is_refused_by_name():
    experts = experts_class()(tiny_config()).to(DEVICE)
    with pytest.raises(
        ValueError, match="requires grad: moe-lab.s experts are inference-only .* experts_implementation=.eager."
    ):
        experts(torch.randn(3, 32, device=DEVICE), random_topk_ids(3, 5, 2), torch.rand(3, 2, device=DEVICE))


# -- block-scaled FP8 (transformers' finegrained-fp8 experts) ---------------------------------------------------


def fp8_experts(block_size=(128, 128), activation_scheme="dynamic", intermediate_size=128, **options):
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")

    class TinyFP8Experts(fp8.FP8Experts):  # decorated as transformers' FP8 quantizer does, without touching FP8Experts
        pass

    cls = use_experts_implementation(TinyFP8Experts, experts_interface=fp8.ALL_FP8_EXPERTS_FUNCTIONS)
    config = transformers.MixtralConfig(hidden_size=128, intermediate_size=intermediate_size, num_local_experts=3)
    config._experts_implementation = "moe_lab"
    return cls(config, block_size=block_size, activation_scheme=activation_scheme, **options).to(DEVICE)


def test_block_scaled_fp8_experts(calls):
    experts = fp8_experts()
    w1 = torch.randn(3, 256, 128, device=DEVICE) / 128**0.5
    w2 = torch.randn(3, 128, 128, device=DEVICE) / 128**0.5
    with torch.no_grad():
        for name, w in (("gate_up_proj", w1), ("down_proj", w2)):
            q, scale = quantize_weights_fp8(w, block_shape=(128, 128))
            getattr(experts, name).data = q
            getattr(experts, f"{name}_scale_inv").data = scale
        hidden = torch.randn(5, 128, device=DEVICE).to(torch.bfloat16)
        ids, weights = random_topk_ids(5, 3, 2), torch.softmax(torch.randn(5, 2, device=DEVICE), dim=-1)
        out = experts(hidden, ids, weights)
        ref = fused_moe_reference(
            hidden, experts.gate_up_proj, experts.down_proj, weights, ids,
            w1_scale=experts.gate_up_proj_scale_inv, w2_scale=experts.down_proj_scale_inv, block_shape=(128, 128),
        )  # fmt: skip
        # scale_inv means value = float8 x scale_inv: against the unquantized weights, FP8's own error only
        unquantized = fused_moe_reference(hidden, w1, w2, weights, ids)
    assert calls[0] == 1 and out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 2e-2 and relative_error(out, unquantized) < 1e-1


@pytest.mark.parametrize(
    "changes,trait",
    [
        (dict(block_size=None), "per-tensor float8 scales"),
        (dict(activation_scheme="static"), "static activation scales"),
        # 2I = 64 <= block_n: transformers keeps two gate/up scale rows where fused_moe reads one
        (dict(intermediate_size=32), r"float8 scales not one per \[block_n, block_k\] block"),
        (dict(has_gate=False), "no gate_up_proj/down_proj weights"),  # up_proj alone
    ],
)
def test_fp8_refusals(changes, trait):
    experts = fp8_experts(**changes)
    if "intermediate_size" in changes and experts.gate_up_proj_scale_inv.shape[1] == 1:
        pytest.skip("this transformers keeps one gate/up scale row per block_n rows (moe-lab's grid)")
    with pytest.raises(NotImplementedError, match=f"TinyFP8Experts .*{trait}"):
        experts(torch.randn(2, 128, device=DEVICE), random_topk_ids(2, 3, 2), torch.rand(2, 2, device=DEVICE))


# -- real sizes, on an H200 -------------------------------------------------------------------------------------

QWEN3_30B_A3B = dict(
    hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=4096, norm_topk_prob=True,
)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 4096])
def test_qwen3_30b_a3b_experts_on_gpu(num_tokens):
    """Qwen3-30B-A3B's experts module (E = 128, k = 8, H = 2048, I = 768) in bf16: moe_lab and transformers'
    grouped_mm against the float32 eager experts."""
    config = transformers.Qwen3MoeConfig(**QWEN3_30B_A3B, num_hidden_layers=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    experts = experts_of(model)
    hidden = torch.randn(num_tokens, 2048, device="cuda", dtype=torch.bfloat16)
    ids = random_topk_ids(num_tokens, 128, 8, device="cuda").long()
    weights = torch.softmax(torch.randn(num_tokens, 8, device="cuda"), dim=-1)
    with torch.no_grad():
        ref = fused_moe_reference(hidden, experts.gate_up_proj, experts.down_proj, weights, ids)
        model.set_experts_implementation("moe_lab")
        ours = experts(hidden, ids, weights)
        model.set_experts_implementation("grouped_mm")
        theirs = experts(hidden, ids, weights)
    print(f"T={num_tokens}: moe_lab {relative_error(ours, ref):.2e}, grouped_mm {relative_error(theirs, ref):.2e}")
    assert relative_error(ours, ref) < 1e-2


@pytest.mark.gpu
def test_qwen3_30b_a3b_four_layers_logits_and_generate_on_gpu():
    config = transformers.Qwen3MoeConfig(**QWEN3_30B_A3B, num_hidden_layers=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, experts_implementation="grouped_mm")
    model = model.cuda().eval()
    input_ids = torch.randint(0, 4096, (4, 32), device="cuda")
    with torch.no_grad():
        ref = model(input_ids).logits
        model.set_experts_implementation("moe_lab")
        out = model(input_ids).logits
        tokens = model.generate(input_ids[:1], max_new_tokens=8, do_sample=False)
    assert relative_error(out, ref) < 2e-2 and tokens.shape == (1, 40)


# -- wrong calls and wrong weights: said in the module's names ----------------------------------------------------


def test_a_module_that_is_not_an_experts_module_is_named_so():
    hidden, ids, weights = torch.randn(2, 32), random_topk_ids(2, 4, 2, device="cpu"), torch.rand(2, 2)
    with torch.no_grad(), pytest.raises(TypeError, match=r"got Linear \(torch.nn.modules.linear\): it is not an") as e:
        moe_tf.experts_forward(torch.nn.Linear(32, 32), hidden, ids, weights)
    assert "activation" not in str(e.value) and ".experts" not in str(e.value)
    block = tiny_model("mixtral").model.layers[0].mlp  # the MoE block instead of its .experts
    with torch.no_grad(), pytest.raises(TypeError, match=r"not an experts module .*; its .experts \(MixtralExperts\)"):
        moe_tf.experts_forward(block, hidden, ids, weights)
    experts = block.experts
    with torch.no_grad(), pytest.raises(TypeError, match="hidden_states must be a float tensor .*, got torch.int64"):
        moe_tf.experts_forward(experts, hidden.long(), ids, weights)


@pytest.mark.parametrize(
    "change, error, says",
    [
        (
            lambda e: setattr(e, "gate_up_proj", torch.nn.Parameter(e.gate_up_proj.data.transpose(1, 2).contiguous())),
            ValueError,
            r"^MixtralExperts.gate_up_proj \(fused_moe's w1\): w1 must have shape \[E, 2I, H\], got \(4, 32, 128\).*"
            r"\[w1 is MixtralExperts.gate_up_proj \(4, 32, 128\), w2 is MixtralExperts.down_proj \(4, 32, 64\)\]$",
        ),
        (
            lambda e: setattr(e, "gate_up_proj", torch.nn.Parameter(e.gate_up_proj.data[:3].contiguous())),
            ValueError,
            r"^MixtralExperts.down_proj \(fused_moe's w2\): .*\[w1 is MixtralExperts.gate_up_proj \(3, 128, 32\)",
        ),
        (
            lambda e: setattr(e, "down_proj", torch.nn.Parameter(e.down_proj.data.bfloat16())),
            TypeError,
            r"^MixtralExperts.down_proj \(fused_moe's w2\): w2 must be float32 \(the dtype of w1\), got bfloat16",
        ),
    ],
)
def test_fused_moes_errors_name_the_modules_weights(change, error, says):
    experts = experts_of(tiny_model("mixtral"))  # E = 4, H = 32, I = 64
    change(experts)
    hidden, ids, weights = torch.randn(2, 32), random_topk_ids(2, 4, 2, device="cpu"), torch.rand(2, 2)
    with torch.no_grad(), pytest.raises(error, match=says):
        moe_tf.experts_forward(experts, hidden.to(DEVICE), ids.to(DEVICE), weights.to(DEVICE))


def test_routing_errors_name_transformers_arguments():
    experts = experts_of(tiny_model("mixtral"))
    hidden, ids = torch.randn(2, 32, device=DEVICE), random_topk_ids(2, 4, 2)
    with torch.no_grad(), pytest.raises((TypeError, ValueError), match=r"^top_k_weights \(fused_moe's topk_weights\)"):
        moe_tf.experts_forward(experts, hidden, ids, torch.rand(2, 3, device=DEVICE))
