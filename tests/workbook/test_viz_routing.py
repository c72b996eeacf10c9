"""moe_lab.workbook.viz.routing: plot functions return Figures; the widget redraws when a slider moves."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import routing as vr  # noqa: E402


@pytest.fixture
def routing():
    return moe_lab.topk_routing(vr.skewed_router_logits(16, 6, 1.0), 2)


def test_skewed_logits_shape_and_skew():
    flat = vr.skewed_router_logits(512, 8, 0.0).argmax(1)
    hot = vr.skewed_router_logits(512, 8, 3.0).argmax(1)
    assert (hot == 0).sum() > 2 * (flat == 0).sum()


def test_expert_load_counts_slots(routing):
    load = vr.expert_load(routing.topk_ids, 6)
    assert load.shape == (6,) and int(load.sum()) == 32


def test_heatmap_and_load_plots(routing):
    fig = vr.plot_routing_heatmap(routing.topk_ids, 6, routing.topk_weights)
    assert isinstance(fig, Figure)
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (16, 6) and (image > 0).sum() == 32
    fig = vr.plot_expert_load(routing.topk_ids, 6)
    assert [round(p.get_height()) for p in fig.axes[0].patches] == vr.expert_load(routing.topk_ids, 6).tolist()


def test_plots_draw_on_a_given_ax(routing):
    fig = Figure()
    ax = fig.add_subplot()
    assert vr.plot_expert_load(routing.topk_ids, 6, ax=ax) is fig
    assert vr.plot_routing(routing.topk_ids, 6, routing.topk_weights).axes


def test_load_summary(routing):
    assert "T·k = 32 slots over E = 6" in vr.load_summary(routing.topk_ids, 6)


def test_widget_redraws_on_slider_change():
    box = vr.routing_explorer(num_tokens=16, num_experts=8, top_k=2)
    first_fig, first_text = box.figure, box.summary.value
    assert all(c.continuous_update is False for c in box.controls.values())
    assert box.routing.topk_ids.shape == (16, 2)
    box.controls["num_experts"].value = 4
    assert box.figure is not first_fig and box.summary.value != first_text
    assert "E = 4" in box.summary.value
    box.controls["top_k"].value = 3
    assert box.routing.topk_ids.shape == (16, 3)
    before = box.summary.value
    box.controls["skew"].value = 3.0
    assert box.summary.value != before


def test_widget_clamps_top_k_to_e():
    box = vr.routing_explorer(num_tokens=8, num_experts=4, top_k=2)
    box.controls["top_k"].value = 8
    assert box.routing.topk_ids.shape == (8, 4)


_IDS = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: vr.plot_routing([[0, 1]], 4), TypeError, r"topk_ids must be a torch.Tensor \[T, k\], got list"),
        (
            lambda: vr.plot_routing(torch.tensor([[0, 9]]), 4),
            ValueError,
            r"experts in \[0, 4\), got values from 0 to 9",
        ),
        (lambda: vr.plot_routing(_IDS, 4, torch.ones(3, 2)), ValueError, r"topk_weights must have shape"),
        (lambda: vr.expert_load(torch.tensor([[-1, 1]]), 4), ValueError, r"in \[0, 4\), got values from -1 to 1"),
        (lambda: vr.expert_load(torch.tensor([[0.0, 1.0]]), 4), TypeError, r"topk_ids must be int32 or int64"),
        (lambda: vr.expert_load(torch.tensor([0, 1]), 4), ValueError, r"topk_ids must have 2 dimensions"),
        (lambda: vr.expert_load(_IDS, 0), ValueError, r"num_experts must be >= 1, got 0"),
        (lambda: vr.load_summary(torch.tensor([[9, 1]]), 4), ValueError, r"in \[0, 4\), got values from 1 to 9"),
        (lambda: vr.skewed_router_logits(-1, 4), ValueError, r"num_tokens must be >= 0, got -1"),
        (lambda: vr.skewed_router_logits(4, 4, skew=-5), ValueError, r"skew must be a finite number >= 0, got -5"),
        (lambda: vr.skewed_router_logits(4, 4, skew=float("nan")), ValueError, r"skew must be a finite .* got nan"),
        (lambda: vr.skewed_router_logits(4, 4, skew="2"), TypeError, r"skew must be a number >= 0, got str"),
        (lambda: vr.skewed_routing(4, 0, 2), ValueError, r"num_experts must be >= 1, got 0"),
        (lambda: vr.skewed_routing(4, 4, 0), ValueError, r"top_k must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_load_summary_of_no_tokens():
    assert "T·k = 0 slots" in vr.load_summary(torch.empty(0, 2, dtype=torch.int64), 4)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        # the sliders would clamp these (E = 100 showed 64) or cast them (2.5 showed 2) without a word
        (dict(num_experts=100), ValueError, r"num_experts must be in \[2, 64\] \(the widget's range\), got 100"),
        (dict(num_experts=1), ValueError, r"num_experts must be in \[2, 64\] .*got 1$"),
        (dict(num_experts=2.5), TypeError, r"num_experts must be an int, got float 2.5"),
        (dict(top_k=0), ValueError, r"top_k must be in \[1, 8\] .*got 0"),
        (dict(top_k=9), ValueError, r"top_k must be in \[1, 8\] .*got 9"),
        (dict(top_k=True), TypeError, r"top_k must be an int, got bool"),
        (dict(skew=3.5), ValueError, r"skew must be in \[0.0, 3.0\] .*got 3.5"),
        (dict(skew=-0.25), ValueError, r"skew must be in \[0.0, 3.0\] .*got -0.25"),
        (dict(skew=float("nan")), ValueError, r"skew must be in \[0.0, 3.0\] .*got nan"),
        (dict(skew="1"), TypeError, r"skew must be a number in \[0.0, 3.0\], got str '1'"),
    ],
)
def test_widget_refuses_what_its_sliders_would_clamp(kwargs, error, match):
    with pytest.raises(error, match=match):
        vr.routing_explorer(**kwargs)


def test_widget_takes_the_ends_of_its_ranges():
    import numpy as np

    box = vr.routing_explorer(num_tokens=4, num_experts=64, top_k=8, skew=3)
    assert box.controls["num_experts"].value == 64 and box.controls["top_k"].value == 8
    assert box.controls["skew"].value == 3.0
    box = vr.routing_explorer(num_tokens=4, num_experts=np.int64(2), top_k=1, skew=0.0)
    assert box.routing.topk_ids.shape == (4, 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5])
def test_heatmap_refuses_weights_it_would_draw_wrongly(bad):
    ids = torch.tensor([[0, 1], [2, 3]])
    weights = torch.tensor([[bad, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="topk_weights must hold finite weights >= 0"):
        vr.plot_routing(ids, 8, weights)


def test_meta_tensors_are_refused():
    with pytest.raises(ValueError, match="topk_ids is on the meta device, which holds no data"):
        vr.plot_routing(torch.zeros(2, 2, dtype=torch.int64, device="meta"), 8)
    with pytest.raises(ValueError, match="topk_weights is on the meta device, which holds no data"):
        vr.plot_routing(torch.zeros(2, 2, dtype=torch.int64), 8, torch.ones(2, 2, device="meta"))


@pytest.mark.parametrize(
    "args,error,match",
    [
        (dict(seed="a"), TypeError, r"seed must be an int, got str 'a'"),
        (dict(seed=1.5), TypeError, r"seed must be an int, got float 1.5"),
        (dict(num_tokens=10**8), ValueError, r"num_tokens is too large to draw: 100000000 tokens .*at most 8192"),
    ],
)
def test_explorer_refuses_bad_seed_and_too_many_tokens_at_once(args, error, match):
    with pytest.raises(error, match=match):
        vr.routing_explorer(**args)
    if "seed" in args:
        with pytest.raises(error, match=match):
            vr.skewed_router_logits(4, 4, seed=args["seed"])


def test_heatmap_ax_must_be_an_axes():
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        vr.plot_routing_heatmap(torch.tensor([[0, 1]]), 4, ax="ax")
