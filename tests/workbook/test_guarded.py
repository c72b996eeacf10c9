"""moe_lab.workbook.guarded: a learner's kernel runs on guarded copies; out-of-bounds accesses are reported with the
tensor's parameter name and offsets (dropped under the interpreter, found by canaries on a GPU)."""

import re

import pytest
import torch
import triton
import triton.language as tl

from moe_lab.runtime import interpreter_active
from moe_lab.workbook.guarded import GUARD_BYTES, KernelMismatch, run_guarded

from ..conftest import ON_GPU

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr, MASK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs * stride, mask=offs < n), mask=offs < n)
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs * stride))


@triton.jit
def count_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(counts_ptr + tl.load(ids_ptr + offs, mask=offs < n, other=0), 1, mask=offs < n)


def test_a_right_kernel_runs_clean_and_leaves_the_callers_tensors_alone(device):
    x = torch.randn(100, device=device)
    out = torch.full_like(x, float("nan"))
    run = run_guarded(copy_kernel, (4,), x_ptr=x, out_ptr=out, n=100, stride=1, BLOCK=32, MASK=True)
    assert run.clean and run.problem() is None
    assert torch.equal(run.tensors["out_ptr"], x) and torch.isnan(out).all()


def test_an_unmasked_tail_is_reported_per_tensor_with_offsets(device):
    x = torch.randn(100, device=device)
    run = run_guarded(copy_kernel, (4,), x_ptr=x, out_ptr=torch.zeros_like(x), n=100, stride=1, BLOCK=32, MASK=False)
    stores = [o for o in run.out_of_bounds if o.kind == "store"]
    assert len(stores) == 1 and stores[0].tensor == "out_ptr"
    assert stores[0].offsets[:3] == (100, 101, 102) and stores[0].count == 28
    assert "past the 100 elements of out_ptr" in run.problem()
    assert any(o.tensor == "x_ptr" and o.kind == "load" for o in run.out_of_bounds)
    assert torch.equal(run.tensors["out_ptr"], x)  # the in-bounds part was written


def test_a_wild_pointer_far_outside_every_buffer_is_dropped_and_named(device):
    """On a GPU too: the interpreter's run on CPU copies finds it, and the GPU never sees it."""
    x = torch.randn(64, device=device)
    run = run_guarded(copy_kernel, (1,), x_ptr=x, out_ptr=torch.zeros_like(x), n=64, stride=10**7, BLOCK=64, MASK=True)
    (load,) = run.out_of_bounds
    assert load.far and load.kind == "load" and load.count == 63  # lane 0 reads x[0]
    assert "far outside every tensor" in run.problem()


def test_gaps_of_a_strided_view_are_out_of_bounds(device):
    x = torch.randn(8, 40, device=device)[:, :32]  # rows of 32 in a row stride of 40
    run = run_guarded(
        copy_kernel, (1,), x_ptr=x, out_ptr=torch.zeros(256, device=device), n=256, stride=1, BLOCK=256, MASK=True
    )
    (load,) = run.out_of_bounds
    assert load.tensor == "x_ptr" and load.offsets[0] == 32 and "gaps its strides skip" in load.describe()


def test_atomics_out_of_bounds_are_reported(device):
    ids = torch.tensor([0, 1, 2, 5, 9], dtype=torch.int32, device=device)  # 9: past 6 counters
    run = run_guarded(
        count_kernel, (1,), ids_ptr=ids, counts_ptr=torch.zeros(6, dtype=torch.int32, device=device), n=5, BLOCK=8
    )
    (bad,) = run.out_of_bounds
    assert bad.tensor == "counts_ptr" and bad.offsets == (9,)
    assert run.tensors["counts_ptr"].tolist() == [1, 1, 1, 0, 0, 1]


def test_an_error_in_the_kernel_is_returned_not_raised(device):
    x = torch.randn(10, device=device)
    run = run_guarded(copy_kernel, (1,), x_ptr=x, out_ptr=x.clone(), n=10, stride=1, BLOCK=10, MASK=True)
    assert run.error is not None and run.problem().startswith("the kernel raised")  # arange of 10


@triton.jit
def misspelled_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + ofs, mask=offs < n), mask=offs < n)  # noqa: F821 - the slip


def test_an_error_in_the_kernel_names_its_line(device):
    x = torch.randn(10, device=device)
    problem = run_guarded(misspelled_kernel, (1,), x_ptr=x, out_ptr=x.clone(), n=10, BLOCK=16).problem()
    assert "NameError" in problem and "'ofs' is not defined" in problem, problem
    line = misspelled_kernel.fn.__code__.co_firstlineno + 3
    assert f"(in misspelled_kernel, line {line}: tl.store(out_ptr + offs, tl.load(x_ptr + ofs, mask=" in problem


def test_wrong_calls_of_the_runner_raise_type_errors():
    def plain(x_ptr):
        pass

    for kernel, says in (
        (None, "got None"),
        (plain, "plain Python function"),
        (copy_kernel[(1,)], "kernel[grid]"),
        ("copy_kernel", "expected a @triton.jit function, got str"),
    ):
        with pytest.raises(KernelMismatch, match=re.escape(says)):
            run_guarded(kernel, (1,))
    with pytest.raises(TypeError, match="has no parameter y_ptr: this exercise passes y_ptr"):
        run_guarded(copy_kernel, (1,), y_ptr=torch.zeros(1))


@pytest.mark.parametrize(
    "change, error, says",
    [
        (
            dict(n=None),
            KernelMismatch,
            "copy_kernel(x_ptr, out_ptr, n, stride, BLOCK, MASK) needs n: this exercise passes x_ptr",
        ),
        (
            dict(x_ptr="numpy"),
            TypeError,
            "x_ptr must be a torch.Tensor (a pointer), an int, float or bool (a scalar), None, or for a tl.constexpr "
            "parameter a constant, got numpy.ndarray; torch.from_numpy(...) makes one",
        ),
        (dict(x_ptr="list"), TypeError, "got list; torch.tensor(...) makes one"),
        (
            dict(n="10"),
            TypeError,
            "n must be a torch.Tensor (a pointer), an int, float or bool (a scalar), None, or for a tl.constexpr "
            "parameter a constant, got str",
        ),
    ],
)
def test_arguments_no_kernel_takes_are_the_calls_mistake(change, error, says):
    x = torch.randn(10)
    args = dict(x_ptr=x, out_ptr=x.clone(), n=10, stride=1, BLOCK=16, MASK=True)
    for name, value in change.items():
        if value is None:
            del args[name]
        else:
            args[name] = {"numpy": x.numpy(), "list": x.tolist()}.get(value, value)
    with pytest.raises(error, match=re.escape(says)):
        run_guarded(copy_kernel, (1,), **args)


def test_autotuned_and_heuristics_kernels_run_with_the_constexprs_their_configs_supply():
    tuned = triton.autotune([triton.Config({"BLOCK": 16})], key=["n"])(copy_kernel)
    guessed = triton.heuristics({"BLOCK": lambda args: 16})(copy_kernel)
    x = torch.randn(10)
    for kernel in (tuned, guessed):
        run = run_guarded(kernel, (1,), x_ptr=x, out_ptr=torch.zeros_like(x), n=10, stride=1, MASK=True)
        assert run.error is None and run.clean and torch.equal(run.tensors["out_ptr"], x), kernel
    with pytest.raises(TypeError, match="n must be a torch.Tensor"):
        run_guarded(tuned, (1,), x_ptr=x, out_ptr=x.clone(), n="10", stride=1, MASK=True)


@pytest.mark.parametrize(
    "grid, error, says",
    [
        (4, TypeError, "grid must be a tuple of 1 to 3 ints, .* got int 4 (one axis: write (4,))"),
        ("4", TypeError, "got str '4'"),
        (None, TypeError, "got NoneType None"),
        ((4.0,), TypeError, "got (4.0,) (holding float 4.0)"),
        ((True,), TypeError, "got (True,) (holding bool True)"),
        (("4",), TypeError, "got ('4',) (holding str '4')"),
        ((), ValueError, "got 0 axes: ()"),
        ((1, 1, 1, 1), ValueError, "got 4 axes"),
        ((-1,), ValueError, "grid must hold ints >= 0 (programs along each axis), got (-1,)"),
    ],
)
def test_a_wrong_grid_is_the_calls_mistake_not_the_kernels(grid, error, says):
    x = torch.randn(10)
    with pytest.raises(error, match=re.escape(says).replace(re.escape(".* "), ".* ")):
        run_guarded(copy_kernel, grid, x_ptr=x, out_ptr=x.clone(), n=10, stride=1, BLOCK=16, MASK=True)


def test_a_grid_as_a_list_numpy_ints_or_a_callable_runs():
    import numpy as np

    x = torch.randn(40)
    for grid in ([3], (np.int64(3),), lambda meta: (triton.cdiv(40, meta["BLOCK"]),)):
        run = run_guarded(copy_kernel, grid, x_ptr=x, out_ptr=torch.zeros_like(x), n=40, stride=1, BLOCK=16, MASK=True)
        assert run.clean and run.error is None and torch.equal(run.tensors["out_ptr"], x), grid


def test_numpy_scalars_are_taken_as_python_scalars():
    import numpy as np

    x = torch.randn(40)
    run = run_guarded(
        copy_kernel, (3,), x_ptr=x, out_ptr=torch.zeros_like(x), n=np.int64(40), stride=np.int32(1), BLOCK=16,
        MASK=np.bool_(True),
    )  # fmt: skip
    assert run.clean and run.error is None and torch.equal(run.tensors["out_ptr"], x)


def test_tensors_the_guard_cannot_take_are_named():
    x = torch.randn(100)
    args = dict(n=100, stride=1, BLOCK=32, MASK=True)
    with pytest.raises(ValueError, match=r"out_ptr has stride 0 \(strides \(0,\) for shape \(100,\): an expand"):
        run_guarded(copy_kernel, (4,), x_ptr=x, out_ptr=torch.zeros(1).expand(100), **args)
    with pytest.raises(ValueError, match=r"x_ptr has stride 0 .* pass a tensor of its own, x_ptr.contiguous\(\)"):
        run_guarded(copy_kernel, (4,), x_ptr=torch.ones(100, 1).expand(100, 3), out_ptr=x, **args)
    with pytest.raises(TypeError, match="x_ptr is a complex64 tensor, which a Triton kernel cannot take"):
        run_guarded(copy_kernel, (4,), x_ptr=torch.zeros(100, dtype=torch.complex64), out_ptr=x, **args)
    one = run_guarded(copy_kernel, (1,), x_ptr=torch.ones(1).expand(1), out_ptr=torch.zeros(1), **{**args, "n": 1})
    assert one.clean  # one element: a stride 0 shares nothing


@pytest.mark.skipif(ON_GPU, reason="the interpreter's deadline")
def test_a_stopped_launch_of_a_very_large_grid_names_the_grid(monkeypatch):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 1.0)
    x = torch.randn(64)
    run = guarded.run_guarded(
        copy_kernel, (100_000,), x_ptr=x, out_ptr=torch.zeros_like(x), n=64, stride=1, BLOCK=16, MASK=True
    )
    assert isinstance(run.error, guarded.NeverEnds)
    assert "or a grid far too large: 100000 programs" in str(run.error)
    assert "a grid far too large" not in guarded.never_ends_message(20, 10, (0, 0, 0), programs=64)


def test_guard_keeps_descriptor_alignment():
    assert GUARD_BYTES % 128 == 0  # a guarded tensor starts 16-byte (and 128-byte) aligned, as TMA wants


@triton.jit
def row_copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Copies a full block whatever n is: out of bounds only where n < BLOCK."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@pytest.mark.gpu
def test_on_a_gpu_the_canaries_see_what_the_gpu_did():
    """The GPU half alone (the interpreter's pre-run is skipped by giving a clean kernel a short output):
    stores into the guard are found with offsets, reads by changing the input's canaries."""
    from moe_lab.workbook import guarded

    x = torch.randn(64, device="cuda")
    seen = guarded._launch(
        row_copy_kernel,
        (1,),
        {"x_ptr": x[:48], "out_ptr": torch.zeros(40, device="cuda"), "n": 48, "BLOCK": 64},
        check_accesses=False,
    )[0]
    (store,) = guarded._written_guards(seen)
    assert store.tensor == "out_ptr" and store.offsets[0] == 40 and store.count == 24
    assert interpreter_active() is False and ON_GPU


CALLS_A_HELPER = """
import torch, triton, triton.language as tl
import moe_lab
from moe_lab.workbook import guarded
from moe_lab.workbook.guarded import run_guarded
from triton.runtime import interpreter

guarded.interpreter_numpy_problem = lambda *versions: "forced"  # take Triton 3.7's loop-bound reading too
patch_tensor = interpreter._patch_lang_tensor

@triton.jit
def double(x):
    return 2 * x

@triton.jit
def helper_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = double(tl.load(x_ptr + offs, mask=offs < n))
    for _ in range(0, tl.cdiv(n, BLOCK)):  # a run-time loop bound
        x += 1
    tl.store(out_ptr + offs, x + tl.sum(x, axis=0))

def language():
    return {(owner.__name__, name): getattr(owner, name) for owner in (tl, tl.core, tl.tensor, tl.math)
            for name in dir(owner) if not name.startswith("__")}

before = language()
run = run_guarded(helper_kernel, (2,), x_ptr=torch.ones(100), out_ptr=torch.zeros(100), n=100, BLOCK=64)
print("RESULT", run.checked_by, run.problem())
changed = sorted(str(key) for key, value in language().items() if key in before and before[key] is not value)
print("CHANGED", changed, interpreter._patch_lang_tensor is patch_tensor)
"""


def test_compiled_kernels_calling_jit_helpers_are_checked_by_the_interpreter_first(tmp_path):
    """What a GPU run does first, reproduced without one (TRITON_INTERPRET=0: compiled kernels): the
    interpreter's check runs the kernel and the @triton.jit functions it calls (a learner's helper,
    tl.cdiv, tl.sum), finds the unmasked store, and nothing reaches a device; triton.language is left as
    it was (else the GPU's compile that follows a clean check fails)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "helper_kernel.py"
    script.write_text(CALLS_A_HELPER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env=dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=root),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RESULT interpreter 28 store(s) past the 100 elements of out_ptr" in done.stdout, done.stdout
    assert "CHANGED [] True" in done.stdout, done.stdout


@triton.jit
def _spins_without_memory(x_ptr, n):
    i = 0
    while i < n:  # no step, and no load or store inside: the access checker's clock never ticks
        i = i * 1


@pytest.mark.skipif(ON_GPU, reason="the interpreter's deadline; compiled for a GPU, this loop would spin there")
def test_a_loop_without_memory_accesses_is_stopped_too(monkeypatch):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 2.0)
    run = guarded.run_guarded(_spins_without_memory, (1,), x_ptr=torch.zeros(4), n=5)
    assert isinstance(run.error, guarded.NeverEnds) and "a loop that never ends" in str(run.error)


def test_static_range_bounds_must_be_constants():
    """The interpreter runs tl.static_range over runtime bounds; a GPU's compiler refuses it: said before any
    launch. Constants (constexpr parameters, locals made of them, a static_range's own index) pass."""
    from moe_lab.workbook.guarded import static_range_problem

    def fine(x_ptr, N, BLOCK: tl.constexpr, STEPS: tl.constexpr = 2):
        HALF = BLOCK // 2
        x = tl.load(x_ptr + tl.arange(0, BLOCK))
        for i in tl.static_range(STEPS):
            for j in tl.static_range(i, HALF + x.shape[0]):
                tl.store(x_ptr + j, j)

    def runtime_param(x_ptr, N, BLOCK: tl.constexpr):
        for i in tl.static_range(0, N):
            tl.store(x_ptr + i, i)

    def runtime_local(x_ptr, n_ptr, BLOCK: tl.constexpr):
        n = tl.load(n_ptr)
        m = n * 2
        for i in tl.static_range(m):
            tl.store(x_ptr + i, i)

    assert static_range_problem(fine) is None
    assert "N is a runtime value" in static_range_problem(runtime_param)
    assert "m is a runtime value" in static_range_problem(runtime_local)
    assert static_range_problem(lambda: None) is None  # no source to read: no claim
