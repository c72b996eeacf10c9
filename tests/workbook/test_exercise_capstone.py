"""The capstone of notebook 05b (the whole grouped GEMM, up and down): the reference solution passes; the
notebook's stubs and typical wrong kernels and descriptor helpers get NOT YET with their diagnosis."""

import functools

import pytest
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_lab.plan import tile_of_program
from moe_lab.workbook import exercises
from moe_lab.workbook.exercises import capstone
from moe_lab.workbook.exercises import capstone_solution as solution
from tests.notebook_source import assert_not_yet, notebook_kernel

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

NOTEBOOK = "05b_capstone"


@triton.jit
def _tile(num_m_blocks, N, BLOCK_SIZE_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr, ORDER: tl.constexpr):
    """(pid_m, pid_n): ORDER 0 grouped, 1 row-major, 2 grouped with the last group not clipped."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    if ORDER == 1:
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
    else:
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
        if ORDER == 2:
            group_size_m = GROUP_SIZE_M
        else:
            group_size_m = min(num_m_blocks - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
        pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _expert(expert_ids_ptr, pid_m, EXPERT: tl.constexpr):
    """EXPERT 0: expert_ids[pid_m]; 1: expert 0; 2: the block index."""
    if EXPERT == 1:
        return 0
    elif EXPERT == 2:
        return pid_m
    else:
        return tl.load(expert_ids_ptr + pid_m)


@triton.jit
def _up(
    a_ptr, w_desc, out_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    num_m_blocks, N, K, num_slots, stride_am, stride_om,
    TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EXPERT: tl.constexpr = 0, ORDER: tl.constexpr = 0, ROW_MASK: tl.constexpr = True,
    K_MASK: tl.constexpr = True, OTHER: tl.constexpr = True, N_MASK: tl.constexpr = True,
    SKIP_UNUSED: tl.constexpr = True, K_TAIL: tl.constexpr = True, STORE_PADDING: tl.constexpr = True,
    TOKEN_ROW: tl.constexpr = True, ROW_STRIDE: tl.constexpr = True, INT64: tl.constexpr = True,
    ACC: tl.constexpr = True, SLOT_MOD: tl.constexpr = False,
):  # fmt: skip
    """The solution, with switches that each make one slip."""
    pid_m, pid_n = _tile(num_m_blocks, N, BLOCK_SIZE_N, GROUP_SIZE_M, ORDER)
    if SKIP_UNUSED:
        if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
            return
    expert = _expert(expert_ids_ptr, pid_m, EXPERT)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    row_ok = slots < num_slots
    if not ROW_MASK:
        row_ok = slots >= 0
    tokens = (slots // TOP_K).to(tl.int64)
    if SLOT_MOD:
        tokens = (slots % TOP_K).to(tl.int64)
    if not INT64:
        tokens = slots // TOP_K
    if not TOKEN_ROW:
        tokens = slots.to(tl.int64)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    k_end = K if K_TAIL else K - BLOCK_SIZE_K + 1
    for k0 in range(0, k_end, BLOCK_SIZE_K):
        mask = row_ok[:, None] & ((k0 + offs_k[None, :] < K) | (not K_MASK))
        if OTHER:
            a = tl.load(a_ptr + tokens[:, None] * stride_am + k0 + offs_k[None, :], mask=mask, other=0.0)
        else:
            a = tl.load(a_ptr + tokens[:, None] * stride_am + k0 + offs_k[None, :], mask=mask)
        w = w_desc.load([expert, pid_n * BLOCK_SIZE_N, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
        if ACC:
            acc = tl.dot(a, w.T, acc)
        else:
            acc = tl.dot(a, w.T)
    mask = (offs_n[None, :] < N) | (not N_MASK)
    if not STORE_PADDING:
        mask = mask & row_ok[:, None]
    row_stride = stride_om if ROW_STRIDE else N
    tl.store(out_ptr + offs_m[:, None] * row_stride + offs_n[None, :], acc.to(tl.float16), mask=mask)


@triton.jit
def _down(
    a_desc, w_desc, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    num_m_blocks, N, K, num_slots, stride_om,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    EXPERT: tl.constexpr = 0, ORDER: tl.constexpr = 0, WEIGHT: tl.constexpr = 1, K_TAIL: tl.constexpr = True,
    STORE_ROW_MASK: tl.constexpr = True, N_MASK: tl.constexpr = True, WEIGHT_MASK: tl.constexpr = True,
    ROW_STRIDE: tl.constexpr = True, A_ROW: tl.constexpr = True,
):  # fmt: skip
    pid_m, pid_n = _tile(num_m_blocks, N, BLOCK_SIZE_N, GROUP_SIZE_M, ORDER)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return
    expert = _expert(expert_ids_ptr, pid_m, EXPERT)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    k_end = K if K_TAIL else K - BLOCK_SIZE_K + 1
    for k0 in range(0, k_end, BLOCK_SIZE_K):
        a = a_desc.load([pid_m * BLOCK_SIZE_M if A_ROW else pid_m, k0])
        w = w_desc.load([expert, pid_n * BLOCK_SIZE_N, k0]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
        acc = tl.dot(a, w.T, acc)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    row_ok = slots < num_slots
    if WEIGHT_MASK:
        weight = tl.load(topk_weights_ptr + slots, mask=row_ok, other=0.0)
    else:
        weight = tl.load(topk_weights_ptr + slots)
    if WEIGHT >= 1:
        acc *= weight[:, None]
    if WEIGHT == 2:
        acc *= weight[:, None]
    mask = ((offs_n[None, :] < N) | (not N_MASK)) & (row_ok[:, None] | (not STORE_ROW_MASK))
    row_stride = stride_om if ROW_STRIDE else N
    tl.store(out_ptr + slots[:, None].to(tl.int64) * row_stride + offs_n[None, :], acc.to(tl.float16), mask=mask)


class Slip:
    """`kernel` launched with `switches` (constexprs with defaults beyond the exercise's signature), as the
    checker launches the learner's kernel: under the interpreter, where these tests run."""

    def __init__(self, kernel, **switches):
        self.kernel, self.switches = kernel, switches
        self.arg_names = kernel.arg_names
        self.__name__ = "_".join(f"{k.lower()}_{v}" for k, v in switches.items())

    def __getitem__(self, grid):
        return lambda **args: self.kernel[grid](**args, **self.switches)

    def __repr__(self):
        return self.__name__


def desc_2d_box(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w, [BLOCK_SIZE_N, BLOCK_SIZE_K])


def desc_swapped_box(w, BLOCK_SIZE_N, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(w, [1, BLOCK_SIZE_K, BLOCK_SIZE_N])


def rows_desc_one_row(a, BLOCK_SIZE_M, BLOCK_SIZE_K):
    return TensorDescriptor.from_tensor(a, [1, BLOCK_SIZE_K])


def test_solutions_pass(capsys):
    up = exercises.check_capstone_up(solution.capstone_up_kernel_solution, solution.weight_desc_solution, strict=True)
    down = exercises.check_capstone_down(
        solution.capstone_down_kernel_solution,
        solution.weight_desc_solution,
        solution.sorted_rows_desc_solution,
        strict=True,
    )
    assert up.passed and down.passed
    out = capsys.readouterr().out
    assert out.startswith("PASS capstone_up_kernel: ") and "\nPASS capstone_down_kernel: " in out
    assert "in GROUP_SIZE_M order" in out and "int64 token offsets" in out


@pytest.mark.parametrize(
    "kernel, says",
    [
        (Slip(_up, EXPERT=1), ["wrong expert id", "expert 0"]),
        (Slip(_up, EXPERT=2), ["wrong expert id", "pid_m is used as the expert"]),
        (Slip(_up, ROW_MASK=False), ["missing mask on the padded slots", "num_slots = 14", "past a's 7 rows"]),
        (Slip(_up, TOKEN_ROW=False), ["the token row is slot // TOP_K", "rows up to 13 of a's 7"]),
        (Slip(_up, ROW_STRIDE=False), ["the output row stride", "stride_om = 72 elements apart, not N = 48"]),
        (Slip(_up, K_MASK=False), ["K tail unmasked", "K = 56", "k0 + offs_k < K"]),
        (Slip(_up, K_TAIL=False), ["the K tail is missing", "stopped at k0 = 48"]),
        (Slip(_up, N_MASK=False), ["no N mask on the store", "offs_n < N"]),
        (Slip(_up, OTHER=False), ["masked lanes of a tl.load with no other=", "other=0.0"]),
        (Slip(_up, SKIP_UNUSED=False), ["blocks past num_tokens_post_padded were written"]),
        (Slip(_up, STORE_PADDING=False), ["padding rows of the blocks in use were left unwritten"]),
        (Slip(_up, ACC=False), ["only the last K step's product", "tl.dot(a, w.T, acc)"]),
        (Slip(_up, SLOT_MOD=True), ["slots % TOP_K", "slots // TOP_K"]),
        (Slip(_up, INT64=False), ["computed in int32", "4 * 2^30 = 2^32 wrapped", "(slots // TOP_K).to(tl.int64)"]),
        (Slip(_up, ORDER=1), ["every value is right", "row-major order"]),
        (
            Slip(_up, ORDER=2),
            ["every value is right", "in grouped order with the last group not clipped", "min(num_m_blocks"],
        ),
        (notebook_kernel(NOTEBOOK, "capstone_up_kernel"), ["stores nothing", "fill in the TODOs"]),
    ],
    ids=lambda v: repr(v) if isinstance(v, (Slip, list)) else "notebook_stub",
)
def test_up_slips_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_capstone_up, kernel, says, "capstone_up_kernel", capsys)


@pytest.mark.parametrize(
    "kernel, says",
    [
        (Slip(_down, EXPERT=1), ["wrong expert id", "expert 0"]),
        (Slip(_down, EXPERT=2), ["wrong expert id", "pid_m is used as the expert"]),
        (Slip(_down, WEIGHT=0), ["the routed weight is missing"]),
        (Slip(_down, WEIGHT=2), ["the routed weight is applied twice"]),
        (Slip(_down, K_TAIL=False), ["the K tail is missing", "stopped at k0 = 16"]),
        (Slip(_down, STORE_ROW_MASK=False), ["missing mask on the padded slots", "slots < num_slots"]),
        (Slip(_down, N_MASK=False), ["no N mask on the store"]),
        (Slip(_down, ROW_STRIDE=False), ["the output row stride", "not N = 56", "sorted_token_ids[r]"]),
        (Slip(_down, WEIGHT_MASK=False), ["routed weight of a padding row was loaded unmasked"]),
        (Slip(_down, ORDER=1), ["every value is right", "row-major order"]),
        (Slip(_down, A_ROW=False), ["the A box starts at row pid_m", "pid_m * BLOCK_SIZE_M"]),
        (notebook_kernel(NOTEBOOK, "capstone_down_kernel"), ["stores nothing"]),
    ],
    ids=lambda v: repr(v) if isinstance(v, (Slip, list)) else "notebook_stub",
)
def test_down_slips_are_named(kernel, says, capsys):
    assert_not_yet(exercises.check_capstone_down, kernel, says, "capstone_down_kernel", capsys)


def test_a_lambda_is_named_as_given_not_as_a_launcher(capsys):
    says = ["got a lambda, a plain Python function, where a @triton.jit kernel is expected", "pass the kernel itself"]
    assert_not_yet(exercises.check_capstone_up, lambda **args: None, says, "capstone_up_kernel", capsys)
    verdict = exercises.check_capstone_up(solution.capstone_up_kernel_solution[(1,)])  # a real launcher
    assert "got capstone_up_kernel_solution[grid], a launch of the kernel" in verdict.message
    assert "launcher" not in exercises.check_capstone_up(lambda **args: None).message


@pytest.mark.parametrize(
    "w_desc, a_desc, says",
    [
        (
            desc_2d_box,
            None,
            ["desc_2d_box(w, 32, 16) raised AssertionError: rank mismatch", "wrong box shape", "3 entries"],
        ),
        (desc_swapped_box, None, ["wrong box shape", "[1, 16, 32] (N and K swapped)", "[1, 32, 16]"]),
        (None, rows_desc_one_row, ["wrong box shape", "[1, 16]", "[16, 16]", "BLOCK_SIZE_M rows of one M-block"]),
        (notebook_kernel(NOTEBOOK, "weight_desc"), None, ["returned None, not a TensorDescriptor"]),
    ],
    ids=["2d_box", "swapped_box", "rows_box", "stub"],
)
def test_descriptor_helpers_are_checked(w_desc, a_desc, says, capsys):
    checker = functools.partial(exercises.check_capstone_down, make_w_desc=w_desc, make_a_desc=a_desc)
    assert_not_yet(checker, solution.capstone_down_kernel_solution, says, "capstone_down_kernel", capsys)


def test_the_grouped_order_is_tritons():
    # The checker's order is the kernels' (moe_lab.plan.tile_of_program runs their _tile_coords).
    # 5 M-blocks, 2 N-blocks, groups of 3: the last group holds M-blocks 3 and 4
    assert capstone.tile_of_program is tile_of_program
    tiles = [tile_of_program(p, 5, 2, 3) for p in range(10)]
    assert tiles == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("projection", ["up", "down"])
def test_solution_on_the_gpu_passes_and_is_timed(projection, capsys):
    """On a CUDA GPU the checker grades the compiled solution (interpreter first, then canaries), then times it
    against moe_lab.grouped_matmul at Qwen3-30B-A3B's shape and prints the ratio."""
    if projection == "up":
        verdict = exercises.check_capstone_up(solution.capstone_up_kernel_solution, strict=True)
    else:
        verdict = exercises.check_capstone_down(solution.capstone_down_kernel_solution, strict=True)
    out = capsys.readouterr().out
    assert verdict.passed and "moe_lab.grouped_matmul" in out and "x its time" in out, out
    timing = capstone.time_against_moe_lab(
        getattr(solution, f"capstone_{projection}_kernel_solution"), f"capstone_{projection}_kernel"
    )
    assert timing.error < 1e-2 and timing.ratio < 1.5, timing.describe()
