"""The verdict of an exercise checker and the diagnosis every checker shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..._validate import check_bool
from ...reference import relative_error
from ..guarded import GuardedRun


@dataclass(frozen=True)
class Verdict:
    """An exercise checker's result: `status` is "PASS" or "NOT YET" ("FAIL" is raised, not returned)."""

    exercise: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def __str__(self) -> str:
        return f"{self.status} {self.exercise}: {self.message}"

    def _ipython_display_(self) -> None:
        """Nothing: the checker printed the verdict already (a cell ending in a checker call shows it once)."""


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    if got.shape != want.shape:
        return False
    if not (got.is_floating_point() or want.is_floating_point()):
        return torch.equal(got.cpu(), want.cpu())
    got_nan, want_nan = torch.isnan(got.float()), torch.isnan(want.float())
    if not torch.equal(got_nan, want_nan):
        return False
    if got_nan.all():
        return True
    return relative_error(got[~got_nan], want[~want_nan]) < tol  # a mistake may leave rows unwritten (NaN)


def _difference(got: torch.Tensor, want: torch.Tensor, tol: float) -> str:
    """What differs, and where. Where `want` is NaN the kernel must leave the value alone (it stays NaN):
    those places are not counted as wrong or unwritten, only reported if the kernel wrote them."""
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    leave = torch.isnan(w)
    wrong = ~leave & (~torch.isclose(g, w, rtol=max(tol, 1e-6), atol=max(tol, 1e-6)) | torch.isnan(g))
    unwritten = int((~leave & torch.isnan(g)).sum())
    parts = []
    if wrong.any():
        first = tuple(wrong.nonzero()[0].tolist())
        text = (
            f"{int(wrong.sum())} of {int((~leave).sum())} values are wrong, the first at index "
            f"{first if len(first) > 1 else first[0]} (got {g[first].item():.6g}, expected {w[first].item():.6g})"
        )
        if unwritten:
            text += f"; {unwritten} were never written (still NaN)"
        elif got.is_floating_point():
            text += f"; relative error {relative_error(got[~leave.to(got.device)], want[~leave.to(want.device)]):.1e}"
        parts.append(text)
    written = leave & ~torch.isnan(g)
    if written.any():
        first = tuple(written.nonzero()[0].tolist())
        parts.append(
            f"{int(written.sum())} values that must be left alone were written, the first at index "
            f"{first if len(first) > 1 else first[0]}"
        )
    return "; ".join(parts) or "the values differ"


def report(exercise: str, problem: Optional[str], passed: str, strict: bool = False) -> Verdict:
    """The verdict of a checker that is not a kernel's (a PyTorch function, a quiz): print "PASS exercise:
    passed" when `problem` is None, else "NOT YET exercise: problem", or raise "FAIL ..." if `strict` (a bool:
    TypeError otherwise)."""
    if check_bool("strict", strict) and problem is not None:
        raise AssertionError(f"FAIL {exercise}: {problem}")
    verdict = Verdict(exercise, "PASS", passed) if problem is None else Verdict(exercise, "NOT YET", problem)
    print(verdict)
    return verdict


def undefined_lanes_problem(
    run: GuardedRun, output: str, want: torch.Tensor, hint: str = "", tol: float = 1e-5
) -> Optional[str]:
    """The message for a result that is wrong only because of the masked lanes of a load without `other=`
    (which the guarded run fills with poison, as undefined as a GPU leaves them), or None: the same launch
    with those lanes 0, as the interpreter alone gives them, is right."""
    if not run.undefined_lanes or _close(run.tensors[output].cpu(), want.cpu(), tol):
        return None
    again = run.with_zero_lanes()
    if again is None or not again.clean or not _close(again.tensors[output].cpu(), want.cpu(), tol):
        return None
    loads = ", ".join(f"{name} ({count} lanes)" for name, count in run.undefined_lanes.items())
    return (
        f"{output} is right only where the masked lanes of a tl.load with no other= read 0: a GPU leaves them "
        f"undefined (here: loads of {loads}; the interpreter alone gives them 0, this check gives them the "
        "largest value of the dtype, as a GPU may give anything). Give the load `other=`, the value the masked "
        f"lanes must have{': ' + hint if hint else ''}"
    )


def stray_stores(run: GuardedRun, written: Sequence[str]) -> Optional[str]:
    """The message for stores into tensors other than `written` (the launch's outputs; the others are inputs,
    to be read only), from the interpreter's record of every access, or None."""
    stray = sorted({a.tensor for a in run.accesses if a.kind != "load" and a.tensor not in written})
    if not stray:
        return None
    return (
        f"the kernel also stores into {', '.join(stray)}, an input it must only read (on a GPU another program, "
        f"or the next launch, would read the changed values): store only into {', '.join(written)}"
    )


def stored_by_two_programs(run: GuardedRun, hint: str = "") -> Optional[str]:
    """The message for elements that more than one program stored with plain stores (atomics aside), from the
    interpreter's record, or None: on a GPU the programs run at once and race (which value stays, or whether an
    add of a load survives, depends on timing), while the interpreter runs them one after another, so the
    result may look right. `hint`: what each program must store instead."""
    seen: dict = {}  # (tensor, element offset) -> the programs that stored it, in one pass over the record
    for a in run.accesses:
        if a.kind == "store":
            for offset in np.unique(a.offsets[a.in_bounds]).tolist():
                seen.setdefault((a.tensor, offset), set()).add(a.program)
    twice = {key: programs for key, programs in seen.items() if len(programs) > 1}
    if not twice:
        return None
    (tensor, offset), programs = min(twice.items())
    count = sum(1 for name, _ in twice if name == tensor)
    who = " and ".join(str(p[: 2 if p[2] == 0 else 3]) for p in sorted(programs)[:2])
    return (
        f"{count} elements of {tensor} are stored by more than one program (element {offset} by programs "
        f"{who}{' and more' if len(programs) > 2 else ''}): on a GPU the programs run at once and race, so which "
        "value stays depends on timing (the interpreter runs them one after another, which hides it)"
        f"{'. ' + hint if hint else ''}"
    )


def diagnose(
    run: GuardedRun,
    output: str,
    want: torch.Tensor,
    *,
    tol: float = 1e-5,
    mistakes: Sequence[Tuple[str, torch.Tensor]] = (),
    out_of_bounds_hint: str = "",
    nothing_written: str = "the kernel stores nothing: compute the values and tl.store them",
    untouched: Optional[torch.Tensor] = None,
    undefined_hint: str = "",
    also_written: Sequence[str] = (),
    race_hint: str = "",
) -> Optional[str]:
    """What is wrong with one guarded launch, or None when it is right: `grade`'s diagnosis, unprinted."""
    got = run.tensors[output]
    problem = run.problem()
    if problem is not None and run.out_of_bounds and out_of_bounds_hint:
        problem += f". {out_of_bounds_hint}"
    if problem is None and not _close(got, want, tol):
        problem = undefined_lanes_problem(run, output, want, undefined_hint, tol)
    if problem is None and not _close(got, want, tol):
        before = untouched if untouched is not None else torch.full_like(got, float("nan"))
        if torch.equal(
            torch.nan_to_num(got.cpu().double(), nan=-1.5e300), torch.nan_to_num(before.cpu().double(), nan=-1.5e300)
        ):
            elsewhere = sorted({a.tensor for a in run.accesses if a.kind != "load" and a.tensor != output})
            problem = (
                f"nothing was stored into {output}; the kernel stored into {', '.join(elsewhere)} instead: "
                "check which pointer each tl.store writes to"
                if elsewhere
                else nothing_written
            )
        else:
            problem = next((why for why, wrong in mistakes if _close(got, wrong, tol)), None) or _difference(
                got, want, tol
            )
    if problem is None:
        problem = stored_by_two_programs(run, race_hint) or stray_stores(run, (output, *also_written))
    return problem


def at_other_sizes(problem: Optional[str], first: str, second: str, hint: str) -> Optional[str]:
    """The message for a kernel right at the first sizes (`first`) and wrong at the second (`second`, where
    it gets `problem`), or None when it is right there too."""
    if problem is None:
        return None
    return f"right with {first}, but not with {second}: {hint}. There: {problem}"


def grade(
    exercise: str,
    run: GuardedRun,
    output: str,
    want: torch.Tensor,
    *,
    tol: float = 1e-5,
    mistakes: Sequence[Tuple[str, torch.Tensor]] = (),
    out_of_bounds_hint: str = "",
    nothing_written: str = "the kernel stores nothing: compute the values and tl.store them",
    untouched: Optional[torch.Tensor] = None,
    undefined_hint: str = "",
    also_written: Sequence[str] = (),
    race_hint: str = "",
    then: Optional[Tuple[str, Callable[[], Optional[str]]]] = None,
    strict: bool = False,
) -> Verdict:
    """Grade one guarded launch: print and return the verdict, or raise "FAIL ..." if `strict`.

    run: the launch; output: the parameter name of the tensor to grade; want: the right result (same
    shape). In order: an error the kernel raised; out-of-bounds accesses (with `out_of_bounds_hint`, what
    usually causes them); a right result (PASS, within relative Frobenius error `tol`, exact for integer
    results); values computed from the undefined masked lanes of a load without `other=`
    (`undefined_hint`: what `other` must be); the output left as given (`untouched`, default all NaN:
    `nothing_written`); a result equal to one of `mistakes` ((explanation, what that mistake computes)
    pairs); else what differs, and where; then elements stored by two programs (a race on a GPU; `race_hint`:
    what each program must store instead), and a store into any tensor but `output` and `also_written` (an
    input, to be read only). then: (what it checked, for the PASS line; a further check run
    only when this launch is right, returning its problem or None), such as the same kernel at other sizes.
    """
    check_bool("strict", strict)
    got = run.tensors[output]
    problem = diagnose(
        run,
        output,
        want,
        tol=tol,
        mistakes=mistakes,
        out_of_bounds_hint=out_of_bounds_hint,
        nothing_written=nothing_written,
        untouched=untouched,
        undefined_hint=undefined_hint,
        also_written=also_written,
        race_hint=race_hint,
    )
    if problem is None and then is not None:
        problem = then[1]()
    if problem is None:
        kept = ~torch.isnan(want) if want.is_floating_point() else None  # NaN where the kernel must not write
        error = relative_error(got[kept], want[kept]) if kept is not None and not kept.all() else None
        if error is None and got.is_floating_point():
            error = relative_error(got, want)
        detail = "exact" if not got.is_floating_point() else f"relative error {error:.1e} < {tol:.0e}"
        also = f", {then[0]}" if then is not None else ""
        verdict = Verdict(exercise, "PASS", f"{detail}, no access out of bounds{also}")
    elif strict:
        raise AssertionError(f"FAIL {exercise}: {problem}")
    else:
        verdict = Verdict(exercise, "NOT YET", problem)
    print(verdict)
    return verdict
