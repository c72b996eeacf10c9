"""moe_lab.workbook.viz.routing: plot functions return Figures; the widget redraws when a slider moves."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
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
