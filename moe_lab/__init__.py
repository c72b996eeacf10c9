"""moe-lab: fast Mixture-of-Experts kernels in Triton, with pointer and TMA load paths.

    from moe_lab import topk_routing, fused_moe
    topk_weights, topk_ids = topk_routing(router_logits, top_k=2)
    out = fused_moe(hidden_states, w1, w2, topk_weights, topk_ids)

Without a CUDA GPU, importing moe_lab switches Triton's interpreter on (TRITON_INTERPRET=1) unless you
set that variable yourself; see `moe_lab.runtime`. Where the kernels cannot run (Triton missing, or Triton
3.6's interpreter under numpy >= 2.4), `import moe_lab` still succeeds, so that `moe-lab doctor` can say
what to fix, and the first use of any of the names below raises RuntimeError saying the same.
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic version)

from .runtime import environment_problem, select_backend  # noqa: E402

select_backend()  # before any @triton.jit function is defined
_PROBLEM = environment_problem()

if _PROBLEM is None:
    from . import gluon_fp8  # noqa: F401 - the module only: Gluon itself is imported at its first launch
    from .activation import silu_and_mul
    from .align import AlignedRouting, moe_align
    from .capability import Fp8Support, TmaSupport, descriptor_problem, fp8_support, tma_support
    from .configs import GemmConfig, MoEConfig
    from .expert_kind import GPT_OSS, Activation
    from .expert_parallel import expert_range, fused_moe_expert_parallel
    from .gemm import grouped_matmul
    from .layer import FusedMoE, FusedMoEInfo, fused_moe
    from .permute import permute_tokens
    from .plan import LaunchPlan, LoadPath, select_load_path
    from .presets import EXPERT_KIND_PRESETS, PRESETS, MoEPreset, get_preset
    from .quantize import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_activations_fp8, quantize_weights_fp8
    from .reduce import topk_reduce
    from .reference import fused_moe_reference, moe_align_reference, relative_error
    from .routing import TopKRouting, topk_routing
    from .runtime import interpreter_active
    from .tuned import default_config

else:

    def __getattr__(name):
        """PEP 562: the kernels were not imported; using any of them says why (dunder look-ups by tools stay
        AttributeErrors)."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"moe_lab.{name} cannot be used here: {_PROBLEM} (`moe-lab doctor` says more)")


__all__ = [
    "Activation",
    "AlignedRouting",
    "default_config",
    "dequantize_fp8",
    "descriptor_problem",
    "EXPERT_KIND_PRESETS",
    "FP8_DTYPE",
    "FP8_MAX",
    "Fp8Support",
    "expert_range",
    "fp8_support",
    "fused_moe",
    "fused_moe_expert_parallel",
    "fused_moe_reference",
    "FusedMoE",
    "FusedMoEInfo",
    "GemmConfig",
    "get_preset",
    "GPT_OSS",
    "grouped_matmul",
    "interpreter_active",
    "LaunchPlan",
    "LoadPath",
    "moe_align",
    "moe_align_reference",
    "MoEConfig",
    "MoEPreset",
    "permute_tokens",
    "PRESETS",
    "quantize_activations_fp8",
    "quantize_weights_fp8",
    "relative_error",
    "select_load_path",
    "silu_and_mul",
    "tma_support",
    "TmaSupport",
    "topk_reduce",
    "topk_routing",
    "TopKRouting",
]
