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


@triton.jit
def round_to_e4m3_grid(x):
    """Round float32 `x` to the nearest float8_e4m3fn value (ties to even, saturating at +-448), still as
    float32.

    Triton's interpreter casts float32 -> float8e4nv wrongly for about one value in five (127.8 -> 64 under
    3.7.1); GPUs round to nearest even. Rounding first to the e4m3 grid makes the interpreter's cast exact.
    Normal e4m3 values keep 3 mantissa bits; below 2^-6 (subnormals) the spacing is a fixed 2^-9, which
    adding and subtracting 1.5 * 2^14 rounds to (float32 spacing there is 2^-9). The sign is put back
    afterwards, so tiny negatives round to -0 as torch's cast does."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (x + 24576.0) - 24576.0
    sub = ((sub.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, sub, normal)


@triton.jit
def quantize_groups_e4m3(x, EMULATE_FP8: tl.constexpr):
    """float32 x [..., G] in groups along its last axis -> (q, scale): scale = max(amax of the group, 1e-10)
    / 448 (shape [...]), q = clamp(x / scale, -448, 448) rounded to e4m3 (still float32; cast to store).
    IEEE divisions (`div_rn`), as torch divides, so the scales match `moe_lab.quantize_weights_fp8`'s math;
    EMULATE_FP8 rounds to the e4m3 grid first (the interpreter's cast is wrong for some values)."""
    amax = tl.max(tl.abs(x), axis=-1)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-10), tl.full(amax.shape, 448.0, tl.float32))
    q = tl.math.div_rn(x, tl.zeros_like(x) + tl.expand_dims(scale, -1))
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if EMULATE_FP8:
        q = round_to_e4m3_grid(q)
    return q, scale
