"""`moe_lab.tools.look_inside`'s argument checks and errors (fast: most never start the child)."""

import subprocess

import pytest

from moe_lab.tools import look_inside


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: look_inside.compile_grouped_matmul("tma", 90.0), TypeError, r"cc must be an int.*got 90\.0"),
        (lambda: look_inside.compile_grouped_matmul("tma", "90"), TypeError, "cc must be an int"),
        (lambda: look_inside.compile_grouped_matmul("tma", True), TypeError, "cc must be an int"),
        (lambda: look_inside.compile_gluon_fp8(64.0), TypeError, r"block_m must be an int.*got 64\.0"),
        (lambda: look_inside.compile_grouped_matmul("tma", 90, timeout_s="60"), TypeError, "timeout_s must be a"),
        (
            lambda: look_inside.compile_grouped_matmul("tma", 90, timeout_s=0),
            ValueError,
            "timeout_s must be a number of seconds > 0",
        ),
        (
            lambda: look_inside.compile_grouped_matmul("tma", 90, timeout_s=-1),
            ValueError,
            "timeout_s must be a number of seconds > 0",
        ),
        (
            lambda: look_inside.compile_gluon_fp8(128, timeout_s=float("nan")),
            ValueError,
            "timeout_s must be a number of seconds > 0",
        ),
        (lambda: look_inside.compile_gluon_fp8(128, timeout_s=float("inf")), ValueError, "at most 86400"),
    ],
)
def test_arguments_are_checked_here_not_in_the_child(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_timeout_is_the_documented_runtime_error(monkeypatch):
    def run(*args, timeout, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(look_inside.subprocess, "run", run)
    with pytest.raises(RuntimeError, match=r"took longer than timeout_s=0.5 s and was stopped"):
        look_inside.compile_grouped_matmul("pointer", 80, timeout_s=0.5)


def test_no_kernel_back_raises_the_compilers_recorded_error():
    class Session:  # what compile_only.Session holds after a compile that failed
        kernels = {}
        outcomes = {("group",): {"error": "NotADirectoryError: [Errno 20] Not a directory: '/x/cache'"}}

    with pytest.raises(look_inside.CompileFailed, match="NotADirectoryError: .* Not a directory"):
        look_inside._the_kernel(Session(), "grouped_matmul_kernel")


def test_an_unusable_triton_cache_is_named(monkeypatch, tmp_path):
    """The real thing: a cache folder under a file. The message quotes the compiler's error, not an unpacking
    error of look_inside's own."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.raises(RuntimeError) as exc:
        look_inside.compile_grouped_matmul("pointer", 80, timeout_s=120)
    message = str(exc.value)
    assert "NotADirectoryError" in message and "not enough values to unpack" not in message
    assert "Traceback" not in message and "moe-lab doctor" in message
