"""moe-lab: fast Mixture-of-Experts kernels in Triton, with pointer and TMA load paths.

    from moe_lab import topk_routing, fused_moe
    topk_weights, topk_ids = topk_routing(router_logits, top_k=2)
    out = fused_moe(hidden_states, w1, w2, topk_weights, topk_ids)

Without a CUDA GPU, importing moe_lab switches Triton's interpreter on (TRITON_INTERPRET=1) unless you
set that variable yourself; see `moe_lab.runtime`.
"""

from .runtime import select_backend

select_backend()  # before any @triton.jit function is defined

from .activation import silu_and_mul  # noqa: E402
from .align import AlignedRouting, moe_align  # noqa: E402
from .capability import Fp8Support, TmaSupport, descriptor_problem, fp8_support, tma_support  # noqa: E402
from .configs import GemmConfig, MoEConfig  # noqa: E402
from .expert_parallel import expert_range, fused_moe_expert_parallel  # noqa: E402
from .gemm import grouped_matmul  # noqa: E402
from .layer import FusedMoE, FusedMoEInfo, fused_moe  # noqa: E402
from .permute import permute_tokens  # noqa: E402
from .plan import LaunchPlan, LoadPath, select_load_path  # noqa: E402
from .presets import PRESETS, MoEPreset, get_preset  # noqa: E402
from .quantize import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_activations_fp8, quantize_weights_fp8  # noqa: E402
from .reduce import topk_reduce  # noqa: E402
from .reference import fused_moe_reference, moe_align_reference, relative_error  # noqa: E402
from .routing import TopKRouting, topk_routing  # noqa: E402
from .runtime import interpreter_active  # noqa: E402
from .tuned import default_config  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AlignedRouting",
    "default_config",
    "dequantize_fp8",
    "descriptor_problem",
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
