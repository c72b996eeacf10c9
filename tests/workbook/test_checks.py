"""moe_lab.workbook.checks: the notebooks' PASS/FAIL lines and the grouped-GEMM reference; a wrong call names
its argument (TypeError / ValueError), a wrong result is a FAIL (AssertionError)."""

import math

import pytest
import torch

from moe_lab.workbook import check, check_equal, expert_rows_matmul

INF, NAN = math.inf, math.nan


def test_check_passes_and_fails_as_before(capsys):
    want = torch.tensor([1.0, 2.0, 3.0])
    assert check("close", want * 1.001, want) < 1e-2
    assert "PASS close: relative error" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="FAIL far: relative error .* is not below 1e-02"):
        check("far", want * 2, want)
    with pytest.raises(AssertionError, match="FAIL nan: .*1 NaN value"):
        check("nan", torch.tensor([1.0, NAN, 3.0]), want)
    with pytest.raises(AssertionError, match=r"FAIL nan want: [^;]*; the reference \(want\) holds 1 NaN value\(s\)$"):
        check("nan want", want, torch.tensor([1.0, NAN, 3.0]))  # not "outputs never written"
    with pytest.raises(AssertionError, match=r"FAIL shape: shape \(2,\), expected \(3,\)"):
        check("shape", want[:2], want)


@pytest.mark.parametrize(
    "args, error, says",
    [
        (([1.0, 2.0], torch.ones(2)), TypeError, "got must be a torch.Tensor, got list"),
        ((torch.ones(2), (1.0, 2.0)), TypeError, "want must be a torch.Tensor, got tuple"),
        ((torch.ones(2), torch.ones(2), "1e-2"), TypeError, "tol must be a number > 0 .* got str '1e-2'"),
        ((torch.ones(2), torch.ones(2), None), TypeError, "tol must be a number > 0 .* got NoneType None"),
        ((torch.ones(2), torch.ones(2), True), TypeError, "got bool True"),
        ((torch.ones(2), torch.ones(2), -1), ValueError, "tol must be a number > 0 .* got -1"),
        ((torch.ones(2), torch.ones(2), 0.0), ValueError, "got 0.0"),
        ((torch.ones(2), torch.ones(2), NAN), ValueError, "got nan"),
    ],
)
def test_check_names_a_wrong_argument(args, error, says):
    with pytest.raises(error, match=says):
        check("label", *args)


def test_check_takes_the_same_infinities_as_equal_and_never_nan(capsys):
    want = torch.tensor([1.0, INF, -INF, 4.0])
    assert check("inf", torch.tensor([1.0, INF, -INF, 4.0]), want) == 0.0
    assert check("all inf", torch.tensor([INF]), torch.tensor([INF])) == 0.0
    assert "PASS inf" in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"FAIL sign: 1 infinite value\(s\) .* first at \(1,\): got -inf"):
        check("sign", torch.tensor([1.0, -INF, -INF, 4.0]), want)
    with pytest.raises(AssertionError, match=r"first at \(1,\): got 5.0, expected inf"):
        check("finite for inf", torch.tensor([1.0, 5.0, -INF, 4.0]), want)
    with pytest.raises(AssertionError, match=r"first at \(0,\): got inf, expected 1.0"):
        check("inf for finite", torch.tensor([INF, INF, -INF, 4.0]), want)
    with pytest.raises(AssertionError, match="FAIL both nan"):
        check("both nan", torch.tensor([NAN]), torch.tensor([NAN]))  # NaN never passes


def test_check_equal(capsys):
    check_equal("ids", torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([1, 2, 3]))  # values, not dtypes
    check_equal("nan", torch.tensor([NAN, 1.0, INF]), torch.tensor([NAN, 1.0, INF]))  # the same values stored
    assert capsys.readouterr().out.count("PASS") == 2
    with pytest.raises(AssertionError, match=r"FAIL ids: 1 element\(s\) differ; first at \(2,\): got 4, expected 3"):
        check_equal("ids", torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]))
    with pytest.raises(AssertionError, match=r"first at \(0,\): got nan, expected 1.0"):
        check_equal("nan", torch.tensor([NAN]), torch.tensor([1.0]))
    with pytest.raises(TypeError, match="got must be a torch.Tensor, got list"):
        check_equal("ids", [1, 2], torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="want must be a torch.Tensor, got int"):
        check_equal("ids", torch.tensor([1]), 1)


def test_expert_rows_matmul_computes_each_row_with_its_expert():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 8, generator=gen), torch.randn(3, 4, 8, generator=gen)
    experts = torch.tensor([2, 0, 1, 2, 0])
    want = torch.stack([x[r] @ w[e].T for r, e in enumerate(experts.tolist())])
    torch.testing.assert_close(expert_rows_matmul(x, w, experts), want)
    assert expert_rows_matmul(x[:0], w, experts[:0]).shape == (0, 4)


@pytest.mark.parametrize(
    "change, error, says",
    [
        (dict(experts=torch.tensor([0, 1, -1, 0, 2])), ValueError, r"ids in \[0, E=3\) .* first at row 2: -1"),
        (dict(experts=torch.tensor([0, 1, 3, 0, 2])), ValueError, r"got 1 outside; first at row 2: 3"),
        (dict(experts=torch.tensor([0.0, 1, 2, 0, 2])), TypeError, "experts must be int32 or int64, got float32"),
        (dict(experts=[0, 1, 2, 0, 2]), TypeError, "experts must be a torch.Tensor .*, got list"),
        (dict(x=[[0.0] * 8] * 5), TypeError, "x must be a torch.Tensor .*, got list"),
        (dict(w=None), TypeError, "w must be a torch.Tensor .*, got NoneType"),
        (
            dict(w=torch.randn(3, 4, 6)),
            ValueError,
            r"w must have shape .* = \[\*, \*, 8\], got \(3, 4, 6\)",
        ),
        (dict(w=torch.randn(4, 8)), ValueError, r"w must have 3 dimensions \[E, N, K\]"),
        (
            dict(experts=torch.tensor([0, 1])),
            ValueError,
            r"experts must have shape .* = \[5\], got \(2,\)",
        ),
    ],
)
def test_expert_rows_matmul_names_a_wrong_argument(change, error, says):
    call = dict(x=torch.randn(5, 8), w=torch.randn(3, 4, 8), experts=torch.tensor([0, 1, 2, 0, 2]))
    call.update(change)
    with pytest.raises(error, match=says):
        expert_rows_matmul(**call)
