"""Small jit helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def round_to_bf16_grid(x):
    """Round float32 `x` to the nearest bfloat16 value (ties to even), still as float32.

    Triton's interpreter (3.6) truncates on float32 -> bfloat16 casts; GPUs round to nearest even.
    Rounding first makes the interpreter's truncation exact, so CPU runs see GPU-like bf16 error."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)
