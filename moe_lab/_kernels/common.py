"""Small jit helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def local_expert(topk_ids_ptr, expert_map_ptr, offs, mask, num_ids, num_experts, HAS_EXPERT_MAP: tl.constexpr):
    """Local expert of each slot `offs` (flat t*k + j) where `mask`, and whether it is computed here
    (`keep`); where not, `num_experts` (the align kernels' spare bin): padding lanes, ids outside
    [0, num_ids) and non-local experts. Ranges are checked in the ids' own dtype, before any narrowing,
    so no id (int64 ones past 2^31 included) is read through the map out of bounds or wraps around."""
    ids = tl.load(topk_ids_ptr + offs, mask=mask, other=-1)
    keep = mask & (ids >= 0) & (ids < num_ids)
    if HAS_EXPERT_MAP:
        ids = tl.load(expert_map_ptr + tl.where(keep, ids, 0), mask=keep, other=-1)
        keep = keep & (ids >= 0) & (ids < num_experts)
    return tl.where(keep, ids, num_experts).to(tl.int32), keep


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

    Triton's interpreter casts float32 -> float8e4nv wrongly where rounding carries into the next power of
    two (127.8 -> 64 under 3.6 to 3.9; 2 to 20 % of values, by their spread); GPUs round to nearest even.
    Rounding first to the e4m3 grid makes the interpreter's cast exact.
    Normal e4m3 values keep 3 mantissa bits; below 2^-6 (subnormals) the spacing is a fixed 2^-9, which
    adding and subtracting 1.5 * 2^14 rounds to (float32 spacing there is 2^-9). The sign is put back
    afterwards, so tiny negatives round to -0 as torch's cast does."""
    nan = x != x  # before the clamp: since Triton 3.8 the interpreter's minimum/maximum drop NaN, as GPUs do
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (x + 24576.0) - 24576.0
    sub = ((sub.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(nan, float("nan"), tl.where(tl.abs(x) < 0.015625, sub, normal))  # NaN stays NaN


@triton.jit
def quantize_groups_e4m3(x, EMULATE_FP8: tl.constexpr):
    """float32 x [..., G] in groups along its last axis -> (q, scale): scale = max(amax of the group, 1e-10)
    / 448 (shape [...]), q = clamp(x / scale, -448, 448) rounded to e4m3 (still float32; cast to store).
    IEEE divisions (`div_rn`), as torch divides, so the scales match `moe_lab.quantize_weights_fp8`'s math;
    EMULATE_FP8 rounds to the e4m3 grid first (the interpreter's cast is wrong for some values)."""
    amax = tl.max(tl.abs(x), axis=-1)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-10), tl.full(amax.shape, 448.0, tl.float32))
    # A NaN makes its group's scale NaN, as torch's amax does (Triton's max skips it): the NaN reaches the output.
    scale = tl.where(tl.max((x != x).to(tl.int32), axis=-1) > 0, float("nan"), scale)
    q = tl.math.div_rn(x, tl.zeros_like(x) + tl.expand_dims(scale, -1))
    return clamp_e4m3(q, EMULATE_FP8), scale


@triton.jit
def clamp_e4m3(q, EMULATE_FP8: tl.constexpr):
    """float32 q clamped to +-448 (NaN kept), and under the interpreter rounded to the e4m3 grid."""
    q = tl.clamp(q, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    if EMULATE_FP8:
        q = round_to_e4m3_grid(q)
    return q


@triton.jit
def cast_e4m3(q, EMULATE_FP8: tl.constexpr):
    """float32 q on the e4m3 grid (or NaN) as float8e4nv. GPUs convert NaN to NaN; the interpreter gives
    384, so there NaN lanes get NaN's bit pattern (0x7F)."""
    out = q.to(tl.float8e4nv)
    if EMULATE_FP8:
        out = tl.where(q != q, tl.full(q.shape, 0x7F, tl.uint8).to(tl.float8e4nv, bitcast=True), out)
    return out


@triton.jit
def e4m3_to_float32(x):
    """float8e4nv x as float32 with NaN kept: Triton's interpreter reads e4m3's NaN (0x7F, 0xFF) as +-480,
    a GPU as NaN."""
    nan = (x.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F
    return tl.where(nan, float("nan"), x.to(tl.float32))


# The kernels' activation names (their SWIGLU / ACTIVATION constexpr, `moe_lab.Activation.kernel_name`): the
# kind ("silu", "swigluoai"), with "_interleaved" where gate and up rows (or columns) alternate; "none": no
# activation. These two take it apart, at compile time; nothing else in the kernels reads the suffix.
@triton.constexpr_function
def gate_up_halves(name):
    """Whether activation name `name` holds gate and up as halves (rows or columns [0, I) gate, [I, 2I) up), not
    interleaved (2j gate j, 2j + 1 up j). False for "none"."""
    return name != "none" and not name.endswith("_interleaved")


@triton.constexpr_function
def activation_kind(name):
    """The function of activation name `name`, its gate/up layout dropped: "silu" or "swigluoai"."""
    return name.removesuffix("_interleaved")


@triton.jit
def gated_activation(gate, up, KIND: tl.constexpr, alpha, limit):
    """The gated activation of float32 gate and up (KIND: an activation name, "silu..." or "swigluoai...",
    `moe_lab.Activation`): silu(gate) * up (Shazeer, arXiv:2002.05202), or gpt-oss's clamped SwiGLU: gate
    clamped above at limit, up to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate) (vLLM's
    "swigluoai"). NaN stays NaN."""
    if activation_kind(KIND) == "silu":
        out = gate * tl.sigmoid(gate) * up
    else:
        gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        up = tl.clamp(up, -limit, limit, propagate_nan=tl.PropagateNan.ALL)
        out = (up + 1.0) * gate * tl.sigmoid(alpha * gate)
    return out
