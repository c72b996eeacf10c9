import pytest
import torch

from moe_lab import topk_routing

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


def test_softmax_topk_renormalized():
    logits = torch.randn(10, 8)
    w, ids = topk_routing(logits, 2)
    probs = torch.softmax(logits, -1)
    ref_w, ref_ids = probs.topk(2, -1)
    assert torch.equal(ids.long(), ref_ids) and ids.dtype == torch.int32 and w.dtype == torch.float32
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))


def test_no_renormalize_keeps_softmax_probabilities():
    logits = torch.randn(10, 8)
    w, ids = topk_routing(logits, 3, renormalize=False)
    torch.testing.assert_close(w, torch.softmax(logits, -1).gather(1, ids.long()))


def test_deepseek_grouped_sigmoid_with_bias():
    torch.manual_seed(0)
    logits = torch.randn(16, 32)
    bias = torch.rand(32)
    w, ids = topk_routing(
        logits, 4, scoring="sigmoid", correction_bias=bias, num_expert_group=8, topk_group=2, routed_scaling_factor=2.5
    )
    groups = ids.long() // 4
    assert all(len(set(g.tolist())) <= 2 for g in groups)  # experts come from at most topk_group groups
    torch.testing.assert_close(w.sum(-1), torch.full((16,), 2.5))
    scores = torch.sigmoid(logits).gather(1, ids.long())
    torch.testing.assert_close(w, scores / scores.sum(-1, keepdim=True) * 2.5)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(top_k=9), ValueError, "top_k must be <= the number of experts E=8"),
        (dict(top_k=0), ValueError, "top_k must be >= 1"),
        (dict(top_k=2, scoring="relu"), ValueError, "scoring must be"),
        (dict(top_k=2, num_expert_group=4), ValueError, "num_expert_group and topk_group go together"),
        (dict(top_k=2, num_expert_group=3, topk_group=1), ValueError, "must divide E=8"),
    ],
)
def test_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        topk_routing(torch.randn(4, 8), **kwargs)
