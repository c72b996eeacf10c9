"""Exercise 09 (quantize_rows_kernel): the notebook's solution passes; the stub and typical wrong FP8
quantization kernels get NOT YET with their diagnosis, and FAIL with strict=True."""

import pytest
import triton
import triton.language as tl

from moe_lab._kernels.common import round_to_e4m3_grid
from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def _quantize(
    x_ptr,
    q_ptr,
    scale_ptr,
    K,
    GROUP: tl.constexpr,
    MASK: tl.constexpr = True,
    SCALE: tl.constexpr = "amax/448",
    ABS: tl.constexpr = True,
    FLOOR: tl.constexpr = True,
    START: tl.constexpr = "group*GROUP",
    ROW: tl.constexpr = "row*K",
    LAYOUT: tl.constexpr = "row-major",
    Q: tl.constexpr = "x/scale",
    ROUND: tl.constexpr = True,
    AXES: tl.constexpr = "row,group",
    CAST: tl.constexpr = "e4m3",
    OTHER: tl.constexpr = 0.0,
):
    """The solution, with switches that each make one typical mistake: MASK False drops the `cols < K` mask;
    SCALE "amax" forgets the 448, "448/amax" stores the inverse (and multiplies x by it), "amax*(1/448)"
    multiplies by a rounded reciprocal, "row" takes one amax per row; ABS False takes max(x); FLOOR False
    lets an all-zero group divide 0 by 0; START "group" starts group g at channel g; ROW "none" leaves the
    row offset out; LAYOUT "transposed" stores scales group-major, "row*K" past the scale tensor, "two"
    with 2 groups per row written in; Q "x*scale" multiplies, "x" casts x as it is; ROUND False skips
    round_to_e4m3_grid; AXES "group,row" swaps the program axes; CAST "e5m2" and "e4b15" cast to other
    float8 types, "int8" to integers; OTHER is the masked load's other= value."""
    if AXES == "row,group":
        row = tl.program_id(0)
        group = tl.program_id(1)
    else:
        row = tl.program_id(1)
        group = tl.program_id(0)
    if START == "group*GROUP":
        cols = group * GROUP + tl.arange(0, GROUP)
    elif START == "zero":  # every program quantizes its row's first group
        cols = tl.arange(0, GROUP)
    else:
        cols = group + tl.arange(0, GROUP)
    if ROW == "row*K":
        offs = row * K + cols
    else:
        offs = cols
    x_offs = cols if ROW == "load" else offs  # "load": the row's start left out of x's offsets only
    if ROW == "load":
        offs = row * K + cols
    if MASK:
        mask = cols < K
    else:
        mask = cols >= 0
    x = tl.load(x_ptr + x_offs, mask=mask, other=OTHER)
    if ABS:
        amax = tl.max(tl.abs(x), axis=0)
    else:
        amax = tl.max(tl.where(mask, x, -float("inf")), axis=0)
    if SCALE == "row":
        amax = 0.0
        for g in range(0, tl.cdiv(K, GROUP)):
            c = g * GROUP + tl.arange(0, GROUP)
            amax = tl.maximum(amax, tl.max(tl.abs(tl.load(x_ptr + row * K + c, mask=c < K, other=0.0)), axis=0))
    if FLOOR:
        amax = tl.maximum(amax, 1e-10)
    if SCALE == "amax":
        scale = amax
    elif SCALE == "448/amax":
        scale = 448.0 / amax
    elif SCALE == "amax*(1/448)":
        scale = amax * (1.0 / 448.0)
    elif SCALE == "448":
        scale = amax * 0.0 + 448.0
    else:
        scale = amax / 448.0
    if Q == "x*scale" or SCALE == "448/amax":
        q = x * scale
    elif Q == "x":
        q = x
    elif Q == "x/448":
        q = x / 448.0
    else:
        q = x / scale
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if ROUND:
        q = round_to_e4m3_grid(q)
    if CAST == "e4m3":
        tl.store(q_ptr + offs, q.to(tl.float8e4nv), mask=mask)
    elif CAST == "e4b15":
        tl.store(q_ptr + offs, q.to(tl.float8e4b15), mask=mask)
    elif CAST == "int8":
        tl.store(q_ptr + offs, q.to(tl.int8), mask=mask)
    else:
        tl.store(q_ptr + offs, q.to(tl.float8e5), mask=mask)
    if LAYOUT == "row-major":
        tl.store(scale_ptr + row * tl.cdiv(K, GROUP) + group, scale)
    elif LAYOUT == "transposed":
        tl.store(scale_ptr + group * tl.num_programs(0) + row, scale)
    elif LAYOUT == "row*K":
        tl.store(scale_ptr + row * K + group, scale)
    else:
        tl.store(scale_ptr + row * 2 + group, scale)


@triton.jit
def cast_e5m2(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ROUND=False, CAST="e5m2")


@triton.jit
def cast_e4b15(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ROUND=False, CAST="e4b15")


@triton.jit
def cast_int8(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, CAST="int8")


@triton.jit
def rounded_then_e5m2(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, CAST="e5m2")


@triton.jit
def q_over_448(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, Q="x/448")


@triton.jit
def scale_448(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, SCALE="448")


@triton.jit
def x_without_row(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ROW="load")


@triton.jit
def load_without_other(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    row = tl.program_id(0)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10) / 448.0
    q = round_to_e4m3_grid(tl.minimum(tl.maximum(x / scale, -448.0), 448.0))
    tl.store(q_ptr + row * K + cols, q.to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptr + row * tl.cdiv(K, GROUP) + group, scale)


@triton.jit
def right(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP)


@triton.jit
def unmasked(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, MASK=False)


@triton.jit
def scale_is_amax(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, SCALE="amax")


@triton.jit
def inverse_scale(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, SCALE="448/amax")


@triton.jit
def reciprocal_multiply(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, SCALE="amax*(1/448)")


@triton.jit
def one_scale_per_row(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, SCALE="row")


@triton.jit
def max_not_abs(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ABS=False)


@triton.jit
def no_floor(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, FLOOR=False)


@triton.jit
def groups_start_at_group(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, START="group")


@triton.jit
def groups_all_at_zero(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, START="zero")


@triton.jit
def no_row_offset(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ROW="none")


@triton.jit
def scales_transposed(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, LAYOUT="transposed")


@triton.jit
def scales_at_row_times_k(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, LAYOUT="row*K")


@triton.jit
def two_groups_written_in(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, LAYOUT="two")


@triton.jit
def q_times_scale(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, Q="x*scale")


@triton.jit
def q_not_scaled(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, Q="x")


@triton.jit
def no_e4m3_rounding(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, ROUND=False)


@triton.jit
def axes_swapped(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, AXES="group,row")


@triton.jit
def other_not_zero(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, OTHER=0.3)  # below every partial group's amax but row 0's


@triton.jit
def other_small_negative(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP, OTHER=-1e-3)


@triton.jit
def scale_only(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    row = tl.program_id(0)
    group = tl.program_id(1)
    tl.store(scale_ptr + row * tl.cdiv(K, GROUP) + group, 1.0)


@triton.jit
def zeroes_its_input(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    _quantize(x_ptr, q_ptr, scale_ptr, K, GROUP)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    tl.store(x_ptr + tl.program_id(0) * K + cols, tl.zeros((GROUP,), tl.float32), mask=cols < K)


@triton.jit
def stores_two_groups(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr):
    """Right values (the interpreter runs group g + 1 after g, which overwrites it), but each program also
    stores the next group's q with its own scale: a race on a GPU."""
    row, group = tl.program_id(0), tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10) / 448.0
    wide = group * GROUP + tl.arange(0, 2 * GROUP)
    xw = tl.load(x_ptr + row * K + wide, mask=wide < K, other=0.0)
    q = round_to_e4m3_grid(tl.minimum(tl.maximum(xw / scale, -448.0), 448.0))
    tl.store(q_ptr + row * K + wide, q.to(tl.float8e4nv), mask=wide < K)
    tl.store(scale_ptr + row * tl.cdiv(K, GROUP) + group, scale)


def _solution():
    return notebook_kernel("09_fp8", "quantize_rows_kernel_solution", round_to_e4m3_grid=round_to_e4m3_grid)


def test_the_notebook_solution_and_the_switch_kernel_pass():
    assert exercises.check_quantize_rows(_solution(), strict=True).passed
    verdict = exercises.check_quantize_rows(right, strict=True)
    assert verdict.passed and "bit for bit" in verdict.message and "two launches" in verdict.message


def test_the_notebook_stub_is_not_yet(capsys):
    stub = notebook_kernel("09_fp8", "quantize_rows_kernel", round_to_e4m3_grid=round_to_e4m3_grid)
    assert_not_yet(exercises.check_quantize_rows, stub, ["stores nothing"], "quantize_rows_kernel", capsys)


def test_wrong_kernels_are_named(capsys):
    for kernel, words in (
        (unmasked, ["past the 1000 elements of x_ptr", "not a multiple of GROUP", "cols < K"]),
        (scale_is_amax, ["group's amax", "divide it by 448"]),
        (inverse_scale, ["448 / amax, the inverse"]),
        (reciprocal_multiply, ["amax * (1 / 448)", "rounds twice"]),
        (one_scale_per_row, ["the row's scale"]),
        (max_not_abs, ["max(x), not max(|x|)"]),
        (no_floor, ["got scale 0", "0 / 0 = NaN", "1e-10"]),
        (groups_start_at_group, ["start at channel `group`, not `group * GROUP`"]),
        (groups_all_at_zero, ["values of q were never written", "cols = group * GROUP"]),
        (cast_e5m2, ["e5m2", "tl.float8e4nv"]),
        (rounded_then_e5m2, ["e5m2", "tl.float8e4nv"]),
        (q_over_448, ["q is x / 448", "group's scale"]),
        (scale_448, ["every scale is 448", "amax divided by 448"]),
        (x_without_row, ["row 0's scales", "x_ptr + row * K + cols"]),
        (load_without_other, ["no other=", "other=0.0", "undefined"]),
        (other_not_zero, ["only scales of the last group", "72 channels and 56 masked lanes", "other=0.0"]),
        (other_small_negative, ["masked lanes' `other=` value enters the amax", "other=0.0"]),
        (cast_e4b15, ["e4b15", "largest value 1.875", "tl.float8e4nv"]),
        (cast_int8, ["cannot convert a tensor to fp8e4nv", "integers stored into a float8 buffer"]),
        (no_row_offset, ["rows [1, 2, 3, 4] of q were never written", "row * K"]),
        (scales_transposed, ["stored transposed", "row * tl.cdiv(K, GROUP) + group"]),
        (scales_at_row_times_k, ["past the 10 elements of scale_ptr", "row * tl.cdiv(K, GROUP) + group"]),
        (two_groups_written_in, ["with 3 rows, K = 300, GROUP = 64", "written into the kernel"]),
        (q_times_scale, ["q is x times the scale: divide instead"]),
        (q_not_scaled, ["x cast as it is"]),
        (axes_swapped, ["never"]),
        (scale_only, ["q was never stored"]),
        (zeroes_its_input, ["also stores into x_ptr, an input it must only read"]),
        (stores_two_groups, ["elements of q_ptr are stored by more than one program", "race"]),
    ):
        assert_not_yet(exercises.check_quantize_rows, kernel, words, "quantize_rows_kernel", capsys)


def test_no_kernel_at_all_is_labelled_with_the_exercises_kernel(capsys):
    for not_a_kernel, words in ((None, ["got None"]), (right[(5, 2)], ["right[grid]", "a launch of the kernel"])):
        assert_not_yet(exercises.check_quantize_rows, not_a_kernel, words, "quantize_rows_kernel", capsys)


def test_the_interpreters_cast_is_named_and_the_helper_fixes_it(capsys):
    # on a GPU too: the checker grades the kernel's interpreted run (see the test below)
    assert_not_yet(
        exercises.check_quantize_rows,
        no_e4m3_rounding,
        ["half what they should be", "round_to_e4m3_grid(q)", "interpreter"],
        "quantize_rows_kernel",
        capsys,
    )


def test_a_kernel_compiled_for_a_gpu_is_graded_by_its_interpreted_run(capsys):
    """On a GPU the learner's kernel is a JITFunction; the checker runs its source under the interpreter (a
    compiled `/` is approximate, bit-for-bit grading needs the IEEE one). Simulated here by wrapping the
    kernels' Python functions in JITFunction, as `@triton.jit` does without TRITON_INTERPRET."""
    from triton.runtime.jit import JITFunction

    assert exercises.check_quantize_rows(JITFunction(right.fn), strict=True).passed
    capsys.readouterr()
    assert_not_yet(
        exercises.check_quantize_rows,
        JITFunction(scale_is_amax.fn),
        ["divide it by 448"],
        "quantize_rows_kernel",
        capsys,
    )
