"""Notebook 09's exercise: quantize rows to FP8 (float8_e4m3fn), one scale per row per GROUP channels.

    quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, GROUP: tl.constexpr)

x [rows, K] float32, q [rows, K] float8_e4m3fn and scale [rows, cdiv(K, GROUP)] float32, all contiguous;
grid (rows, cdiv(K, GROUP)). Program (row, group) quantizes channels group * GROUP .. group * GROUP + GROUP - 1
of its row (the last group of a row is partial when GROUP does not divide K):

    amax  = max(max |x| over the group, 1e-10)
    scale = amax / 448                              (448: float8_e4m3fn's largest value)
    q     = clamp(x / scale, -448, 448), rounded to e4m3 by round_to_e4m3_grid, then cast
    store q, and the scale at scale_ptr + row * cdiv(K, GROUP) + group

Graded bit for bit against `moe_lab.quantize_activations_fp8(x, group_size=GROUP)` (the package's kernel,
whose layout the FP8 grouped GEMM reads), on two launches with different sizes: every scale's float32 bits
and every q byte. Bit for bit needs the learner's kernel to round with
`moe_lab._kernels.common.round_to_e4m3_grid` before the cast: Triton's interpreter casts float32 to
float8e4nv wrongly where rounding carries into the next power of two (127.9 -> 64, not 128); GPUs round
right, and there the helper changes nothing.

The launches are always interpreted, on guarded CPU buffers, also on a GPU (a kernel compiled for it is run
from its source by the interpreter, as `run_guarded`'s first check does): the GPU's compiled `/` is an
approximate division, which can differ from torch's IEEE one in the last bit, and bit-for-bit grading would
fail a right kernel for it. moe-lab's own kernel divides with `tl.math.div_rn` for that reason.

The checker names, from the values and the interpreter's record of every store: nothing stored; loads or
stores past a row's end (no `cols < K` mask); a scale layout that reaches past the scale tensor, or stores
the scales transposed; scales that are the amax (not divided by 448), 448 / amax (the inverse), max(x)
instead of max |x|, one per row instead of one per group, groups starting at channel `group` instead of
`group * GROUP`, 0 for an all-zero group (no floor), off in the last bit (a multiply by 1 / 448, or a GPU's
approximate `/`); rows or channels of q never written; q multiplied by the scale instead of divided, or cast
without it, or divided by 448 instead of the scale; every scale 448; the row's start missing from x's offsets
(every row gets row 0's scales); a masked load of x without `other=` (undefined lanes on a GPU, read by
the amax; the guarded run fills them with the largest value of the dtype), or with an `other=` that is not 0
(row 0's last group is all zeros, so any other value shows in its scale); a cast to another float8 type
(e5m2, before or after `round_to_e4m3_grid`, or e4b15); the interpreter's cast without `round_to_e4m3_grid`;
sizes written into the kernel (the second launch only). A missing clamp cannot be seen: with scale =
amax / 448 no |x| / scale passes 448 by more than one rounding, and both `round_to_e4m3_grid` and a GPU's
cast saturate at 448 anyway. The clamp is there for a static (calibrated) scale, which the package's kernel
also takes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
from triton.runtime.jit import JITFunction

from ...quantize import quantize_activations_fp8
from ...runtime import default_device
from ..guarded import _interpreted, _interpreting_beside_a_gpu, run_guarded
from ._grade import Verdict, report, stored_by_two_programs, stray_stores, undefined_lanes_problem

EXERCISE = "quantize_rows_kernel"
FP8 = torch.float8_e4m3fn
E4B15_MAX = 1.875  # tl.float8e4b15's largest value

SCALE_HINT = "scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10) / 448.0"
LAYOUT_HINT = (
    "scale is [rows, tl.cdiv(K, GROUP)], one float32 per program: store it at "
    "scale_ptr + row * tl.cdiv(K, GROUP) + group"
)
ROUND_HINT = (
    "call q = round_to_e4m3_grid(q) before q.to(tl.float8e4nv): Triton's interpreter drops the carry "
    "when rounding to e4m3 goes up to the next power of two; the helper rounds to the e4m3 grid first, so "
    "the cast is exact (on a GPU it changes nothing)"
)
SIZES_HINT = (
    "it passes the first launch (5 rows, K = 200, GROUP = 128) but not this one: look for 128, 200 or 2 "
    "written into the kernel instead of GROUP, K and tl.cdiv(K, GROUP)"
)


@dataclass(frozen=True)
class Case:
    rows: int
    k: int
    group: int

    @property
    def groups(self) -> int:
        return triton.cdiv(self.k, self.group)

    def describe(self) -> str:
        return f"{self.rows} rows, K = {self.k}, GROUP = {self.group}"


# The notebook's sizes first (K not a multiple of GROUP: the last group is 72 wide); then other sizes with
# more groups than rows (so swapped program axes show), GROUP = 64 and a partial last group of 44.
CASES = (Case(5, 200, 128), Case(3, 300, 64))


def _inputs(case: Case) -> torch.Tensor:
    """x [rows, K] float32: each group at its own magnitude (1e-2 .. 1e2, so a scale taken over the wrong
    channels shows), one all-zero group (row rows-2, group 0: the amax floor) and, where K is not a multiple
    of GROUP, an all-zero last group in row 0 (any `other=` but 0 on the masked load changes its scale)."""
    gen = torch.Generator().manual_seed(9)
    gain = 10.0 ** (4 * torch.rand(case.rows, case.groups, generator=gen) - 2)
    x = torch.randn(case.rows, case.k, generator=gen) * gain.repeat_interleave(case.group, 1)[:, : case.k]
    x[case.rows - 2, : case.group] = 0.0
    if case.k % case.group:
        x[0, case.k - case.k % case.group :] = 0.0
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype == FP8 else t.float().view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _cast_slips(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Where got differs from want (float8) as the interpreter's cast makes it differ: half of a power of two."""
    g, w = got.float(), want.float()
    wrong = _bits(got) != _bits(want)
    power = (w != 0) & (torch.frexp(w.abs())[0] == 0.5)
    return wrong & power & (g * 2 == w)


def _q_matches(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got == want bit for bit, or up to the interpreter's cast slips."""
    wrong = _bits(got) != _bits(want)
    return not wrong.any() or bool((wrong == _cast_slips(got, want)).all())


def _cast_as_e5m2(got: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether got is v cast to float8 e5m2, as it is or after round_to_e4m3_grid: every value on e5m2's grid
    (2 mantissa bits) and one of v's two e5m2 neighbours (the interpreter breaks ties unlike torch, and drops
    carries), and not simply e4m3's answer."""
    g, v = got.float(), v.float()
    if not bool(torch.isfinite(g).all()) or _q_matches(got, v.to(FP8)):
        return False
    exponent = torch.floor(torch.log2(v.abs().clamp(min=2.0**-14)))
    ulp = torch.exp2(exponent - 2)  # e5m2's spacing at |v|
    on_grid = g.to(torch.float8_e5m2).float() == g
    # the interpreter's cast drops the carry where rounding goes up to a power of two (as it does for e4m3)
    carry_dropped = (torch.frexp(g)[0].abs() == 0.5) & ((2 * g - v).abs() <= ulp)
    return bool((on_grid & (((g - v).abs() <= ulp) | carry_dropped)).all())


def _cast_as_e4b15(got: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether got is v cast to float8e4b15 (e4m3's bits with exponent bias 15: e4m3fn's values / 256, largest
    1.875): nothing past 1.875, and the values within its range on its grid. Torch has no e4b15 type, and what
    a cast makes of larger values differs (the interpreter wraps them into [1, 1.875], a GPU saturates)."""
    small = v.abs() <= 1.75  # where e4b15's grid is e4m3fn's / 256
    on_grid = ((v[small] * 256).to(FP8).float() / 256).to(FP8)
    return bool((got.float().abs() <= E4B15_MAX).all()) and _q_matches(got[small], on_grid)


def _stored(run, tensor: str) -> torch.Tensor:
    """Element offsets (in bounds) that the kernel stored into `tensor`, from the interpreter's record."""
    chunks = [
        torch.from_numpy(a.offsets[a.in_bounds])
        for a in run.accesses
        if a.tensor == tensor and a.kind != "load" and a.in_bounds.any()
    ]
    return torch.unique(torch.cat(chunks)) if chunks else torch.zeros(0, dtype=torch.int64)


def _group_amax(x: torch.Tensor, case: Case, starts=None) -> torch.Tensor:
    """[rows, groups] max |x| of each group (channels start .. start + GROUP - 1, below K)."""
    if starts is None:
        padded = F.pad(x.abs(), (0, case.groups * case.group - case.k))
        return padded.view(case.rows, case.groups, case.group).amax(dim=2)
    return torch.stack([x[:, s : min(s + case.group, case.k)].abs().amax(dim=1) for s in starts], dim=1)


def _div448(t: torch.Tensor) -> torch.Tensor:
    return t / torch.full_like(t, 448.0)  # an IEEE division, as the kernel's div_rn


def _scale_problem(
    case: Case, x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, stored: torch.Tensor, named_only: bool = False
) -> Optional[str]:
    """What is wrong with the scales: a mistake recognized by name, or (unless named_only) what differs."""
    if _same(got, want):
        return None
    amax = _group_amax(x, case)
    floored = amax.clamp(min=1e-10)
    signed = F.pad(x, (0, case.groups * case.group - case.k), value=-float("inf"))
    signed_max = signed.view(case.rows, case.groups, case.group).amax(dim=2).clamp(min=1e-10)
    per_row = x.abs().amax(dim=1, keepdim=True).expand(case.rows, case.groups).clamp(min=1e-10)
    shifted = _group_amax(x, case, starts=range(case.groups)).clamp(min=1e-10)
    candidates = (
        (
            floored,
            f"each scale is its group's amax: divide it by 448, FP8's largest value, so that the group's "
            f"largest |x| becomes 448 ({SCALE_HINT})",
        ),
        (
            torch.full_like(floored, 448.0) / floored,
            "each scale is 448 / amax, the inverse: store scale = amax / 448, the number that multiplies q back into "
            "x (x ~ q * scale), and divide x by it",
        ),
        (
            _div448(signed_max),
            f"the scales come from max(x), not max(|x|): a group whose largest magnitude is "
            f"negative gets too small a scale ({SCALE_HINT})",
        ),
        (
            _div448(per_row),
            "every group of a row has the row's scale: each group of GROUP channels has its own "
            "amax (that is the point: an outlier spoils only its own group)",
        ),
        (
            _div448(shifted),
            "the groups start at channel `group`, not `group * GROUP`: program (row, group) covers "
            "channels group * GROUP + tl.arange(0, GROUP)",
        ),
        (
            _div448(amax),
            f"the all-zero group (row {case.rows - 2}, group 0) got scale 0, so its q is 0 / 0 = NaN: "
            f"floor the amax at 1e-10 before dividing ({SCALE_HINT})",
        ),
        (
            floored * torch.tensor(1 / 448, dtype=torch.float32),
            "the scales are amax * (1 / 448), which rounds twice "
            "(1 / 448 has no exact float32): divide, scale = amax / 448",
        ),
        (
            want.t().contiguous().view(case.rows, case.groups),
            f"the scales are stored transposed (group-major, scale_ptr + group * rows + row): {LAYOUT_HINT}",
        ),
        (
            torch.full_like(floored, 448.0),
            f"every scale is 448: the scale is the group's amax divided by 448 ({SCALE_HINT})",
        ),
        (
            want[:1].expand(case.rows, case.groups),
            "every row got row 0's scales: the load of x misses the row's start, x_ptr + row * K + cols",
        ),
    )
    for wrong, why in candidates:
        if not _same(wrong, want) and _same(got, wrong):
            return why
    off = _bits(got) != _bits(want)
    if case.k % case.group and off.any() and not off[:, :-1].any() and bool((got[off] > want[off]).all()):
        return (
            f"only scales of the last group (its {case.k % case.group} channels and {-case.k % case.group} "
            "masked lanes) are wrong, and too large: the masked lanes' `other=` value enters the amax. Load "
            "with other=0.0, which leaves the amax alone"
        )
    if named_only:
        return None
    if stored.numel() < want.numel():
        missing = sorted(set(range(want.numel())) - set(stored.tolist()))
        r, g = divmod(missing[0], case.groups)
        return (
            f"{len(missing)} of {want.numel()} scales were never stored, the first for row {r}, group {g}: "
            f"{LAYOUT_HINT}"
        )
    g64, w64 = got.double().cpu(), want.double().cpu()
    close = torch.isclose(g64, w64, rtol=5e-7, atol=0)
    if close.all():
        n = int((_bits(got) != _bits(want)).sum())
        return (
            f"{n} of {want.numel()} scales differ from amax / 448 in the last bit: compute it as one float32 "
            "division of the floored amax by 448.0"
        )
    wrong = (~close).nonzero()[0].tolist()
    return (
        f"{int((~close).sum())} of {want.numel()} scales are wrong, the first for row {wrong[0]}, group {wrong[1]} "
        f"(got {g64[tuple(wrong)].item():.6g}, expected {w64[tuple(wrong)].item():.6g}): {SCALE_HINT}"
    )


def _coverage_problem(case: Case, stored: torch.Tensor, whole_rows: bool) -> Optional[str]:
    """Rows (whole_rows) or else channels of q that no store reached."""
    if stored.numel() == case.rows * case.k:
        return None
    written = torch.zeros(case.rows * case.k, dtype=torch.bool)
    written[stored] = True
    written = written.view(case.rows, case.k)
    rows = [r for r in range(case.rows) if not written[r].any()]
    if whole_rows:
        return (
            (
                f"rows {rows} of q were never written (of {case.rows}): program (row, group) quantizes one group of "
                "row `row = tl.program_id(0)` (group = tl.program_id(1)), at offsets row * K + cols"
            )
            if rows
            else None
        )
    r, c = (~written).nonzero()[0].tolist()
    return (
        f"{int((~written).sum())} values of q were never written, the first at row {r}, channel {c}: program "
        "(row, group) covers channels cols = group * GROUP + tl.arange(0, GROUP) of its row (group = "
        "tl.program_id(1))"
    )


def _q_problem(
    case: Case, x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor
) -> Optional[str]:
    if _same(got, want):
        return None
    full = scale.repeat_interleave(case.group, 1)[:, : case.k]
    if _q_matches(got, (x * full).clamp(-448, 448).to(FP8)):
        return (
            "q is x times the scale: divide instead, q = x / scale (x ~ q * scale: the scale multiplies q back into x)"
        )
    if _q_matches(got, x.clamp(-448, 448).to(FP8)):
        return "q is x cast as it is: divide x by its group's scale first, so the group's largest |x| becomes 448"
    if _q_matches(got, (x / 448.0).to(FP8)):
        return "q is x / 448: divide x by its group's scale (amax / 448), so the group's largest |x| becomes 448"
    clamped = (x / full).clamp(-448, 448)
    if _cast_as_e5m2(got, clamped):
        return (
            "q was rounded as float8 e5m2 (2 mantissa bits), not e4m3: cast with q.to(tl.float8e4nv), after "
            "round_to_e4m3_grid"
        )
    if _cast_as_e4b15(got, clamped):
        return (
            "q was cast to float8 e4b15 (exponent bias 15, largest value 1.875), not e4m3 (largest 448): cast "
            "with q.to(tl.float8e4nv), after round_to_e4m3_grid"
        )
    slips = _cast_slips(got, want)
    wrong = _bits(got) != _bits(want)
    if wrong.any() and bool((wrong == slips).all()):
        first = slips.nonzero()[0].tolist()
        got_v, want_v = got[tuple(first)].float().item(), want[tuple(first)].float().item()
        return (
            f"{int(slips.sum())} of {want.numel()} values are half what they should be, all where rounding "
            f"goes up to a power of two (row {first[0]}, channel {first[1]}: got {got_v:g}, expected {want_v:g}): "
            f"{ROUND_HINT}"
        )
    first = wrong.nonzero()[0].tolist()
    got_v = got[tuple(first)].float().item()
    nan = (
        (
            " (±384 is what the interpreter's cast makes of a NaN: a 0 / 0, as from an all-zero group divided by "
            "an amax without its floor, tl.maximum(amax, 1e-10)?)"
        )
        if abs(got_v) == 384
        else ""
    )
    return (
        f"{int(wrong.sum())} of {want.numel()} values of q are wrong, the first at row {first[0]}, channel "
        f"{first[1]} (got {got_v:g}, expected {want[tuple(first)].float().item():g}){nan}: "
        f"q = clamp(x / scale, -448, 448), then round_to_e4m3_grid, then the cast"
    )


def _bounds_hint(case: Case, run) -> str:
    tensors = {o.tensor for o in run.out_of_bounds}
    if "scale_ptr" in tensors:
        return LAYOUT_HINT
    if case.k % case.group:
        return (
            f"K = {case.k} is not a multiple of GROUP = {case.group}: the last group of a row is "
            f"{case.k % case.group} channels wide. Mask the load and the store with `cols < K` (load with "
            "other=0.0, so the lanes past K add nothing to the amax)"
        )
    return "row r starts at element r * K: offsets row * K + cols, cols < K"


def _run(kernel, case: Case, x: torch.Tensor):
    """One guarded launch, interpreted on CPU buffers (see the module doc for why, also on a GPU)."""
    args = dict(
        x_ptr=x,
        q_ptr=torch.full((case.rows, case.k), float("nan")).to(FP8),
        scale_ptr=torch.full((case.rows, case.groups), float("nan")),
        K=case.k,
        GROUP=case.group,
    )
    with warnings.catch_warnings():  # the interpreter's 0 / 0 of a kernel without the amax floor: named later
        warnings.simplefilter("ignore", RuntimeWarning)
        if isinstance(kernel, JITFunction):  # compiled for a GPU: its source, interpreted
            with _interpreting_beside_a_gpu():
                return run_guarded(_interpreted(kernel), (case.rows, case.groups), **args)
        return run_guarded(kernel, (case.rows, case.groups), **args)


def _case_problem(kernel, case: Case) -> Optional[str]:
    x = _inputs(case)
    run = _run(kernel, case, x)
    problem = run.problem()
    if problem is not None:
        return problem + f". {_bounds_hint(case, run)}" if run.out_of_bounds else problem
    stored_q, stored_s = _stored(run, "q_ptr"), _stored(run, "scale_ptr")
    if not stored_q.numel() and not stored_s.numel():
        return "the kernel stores nothing: load the group, compute its scale, and tl.store q (as float8) and the scale"
    if not stored_s.numel():
        return f"no scale was stored: {LAYOUT_HINT}"
    if not stored_q.numel():
        return "q was never stored: tl.store q.to(tl.float8e4nv) at the group's offsets (masked: cols < K)"
    want_q, want_s = (t.cpu() for t in quantize_activations_fp8(x.to(default_device()), group_size=case.group))
    got_q, got_s = run.tensors["q_ptr"].cpu(), run.tensors["scale_ptr"].cpu()
    # A mistake recognized by name first; then channels never written (a group's bounds or index gone wrong
    # also spoil its scale, and are the thing to fix), then whatever else differs.
    return (
        undefined_lanes_problem(run, "scale_ptr", want_s, "other=0.0, which leaves the amax alone", tol=1e-6)
        or _coverage_problem(case, stored_q, True)
        or _scale_problem(case, x, got_s, want_s, stored_s, True)
        or _coverage_problem(case, stored_q, False)
        or _scale_problem(case, x, got_s, want_s, stored_s)
        or _q_problem(case, x, got_q, want_q, want_s)
        or stored_by_two_programs(
            run,
            f"Each program stores its own group's q (columns group * GROUP .. group * "
            f"GROUP + GROUP - 1) and one scale: {LAYOUT_HINT}",
        )
        or stray_stores(run, ("q_ptr", "scale_ptr"))
    )


def check_quantize_rows(kernel, strict: bool = False) -> Verdict:
    """Grade `quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, GROUP)` on two launches (`CASES`: 5 rows of
    K = 200 in groups of 128, then 3 rows of K = 300 in groups of 64), q and scale poisoned with NaN, against
    `quantize_activations_fp8` bit for bit. See the module doc for the mistakes it names."""
    for i, case in enumerate(CASES):
        problem = _case_problem(kernel, case)
        if problem is not None:
            if i:
                problem = f"with {case.describe()}, {SIZES_HINT}: {problem}"
            return report(EXERCISE, problem, "", strict)
    return report(
        EXERCISE,
        None,
        "q and every scale bit for bit as quantize_activations_fp8 makes them, on two "
        "launches (" + "; ".join(c.describe() for c in CASES) + "), no access out of bounds",
        strict,
    )
