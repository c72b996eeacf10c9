"""Exercise 10 (copy_load_partition, Gluon): the notebook's solution passes the protocol model and compiles for
sm_90 in a child process (no GPU); the stub and every named slip get NOT YET with their diagnosis (from the model,
no compile), and FAIL with strict=True; on a Hopper GPU the solution copies bit for bit and a hanging producer is
stopped."""

import pytest
import torch

from moe_lab import capability
from moe_lab.workbook import exercises
from moe_lab.workbook.exercises import ws_copy
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = [
    pytest.mark.kernels,  # the kernel subset, run under every supported Triton (make test-matrix)
    pytest.mark.skipif(capability._gluon_problem() is not None, reason="this Triton has no Gluon for Hopper"),
]


def _notebook(name):
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    return notebook_kernel(
        "10_warp_specialization", name, gluon=gluon, gl=gl, mbarrier=mbarrier, tma=tma, tma_load=tma_load
    )


def _slip(body: str):
    """The solution with its loop body replaced: a @gluon.jit function of the same signature."""
    source = f"""
@gluon.jit
def copy_load_partition(src_desc, bufs, ready, empty, M, N):
    BLOCK_M: gl.constexpr = src_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = src_desc.block_type.shape[1]
    STAGES: gl.constexpr = bufs.type.shape[0]
    num_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for t in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * num_n, gl.num_programs(0)):
        row = (t // num_n) * BLOCK_M
        col = (t % num_n) * BLOCK_N
{body}
"""
    return source


WAIT = "        mbarrier.wait(empty.index(step % STAGES), ((step // STAGES) & 1) ^ 1)\n"
EXPECT = "        mbarrier.expect(ready.index(step % STAGES), src_desc.block_type.nbytes)\n"
LOAD = "        tma_load(src_desc, [row, col], ready.index(step % STAGES), bufs.index(step % STAGES))\n"
STEP = "        step += 1\n"

SLIPS = {
    "no_wait": (EXPECT + LOAD + STEP, "does not wait for stage"),
    "wait_on_ready": (WAIT.replace("empty", "ready") + EXPECT + LOAD + STEP, "waits on ready[0], the consumer's"),
    "wait_after_load": (EXPECT + LOAD + WAIT + STEP, "comes after the load"),
    "parity_not_flipped": (
        WAIT.replace(" ^ 1", "") + EXPECT + LOAD + STEP,
        "parity of the wait on empty is not flipped",
    ),
    "constant_parity": (WAIT.replace("((step // STAGES) & 1) ^ 1", "1") + EXPECT + LOAD + STEP, "always uses parity 1"),
    "no_expect": (WAIT + LOAD + STEP, "no expect on ready[0]"),
    "expect_on_empty": (WAIT + EXPECT.replace("ready", "empty") + LOAD + STEP, "the expect is on empty[0]"),
    "expect_wrong_bytes": (
        WAIT + EXPECT.replace("src_desc.block_type.nbytes", "BLOCK_M * BLOCK_N") + LOAD + STEP,
        "the expect counts 512 bytes; one box is 2048 bytes",
    ),
    "load_signals_empty": (
        WAIT + EXPECT + LOAD.replace("ready.index", "empty.index") + STEP,
        "the TMA load signals empty[0]",
    ),
    "stage_from_tile": (
        (WAIT + EXPECT + LOAD).replace("step % STAGES", "t % STAGES").replace("step // STAGES", "t // STAGES") + STEP,
        "the stage comes from the tile index t",
    ),
    "step_never_advances": (WAIT + EXPECT + LOAD, "step never advances"),
    "off_by_one": (STEP + WAIT + EXPECT + LOAD, "off by one in the ring"),
    "box_and_barrier_apart": (
        WAIT + EXPECT + LOAD.replace("bufs.index(step % STAGES)", "bufs.index((step + 1) % STAGES)") + STEP,
        "loads into bufs[1] but signals ready[0]",
    ),
    "ring_overflow": (
        WAIT + EXPECT + LOAD.replace("bufs.index(step % STAGES)", "bufs.index(step)") + STEP,
        "the ring has STAGES = 3 stages",
    ),
    "expect_before_wait": (EXPECT + WAIT + LOAD + STEP, "comes before the wait on empty"),
    # pred=: a call predicated off does nothing, as on the GPU (the model used to record it all the same)
    "wait_only_in_round_0": (
        WAIT.replace(" ^ 1)", " ^ 1, pred=step < STAGES)") + EXPECT + LOAD + STEP,
        "does not wait for stage 0 to be empty",
    ),
    "expect_predicated_off": (WAIT + EXPECT.replace("nbytes)", "nbytes, pred=False)") + LOAD + STEP, "no expect on"),
    "loads_predicated_off": (WAIT + EXPECT + LOAD.replace("STAGES))", "STAGES), pred=t < 3)") + STEP, "deadlock"),
    # // and % of a negative number round toward zero on the GPU, toward minus infinity in Python's body
    "previous_rounds_parity": (
        WAIT.replace("((step // STAGES) & 1) ^ 1", "((step - STAGES) // STAGES) & 1") + EXPECT + LOAD + STEP,
        "`(step - STAGES) // STAGES` is -2 // 3: -1 in Python but 0 on the GPU",
    ),
    "stage_of_negative_step": (
        (WAIT + EXPECT + LOAD).replace("step % STAGES", "(step - STAGES) % STAGES") + STEP,
        "is -2 % 3: 1 in Python but -2 on the GPU",
    ),
    "producer_arrives": (
        WAIT + EXPECT + LOAD + "        mbarrier.arrive(ready.index(step % STAGES), count=1)\n" + STEP,
        "the producer arrives on ready[0] itself",
    ),
}


def _define(source, tmp_path, name):
    """Define a producer from source in a module file (Gluon reads a function's source from its file)."""
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(ws_copy.PRODUCER_HEADER + source)
    spec = importlib.util.spec_from_file_location(f"ws_copy_slip_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.copy_load_partition


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_each_slip_is_named(slip, tmp_path):
    body, words = SLIPS[slip]
    kernel = _define(_slip(body), tmp_path, slip)
    verdict = exercises.check_ws_copy(kernel)
    assert verdict.status == "NOT YET" and words in verdict.message, verdict.message


# A producer right at the notebook's size (2 programs, STAGES = 3, boxes of 16 x 32: two rounds of the ring) but not
# at the GPU run's others: the model plays those too, so a laptop finds it.
SECOND_SIZE = {
    "parity_right_for_two_rounds": (
        WAIT.replace("((step // STAGES) & 1) ^ 1", "1 if step < STAGES else 0") + EXPECT + LOAD + STEP,
        "step 4 (round 2 of the ring) waits on empty[0] for parity 0, the protocol for 1",
    ),
    "bytes_written_in": (
        WAIT + EXPECT.replace("src_desc.block_type.nbytes", "2048") + LOAD + STEP,
        "the expect counts 2048 bytes; one box is 4096 bytes (32 x 32 float32)",
    ),
    "stages_written_in": (
        (WAIT + EXPECT + LOAD).replace("STAGES", "3") + STEP,
        "empty.index(2): the ring has STAGES = 2 stages",
    ),
}


@pytest.mark.parametrize("slip", sorted(SECOND_SIZE))
def test_a_number_written_into_the_producer_is_found_at_another_size(slip, tmp_path):
    body, words = SECOND_SIZE[slip]
    kernel = _define(_slip(body), tmp_path, slip)
    verdict = exercises.check_ws_copy(kernel)
    assert verdict.status == "NOT YET", verdict.message
    assert verdict.message.startswith(
        "right with 2 programs, STAGES = 3 and boxes of 16 x 32 (2 rounds of the ring), but not with 5 programs, "
        "STAGES = 2 and boxes of 32 x 32 (7 rounds of the ring): look for a number written into the producer"
    ), verdict.message
    assert words in verdict.message, verdict.message


def test_the_model_plays_the_sizes_of_the_gpu_run():
    from moe_lab.workbook.exercises import ws_copy_kernels

    assert [(m, n, bm, bn, s, p) for m, n, _, bm, bn, s, p in ws_copy_kernels.CASES] == [
        (c.m, c.n, c.block_m, c.block_n, c.stages, c.programs) for c in ws_copy.CONFIGS
    ]
    assert max(c.rounds for c in ws_copy.CONFIGS) >= 4 and {c.stages for c in ws_copy.CONFIGS} == {2, 3, 4}


def test_gluon_builtins_on_scalars_run_in_the_model(tmp_path):
    """gl.static_assert, gl.where, gl.minimum and gl.maximum on the body's Python numbers run in the model (a right
    producer using them passes); a false static_assert is named as such; a function the model cannot run says so,
    never Triton's "Did you forget to add @triton.gluon.jit?"."""
    body = (
        "        gl.static_assert(STAGES >= 2, 'a ring of two stages or more')\n"
        "        gl.static_print('stages', STAGES)\n"
        + WAIT.replace("((step // STAGES) & 1) ^ 1", "gl.where((step // STAGES) % 2 == 0, 1, 0)")
        + EXPECT
        + LOAD.replace("[row, col]", "[gl.minimum(row, M), gl.maximum(col, 0)]")
        + STEP
    )
    kernel = _define(_slip(body), tmp_path, "builtins")
    assert exercises.check_ws_copy(kernel, strict=True, gpu=False).passed  # and it compiles for sm_90
    false = _define(_slip(body.replace("STAGES >= 2", "STAGES >= 3")), tmp_path, "static_assert")
    message = exercises.check_ws_copy(false).message
    assert message.startswith("right with 2 programs, STAGES = 3") and (
        "the producer's gl.static_assert failed: 'a ring of two stages or more' (in the model, with STAGES = 2 and "
        "boxes of 32 x 32)" in message
    ), message
    other = _define(_slip("        offs = gl.arange(0, 16)\n" + WAIT + EXPECT + LOAD + STEP), tmp_path, "arange")
    message = exercises.check_ws_copy(other).message
    assert "the model runs the producer's body as plain Python and cannot run gl.arange" in message, message
    assert "forget" not in message
    init = _define(
        _slip("        mbarrier.init(ready.index(0), count=1)\n" + WAIT + EXPECT + LOAD + STEP), tmp_path, "i"
    )
    assert "cannot run mbarrier.init" in exercises.check_ws_copy(init).message


def test_skipping_the_waits_of_round_0_passes(tmp_path):
    """Round 0's stages start empty, so its waits pass at once on hardware: a producer that skips them is right.
    Skipping one more (step 3, the first of round 1, with 3 stages) is not."""
    skip = "        if step >= STAGES:\n    " + WAIT
    kernel = _define(_slip(skip + EXPECT + LOAD + STEP), tmp_path, "skip_round_0")
    assert exercises.check_ws_copy(kernel, strict=True, gpu=False).passed
    late = _define(_slip(skip.replace("STAGES:", "STAGES + 1:") + EXPECT + LOAD + STEP), tmp_path, "skip_more")
    message = exercises.check_ws_copy(late).message
    assert message.startswith("the producer does not wait for stage 0 to be empty") and "race in the model" in message


def test_slips_that_hang_say_deadlock(tmp_path):
    for slip in ("parity_not_flipped", "no_expect"):
        message = ws_copy.model_problem(_define(_slip(SLIPS[slip][0]), tmp_path, slip))
        assert "deadlock in the model" in message, message
    message = ws_copy.model_problem(_define(_slip(SLIPS["no_wait"][0]), tmp_path, "no_wait"))
    assert "race in the model" in message and "overwritten" in message, message


def test_the_stub_is_not_yet(capsys):
    words = ["the producer issues no TMA load", "deadlock in the model"]
    assert_not_yet(exercises.check_ws_copy, _notebook("copy_load_partition"), words, "copy_load_partition", capsys)


def test_the_solution_passes_the_model_and_compiles_for_sm90():
    solution = _notebook("copy_load_partition_solution")
    assert ws_copy.model_problem(solution) is None
    verdict = exercises.check_ws_copy(solution, strict=True, gpu=False)
    assert verdict.passed and "warp_specialize" in verdict.message


def test_not_a_gluon_kernel_is_named(tmp_path):
    verdict = exercises.check_ws_copy(None)
    assert verdict.status == "NOT YET" and "@gluon.jit" in verdict.message
    with pytest.raises(AssertionError, match="FAIL"):
        exercises.check_ws_copy(lambda: None, strict=True)
    solution = _define(_slip(WAIT + EXPECT + LOAD + STEP), tmp_path, "launch")
    assert "copy_load_partition[grid], a launch" in exercises.check_ws_copy(solution[(2,)]).message
    triton_kernel = _define(_slip(STEP).replace("@gluon.jit", "import triton\n\n\n@triton.jit"), tmp_path, "triton_jit")
    assert "a @triton.jit function" in exercises.check_ws_copy(triton_kernel).message
    plain = _define(_slip(STEP).replace("@gluon.jit", ""), tmp_path, "plain")
    assert "a plain Python function" in exercises.check_ws_copy(plain).message
    assert "got int 5 (from" in exercises.check_ws_copy(5).message


def test_a_signature_of_other_than_six_parameters_is_named(tmp_path):
    kernel = _define(_slip(STEP).replace("empty, M, N)", "empty, M)"), tmp_path, "five")
    verdict = exercises.check_ws_copy(kernel)
    assert verdict.status == "NOT YET" and "the producer takes (src_desc, bufs, ready, empty, M);" in verdict.message


def test_a_call_with_wrong_arguments_names_the_gluon_call(tmp_path):
    kernel = _define(
        _slip(WAIT + EXPECT.replace("src_desc.block_type", "bytes=src_desc.block_type") + LOAD + STEP),
        tmp_path,
        "keyword",
    )
    verdict = exercises.check_ws_copy(kernel)
    assert "mbarrier.expect() got an unexpected keyword argument 'bytes'" in verdict.message, verdict.message
    kernel = _define(
        _slip(WAIT + EXPECT + LOAD.replace("ready.index(step % STAGES)", "ready[step % STAGES]") + STEP),
        tmp_path,
        "subscript",
    )
    verdict = exercises.check_ws_copy(kernel)
    assert "ready[...]: a stage of the ring is ready.index(stage)" in verdict.message, verdict.message


def test_a_compile_error_names_its_cause(tmp_path):
    """A producer that passes the model but not the compiler (a module global, a break) gets the compiler's own
    error, not only the outer layer of its CompilationError."""
    source = _slip(WAIT + EXPECT + LOAD + STEP.replace("1", "ONE"))
    kernel = _define(source.replace("@gluon.jit", "ONE = 1\n\n\n@gluon.jit"), tmp_path, "global")
    verdict = exercises.check_ws_copy(kernel)
    assert verdict.status == "NOT YET" and "NameError" in verdict.message and "keep everything else" in verdict.message
    kernel = _define(
        _slip(WAIT + EXPECT + LOAD + STEP + "        if step > 1000:\n            break\n"), tmp_path, "brk"
    )
    message = exercises.check_ws_copy(kernel).message
    assert "failed at `break` (line 15 of copy_load_partition" in message and "Break" in message, message


def test_a_compile_error_shows_the_producers_line_once(tmp_path):
    """The compile error names the producer's failing line (the innermost CompilationError), not the entry
    kernel's gl.warp_specialize( twice; a Python builtin Gluon does not run is named as such."""
    divmod_ = WAIT + EXPECT + LOAD.replace("[row, col]", "[q * BLOCK_M, r * BLOCK_N]") + STEP
    kernel = _define(_slip("        q, r = divmod(t, num_n)\n" + divmod_), tmp_path, "divmod")
    message = exercises.check_ws_copy(kernel).message
    assert message.startswith(
        "compiling the producer for sm_90 failed at `q, r = divmod(t, num_n)` (line 10 of copy_load_partition, its "
        "def line 1): Gluon kernels cannot call Python's divmod: use // and %"
    ), message
    assert "warp_specialize" not in message and "keep everything else" not in message, message
    kernel = _define(_slip("        order = sorted([row, col])\n" + WAIT + EXPECT + LOAD + STEP), tmp_path, "sorted")
    message = exercises.check_ws_copy(kernel).message
    assert "`order = sorted([row, col])` (line 10 of copy_load_partition" in message, message
    assert "sorted is a Python builtin Gluon does not run inside a kernel" in message, message
    kernel = _define(_slip("        print(step)\n" + WAIT + EXPECT + LOAD + STEP), tmp_path, "print")
    message = exercises.check_ws_copy(kernel).message
    assert "`print(step)`" in message and 'gl.device_print("stage", stage)' in message, message


def test_a_loop_that_never_ends_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(ws_copy, "MODEL_SECONDS", 0.5)
    spin = _define(_slip("        while True:\n            pass\n"), tmp_path, "spin")
    verdict = exercises.check_ws_copy(spin)
    assert verdict.status == "NOT YET" and "ran for more than 0.5 s in the model" in verdict.message, verdict.message
    waits = _define(_slip("        while step >= 0:\n    " + WAIT), tmp_path, "waits")
    verdict = exercises.check_ws_copy(waits)
    assert verdict.status == "NOT YET" and "more than 1000 mbarrier and TMA calls" in verdict.message, verdict.message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="Hopper")
def test_the_solution_copies_bitwise_on_hopper_and_a_hang_is_stopped(tmp_path):
    verdict = exercises.check_ws_copy(_notebook("copy_load_partition_solution"), strict=True)
    assert "bitwise right at three sizes" in verdict.message
    hang = _define(_slip(SLIPS["parity_not_flipped"][0]), tmp_path, "hang")
    assert ws_copy._child(hang, "run", 60) == {"timeout": 60}  # a deadlocked kernel is stopped, not waited on


def test_the_verdict_is_labelled_with_the_exercise(tmp_path):
    """As every checker's: `PASS copy_load_partition: ...` whatever the producer's function is called."""
    source = _slip(WAIT + EXPECT + LOAD + STEP).replace("def copy_load_partition", "def my_producer")
    kernel = _define(source + "\n\ncopy_load_partition = my_producer\n", tmp_path, "renamed")
    verdict = exercises.check_ws_copy(kernel, gpu=False)
    assert kernel.__name__ == "my_producer" and str(verdict).startswith("PASS copy_load_partition: "), verdict


def test_the_descriptors_dtype_and_element_type_are_gluons(tmp_path):
    """A producer counting the expect's bytes from the dtype (a right one) passes the model; what the model's
    src_desc lacks is said, not shown as an AttributeError of a stand-in."""
    bits = EXPECT.replace("src_desc.block_type.nbytes", "BLOCK_M * BLOCK_N * src_desc.dtype.primitive_bitwidth // 8")
    assert ws_copy.model_problem(_define(_slip(WAIT + bits + LOAD + STEP), tmp_path, "bits")) is None
    element = bits.replace("src_desc.dtype", "src_desc.block_type.element_ty")
    assert ws_copy.model_problem(_define(_slip(WAIT + element + LOAD + STEP), tmp_path, "element")) is None
    layout = "        lay = src_desc.layout\n"
    message = ws_copy.model_problem(_define(_slip(layout + WAIT + EXPECT + LOAD + STEP), tmp_path, "layout"))
    assert "the model's src_desc has" in message and "not .layout" in message, message


def test_a_compile_error_the_compiler_prints_names_the_line(tmp_path):
    """A bool parity passes the model (True is 1) but not the compiler, which says why only on stderr (MLIR's
    diagnostic): the verdict gives that line and reason, not only "error encountered during parsing"."""
    wait = WAIT.replace("((step // STAGES) & 1) ^ 1", "(step // STAGES) % 2 == 0")
    message = exercises.check_ws_copy(_define(_slip(wait + EXPECT + LOAD + STEP), tmp_path, "bool")).message
    assert "(line 10 of copy_load_partition" in message and "32-bit signless integer" in message, message


def test_strict_and_gpu_must_be_bools_and_gpu_true_needs_hopper(tmp_path):
    solution = _notebook("copy_load_partition_solution")
    with pytest.raises(TypeError, match="strict must be a bool, got str 'no'"):
        exercises.check_ws_copy(solution, strict="no")
    with pytest.raises(TypeError, match="gpu must be a bool, got str 'no'"):
        exercises.check_ws_copy(solution, gpu="no")
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        with pytest.raises(ValueError, match="gpu=True runs the copy on a Hopper GPU"):
            exercises.check_ws_copy(solution, gpu=True)


def test_divisions_the_gpu_rounds_alike_pass():
    """Exact divisions of negative numbers, and every division of counts >= 0, run in the model as in Python."""
    assert ws_copy._int_division(-6, 3, "//") == -2 and ws_copy._int_division(-6, 3, "%") == 0
    assert ws_copy._int_division(7, 3, "//") == 2 and ws_copy._int_division(7, 3, "%") == 1
    assert ws_copy._int_division(-7, -2, "//") == 3  # same signs: both round the same way
    with pytest.raises(ws_copy.ModelError, match="`a` is 7 // -2: -4 in Python but -3 on the GPU"):
        ws_copy._int_division(7, -2, "//", "a")


def test_a_gluon_helper_of_the_learners_own_is_named(tmp_path):
    source = _slip(WAIT.replace("((step // STAGES) & 1) ^ 1", "parity(step, STAGES)") + EXPECT + LOAD + STEP)
    helper = "@gluon.jit\ndef parity(step, STAGES):\n    return ((step // STAGES) & 1) ^ 1\n\n\n"
    source = source.replace("@gluon.jit\ndef copy_load_partition", helper + "@gluon.jit\ndef copy_load_partition")
    verdict = exercises.check_ws_copy(_define(source, tmp_path, "helper"))
    assert verdict.status == "NOT YET" and "calls a @gluon.jit function of its own" in verdict.message
