import numpy as np
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


def test_result_unpacks_indexes_and_names_its_fields():
    routing = topk_routing(torch.randn(6, 8), 2)
    topk_weights, topk_ids = routing
    assert routing[0] is routing.topk_weights is topk_weights and routing[1] is routing.topk_ids is topk_ids
    assert routing[-1] is topk_ids and len(routing) == 2 and routing._fields == ("topk_weights", "topk_ids")


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
        (dict(top_k=2, routed_scaling_factor=0), ValueError, "routed_scaling_factor must be a finite number > 0"),
        (dict(top_k=2, routed_scaling_factor=float("inf")), ValueError, "finite number > 0, got inf"),
        (dict(top_k=2, routed_scaling_factor=True), TypeError, "routed_scaling_factor must be a real number, got bool"),
        (dict(top_k=2, routed_scaling_factor="2.5"), TypeError, "must be a real number, got str"),
    ],
)
def test_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        topk_routing(torch.randn(4, 8), **kwargs)


def test_routed_scaling_factor_read_from_a_config_is_taken():
    """DeepSeek-V3's 2.5 as numpy's float32 or a 0-d tensor (read from a checkpoint's config) scales as the float."""
    logits = torch.randn(4, 8)
    want = topk_routing(logits, 2, routed_scaling_factor=2.5).topk_weights
    for factor in (np.float32(2.5), torch.tensor(2.5)):
        assert torch.equal(topk_routing(logits, 2, routed_scaling_factor=factor).topk_weights, want)


def _group_limited_greedy(logits, top_k, num_groups, topk_group):
    """DeepSeek-V2's routing as transformers' DeepseekV2 writes it (topk_method="group_limited_greedy"), per
    token in float64: softmax scores, each group scored by its best expert, the topk_group best groups kept,
    top-k of their experts, weights the softmax scores (no renormalization)."""
    ids, weights = [], []
    for row in logits.double():
        scores = torch.softmax(row, dim=-1)
        groups = scores.view(num_groups, -1)
        kept = groups.max(dim=-1).values.topk(topk_group).indices
        masked = torch.zeros_like(groups).fill_(-1.0)
        masked[kept] = groups[kept]
        top = masked.flatten().topk(top_k)
        ids.append(top.indices)
        weights.append(scores[top.indices])
    return torch.stack(weights), torch.stack(ids)


def test_deepseek_v2_group_limited_greedy_matches_the_reference():
    """DeepSeek-V2's shape (160 experts in 8 groups, 3 kept, top-6) and one where V3's scoring (sum of a
    group's two best) keeps another group than V2's (its best expert): group 0 = [0.9, 0.0], group 1 =
    [0.5, 0.5]."""
    logits = torch.randn(32, 160)
    tw, ti = topk_routing(logits, 6, renormalize=False, num_expert_group=8, topk_group=3, group_scoring="max")
    ref_w, ref_i = _group_limited_greedy(logits, 6, 8, 3)
    assert torch.equal(ti.long(), ref_i)
    assert torch.allclose(tw.double(), ref_w, rtol=1e-6)
    scores = torch.tensor([[0.9, 0.0, 0.5, 0.5]]).log()
    v2 = topk_routing(scores, 1, num_expert_group=2, topk_group=1, group_scoring="max").topk_ids
    v3 = topk_routing(scores, 1, num_expert_group=2, topk_group=1).topk_ids
    assert v2.item() == 0 and v3.item() in (2, 3)
    with pytest.raises(ValueError, match="group_scoring must be 'top2_sum' or 'max', got 'sum'"):
        topk_routing(logits, 6, num_expert_group=8, topk_group=3, group_scoring="sum")
