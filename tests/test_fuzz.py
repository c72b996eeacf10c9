"""Property tests: fused_moe equals the reference over random shapes, dtypes, block sizes, strides and
both load paths (interpreter on a CPU), starting from a seed corpus of the edge cases."""

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from moe_lab import GemmConfig, fused_moe, fused_moe_reference, relative_error

from .conftest import DEVICE, TOL, random_topk_ids

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@st.composite
def layers(draw):
    num_experts = draw(st.integers(1, 12))
    return dict(
        num_tokens=draw(st.integers(0, 40)),
        num_experts=num_experts,
        top_k=draw(st.integers(1, num_experts)),
        hidden=draw(st.sampled_from([16, 24, 32, 48, 64, 72])),
        inter=draw(st.sampled_from([16, 20, 32, 40, 64])),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        block_m=draw(st.sampled_from([16, 32])),
        block_n=draw(st.sampled_from([16, 32, 64])),
        block_k=draw(st.sampled_from([16, 32, 64])),
        transposed_input=draw(st.booleans()),
        use_tma=draw(st.sampled_from([False, "auto"])),
    )


@pytest.mark.slow  # about a minute under the interpreter; CI runs it (`-m "not slow"` skips it locally)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers())
@example(
    dict(
        num_tokens=0,
        num_experts=4,
        top_k=2,
        hidden=32,
        inter=16,
        dtype="bf16",
        block_m=16,
        block_n=32,
        block_k=32,
        transposed_input=False,
        use_tma="auto",
    )
)  # idle rank
@example(
    dict(
        num_tokens=7,
        num_experts=5,
        top_k=5,
        hidden=24,
        inter=20,
        dtype="fp32",
        block_m=16,
        block_n=16,
        block_k=16,
        transposed_input=True,
        use_tma="auto",
    )
)  # top_k = E, ragged K
@example(
    dict(
        num_tokens=33,
        num_experts=1,
        top_k=1,
        hidden=48,
        inter=40,
        dtype="fp16",
        block_m=32,
        block_n=64,
        block_k=32,
        transposed_input=False,
        use_tma=False,
    )
)  # E = 1
@example(
    dict(
        num_tokens=3,
        num_experts=12,
        top_k=1,
        hidden=72,
        inter=16,
        dtype="bf16",
        block_m=16,
        block_n=16,
        block_k=64,
        transposed_input=True,
        use_tma="auto",
    )
)  # most experts empty
def test_fused_moe_matches_reference(p):
    torch.manual_seed(p["num_tokens"] * 131 + p["num_experts"])
    dtype = DTYPES[p["dtype"]]
    t, e, k, h, i = p["num_tokens"], p["num_experts"], p["top_k"], p["hidden"], p["inter"]
    hs = (
        torch.randn(h, t, device=DEVICE).t().to(dtype)
        if p["transposed_input"]
        else torch.randn(t, h, device=DEVICE).to(dtype)
    )
    w1 = (torch.randn(e, 2 * i, h, device=DEVICE) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, i, device=DEVICE) / i**0.5).to(dtype)
    ti = random_topk_ids(t, e, k)
    tw = torch.softmax(torch.randn(t, k, device=DEVICE), -1)
    cfg = GemmConfig(p["block_m"], p["block_n"], p["block_k"], 1, 4, 1)
    out = fused_moe(hs, w1, w2, tw, ti, config=cfg, use_tma=p["use_tma"])
    assert out.shape == (t, h)
    if t:
        assert relative_error(out, fused_moe_reference(hs, w1, w2, tw, ti)) < TOL[dtype]
