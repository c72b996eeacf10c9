"""PyTorch references, written for clarity, in float32 (or float64) math. Tests compare against these."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from ._validate import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, described
from .align import AlignedRouting, check_align_args, max_num_tokens_padded
from .expert_kind import Activation, check_activation
from .gemm import check_weight_scale
from .quantize import FP8_DTYPE, FP8_MAX, check_gemm_block_shape, check_static_scale, dequantize_fp8


def moe_align_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size_m: int, *, expert_map: Optional[torch.Tensor] = None
) -> AlignedRouting:
    """The same schedule as `moe_align`, built with a stable sort on the host. Slots whose expert is
    outside [0, E) (after `expert_map`) are dropped. Checks its arguments as `moe_align` does."""
    num_experts, block_size_m = check_align_args(topk_ids, num_experts, block_size_m, expert_map)
    num_tokens, top_k = topk_ids.shape
    num_slots = num_tokens * top_k
    ids = topk_ids.reshape(-1).long().cpu()
    if expert_map is not None:
        emap = expert_map.long().cpu()
        inside = (ids >= 0) & (ids < emap.numel())
        ids = torch.where(inside, emap[ids.clamp(0, emap.numel() - 1)], torch.full_like(ids, -1))
    keep = (ids >= 0) & (ids < num_experts)
    counts = torch.bincount(ids[keep], minlength=num_experts)
    padded_len = max_num_tokens_padded(num_slots, num_experts, block_size_m)
    sorted_ids = torch.full((padded_len,), num_slots, dtype=torch.int64)
    expert_ids = torch.full((padded_len // block_size_m,), -1, dtype=torch.int64)
    row = 0
    for e in range(num_experts):
        slots = torch.nonzero(ids == e).flatten()  # ascending: stable order
        sorted_ids[row : row + slots.numel()] = slots
        blocks = -(-slots.numel() // block_size_m)
        expert_ids[row // block_size_m : row // block_size_m + blocks] = e
        row += blocks * block_size_m
    dev = dict(dtype=torch.int32, device=topk_ids.device)
    return AlignedRouting(
        counts.to(**dev),
        sorted_ids.to(**dev),
        expert_ids.to(**dev),
        torch.tensor([row], **dev),
        block_size_m,
        num_tokens,
        top_k,
        num_experts,
    )


def fake_quantize_activations(
    x: torch.Tensor, group_size: Optional[int] = None, scale: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """x [rows, K] as the float8 GEMM sees it, back in float32: quantized to float8_e4m3fn and multiplied
    by its scale, with the static per-tensor `scale`, or scales amax/448 per `group_size` channels of a
    row (per row when None), as `moe_lab.quantize_activations_fp8` makes them."""
    x = x.float()
    if scale is not None:
        s = scale.float().reshape(1, 1)
        return (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s
    rows, k = x.shape
    group = min(group_size or k, k) or 1  # a group wider than the row is the row (no padding to its width)
    pad = -k % group
    groups = F.pad(x, (0, pad)).reshape(rows, (k + pad) // group, group)
    amax = groups.abs().amax(dim=2, keepdim=True).clamp(min=1e-10)
    s = amax / torch.full_like(amax, FP8_MAX)  # an IEEE division, as the kernel's (not a reciprocal multiply)
    q = (groups / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s
    return q.reshape(rows, k + pad)[:, :k]


def gated_activation_reference(gate_up: torch.Tensor, activation: Union[Activation, str, None] = None) -> torch.Tensor:
    """act [rows, I] of gate_up [rows, 2I] (w1's row order: halves or interleaved), in gate_up's dtype:
    silu(gate) * up, or gpt-oss's clamped SwiGLU (`moe_lab.Activation`)."""
    activation = check_activation(activation)
    if activation.interleaved:
        gate, up = gate_up[:, 0::2], gate_up[:, 1::2]
    else:
        gate, up = gate_up.chunk(2, dim=-1)
    if activation.kind == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=activation.limit)
    up = up.clamp(-activation.limit, activation.limit)
    return (up + 1) * gate * torch.sigmoid(activation.alpha * gate)


def fused_moe_reference(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_map: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
    w1_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    block_shape=None,
    activation: Union[Activation, str, None] = None,
    w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    shared_w1: Optional[torch.Tensor] = None,
    shared_w2: Optional[torch.Tensor] = None,
    shared_weights: Optional[torch.Tensor] = None,
    quantize_inputs: bool = True,
) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * W2[e] (silu(W1g[e] x_t) * W1u[e] x_t), e = topk_ids[t, j].

    hidden_states [T, H], w1 [E, 2I, H] (gate rows first, then up), w2 [E, H, I]; math in `dtype`
    (float32 by default, float64 for tight checks). Returns [T, H] in `dtype`. With `expert_map`, only
    local experts contribute (the others give zero).

    activation, w1_bias, w2_bias, shared_w1, shared_w2, shared_weights as `moe_lab.fused_moe` takes them:
    out[t] = sum_j w[t, j] * (W2[e] act(W1[e] x_t + b1[e]) + b2[e]) + sum_s g[t, s] * W2s[s] act(W1s[s] x_t).

    float8_e4m3fn w1 and w2 (scales and block_shape as `moe_lab.fused_moe` takes them): the weights are
    dequantized and each GEMM's input is quantized as the layer quantizes it (`fake_quantize_activations`,
    the SwiGLU output from float32), so comparing with the layer measures the kernels' error apart from
    the quantization's; shared experts (in hidden_states' dtype) read hidden_states unquantized, as the layer's do.
    quantize_inputs=False (float8 weights): both GEMMs' inputs stay in `dtype` and a1_scale, a2_scale go unused:
    exact math on the dequantized weights, against which a layer's whole error shows, its quantization's
    included. Against the default reference, a layer whose float32 sums differ from the reference's by a
    rounding can round an activation to the neighbouring float8 value and move its row by a step; against this
    one such a step costs no more than either rounding (docs/experiments.md, "FP8 at decode: which reference").
    Raises TypeError / ValueError, as `fused_moe` does, for hidden_states, topk_ids and topk_weights of the
    wrong rank, dtype or shape, for w1 not [E, 2I, H] or w2 not [E, H, I] (E, H and I agreeing with each other
    and with hidden_states; float16/bfloat16/float32 or float8_e4m3fn, w2 in w1's dtype), for shared experts
    likewise ([S, 2I_s, H], [S, H, I_s]), for experts outside [0, E) and for scales or a block_shape given
    with weights that are not float8; TypeError for a `dtype` that is not a floating torch.dtype. Unlike
    `fused_moe` it takes float weights of another float dtype than hidden_states' (everything is computed in
    `dtype`).
    """
    # the layer imports the kernels: only when called
    from .layer import _check_ids, _check_no_scales, _check_shared_weights, _check_weights

    if not isinstance(quantize_inputs, bool):
        raise TypeError(f"quantize_inputs must be a bool, got {described(quantize_inputs)}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize == 1:
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32 or torch.float64), got {dtype!r}")

    check_tensor("hidden_states", hidden_states, ndim=2, dtypes=FLOAT_DTYPES, layout="[T, H]")
    _check_weights(w1, w2, FLOAT_DTYPES + (FP8_DTYPE,), hidden_states.shape[1])
    _check_shared_weights(shared_w1, shared_w2, FLOAT_DTYPES, hidden_states.shape[1])
    check_tensor(
        "topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, shape=(hidden_states.shape[0], None), layout="[T, k]"
    )
    check_tensor(
        "topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES, shape=tuple(topk_ids.shape), layout="[T, k]"
    )
    _check_ids(topk_ids, expert_map, w1.shape[0], True)  # experts out of range would add nothing: say so
    shared_x = hidden_states.to(dtype)  # shared experts run in hidden_states' dtype, on unquantized rows
    fp8 = w1.dtype == FP8_DTYPE
    if not fp8:
        _check_no_scales(
            w1, w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, block_shape=block_shape
        )
    if fp8:  # the layer's checks of the scales, so a mistake is named as fused_moe names it
        block_shape = check_gemm_block_shape(block_shape)
        check_weight_scale("w1_scale", w1_scale, w1, block_shape)
        check_weight_scale("w2_scale", w2_scale, w2, block_shape)
        a1_scale, a2_scale = (
            None if s is None else check_static_scale(name, s)
            for name, s in (("a1_scale", a1_scale), ("a2_scale", a2_scale))
        )
        group = block_shape[1] if block_shape is not None else None
        if quantize_inputs:
            hidden_states = fake_quantize_activations(hidden_states, group, a1_scale)
    x = hidden_states.to(dtype)
    num_tokens = x.shape[0]
    out = torch.zeros(num_tokens, w2.shape[1], dtype=dtype, device=x.device)
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.long().to(ids.device)[ids]
    for e in range(w1.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        w1_e, w2_e = w1[e], w2[e]
        if fp8:  # one expert at a time: DeepSeek-V3's whole w1 in float32 would be 28 GiB
            w1_e = dequantize_fp8(w1[e : e + 1], _expert_scale(w1_scale, e), block_shape)[0]
            w2_e = dequantize_fp8(w2[e : e + 1], _expert_scale(w2_scale, e), block_shape)[0]
        gate_up = x[token] @ w1_e.to(dtype).T
        if w1_bias is not None:
            gate_up = gate_up + w1_bias[e].to(dtype)
        act = gated_activation_reference(gate_up, activation)
        if fp8 and quantize_inputs:
            act = fake_quantize_activations(act, group, a2_scale).to(dtype)
        y = act @ w2_e.to(dtype).T
        if w2_bias is not None:
            y = y + w2_bias[e].to(dtype)
        out.index_add_(0, token, y * topk_weights[token, slot].to(dtype)[:, None])
    if shared_w1 is not None:
        for s in range(shared_w1.shape[0]):
            act = gated_activation_reference(shared_x @ shared_w1[s].to(dtype).T, activation)
            y = act @ shared_w2[s].to(dtype).T
            out += y if shared_weights is None else y * shared_weights[:, s].to(dtype)[:, None]
    return out


def _expert_scale(scale: torch.Tensor, e: int) -> torch.Tensor:
    """Expert e's part of a weight scale (per tensor: the scale itself; [E], [E, N], [E, N/bn, K/bk]: row e)."""
    return scale if scale.numel() == 1 else scale[e : e + 1]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64 (both scaled by ref's largest magnitude first, so values near
    float64's limit do not overflow the norms); NaN or inf anywhere gives NaN or inf (never passes a `<` check).
    Where ref is all zeros (or empty) there is no scale to divide by: it is ||out||_F, 0 only for an exact match.
    Raises ValueError unless out and ref have the same shape (no broadcasting: a wrong-shaped result must not
    pass as a match); TypeError unless both are real (not complex) tensors with data (not on meta;
    torch.as_tensor makes one of an array)."""
    for name, value in (("out", out), ("ref", ref)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__} (torch.as_tensor makes one)")
        if value.is_complex():  # .double() would drop the imaginary part
            raise TypeError(f"{name} must be a real tensor, got {str(value.dtype).replace('torch.', '')}")
        if value.is_meta:
            raise TypeError(f"{name} must be a tensor with data, got one on meta")
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out and ref must have the same shape, got {tuple(out.shape)} and {tuple(ref.shape)}")
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    scale = ref64.abs().max() if ref64.numel() else torch.zeros((), dtype=torch.float64)
    if 0 < scale < float("inf"):
        out64, ref64 = out64 / scale, ref64 / scale
    denom = ref64.norm()
    diff = (out64 - ref64).norm()
    if denom == 0:
        return float(diff)
    return float(diff / denom)
