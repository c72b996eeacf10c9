"""`capture_device_print`: what `tl.device_print` writes on a GPU, shown in the notebook cell.

Under Triton's interpreter `tl.device_print` is a Python `print`, so its text reaches the cell by itself. On a
GPU the CUDA driver writes it to the process's file descriptor 1 when the kernel's work is synchronized; in
Jupyter that descriptor is the kernel process's own standard output (the terminal or log of the Jupyter
server), not the cell. The context manager points descriptor 1 at a temporary file around the launch,
synchronizes, puts descriptor 1 back and prints what it caught through `sys.stdout`, which is the cell.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from typing import Iterator, Optional

import torch

from ..runtime import interpreter_active


def _flush_c_stdio() -> None:
    """Flush the C library's `stdout` buffer into descriptor 1 (what the CUDA driver prints through)."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to load by that name (not Linux or macOS)
        pass


@contextlib.contextmanager
def capture_device_print(enabled: Optional[bool] = None) -> Iterator[None]:
    """Show in the cell what the kernels launched inside the block print with `tl.device_print` (and
    anything else written to file descriptor 1 there, such as C code's `printf`).

        with workbook.capture_device_print():
            peek_kernel[(2,)](x, out, n, BLOCK=4)

    `enabled`: None (the default) captures on a CUDA GPU, where the text would otherwise go to the Jupyter
    server's terminal, and passes through under the interpreter (whose device_print already prints into the
    cell); True always captures, False never. When capturing, on leaving the block it synchronizes CUDA
    (device_print's buffer is written then), flushes the C library's stdout, restores descriptor 1 and
    writes the captured text to `sys.stdout`, also when the block raised. Not thread-safe: descriptor 1 is
    the process's, so another thread's writes to it during the block are captured too.
    """
    if enabled is None:
        enabled = torch.cuda.is_available() and not interpreter_active()
    if not enabled:
        yield
        return
    sys.stdout.flush()
    _flush_c_stdio()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 1)
        try:
            yield
        finally:
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
            finally:
                _flush_c_stdio()
                os.dup2(saved, 1)
                os.close(saved)
                caught.seek(0)
                text = caught.read().decode(errors="replace")
                if text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
