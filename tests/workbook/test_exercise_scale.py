"""Exercise 00 (scale_kernel): the notebook's solution passes; typical wrong kernels get their diagnosis;
the unmasked kernel, which used to kill the Jupyter kernel under the interpreter, is reported and the
process lives on."""

import os
import subprocess
import sys
import textwrap

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def unmasked(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs))


@triton.jit
def store_masked_only(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs), mask=offs < n)


@triton.jit
def without_alpha(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def first_block_only(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def stores_into_x(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def int8_offsets(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int8)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs))


@triton.jit
def strided_offsets(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + 2 * offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def stub(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # noqa: F841 - the notebook's stub
    pass


@triton.jit
def shape_error(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK) + tl.arange(0, 2 * BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def alpha_written_in(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2.5 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def junk_into_the_next_block_first(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    """Right under the interpreter (the next program runs later and overwrites), a race on a GPU."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs + BLOCK, tl.zeros((BLOCK,), tl.float32), mask=offs + BLOCK < n)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_solution_passes():
    verdict = exercises.check_scale(notebook_kernel("00_start_here", "scale_kernel_solution"), strict=True)
    assert verdict.passed and str(verdict).startswith("PASS scale_kernel:")


@pytest.mark.parametrize(
    "kernel, says",
    [
        (unmasked, ["store(s) past the 1000 elements of out_ptr", "offsets 1000, 1001", "offs < n"]),
        (store_masked_only, ["load(s) past the 1000 elements of x_ptr", "offs < n"]),
        (without_alpha, ["multiply by alpha"]),
        (int8_offsets, ["before the first element of x_ptr", "offsets -128", "the offsets are wrong", "int8"]),
        (strided_offsets, ["store(s) past the 1000 elements of out_ptr", "the offsets are wrong", "no stride"]),
        (first_block_only, ["program_id(0) * BLOCK"]),
        (stub, ["stores nothing"]),
        (stores_into_x, ["nothing was stored into out_ptr; the kernel stored into x_ptr instead"]),
        (shape_error, ["raised", "256 and 512"]),
        (alpha_written_in, ["alpha = -1.5", "written into the kernel"]),
        (junk_into_the_next_block_first, ["stored by more than one program", "race"]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_wrong_kernels_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_scale, kernel, says, "scale_kernel", capsys)


def test_the_unmasked_kernel_leaves_the_process_alive():
    """In a fresh process (a heap corrupted by a stray store may only crash later), many unmasked runs,
    then normal work: the process must exit cleanly."""
    script = textwrap.dedent("""
        import moe_lab, torch
        from moe_lab.workbook import exercises
        from tests.workbook.test_exercise_scale import unmasked
        for _ in range(5):
            assert exercises.check_scale(unmasked).status == "NOT YET"
        x = [torch.randn(1000) for _ in range(200)]
        print("alive", sum(float(t.sum()) for t in x) == sum(float(t.sum()) for t in x))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alive True" in done.stdout


@triton.jit
def renamed(x, out, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, alpha * tl.load(x + offs, mask=offs < n), mask=offs < n)


@pytest.mark.parametrize(
    "kernel, says",
    [
        (None, "got None"),
        (renamed, "renamed(x, out, alpha, n, BLOCK) has no parameter x_ptr, out_ptr"),
        (unmasked[(4,)], "pass the kernel itself"),
    ],
)
def test_what_is_not_a_kernel_of_the_exercise_gets_not_yet(kernel, says):
    verdict = exercises.check_scale(kernel)
    assert verdict.status == "NOT YET" and says in verdict.message
    with pytest.raises(AssertionError, match="^FAIL "):
        exercises.check_scale(kernel, strict=True)


def test_a_kernel_defined_before_moe_lab_switched_the_interpreter_on_is_graded(tmp_path):
    """A script that imports triton and defines its kernel before `import moe_lab` has a compiled kernel
    with the interpreter on afterwards (and no GPU): the checker runs its source under the interpreter."""
    script = tmp_path / "early.py"
    script.write_text(
        textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

        import moe_lab
        from moe_lab.workbook import exercises
        print(exercises.check_scale(scale_kernel).status)
    """)
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("PASS"), done.stdout


@pytest.mark.parametrize("kernel", [int8_offsets, strided_offsets])
def test_wrong_offsets_are_not_told_to_mask(kernel):
    assert "mask the last block" not in exercises.check_scale(kernel).message
