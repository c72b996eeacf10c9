"""moe_lab.workbook.viz.align: the alignment strip, the padding report, and the BLOCK_SIZE_M widget."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import moe_lab  # noqa: E402
from moe_lab.workbook.viz import align as va  # noqa: E402


def small_ids():
    return torch.tensor([[0, 2], [2, 3], [1, 0], [3, 2]], dtype=torch.int32)


def test_row_experts_marks_padding():
    routing = moe_lab.moe_align_reference(small_ids(), 4, 4)
    experts = va.row_experts(routing)
    assert experts.tolist() == [0, 0, -1, -1, 1, -1, -1, -1, 2, 2, 2, -1, 3, 3, -1, -1]


def test_padding_report_numbers():
    routing = moe_lab.moe_align_reference(small_ids(), 4, 4)
    text = va.padding_report(routing)
    assert "8 slots -> num_tokens_post_padded = 16 rows, 8 padding rows (50.0%" in text


def test_strip_draws_one_cell_per_row_and_block_labels():
    routing = moe_lab.moe_align(small_ids(), 4, 4)
    fig = va.plot_alignment_strip(routing)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (1, 16)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("pad") == 8 and ["e0", "e1", "e2", "e3"] == [t for t in texts if t.startswith("e")]


def test_strip_on_given_ax_and_large_schedule():
    fig = Figure()
    ax = fig.add_subplot()
    ids = torch.randint(0, 16, (512, 2), dtype=torch.int32)
    assert va.plot_alignment_strip(moe_lab.moe_align_reference(ids, 16, 64), ax=ax) is fig
    assert (
        len(
            va.plot_alignment_cases(
                {"a": moe_lab.moe_align_reference(ids, 16, 16), "b": moe_lab.moe_align_reference(ids[:2], 16, 16)}
            ).axes
        )
        >= 2
    )


def test_widget_redraws_on_block_size_change():
    cases = {
        "prefill": torch.randint(0, 8, (64, 2), dtype=torch.int32),
        "decode": torch.randint(0, 8, (2, 2), dtype=torch.int32),
    }
    box = va.align_explorer(cases, 8, value=16)
    assert box.control.continuous_update is False
    first_fig, first_text = box.figure, box.summary.value
    assert "BLOCK_SIZE_M= 16" in first_text and "prefill" in first_text and "decode" in first_text
    box.control.value = 64
    assert box.figure is not first_fig
    assert "BLOCK_SIZE_M= 64" in box.summary.value and box.summary.value != first_text
    assert all(r.block_size_m == 64 for r in box.routings.values())


def test_slot_order_routing_is_refused_with_a_pointer_to_moe_align():
    import pytest

    from moe_lab.align import slot_order_routing
    from moe_lab.workbook.viz.align import padding_report
    from moe_lab.workbook.viz.tiles import tile_report

    routing = slot_order_routing(torch.tensor([[1, 3]], dtype=torch.int32), 4, 16)
    with pytest.raises(ValueError, match="slot order .*moe_lab.moe_align"):
        padding_report(routing)
    with pytest.raises(ValueError, match="slot order"):
        tile_report(routing, 64, 32, 32, 32)


@pytest.mark.parametrize("routing", [(1, 2), [1, 2], None])
def test_padding_report_refuses_what_is_not_a_routing(routing):
    with pytest.raises(TypeError, match=r"routing must be an AlignedRouting \(from moe_align\), got"):
        va.padding_report(routing)
