"""FP8 (float8_e4m3fn) quantization of weights and activations, in the layouts the field uses.

A float tensor is stored as q (e4m3: 4 exponent bits, 3 mantissa bits, largest finite value 448) and
float32 scales, with x ~ q * scale. Each scale covers one block of x and is its absolute maximum over 448
(floored at 1e-10 / 448, so an all-zero block gets q = 0); q = clamp(x / scale, -448, 448), rounded to the
nearest e4m3 value (ties to even).

Layouts (the names vLLM and SGLang use: `w1_scale`, `a1_scale`, `block_shape`):
- weights w [E, N, K], offline (`quantize_weights_fp8`, torch ops): block-wise, one scale per
  block_shape = [bn, bk] block, w_scale [E, ceil(N/bn), ceil(K/bk)] (edge blocks partial); DeepSeek-V3
  ships its experts so, with `"quantization_config": {"fmt": "e4m3", "weight_block_size": [128, 128]}` in
  its config.json. Or per tensor, w_scale [E] (one per expert), or per channel, w_scale [E, N] (one per
  output row).
- activations x [rows, K], at run time (`quantize_activations_fp8`, a Triton kernel): per token group,
  one scale per token per group_size (128) consecutive channels, x_scale [rows, ceil(K/group_size)]: the
  activation side of DeepSeek-V3's fine-grained scheme and of vLLM's `per_token_group_quant_fp8`; or per
  token, x_scale [rows, 1]; or per tensor, x_scale [1], given (static) or computed on the device.

Source: DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.3 "Fine-Grained Quantization" (1x128 tiles for
activations, 128x128 blocks for weights, online max-abs scaling); vLLM,
`vllm/model_executor/layers/quantization/utils/fp8_utils.py` (`per_token_group_quant_fp8`).
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ._ints import cdiv, next_power_of_2
from ._kernels.quantize import per_token_group_quant_fp8_kernel
from ._launch import LaunchSite, launch
from ._validate import (
    FLOAT_DTYPES,
    check_bool,
    check_kernel_device,
    check_not_aliased,
    check_own_memory,
    check_positive_int,
    check_same_device,
    check_tensor,
    is_bool,
    output_buffer,
)
from .capability import require_fp8
from .runtime import interpreter_active, interpreter_serialized

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn value
AMAX_FLOOR = 1e-10  # scale = max(amax, AMAX_FLOOR) / FP8_MAX: an all-zero block gets a tiny scale, q = 0
TILE_ELEMENTS = 2048  # elements one program quantizes (more when a single group is larger)
MAX_GROUP = 65536  # channels of one group (one program's tile; Triton's tiles hold at most 2^20 values)


# --- checks ------------------------------------------------------------------------------------------


def check_block_shape(block_shape) -> Optional[Tuple[int, int]]:
    """None, or (bn, bk) from two positive ints (int-likes such as numpy integers too); TypeError/ValueError
    naming block_shape otherwise."""
    if block_shape is None:
        return None
    if isinstance(block_shape, torch.Tensor) or type(block_shape).__module__ == "numpy":  # a tensor or an array
        block_shape = block_shape.tolist() if getattr(block_shape, "ndim", 1) else block_shape
    if not isinstance(block_shape, (tuple, list)):
        raise TypeError(
            f"block_shape must be a tuple or list of two ints [bn, bk] (e.g. (128, 128)) or None, got "
            f"{type(block_shape).__name__}"
        )
    if len(block_shape) != 2:
        raise ValueError(f"block_shape must hold two ints [bn, bk], got {len(block_shape)}: {list(block_shape)}")
    values = []
    for value in block_shape:
        try:
            if is_bool(value):
                raise TypeError
            values.append(operator.index(value))
        except TypeError:
            raise TypeError(
                f"block_shape must hold two ints [bn, bk], got {list(block_shape)} "
                f"(an element of type {type(value).__name__})"
            ) from None
    if min(values) < 1:
        raise ValueError(f"block_shape entries must be >= 1, got {values}")
    return values[0], values[1]


# The least K of a float8 dot on NVIDIA GPUs (8-bit mma.sync and wgmma take K = 32): FP8 configs' BLOCK_SIZE_K
# is raised to it, and block scales' block_k must be a multiple of it.
MIN_FP8_DOT_K = 32


def check_gemm_block_shape(block_shape) -> Optional[Tuple[int, int]]:
    """`check_block_shape`, and what the grouped GEMM needs beyond it (so weights are never quantized in
    blocks it cannot run): block_k a multiple of 32 (each dot lies in one scale block, and float8
    tensor-core dots take at least 32 channels: NVIDIA's 8-bit mma and wgmma have K = 32), both entries
    below 2**31."""
    block_shape = check_block_shape(block_shape)
    if block_shape is not None and block_shape[1] % MIN_FP8_DOT_K:
        raise ValueError(
            f"block_shape[1] (block_k) must be a multiple of {MIN_FP8_DOT_K} (float8 dots take K in "
            f"steps of {MIN_FP8_DOT_K}), got {block_shape[1]}"
        )
    if block_shape is not None and max(block_shape) >= 2**31:  # the kernel divides int32 indices by them
        raise ValueError(f"block_shape entries must be below 2**31, got {list(block_shape)}")
    return block_shape


def check_static_scale(name: str, scale, layout: str = "[1] or [] (per tensor)") -> torch.Tensor:
    """A static per-tensor scale (a calibrated a1_scale, ...) viewed as [1], the shape the kernels read, after
    checking it: a float32 tensor of shape [1] or [] (0-d: checkpoints store both). `layout` is the message's
    list of accepted shapes, for callers that also take others."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(scale).__name__}")
    if scale.shape not in ((1,), ()):
        raise ValueError(f"{name} must have shape {layout}, got shape {tuple(scale.shape)}")
    check_tensor(name, scale, ndim=scale.dim(), dtypes=(torch.float32,))
    return scale.reshape(1)


def check_scale_values(name: str, scale: torch.Tensor) -> None:
    """Raise ValueError unless every value of `scale` is finite and positive (a NaN, zero or negative scale
    makes what it scales NaN, zero or of the wrong sign); reads the values (a sync on a GPU; none on meta)."""
    if scale.numel() and scale.device.type != "meta":
        bad = ~(torch.isfinite(scale) & (scale > 0))
        if bad.any():
            where = tuple(torch.nonzero(bad)[0].tolist())
            at = f"[{', '.join(map(str, where))}]" if where else ""
            raise ValueError(
                f"{name} must be finite and positive, got {name}{at} = "
                f"{scale[where].item()} ({int(bad.sum())} of {scale.numel()} scales): a scale multiplies the "
                "values it scales (zero gives zeros, a negative one flips their signs)"
            )


def check_scale_values_on_cpu(name: str, scale: torch.Tensor) -> None:
    """`check_scale_values` where it is free: on CPU tensors; on a GPU the scale is taken as given (reading it
    back would cost a host sync)."""
    if scale.device.type == "cpu":
        check_scale_values(name, scale)


def _fit_block(block: Tuple[int, int], rows: int, cols: int) -> Tuple[int, int]:
    """The block cut to the matrix: a block larger than it covers all of it, with no larger copy."""
    return min(block[0], rows), min(block[1], cols)


def _expand_blocks(scale: torch.Tensor, block: Tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    """A scale per [bn, bk] block ([..., ceil(rows/bn), ceil(cols/bk)]) repeated over its block: [..., rows, cols]."""
    bn, bk = _fit_block(block, rows, cols)
    return scale.repeat_interleave(bn, dim=-2)[..., :rows, :].repeat_interleave(bk, dim=-1)[..., :cols]


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """max(amax, 1e-10) / 448, an IEEE division as the kernel's (on CUDA, torch divides by a Python number
    as a multiply by its rounded reciprocal, which can differ in the last bit)."""
    amax = amax.float().clamp(min=AMAX_FLOOR)
    return amax / torch.full_like(amax, FP8_MAX)


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


# --- weights (offline, torch) ------------------------------------------------------------------------


def quantize_weights_fp8(
    w: torch.Tensor, block_shape: Optional[Sequence[int]] = (128, 128), *, per_channel: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize expert weights to FP8: w [E, N, K] float16/bfloat16/float32 (any strides) ->
    (w_fp8 [E, N, K] float8_e4m3fn, contiguous; w_scale float32), with w ~ w_fp8 * w_scale per block.

    - block_shape = [bn, bk] (default (128, 128), DeepSeek-V3's `weight_block_size`): w_scale
      [E, ceil(N/bn), ceil(K/bk)], one scale per bn x bk block of each expert; edge blocks are partial.
    - block_shape=None: per tensor, w_scale [E] (one per expert); with per_channel=True, w_scale [E, N]
      (one per output row, to pair with per-token activation scales). per_channel=True needs
      block_shape=None.
    Each scale = max(amax of its block, 1e-10) / 448; w_fp8 = clamp(w / scale, -448, 448) rounded to the
    nearest e4m3 value (torch's cast: ties to even). Math in float32, one expert at a time (offline: torch
    ops, no kernel; memory beyond the outputs is a few float32 copies of one expert).

    Raises TypeError/ValueError for w not a 3-D float tensor, N or K of 0, an inf or NaN in w (its block's
    scale would be inf or NaN: the block would read back as NaN and zeros), block_shape not None or two
    positive ints with bk a multiple of 32 (what the grouped GEMM runs), per_channel not a bool or
    combined with a block_shape.
    Source: DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.3 (128x128 weight blocks), and its
    config.json `quantization_config` (`"weight_block_size": [128, 128]`, `"fmt": "e4m3"`)."""
    check_tensor("w", w, ndim=3, dtypes=FLOAT_DTYPES, layout="[E, N, K]")
    block = check_gemm_block_shape(block_shape)
    if check_bool("per_channel", per_channel) and block is not None:
        raise ValueError(
            f"per_channel=True gives one scale per output row and takes block_shape=None, got "
            f"block_shape={list(block)}; pass block_shape=None"
        )
    experts, n, k = w.shape
    if n == 0 or k == 0:
        raise ValueError(f"w must have N >= 1 and K >= 1 [E, N, K], got shape {tuple(w.shape)}")
    if block is not None:
        scale_shape: Tuple[int, ...] = (experts, cdiv(n, block[0]), cdiv(k, block[1]))
    else:
        scale_shape = (experts, n) if per_channel else (experts,)
    w_fp8 = torch.empty((experts, n, k), dtype=FP8_DTYPE, device=w.device)
    w_scale = torch.empty(scale_shape, dtype=torch.float32, device=w.device)
    if block is not None:
        fit = _fit_block(block, n, k)
    for e in range(experts):
        we = w[e].detach().float()  # offline: the results carry no autograd history
        if we.device.type != "meta" and not torch.isfinite(we).all():  # offline: a host sync per expert is free
            where = torch.nonzero(~torch.isfinite(we))[0].tolist()
            raise ValueError(
                f"w must be finite: w[{e}, {where[0]}, {where[1]}] = {we[where[0], where[1]].item()}; an inf or NaN "
                f"would make its block's scale inf or NaN and the whole block read back as NaN and zeros"
            )
        if block is not None:
            nb, kb = scale_shape[1:]
            padded = F.pad(we.abs(), (0, kb * fit[1] - k, 0, nb * fit[0] - n))  # zeros do not raise amax
            scale = _scale_of(padded.view(nb, fit[0], kb, fit[1]).amax(dim=(1, 3)))
            full = _expand_blocks(scale, block, n, k)
        elif per_channel:
            scale = _scale_of(we.abs().amax(dim=1))
            full = scale[:, None]
        else:
            scale = _scale_of(we.abs().amax())
            full = scale
        w_fp8[e] = _to_fp8(we, full)
        w_scale[e] = scale
    return w_fp8, w_scale


# --- dequantize (references and tests) ---------------------------------------------------------------


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block_shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    """q * scale in float32, the scale repeated over what it covers: the inverse of `quantize_weights_fp8`
    and `quantize_activations_fp8`, for references and tests. q float8_e4m3fn, [E, N, K] (weights) or
    [rows, K] (activations); scale float32, one of:

    - per tensor: [1] (or a 0-d tensor), one scale for all of q; for weights also [E], one per expert;
    - per channel / per token: weights [E, N], activations [rows, 1];
    - blocks: weights [E, ceil(N/bn), ceil(K/bk)] with block_shape=(bn, bk); activations quantized per
      token group take block_shape=(1, group_size) with scale [rows, ceil(K/group_size)].
    block_shape is needed for (only) the block layouts. Returns a new float32 tensor of q's shape.

    Raises TypeError/ValueError for q not float8_e4m3fn of rank 2 or 3, scale not float32, a scale shape
    that is none of these layouts (the message lists those that would fit), or block_shape not None or
    two positive ints. Source: the layouts of DeepSeek-V3 (arXiv:2412.19437 §3.3) and vLLM."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor [E, N, K] or [rows, K], got {type(q).__name__}")
    if q.dim() not in (2, 3):
        raise ValueError(f"q must have 2 dimensions [rows, K] or 3 [E, N, K], got shape {tuple(q.shape)}")
    check_tensor("q", q, ndim=q.dim(), dtypes=(FP8_DTYPE,), layout="[E, N, K] or [rows, K]")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a float32 torch.Tensor, got {type(scale).__name__}")
    check_tensor("scale", scale, ndim=scale.dim(), dtypes=(torch.float32,))
    block = check_block_shape(block_shape)
    check_same_device(q=q, scale=scale)
    n, k = q.shape[-2:]
    weights = q.dim() == 3
    shape = tuple(scale.shape)
    full = None
    if block is not None:
        want = q.shape[:-2] + (cdiv(n, block[0]), cdiv(k, block[1]))
        if shape == tuple(want):
            full = _expand_blocks(scale, block, n, k)
    elif scale.dim() <= 1 and scale.numel() == 1:
        full = scale.reshape(())
    elif weights and shape == (q.shape[0],):
        full = scale[:, None, None]
    elif weights and shape == (q.shape[0], n):
        full = scale[:, :, None]
    elif not weights and shape == (n, 1):
        full = scale
    if full is None:
        if weights:
            layouts = (
                f"[1] or [E] = [{q.shape[0]}] (per tensor), [E, N] = [{q.shape[0]}, {n}] (per channel), "
                f"[E, ceil(N/bn), ceil(K/bk)] with block_shape=(bn, bk)"
            )
        else:
            layouts = (
                f"[1] (per tensor), [rows, 1] = [{n}, 1] (per token), [rows, ceil(K/g)] with "
                "block_shape=(1, g) (per token group)"
            )
        given = f" with block_shape={list(block)}" if block is not None else " without block_shape"
        raise ValueError(f"scale of shape {shape}{given} fits no layout of q {tuple(q.shape)}; expected {layouts}")
    return q.float() * full


# --- activations (run time, Triton) ------------------------------------------------------------------


def _group(k: int, group_size: Optional[int], static: bool) -> int:
    """Channels per scale: group_size cut to K; K (per token) for group_size None; K with a static scale."""
    return k if group_size is None or static else min(group_size, k)


def run_quantize_activations(
    x: torch.Tensor,
    group_size: Optional[int],
    scale: Optional[torch.Tensor],
    num_rows: Optional[torch.Tensor],
    site: Optional[LaunchSite] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """`quantize_activations_fp8(x, group_size=..., num_rows=...)`, or with `scale` (static, [1]), on arguments
    already checked (`fused_moe` checks its inputs once): no check here, new buffers. `site`: where a cached
    layer plan keeps the compiled kernel (`moe_lab._launch`), or None."""
    rows, k = x.shape
    static = scale is not None
    group = _group(k, group_size, static)
    q = torch.empty((rows, k), dtype=FP8_DTYPE, device=x.device)
    if not static:
        scale = torch.empty((rows, cdiv(k, group)), dtype=torch.float32, device=x.device)
    _quantize(x, q, scale, num_rows, group, static, site)
    return q, scale


def _quantize(x, q, scale, num_rows, group, static, site=None):
    """Quantize x [rows, K] into q with `scale`: per group of `group` channels, or with a static scale."""
    rows, k = x.shape
    if rows == 0:
        return
    if static:
        _launch(x, q, scale, num_rows, min(next_power_of_2(k), TILE_ELEMENTS), True, site)
    else:
        _launch(x, q, scale, num_rows, group, False, site)


def _launch(x, q, scale, num_rows, group_size, static, site):
    """One launch of the quantization kernel over x [rows, K]: groups of group_size channels (static: the
    whole row in tiles, all with the given scale)."""
    rows, k = x.shape
    group_block = next_power_of_2(group_size)
    groups = cdiv(k, group_size)
    per_program = max(1, min(next_power_of_2(groups), TILE_ELEMENTS // group_block))
    per_program = per_program if not static else 1
    # short rows: several per program, so a program still holds about TILE_ELEMENTS values
    rows_per_program = max(1, min(next_power_of_2(rows), TILE_ELEMENTS // (per_program * group_block)))
    num_warps = max(1, min(8, rows_per_program * per_program * group_block // 256))
    stride_sm, stride_sg = (0, 0) if static else (scale.stride(0), scale.stride(1))
    grid = (cdiv(rows, rows_per_program), cdiv(groups, per_program))
    launch(
        per_token_group_quant_fp8_kernel,
        grid,
        (x, q, scale, num_rows, rows, k, x.stride(0), x.stride(1), q.stride(0), stride_sm, stride_sg),
        dict(
            GROUP_SIZE=group_size,
            GROUP_BLOCK=group_block,
            GROUPS_PER_PROGRAM=per_program,
            ROWS_PER_PROGRAM=rows_per_program,
            STATIC_SCALE=static,
            HAS_ROW_BOUND=num_rows is not None,
            EMULATE_FP8=interpreter_active(),
            num_warps=num_warps,
        ),
        site,
    )


@interpreter_serialized
def quantize_activations_fp8(
    x: torch.Tensor,
    *,
    group_size: Optional[int] = 128,
    scale: Optional[torch.Tensor] = None,
    per_tensor: bool = False,
    num_rows: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    out_scale: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations to FP8 with a Triton kernel: x [rows, K] float16/bfloat16/float32 (any strides)
    -> (x_fp8 [rows, K] float8_e4m3fn, x_scale float32), with x ~ x_fp8 * x_scale per group. Each scale =
    max(amax of its group, 1e-10) / 448; x_fp8 = clamp(x / scale, -448, 448) rounded to the nearest e4m3
    value (ties to even); math in float32, divisions IEEE-rounded (as torch computes them).

    - group_size=g (default 128): per token group, x_scale [rows, ceil(K/g)], one scale per token per g
      consecutive channels (the last group is partial when g does not divide K): DeepSeek-V3's 1x128
      activation tiles, vLLM's `per_token_group_quant_fp8`. Any g >= 1 works (g >= K: per token); a group
      of more than 65536 channels is refused. A NaN makes its group's scale and values NaN (as torch's amax);
      an inf makes its group's scale inf, so its own value reads back NaN and the others zero (no check:
      the kernel reads nothing back to the host).
    - group_size=None: per token, x_scale [rows, 1].
    - scale=<float32 tensor of one element, shape [1] or []> (static per tensor, e.g. a calibrated
      `a1_scale`): every value is divided by it; no amax is taken; x_scale is `scale` viewed as [1]. It must be
      finite and positive: checked on the CPU (ValueError), taken as given on a GPU (no host sync).
    - per_tensor=True (dynamic per tensor): the scale is the amax over all rows (those below num_rows)
      / 448, computed with torch on the device (no host sync); x_scale [1].
    group_size is not used with scale= or per_tensor=True.
    num_rows: optional int32 tensor [1] on x's device (e.g. AlignedRouting.num_tokens_post_padded): rows at
      or past its value are neither read nor written (they keep what `out`/`out_scale` held), read on the
      device only, so the call can be captured in a CUDA graph.
    out, out_scale: optional buffers for x_fp8 ([rows, K] float8_e4m3fn, last stride 1) and for a computed
      x_scale (float32 of the shape above, any strides); out_scale not with scale= (the scale is given).
    rows = 0 returns empty tensors without launching.

    Raises TypeError/ValueError for x not a 2-D float tensor or with K = 0, group_size not None or an int
    >= 1 (bools refused), scale not a float32 tensor of shape [1] or [] (on the CPU: not finite and positive),
    per_tensor not a bool or combined with scale, num_rows not an int32 [1] tensor, out/out_scale of the wrong shape
    or dtype, out sharing memory with x, or tensors on different devices; RuntimeError where FP8 cannot run
    (`fp8_support`: a CUDA GPU below compute capability 8.9, where Triton has no e4m3 type). Under the interpreter
    e4m3 is emulated (values rounded to the e4m3 grid first; bit-exact with torch's cast).
    Source: DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.3; vLLM,
    `vllm/model_executor/layers/quantization/utils/fp8_utils.py` (`per_token_group_quant_fp8`)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, layout="[rows, K]")
    rows, k = x.shape
    if k == 0:
        raise ValueError(f"x must have K >= 1 channels [rows, K], got shape {tuple(x.shape)}")
    if group_size is not None:
        group_size = check_positive_int("group_size", group_size)  # numpy ints too, as block_shape takes them
    per_tensor = check_bool("per_tensor", per_tensor)
    if scale is not None:
        scale = check_static_scale("scale", scale)
        check_scale_values_on_cpu("scale", scale)
        if per_tensor:
            raise ValueError("per_tensor=True computes the scale; with scale= given, leave per_tensor=False")
        if out_scale is not None:
            raise ValueError("out_scale is for a computed scale; with scale= given, x_scale is that scale")
    if num_rows is not None:
        check_tensor("num_rows", num_rows, ndim=1, dtypes=(torch.int32,), shape=(1,), layout="[1]")
    static = scale is not None or per_tensor
    group = _group(k, group_size, static)
    if not static and next_power_of_2(group) > MAX_GROUP:
        raise ValueError(
            f"a group of {group} channels is wider than the kernel's limit of {MAX_GROUP}: pass "
            f"group_size <= {MAX_GROUP} (x has K = {k})"
        )
    scale_shape = (1,) if static else (rows, cdiv(k, group))
    q = output_buffer(out, (rows, k), FP8_DTYPE, x.device, "[rows, K]")
    if out is not None:
        check_not_aliased(out, x=x)
    if out_scale is None:
        x_scale = scale if scale is not None else torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    else:
        check_tensor(
            "out_scale",
            out_scale,
            ndim=len(scale_shape),
            dtypes=(torch.float32,),
            shape=scale_shape,
            layout="[1]" if static else "[rows, ceil(K/group_size)]",
        )
        check_own_memory("out_scale", out_scale)
        check_not_aliased(out_scale, x=x, out=out, name="out_scale")
        x_scale = out_scale
    device = check_kernel_device(x=x, scale=scale, num_rows=num_rows, out=out, out_scale=out_scale)
    require_fp8(device, "FP8 (float8_e4m3fn) kernels")
    if per_tensor:  # dynamic per tensor: amax over the rows in use, on the device (0 for no rows)
        row_amax = x.abs().amax(dim=1).float() if rows else torch.zeros(1, device=x.device)
        if num_rows is not None and rows:
            row_amax = torch.where(torch.arange(rows, device=x.device) < num_rows, row_amax, 0.0)
        x_scale.copy_(_scale_of(row_amax.amax()).reshape(1))
    _quantize(x, q, x_scale, num_rows, group, static)
    return q, x_scale
