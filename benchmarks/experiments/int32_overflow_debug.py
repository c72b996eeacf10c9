"""Does Triton catch an int32 offset overflow (row * stride past 2**31) in a kernel? With TRITON_DEBUG=1
on a GPU it inserts a device_assert after integer add/sub/mul; the interpreter does not check.
Run: TRITON_DEBUG=1 python benchmarks/experiments/int32_overflow_debug.py (and without TRITON_DEBUG)."""
import torch
import triton
import triton.language as tl

import moe_lab


@triton.jit
def offset_kernel(out_ptr, row, stride):
    tl.store(out_ptr, row * stride)   # 300000 * 8192 = 2.46e9 > 2**31 - 1 in int32


out = torch.zeros(1, dtype=torch.int32, device=moe_lab.runtime.default_device())
try:
    offset_kernel[(1,)](out, 300000, 8192)
    if out.is_cuda:
        torch.cuda.synchronize()
    print("no error, stored", out.item())
except Exception as exc:  # noqa: BLE001 - what the run raised is the result
    print("raised", type(exc).__name__, str(exc)[:300])
