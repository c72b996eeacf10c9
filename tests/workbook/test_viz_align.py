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


def test_folded_tails_counts_and_refusals():
    assert va.folded_tails([40, 16, 5, 0], 32, 16) == (4, 1)  # 40 = 32 + 8: its tail of 8 rows folds
    assert va.folded_tails(torch.tensor([40, 16]), 32, 16) == va.folded_tails([40, 16], 32, 16)
    for args, error, match in (
        (([40, -3], 32, 16), ValueError, r"counts\[1\] must be >= 0, got -3"),
        (([40, 2.5], 32, 16), TypeError, r"counts\[1\] must be an int, got float 2.5"),
        (("40", 32, 16), TypeError, r"counts must be a sequence of ints .*got str"),
        (([40], 0, 0), ValueError, r"block_size_m must be >= 1, got 0"),
        (([40], 32, -1), ValueError, r"fold_tail_rows must be >= 0, got -1"),
        (([40], 16, 32), ValueError, r"fold_tail_rows must be in \[0, block_size_m\) = \[0, 16\) .*got 32"),
    ):
        with pytest.raises(error, match=match):
            va.folded_tails(*args)


def test_strip_and_cases_refuse_bad_arguments():
    routing = moe_lab.moe_align_reference(small_ids(), 4, 4)
    with pytest.raises(ValueError, match=r"max_labels must be >= 0, got -1"):
        va.plot_alignment_strip(routing, max_labels=-1)
    with pytest.raises(TypeError, match=r"max_labels must be an int, got str"):
        va.plot_alignment_strip(routing, max_labels="64")
    with pytest.raises(ValueError, match=r"cases must name at least one case"):
        va.plot_alignment_cases({})
    with pytest.raises(TypeError, match=r"cases must be a dict of name -> case .*got list"):
        va.plot_alignment_cases([routing])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        # the slider would raise ipywidgets' TraitError, naming neither the argument nor the choices
        (dict(value=24), ValueError, r"value must be one of \[16, 32, 64, 128\], got int 24"),
        (dict(value=0), ValueError, r"value must be one of \[16, 32, 64, 128\], got int 0"),
        (dict(block_sizes=()), ValueError, r"block_sizes must offer at least one"),
        (dict(block_sizes="16"), TypeError, r"block_sizes must be a sequence of ints, got str"),
        (dict(block_sizes=(16, -32)), ValueError, r"block_sizes\[1\] must be >= 1, got -32"),
        (dict(cases={}), ValueError, r"cases must name at least one case"),
    ],
)
def test_widget_refuses_bad_choices(kwargs, error, match):
    args = dict(cases={"decode": small_ids()}, num_experts=4) | kwargs
    with pytest.raises(error, match=match):
        va.align_explorer(**args)


def test_widget_takes_a_value_among_its_choices():
    box = va.align_explorer({"decode": small_ids()}, 4, block_sizes=[32, 16], value=None)
    assert box.control.value == 32  # none given: the first choice


def test_widget_refuses_ids_outside_the_experts():
    ids = torch.tensor([[0, 7], [1, 2]], dtype=torch.int32)  # moe_align would drop 7 of E = 4
    with pytest.raises(ValueError, match=r"cases\['a'\] must hold experts in \[0, 4\), got values from 0 to 7 "):
        va.align_explorer({"a": ids}, 4)
    with pytest.raises(ValueError, match=r"num_experts = 4"):
        va.align_explorer({"a": ids}, 4)
    with pytest.raises(ValueError, match=r"cases\['b'\] is on the meta device"):
        va.align_explorer({"a": small_ids(), "b": torch.zeros(2, 2, dtype=torch.int32, device="meta")}, 4)


def test_folded_tails_bounds_counts_to_int64():
    with pytest.raises(ValueError, match=r"counts\[0\] must be at most 2\^63 - 1 .*got 18446744073709551616"):
        va.folded_tails([2**64], 16, 1)
    assert va.folded_tails([2**63 - 1, 40, 17, 0], 16, 8) == (-(-(2**63 - 1) // 16) + 3 + 2, 1 + 1)
