"""The wrong attempts a workbook trial found passing, or named only by "N of M values wrong", each a test of
its checker: sizes written into a kernel, a masked load without other=, a row offset in int32, slips named
by what they compute, and a kernel that never ends (stopped with a message, or by the learner)."""

import ctypes
import threading

import pytest
import triton
import triton.language as tl

from moe_lab.workbook import exercises
from tests.notebook_source import assert_not_yet

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)


# 00: scale_kernel
@triton.jit
def scale_mask_1000(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < 1000), mask=offs < 1000)


@triton.jit
def scale_pid_plus_arange(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


# 01: renormalize_kernel
@triton.jit
def renormalize_without_other(
    topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr
):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < top_k)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < top_k)


@triton.jit
def renormalize_top_k_6(topk_weights_ptr, out_ptr, weights_row_stride, out_row_stride, top_k, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    w = tl.load(topk_weights_ptr + t * weights_row_stride + j, mask=j < 6, other=0.0)
    tl.store(out_ptr + t * out_row_stride + j, w / tl.sum(w, axis=0), mask=j < 6)


# 02: histogram_kernel
@triton.jit
def histogram_undefined_ids(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(counts_ptr + tl.load(topk_ids_ptr + offs, mask=offs < num_slots), 1)


@triton.jit
def histogram_270_slots(topk_ids_ptr, counts_ptr, num_slots, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(counts_ptr + tl.load(topk_ids_ptr + offs, mask=offs < 270), 1, mask=offs < 270)


# 03: gather_rows_kernel. SLIP 1: no int64 cast; 2: slots % TOP_K; 3: the tile transposed; 4: no other=;
# 5: the row after the token's (loads past A only)
@triton.jit
def _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, SLIP: tl.constexpr):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if SLIP == 1:
        tokens = slots // TOP_K
    elif SLIP == 2:
        tokens = (slots % TOP_K).to(tl.int64)
    elif SLIP == 5:
        tokens = (slots // TOP_K + 1).to(tl.int64)
    else:
        tokens = (slots // TOP_K).to(tl.int64)
    row_ok = slots < num_slots
    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = (k0 + offs_k) < K
        if SLIP == 3:
            a_ptrs = a_ptr + tokens[None, :] * stride_am + (k0 + offs_k)[:, None] * stride_ak
        else:
            a_ptrs = a_ptr + tokens[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
        if SLIP == 4:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :])
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + (k0 + offs_k)[None, :]
        tl.store(out_ptrs, a, mask=k_ok[None, :])


@triton.jit
def gather_int32_rows(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                      TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, 1)  # fmt: skip


@triton.jit
def gather_slots_mod_top_k(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                           TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, 2)  # fmt: skip


@triton.jit
def gather_tile_transposed(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                           TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, 3)  # fmt: skip


@triton.jit
def gather_without_other(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                         TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, 4)  # fmt: skip


@triton.jit
def gather_next_row(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om,
                    TOP_K: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    _gather(a_ptr, out_ptr, sorted_token_ids_ptr, num_slots, K, stride_am, stride_ak, stride_om, TOP_K, BLOCK_SIZE_M,
            BLOCK_SIZE_K, 5)  # fmt: skip


# 04: copy_2d_kernel (host descriptors) and copy_2d_device_kernel
@triton.jit
def copy_store_at_origin(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    dst_desc.store([0, 0], src_desc.load([tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N]))


@triton.jit
def copy_columns_by_block_m(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_M
    dst_desc.store([row, col], src_desc.load([row, col]))


@triton.jit
def copy_sizes_written_in(src_desc, dst_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row, col = tl.program_id(0) * 16, tl.program_id(1) * 32
    dst_desc.store([row, col], src_desc.load([row, col]))


@triton.jit
def device_square_boxes(
    src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_M])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_dst_m, 1], block_shape=[BLOCK_M, BLOCK_M])
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, col], src.load([row, col]))


@triton.jit
def device_store_column_0(
    src_ptr, dst_ptr, M, N, stride_src_m, stride_dst_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[stride_src_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[stride_dst_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    dst.store([row, 0], src.load([row, col]))


# 06: topk_reduce_kernel
@triton.jit
def topk_reduce_h_200(y_ptr, topk_weights_ptr, out_ptr, H, stride_y_row, stride_w_token, stride_out_row,
                      TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        w = tl.load(topk_weights_ptr + t * stride_w_token + j)
        acc += w * tl.load(y_ptr + (t * TOP_K + j) * stride_y_row + offs_h, mask=offs_h < 200, other=0.0)
    tl.store(out_ptr + t * stride_out_row + offs_h, acc, mask=offs_h < 200)


# 08: persistent_copy_kernel
@triton.jit
def persistent_without_step(x_ptr, out_ptr, num_rows_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = (tl.load(num_rows_ptr) // BLOCK_M) * num_pid_n
    tile = tl.program_id(0)
    while tile < num_tiles:  # tile never steps
        rows = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs = rows[:, None] * N + cols[None, :]
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=cols[None, :] < N), mask=cols[None, :] < N)


CASES = [
    (exercises.check_scale, scale_mask_1000, ["not with n = 777", "compares with 1000", "`offs < n`"]),
    (exercises.check_scale, scale_pid_plus_arange, ["program_id(0) + tl.arange(0, BLOCK)", "p * BLOCK"]),
    (exercises.check_renormalize, renormalize_without_other, ["tl.load with no other=", "undefined", "other=0.0"]),
    (exercises.check_renormalize, renormalize_top_k_6, ["not with T = 11, top_k = 3", "size written into"]),
    (exercises.check_expert_histogram, histogram_undefined_ids, ["far outside", "no other=", "mask the tl.atomic_add"]),
    (exercises.check_expert_histogram, histogram_270_slots, ["not with num_slots = 60", "size written into"]),
    (exercises.check_gather_rows, gather_int32_rows, ["computed in int32", "wrapped around", ".to(tl.int64)"]),
    (exercises.check_gather_rows, gather_slots_mod_top_k, ["`slots % TOP_K`", "`slots // TOP_K`"]),
    (exercises.check_gather_rows, gather_tile_transposed, ["the A tile is transposed", "tokens[:, None]"]),
    (exercises.check_gather_rows, gather_without_other, ["no other=", "padding rows hold zeros"]),
    (exercises.check_descriptor_copy, copy_store_at_origin, ["every program's store is at the same offsets [0, 0]"]),
    (exercises.check_descriptor_copy, copy_columns_by_block_m, ["column offset steps by BLOCK_M", "pid_n * BLOCK_N"]),
    (exercises.check_descriptor_copy, copy_sizes_written_in, ["not with 40 x 72", "size written into"]),
    (
        exercises.check_device_descriptor_copy,
        device_square_boxes,
        ["box of 16 x 16", "block_shape is [BLOCK_M, BLOCK_N]"],
    ),
    (exercises.check_device_descriptor_copy, device_store_column_0, ["store's column offset is the same (0)"]),
    (exercises.check_topk_reduce, topk_reduce_h_200, ["not with T = 3, TOP_K = 2, H = 100", "size written into"]),
]


EXERCISE = {  # the label of each checker's verdicts
    "check_scale": "scale_kernel",
    "check_renormalize": "renormalize_kernel",
    "check_expert_histogram": "histogram_kernel",
    "check_gather_rows": "gather_rows_kernel",
    "check_descriptor_copy": "copy_2d_kernel",
    "check_device_descriptor_copy": "copy_2d_device_kernel",
    "check_topk_reduce": "topk_reduce_kernel",
}


@pytest.mark.parametrize("checker, kernel, says", CASES, ids=[kernel.__name__ for _, kernel, _ in CASES])
def test_each_slip_is_named(checker, kernel, says, capsys):
    assert_not_yet(checker, kernel, says, EXERCISE[checker.__name__], capsys)


def test_causes_listed_are_only_those_the_accesses_fit():
    message = exercises.check_gather_rows(gather_next_row).message
    assert "loads past A's last row" in message
    assert "gap after a row" not in message and "stores past the end of out" not in message


def test_a_missing_mask_is_not_told_about_strides():
    from tests.workbook.test_exercise_topk_reduce import no_h_mask

    message = exercises.check_topk_reduce(no_h_mask).message
    assert "offs_h < H" in message and "stride_y_row" not in message


def test_a_loop_that_never_ends_is_stopped_with_its_program(monkeypatch, capsys):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 2.0)
    says = ["a loop that never ends", "in program (0, 0, 0)", "never steps"]
    assert_not_yet(exercises.check_persistent_copy, persistent_without_step, says, "persistent_copy_kernel", capsys)


def test_a_loop_that_never_ends_is_stopped_outside_the_main_thread_too(monkeypatch):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 2.0)
    verdicts = []
    worker = threading.Thread(target=lambda: verdicts.append(exercises.check_persistent_copy(persistent_without_step)))
    worker.start()
    worker.join(timeout=120)
    assert verdicts and "a loop that never ends" in verdicts[0].message


def _interrupted(strict: bool):
    """check_persistent_copy on the never-ending kernel, stopped after 1.5 s as Jupyter's stop button does
    (a SIGINT: KeyboardInterrupt in the thread running the cell; here the test's thread, which pytest-xdist's
    workers need not run in the main thread)."""
    target = threading.get_ident()
    timer = threading.Timer(
        1.5,
        lambda: ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(KeyboardInterrupt)),
    )
    timer.start()
    try:
        return exercises.check_persistent_copy(persistent_without_step, strict=strict)
    finally:
        timer.cancel()


def test_the_stop_button_gets_a_message_not_a_traceback(monkeypatch, capsys):
    import moe_lab.workbook.guarded as guarded

    monkeypatch.setattr(guarded, "MAX_SECONDS", 60.0)
    verdict = _interrupted(strict=False)
    assert verdict.status == "NOT YET"
    for words in ("stopped by a keyboard interrupt", "in program (0, 0, 0)", "does a loop never end"):
        assert words in verdict.message, verdict.message
    # labelled like the check's other verdicts: with the learner's function's name
    assert capsys.readouterr().out.startswith("NOT YET persistent_without_step: stopped by a keyboard interrupt")
    with pytest.raises(KeyboardInterrupt, match="stopped by a keyboard interrupt"):  # strict: it goes on
        _interrupted(strict=True)
