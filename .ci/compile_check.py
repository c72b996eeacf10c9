#!/usr/bin/env python3
"""Compile-only check: every kernel variant moe_lab and the notebooks launch, compiled for real GPU
targets on a machine without a GPU. A compile error fails it (exit status 1).

    .venv/bin/python .ci/compile_check.py                   # sm_80, sm_90 and sm_100, this venv's Triton
    .venv-triton-3.9.0/bin/python .ci/compile_check.py --targets 90
    .venv/bin/python .ci/compile_check.py --list            # the variants and what launches them; no compile

What it checks, and how:
- Package kernels: moe_lab's own launchers (fused_moe, grouped_matmul, moe_align, silu_and_mul, ...) run
  on meta tensors at real model shapes (the list, and what was cut and why: .ci/package_variants.py), with
  Triton's driver replaced by a fake sm_80 (A100), sm_90 (H200) or sm_100 (B200) and each
  `kernel[grid](...)` turned into a compile without launch (moe_lab/tools/compile_only.py). So the config, the load
  paths (TMA from sm_90, pointers on sm_80), the shared-memory fit and Triton's specialization of every
  argument are those of a run on that GPU. Meta tensors have no contents, so the run also shows that the
  launch code never reads a buffer back to the host.
- Notebook kernels: the @triton.jit functions of notebooks/[0-9]*.py, taken from the scripts' source as
  they are, compiled with the arguments the notebooks launch them with, recorded by running each script
  under Triton's interpreter (.ci/notebook_kernels.py).
- A kernel needing more shared memory, tensor memory or threads than the GPU has fails as its launch
  would, unless the launcher handles that (grouped_matmul retries with fewer stages; those compile too).
- A launcher that raises on that GPU (e.g. a config that cannot fit its shared memory) is a failure too
  (--launch-errors warn: a warning).
Output: a line per target (Triton version, target, number of kernel variants, failures), a FAIL block per
failure (kernel, constexprs, argument types, which launches reach it, the compiler's error), WARN lines
for notebook kernels that could not be checked, and a timing line.

Speed: the package's launches are recorded first, without compiling (seconds). Then each distinct
specialization is compiled once, on all cores, slowest first, into Triton's on-disk cache
(TRITON_CACHE_DIR, default ~/.triton/cache), so a second run loads instead of compiling: the package's
while the notebooks are still being recorded, then the notebooks'. Notebook recordings are cached beside
it (MOE_LAB_COMPILE_CHECK_CACHE to move them), keyed by content and torch version but not by Triton's, so
the Tritons of `make compile-check` share them: the first records, the others only replay. Variants
differing only in constexprs that set integer constants of index arithmetic (TOP_K, GROUP_SIZE_M;
BLOCK_SIZE_M in two align kernels, see compile_only.EQUIVALENT_CONSTEXPRS) compile alike: one compiles
and stands for the rest (--all: all).

What it cannot catch: whatever happens after compiling: wrong results, out-of-bounds or misaligned
accesses (a descriptor offset breaking the 16-byte rule compiles fine and faults on an H200), races,
speed, a cubin the real driver refuses; and launches it does not make: shapes and configs beyond those
listed, tuned tables added at run time, notebook launches on a GPU with sizes other than the CPU run's.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TARGETS = (80, 90, 100)
OPTIONAL_TARGETS = {100}  # Blackwell: checked with the Tritons that compile for it, skipped (said so) otherwise


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--targets",
        type=int,
        nargs="+",
        default=list(DEFAULT_TARGETS),
        help="compute capabilities to compile for (default: 80 90 100). sm_100 is skipped, with a SKIP "
        "line, where this Triton cannot compile for it; sm_80 or sm_90 failing so is a failure",
    )
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1, help="compile processes (default: all cores)")
    p.add_argument("--only", choices=("package", "notebooks"), help="check only the package or only the notebooks")
    p.add_argument("--filter", default="", help="only package workloads whose label contains this text")
    p.add_argument("--notebooks", nargs="*", help="notebook scripts (default: notebooks/[0-9]*.py)")
    p.add_argument(
        "--launch-errors",
        choices=("fail", "warn"),
        default="fail",
        help="a launcher that raises on a fake GPU (not a compile error, but a crash a run on that GPU "
        "would meet): fail the check (default) or only warn",
    )
    p.add_argument("--all", action="store_true", help="compile every variant, also those an equivalent one stands for")
    p.add_argument("--list", action="store_true", help="list the variants and what launches them; compile nothing")
    p.add_argument("--verbose", "-v", action="store_true", help="a line per compiled variant, with its time")
    return p.parse_args(argv)


def run_all(co, session, targets, workloads, errors):
    """Run every workload on every target in `session`; collect (target, label, error) for those that raise."""
    for cc in targets:
        with co.fake_gpu(cc, session):
            for label, fn in workloads:
                error = co.run_workload(session, label, fn)
                if error:
                    errors.append((cc, label, error))


def main(argv=None) -> int:
    args = parse_args(argv)
    wall = time.perf_counter()
    # Triton 3.9 announces a default change on every compile; the check compiles with today's defaults.
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION is unset")
    sys.path.insert(0, HERE)
    os.environ["TRITON_INTERPRET"] = "0"  # before moe_lab defines its kernels: real JITFunctions
    import notebook_kernels as nbk
    import package_variants
    import triton

    from moe_lab.tools import compile_only as co

    co.patch_moe_lab()
    version = f"triton {triton.__version__}"
    unknown = [cc for cc in args.targets if cc not in co.DEVICES]
    if unknown:
        print(f"unknown targets {unknown}; known: {sorted(co.DEVICES)}", file=sys.stderr)
        return 2

    # Notebook launches are recorded by running the scripts under the interpreter in child processes
    # (cached by content); they run while this process records the package's launches and its variants compile.
    recording = nbk.start_recordings(
        [] if args.only == "package" else nbk.notebook_scripts(args.notebooks), jobs=args.jobs
    )

    # 1. Record: every launch, per target, bound and specialized by Triton but not compiled (seconds).
    t0 = time.perf_counter()
    session = co.Session(equivalent=not args.all)
    workloads = [] if args.only == "notebooks" else [w for w in package_variants.all_workloads() if args.filter in w[0]]
    errors: list = []
    run_all(co, session, args.targets, workloads, errors)
    record_s = time.perf_counter() - t0
    if args.list:
        notebook_runs = recording.wait()
        replays = nbk.replays(notebook_runs)
        run_all(co, session, args.targets, replays, errors)
        for v in session.order:
            rep = session.representatives[v.group]
            print(
                f"#{v.index} sm_{v.cc} {v.describe()}"
                + ("" if rep is v else f"  (stood for by #{rep.index})")
                + f"\n      launched by: {'; '.join(v.launched_by[:3])}"
                + (" ..." if len(v.launched_by) > 3 else "")
            )
        for cc, label, error in errors:
            print(f"FAIL {version} sm_{cc} {label}: {error}")
        print(f"{len(session.order)} variants, {len(session.representatives)} to compile")
        return 1 if errors else 0

    # 2. Compile one variant per group, in worker processes, slowest first: the package's variants while the
    # notebooks are still being recorded (no core idles while the last recordings finish), then the
    # notebooks' (replayed from the recordings). Each pool is forked before this process compiles anything
    # (the workers inherit the recorded launches); a probe per target runs first, so a target this Triton
    # cannot compile for is skipped (or failed) once, not per variant.
    t1 = time.perf_counter()
    unsupported, outcomes = {}, {}
    with _pool(args, list(session.representatives.values())) as pool:
        for cc, problem in zip(args.targets, pool.map(co.target_supported, args.targets)):
            if problem:
                unsupported[cc] = problem
        package = _compile_all(pool, unsupported)
        notebook_runs = recording.wait()
        notebooks_s = time.perf_counter() - wall
        _collect(args, package, outcomes)
    replays = nbk.replays(notebook_runs)
    run_all(co, session, args.targets, replays, errors)
    new = [v for g, v in session.representatives.items() if g not in outcomes]
    if new:
        with _pool(args, new) as pool:
            _collect(args, _compile_all(pool, unsupported), outcomes)
    compile_s = time.perf_counter() - t1

    # 3. Check: run everything again, acting on the outcomes: a kernel too big for the GPU raises
    # OutOfResources as its launch would, so the launcher's retries run (and their new variants compile here).
    t2 = time.perf_counter()
    check = co.Session(outcomes=dict(outcomes), compile_missing=True, equivalent=not args.all)
    errors = []
    run_all(co, check, [cc for cc in args.targets if cc not in unsupported], workloads + replays, errors)
    check_s = time.perf_counter() - t2

    failed = report(args, version, check, unsupported, errors)
    for line in nbk.report(notebook_runs):  # warnings: what could not be checked
        print(line)
    compiled_there = sum(1 for g in check.outcomes if g not in outcomes)
    print(
        f"{version}: {'FAILED' if failed else 'ok'}, {failed} failure(s); wall {time.perf_counter() - wall:.1f} s "
        f"(record {record_s:.1f} s, compile {compile_s:.1f} s on {args.jobs} processes with the notebooks' "
        f"recordings done after {notebooks_s:.1f} s, check {check_s:.1f} s"
        f"{f', {compiled_there} compiled there' if compiled_there else ''}); Triton cache {triton.knobs.cache.dir}"
    )
    return 1 if failed else 0


def report(args, version, check, unsupported, errors) -> int:
    """Print a line per target, then every failure: kernel, constexprs, signature, who launched it, and the
    compiler's error. Returns the number of failures."""
    failed = 0
    for cc in args.targets:
        if cc in unsupported:
            failed += cc not in OPTIONAL_TARGETS
            print(
                f"{version}  sm_{cc:<3}  {'SKIP' if cc in OPTIONAL_TARGETS else 'FAIL'}: this Triton does not "
                f"compile for sm_{cc}: {unsupported[cc]}"
            )
            continue
        variants = [v for v in check.order if v.cc == cc]
        groups = {v.group for v in variants}
        bad = [g for g in groups if check.outcomes.get(g, {}).get("error")]
        notebook = sum(
            1 for v in variants if v.launched_by and all(lbl.startswith("notebook ") for lbl in v.launched_by)
        )
        print(
            f"{version}  sm_{cc:<3}  {len(variants):4d} kernel variants ({len(groups)} compiled, "
            f"{len(variants) - len(groups)} stood for by an equivalent; package {len(variants) - notebook}, "
            f"notebooks {notebook}), {len(bad)} failed"
        )
        if args.verbose:
            kinds = collections.Counter(v.name for v in variants)
            print("          " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for group, outcome in check.outcomes.items():
        if not outcome.get("error") or group not in check.representatives:
            continue
        failed += 1
        v = check.representatives[group]
        launched = sorted({lbl for u in check.order if u.group == group for lbl in u.launched_by})
        print(f"FAIL {version} sm_{v.cc} {v.describe()}")
        print(f"     signature: {', '.join(f'{k}: {t}' for k, t in v.signature.items())}")
        print(
            f"     launched by: {'; '.join(launched[:4])}"
            + (f" and {len(launched) - 4} more" if len(launched) > 4 else "")
        )
        for line in outcome["error"].splitlines():
            print(f"     | {line}")
    by_error = collections.defaultdict(list)  # one block per distinct error, however many launches meet it
    for cc, label, error in errors:
        by_error[error].append((cc, label))
    for error, where in by_error.items():
        failed += args.launch_errors == "fail"
        targets = ", ".join(f"sm_{cc}" for cc in sorted({cc for cc, _ in where}))
        labels = list(dict.fromkeys(label for _, label in where))
        print(f"{'FAIL' if args.launch_errors == 'fail' else 'WARN'} {version} {targets} {labels[0]}: {error}")
        if len(labels) > 1:
            print(
                f"     also in {len(labels) - 1} more: {'; '.join(labels[1:4])}" + (" ..." if len(labels) > 4 else "")
            )
    return failed


_VARIANTS: list = []  # the variants to compile, inherited by the forked workers


def _pool(args, variants):
    """Worker processes forked now, holding `variants` (their indexes are what is sent to them)."""
    global _VARIANTS
    _VARIANTS = variants
    return multiprocessing.get_context("fork").Pool(max(1, args.jobs))


def _compile_all(pool, unsupported):
    """Start compiling every variant of the pool's list (slowest first) but those of unsupported targets;
    an iterator of (variant, outcome) as they finish."""
    todo = sorted((i for i, v in enumerate(_VARIANTS) if v.cc not in unsupported), key=lambda i: -_VARIANTS[i].cost())
    variants = _VARIANTS
    return ((variants[i], outcome) for i, outcome in pool.imap_unordered(_compile_one, todo))


def _collect(args, finished, outcomes):
    for variant, outcome in finished:
        outcomes[variant.group] = outcome
        if args.verbose:
            status = "ok" if not outcome["error"] else "FAILED"
            print(f"  {outcome['seconds']:6.1f} s  sm_{variant.cc} {variant.describe()}  {status}", flush=True)


def _compile_one(i):
    from moe_lab.tools import compile_only as co

    return i, co.compile_variant(_VARIANTS[i])


if __name__ == "__main__":
    sys.exit(main())
