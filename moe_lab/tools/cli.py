"""The `moe-lab` command: `demo` (the main job), `info`, `doctor`, `bench` and `tune` (GPU only).

moe-lab demo [--model NAME ...] [--tokens T ...] [--dtype bf16|fp16|fp32|fp8] [--use-tma auto|on|off]
moe-lab info      versions, device, TMA support
moe-lab doctor    the same and more (notebook extras, front end, tuned table), and what to fix
moe-lab --version, moe-lab COMMAND --help (every option with its default)
Names (--model, --dtype, --use-tma) are taken in any case.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys

import torch

from .. import __version__
from ..capability import fp8_support, tma_support
from ..presets import DEFAULT_FP8_BLOCK, EXPERT_KIND_PRESETS, MAIN_MODELS, PRESETS, SWEEP_TOKENS, get_preset
from ..runtime import default_device, environment_problem, interpreter_active

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Relative Frobenius error allowed against the float32 reference.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 2e-3}
# --dtype fp8: float8_e4m3fn weights with one float32 scale per block (MoEPreset.quantize_fp8, from the bf16
# weights), bf16 hidden states quantized per token per block_k channels inside the layer. The check is the
# kernels' error: against the float32 reference on the same quantized operands.
FP8 = "fp8"
FP8_TOLERANCE = 1e-2
CPU_SCALE = 64  # H and I are divided by this under the interpreter; E and k stay real
# Under the interpreter about 4 s per 500 routed slots (T*top_k) at the CPU scale: past this, ask first.
CPU_MAX_SLOTS = 4096
# FP8 is slower there, about 20 s per 500 slots: the activation quantization runs one program per padded row.
CPU_MAX_SLOTS_FP8 = 1024
DEFAULT_MODELS = MAIN_MODELS
USE_TMA_CHOICES = ("auto", "off", "on")  # the keys of plan.USE_TMA_WORDS (a test checks; plan imports the kernels)
GPU_TOKENS = (1, 64, 4096)
CPU_TOKENS = (1, 16, 64)
CPU_TOKENS_FP8 = (1, 4)  # in the bf16 demo's time on a CPU (about 15 s for the three default models)


def int_at_least_one(text: str) -> int:
    """An argparse type: an int >= 1 (argparse's error then names the option). Also the scripts' in examples/
    and benchmarks/."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _interpreter_setting() -> str:
    """TRITON_INTERPRET as it is set, for messages: "TRITON_INTERPRET='0'" or "TRITON_INTERPRET unset"."""
    value = os.environ.get("TRITON_INTERPRET")
    return "TRITON_INTERPRET unset" if value is None else f"TRITON_INTERPRET={value!r}"


def _refuse(command: str, message: str) -> int:
    """Say in one line why `moe-lab <command>` will not run; the exit status of a refusal (2, as argparse's)."""
    print(f"moe-lab {command}: {message}", file=sys.stderr)
    return 2


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    where = (
        "Triton interpreter"
        if interpreter_active()
        else "no GPU and interpreter off: kernels cannot run (moe-lab doctor)"
    )
    return f"CPU ({platform.processor() or platform.machine()}), {where}"


def cmd_info(_args) -> int:
    import triton

    from ..tuned import table_for_device

    device = default_device()
    support = tma_support(device)
    print(f"moe-lab {__version__}")
    print(f"python  {platform.python_version()}")
    print(f"torch   {torch.__version__}")
    print(f"triton  {triton.__version__}")
    import numpy

    print(f"numpy   {numpy.__version__}")
    print(f"device  {_device_name(device)}")
    print(f"interpreter (TRITON_INTERPRET): {'on' if interpreter_active() else 'off'}")
    print(f"TMA path: {'available' if support.available else 'not available'}: {support.reason}")
    print(f"tuned table: {table_for_device(device).reason}")
    return 0


def cmd_doctor(_args) -> int:
    from .doctor import main as doctor_main

    return doctor_main()


def _fp8_refused(command: str, device) -> bool:
    """Print why FP8 kernels cannot run on `device` and return True; False when they can."""
    support = fp8_support(device)
    if not support:
        print(
            f"{command} --dtype fp8 refused: FP8 (float8_e4m3fn) kernels cannot run here: {support.reason}. "
            "They need an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper) or Triton's interpreter "
            "(TRITON_INTERPRET=1, CPU).",
            file=sys.stderr,
        )
        return True
    return False


def cmd_demo(args) -> int:
    import triton

    from ..layer import fused_moe
    from ..plan import USE_TMA_WORDS
    from ..reference import fused_moe_reference, relative_error

    device = default_device()
    on_gpu = device.type == "cuda"
    fp8 = args.dtype == FP8
    if fp8 and _fp8_refused("moe-lab demo", device):
        return 2
    dtype = torch.bfloat16 if fp8 else DTYPES[args.dtype]  # of the hidden states (and of the weights but FP8)
    tolerance = FP8_TOLERANCE if fp8 else TOLERANCE[dtype]
    tokens = args.tokens or (GPU_TOKENS if on_gpu else CPU_TOKENS_FP8 if fp8 else CPU_TOKENS)
    scale = args.scale if args.scale is not None else (1 if on_gpu else CPU_SCALE)
    use_tma = USE_TMA_WORDS[args.use_tma]
    models = [get_preset(name) for name in args.model or DEFAULT_MODELS]
    if not on_gpu and not interpreter_active():
        return _refuse(
            "demo",
            f"no GPU and Triton's interpreter is off ({_interpreter_setting()}): the kernels cannot run here. "
            "Unset TRITON_INTERPRET (moe-lab turns the interpreter on without a GPU), or see moe-lab doctor.",
        )
    support = tma_support(device)
    if use_tma is True and not support.available:  # said before any work, not as the first launch's traceback
        return _refuse(
            "demo", f"--use-tma on, but TMA cannot be used here: {support.reason} (use --use-tma auto or off)"
        )
    if not on_gpu and not args.force:
        slots = max(tokens) * max(p.top_k for p in models)
        limit = CPU_MAX_SLOTS_FP8 if fp8 else CPU_MAX_SLOTS
        if slots > limit:
            return _refuse(
                "demo",
                f"T = {max(tokens)} routes {slots} token slots; under Triton's interpreter (no GPU) "
                f"that takes minutes per model (about {20 if fp8 else 4} s per 500 slots"
                f"{' in FP8' if fp8 else ''}). Pass --force to run it anyway, or use token counts up to "
                f"{limit // max(p.top_k for p in models)}.",
            )
        if scale < CPU_SCALE // 2:  # the work grows as H * I: (CPU_SCALE / scale)^2 times the default's
            return _refuse(
                "demo",
                f"--scale {scale} gives each layer about {round((CPU_SCALE / scale) ** 2)} times the "
                f"work of the CPU default (--scale {CPU_SCALE}): under Triton's interpreter (no GPU) minutes to hours "
                f"per model. Pass --force to run it anyway, or use --scale {CPU_SCALE // 2} or more.",
            )
    print(f"moe-lab demo on {_device_name(device)}; torch {torch.__version__}, triton {triton.__version__}")
    if not on_gpu:
        print(
            f"No GPU: kernels run under Triton's interpreter, H and I divided by {scale} "
            "(E and top_k are the real model's). Timings are not taken."
        )
    if fp8:
        blocks = sorted({tuple(p.weight_block_size or DEFAULT_FP8_BLOCK) for p in models})
        shipped = [p.name for p in models if p.quantization == FP8]
        print(
            f"FP8: float8_e4m3fn weights with one float32 scale per {' or '.join(str(list(b)) for b in blocks)} "
            "block, quantized from the bf16 weights (moe_lab.quantize_weights_fp8)"
            + (f"; the checkpoint of {', '.join(shipped)} ships its experts in this format" if shipped else "")
            + f". The layer quantizes the bf16 hidden states per token per {blocks[0][1]} channels."
        )
    for preset in models:
        rounded = [
            f"{what} {size}/{scale} -> {new}"
            for what, size, new in (
                ("H", preset.hidden_size, preset.scaled(scale).hidden_size),
                ("I", preset.intermediate_size, preset.scaled(scale).intermediate_size),
            )
            if size != new * scale
        ]
        if scale != 1 and rounded:
            given = f"--scale {scale}" if args.scale is not None else f"the CPU's scale ({scale})"
            print(f"note: {preset.name}: {given} rounds {' and '.join(rounded)} (a multiple of 16, at least 16)")
    header = (
        f"{'model':<18} {'T':>6} {'E':>4} {'k':>2} {'H':>5} {'I':>6} {'up path':<11} {'down path':<11} "
        f"{'rel err':>9}  {'result':<6}"
        + (f"  {'quant err':>9}" if fp8 else "")
        + ("  graph ms  TFLOP/s" if on_gpu else "")
    )
    print(header)
    print("-" * len(header))
    failures = compared = 0
    reasons = {}  # model -> why each GEMM took its load path (at its largest T)
    for preset in models:
        if scale != 1:
            preset = preset.scaled(scale)
        for num_tokens in tokens:
            hidden, w1, w2, (topk_weights, topk_ids) = preset.build(
                num_tokens, dtype=dtype, device=device, seed=num_tokens
            )
            kind = preset.expert_kind(dtype=dtype, device=device, seed=num_tokens)  # gpt-oss: activation, biases
            scales, unquantized = {}, None
            if fp8:  # kernels: against FP8's own operands; what FP8 costs: against the bf16 weights
                unquantized = (w1, w2)
                w1, w2, scales = preset.quantize_fp8(w1, w2)
            scales.update(kind)
            try:
                out, info = fused_moe(
                    hidden, w1, w2, topk_weights, topk_ids, use_tma=use_tma, return_info=True, **scales
                )
            except ValueError as exc:
                if use_tma is not True or "use_tma=True" not in str(exc):
                    raise
                # --use-tma on and a tensor TMA cannot read (the device's support was checked above)
                return _refuse("demo", f"--use-tma on: {exc} (use --use-tma auto or off)")
            # T = 0 launches nothing: nothing to compare, said as "-" (not an error of 0)
            ref = fused_moe_reference(hidden, w1, w2, topk_weights, topk_ids, **scales) if num_tokens else None
            err = relative_error(out, ref) if num_tokens else None
            ok = err is None or err < tolerance  # NaN fails
            failures += not ok
            compared += err is not None
            if info.up_path:  # the device's TMA note is printed once, below, not in every reason
                reasons[preset.name] = (info.up_path.choice, info.down_path.choice)
            up = info.up_path.name if info.up_path else "-"
            down = info.down_path.name if info.down_path else "-"
            line = (
                f"{preset.name:<18} {num_tokens:>6} {preset.num_experts:>4} {preset.top_k:>2} "
                f"{preset.hidden_size:>5} {preset.intermediate_size:>6} {up:<11} {down:<11} "
                f"{'-' if err is None else format(err, '.2e'):>9}  {'-' if err is None else 'ok' if ok else 'FAIL':<6}"
            )
            if fp8:
                quant_err = (
                    relative_error(out, fused_moe_reference(hidden, *unquantized, topk_weights, topk_ids, **kind))
                    if num_tokens
                    else None
                )
                line += f"  {'-' if quant_err is None else format(quant_err, '.2e'):>9}"
            if on_gpu and num_tokens:
                from .timing import graph_ms  # median of CUDA-graph replays of the whole layer, L2 flushed

                ms = graph_ms(lambda: fused_moe(hidden, w1, w2, topk_weights, topk_ids, use_tma=use_tma, **scales))
                line += f"  {ms:>8.3f}  {preset.flops(num_tokens) / ms / 1e9:>7.1f}"
            print(line, flush=True)
            del hidden, w1, w2, out, ref, unquantized
    if reasons:
        print(f"\nWhy these load paths. TMA on this device: {support.reason}.")
        for model, (up_reason, down_reason) in reasons.items():
            print(f"  {model}\n    up:   {up_reason}\n    down: {down_reason}")
    if on_gpu:
        print("\ngraph ms: median time of the whole layer replayed as a CUDA graph, L2 flushed before each run.")
    if fp8:
        print(
            "\nrel err: the FP8 layer against the float32 PyTorch reference on the same FP8 operands (dequantized "
            "weights, activations quantized as the layer does): the kernels' own error, checked.\n"
            "quant err: the FP8 layer against the float32 PyTorch reference on the unquantized bf16 weights: "
            "what FP8 itself costs, reported, not checked."
        )
    if not compared:
        print("\nnothing was compared: T = 0 launches no kernel, so there is no result to check.")
        return 0
    print(
        f"\n{'all results match' if not failures else f'{failures} result(s) FAILED'} the float32 PyTorch "
        f"reference{' on the same FP8 operands' if fp8 else ''} (relative Frobenius error < {tolerance:.0e})"
        + ("; T = 0 launches nothing: its rows show -." if compared < len(models) * len(tokens) else ".")
    )
    return 1 if failures else 0


def _refused(what: str) -> bool:
    """Print why `what` cannot time here (interpreter or no GPU) and return True; False when it can."""
    from ..runtime import require_gpu_timing

    try:
        require_gpu_timing(what)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return True
    return False


def cmd_bench(args) -> int:
    from . import bench

    if _refused("moe-lab bench"):
        return 2
    if args.dtype == FP8 and _fp8_refused("moe-lab bench", default_device()):
        return 2
    dtype = torch.float8_e4m3fn if args.dtype == FP8 else DTYPES[args.dtype]
    try:  # before the GPU work: a folder it cannot write would fail only after the first point
        bench.check_out_dir(args.out, dtype, name="--out")
    except ValueError as exc:
        return _refuse("bench", str(exc))
    bench.run(
        args.model or MAIN_MODELS,
        args.tokens or SWEEP_TOKENS,
        dtype=dtype,
        out_dir=args.out,
        peers=not args.no_peers,
    )
    return 0


def cmd_tune(args) -> int:
    import triton

    from . import tune

    if _refused("moe-lab tune"):
        return 2
    if args.dtype == FP8 and _fp8_refused("moe-lab tune", default_device()):
        return 2
    device, version = torch.cuda.get_device_name(), triton.__version__
    path = args.out if args.out is not None else tune.config_path(device, version)
    try:  # before the compiling and timing: a file it cannot write would fail only after the first point
        tune.open_table(path, device, version, name="--out" if args.out is not None else "the table (no --out)")
    except ValueError as exc:
        return _refuse("tune", str(exc))
    path = tune.run(
        args.model or sorted(PRESETS),
        args.tokens or SWEEP_TOKENS,
        dtype=torch.float8_e4m3fn if args.dtype == FP8 else DTYPES[args.dtype],
        path=path,
    )
    print(f"wrote {path}")
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default: argparse's "(default: ...)" where the help does not say it
    already (defaults that depend on the machine are said in words); flags and help as they are."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.nargs == 0:
            return text
        return super()._get_help_string(action)


class _MainHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The top level's help: the module docstring's lines as they are, and the defaults."""


def _words(values) -> str:
    return " ".join(map(str, values))


def _add_shape_arguments(
    parser: argparse.ArgumentParser, models, tokens, dtypes=tuple(DTYPES), dtype_help=None
) -> None:
    parser.add_argument(
        "--model",
        nargs="+",
        type=str.lower,
        choices=sorted(PRESETS),
        metavar="NAME",
        help=f"model presets, any case (default: {_words(models)}); choices: {', '.join(PRESETS)}",
    )
    parser.add_argument("--tokens", nargs="+", type=int, metavar="T", help=f"token counts (default: {_words(tokens)})")
    parser.add_argument("--dtype", type=str.lower, choices=sorted(dtypes), default="bf16", help=dtype_help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moe-lab", description=__doc__, formatter_class=_MainHelpFormatter)
    parser.add_argument("--version", action="version", version=f"moe-lab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add = functools.partial(sub.add_parser, formatter_class=HelpFormatter)
    demo = add(
        "demo",
        help="run fused_moe on real model shapes and check it against PyTorch",
        description="Run the fused MoE layer on real models' shapes with random weights and routing, compare "
        "each result with the float32 PyTorch reference (relative Frobenius error), and say which "
        "load path (pointer or TMA) each GEMM took and why. On a GPU it also times the layer.",
    )
    demo_models = [*PRESETS, *EXPERT_KIND_PRESETS]
    demo.add_argument(
        "--model",
        nargs="+",
        type=str.lower,
        choices=sorted(demo_models),
        metavar="NAME",
        help=f"model presets, any case (default: {' '.join(DEFAULT_MODELS)}); choices: {', '.join(demo_models)} "
        "(gpt-oss: clamped SwiGLU on interleaved rows, with biases)",
    )
    demo.add_argument(
        "--tokens",
        nargs="+",
        type=int,
        metavar="T",
        help=f"token counts (default: {' '.join(map(str, GPU_TOKENS))} on a GPU, "
        f"{' '.join(map(str, CPU_TOKENS))} on a CPU, {' '.join(map(str, CPU_TOKENS_FP8))} with --dtype fp8 "
        "on a CPU)",
    )
    demo.add_argument(
        "--dtype",
        type=str.lower,
        choices=sorted([*DTYPES, FP8]),
        default="bf16",
        help="element type of hidden states and weights (default: bf16); fp8: float8_e4m3fn weights "
        "with one float32 scale per [128, 128] block (DeepSeek-V3's format), quantized from "
        "the bf16 weights, and bf16 hidden states that the layer quantizes per token per 128 "
        "channels; it also reports the error against the unquantized weights (quant err). "
        "Allowed error against the float32 reference: "
        + ", ".join(f"{k} {TOLERANCE[v]:.0e}" for k, v in DTYPES.items())
        + f", fp8 {FP8_TOLERANCE:.0e} (the reference on the same FP8 operands)",
    )
    demo.add_argument(
        "--use-tma",
        type=str.lower,
        choices=USE_TMA_CHOICES,
        default="auto",
        help="auto: TMA where the device and tensors allow it, pointer loads elsewhere (default); "
        "on: TMA, or a one-line refusal saying why not (the device, or the tensor and rule); off: pointer "
        "loads only; any case",
    )
    demo.add_argument(
        "--scale",
        type=int,
        help=f"divide H and I by this, rounding up to a multiple of 16 (default: 1 on a GPU, {CPU_SCALE} on a CPU)",
    )
    demo.add_argument(
        "--force",
        action="store_true",
        help=f"on a CPU, run token counts that route more than {CPU_MAX_SLOTS} slots (minutes)",
    )
    demo.set_defaults(func=cmd_demo, command_parser=demo)
    bench = add(
        "bench",
        help="GPU benchmark against peers (refuses under the interpreter)",
        description="Time moe-lab's up and down GEMMs (pointer and TMA paths) and the whole layer on real models' "
        "shapes against torch._grouped_mm and a per-expert PyTorch loop, as medians of CUDA-graph "
        "replays with L2 flushed, checking each result against the float32 reference. Prints a table "
        "(ms, TFLOP/s, TB/s, % of the roofline measured in the same run) and writes it as JSON and "
        "CSV to the --out folder (made if missing; one it cannot write is refused before any timing). "
        "Needs a CUDA GPU: refuses under Triton's interpreter. --dtype fp8 "
        "times moe-lab's FP8 layer against its bf16 layer instead (no peers), with the speedups, "
        "into an fp8/ folder under --out.",
    )
    _add_shape_arguments(
        bench,
        MAIN_MODELS,
        SWEEP_TOKENS,
        (*DTYPES, FP8),
        "element type (default: bf16); fp8: moe-lab's FP8 layer (float8_e4m3fn weights, "
        "[128, 128] block scales) against moe-lab's bf16 layer in the same run, with speedups",
    )
    bench.add_argument(
        "--out",
        default="benchmarks/results",
        help="folder for JSON/CSV results (bf16; other dtypes in a folder of their own in it, "
        "e.g. benchmarks/results/fp8/)",
    )
    bench.add_argument("--no-peers", action="store_true", help="time moe-lab only")
    bench.set_defaults(func=cmd_bench, command_parser=bench)
    tune = add(
        "tune",
        help="search launch configs per shape on this GPU and save them as JSON",
        description="For each model preset and token count, time candidate launch configs of the up and the down "
        "GEMM on this GPU (CUDA-graph medians, L2 flushed) and save the fastest pair per shape and "
        "token bucket into the JSON table that fused_moe reads for this device and Triton version "
        "(merged into an existing one). Defaults: all five presets, T = "
        + _words(SWEEP_TOKENS)
        + ", bf16. Needs a CUDA GPU: refuses under Triton's "
        "interpreter. --dtype fp8 tunes FP8 layers with [128, 128] block scales. docs/tuning.md "
        "says how, and which table serves at run time.",
    )
    _add_shape_arguments(
        tune,
        sorted(PRESETS),
        SWEEP_TOKENS,
        (*DTYPES, FP8),
        "element type (default: bf16); fp8: float8_e4m3fn weights with "
        "[128, 128] block scales, tuned under keys of their own",
    )
    tune.add_argument(
        "--out",
        help="JSON file, a bare name in the current folder (default: the package's table for this device and "
        "Triton); an existing table is merged into, unless it is another device's or Triton version's: refused",
    )
    tune.set_defaults(func=cmd_tune, command_parser=tune)
    info = add(
        "info",
        help="versions, device, interpreter, TMA support",
        description="Print, in a few lines, the versions of moe-lab, Python, torch, Triton and numpy, the device "
        "kernels run on (a GPU, or Triton's interpreter on the CPU), whether the TMA load path is available "
        "and why, and the tuned launch table in use.",
    )
    info.set_defaults(func=cmd_info, command_parser=info)
    doctor = add(
        "doctor",
        help="check this environment for moe-lab and the notebooks; say what to fix",
        description="Check this environment for moe-lab and its notebooks: what `info` prints, and the notebook "
        "extras, the widget front end and Triton's cache folder; then a PROBLEM line for each thing "
        "that will fail, and a NOTE line for each that works but is worth knowing, each with what to do. "
        "It runs where moe-lab's kernels cannot (Triton missing, Triton 3.6's interpreter under numpy "
        ">= 2.4) and says why. Exit status 1 where a problem was found, else 0 (notes, such as the "
        "notebook extras missing from a library-only install, do not count).",
    )
    doctor.set_defaults(func=cmd_doctor, command_parser=doctor)
    return parser


def main(argv=None) -> int:
    """`moe-lab`: the exit status of the command (0, 1 where a check failed or a problem was found, 2 where
    it refused). Output cut short (`moe-lab info | head -1`) ends quietly, with status 1."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # what is still buffered: written here, where a closed pipe can be caught
        return status
    except BrokenPipeError:
        # Point standard output at /dev/null, so that Python's flush at exit raises nothing more (the Python
        # docs' "Note on SIGPIPE"); a captured stdout has no file descriptor and is not flushed at exit.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1


def _main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said with the command's own usage line, not the top level's
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:  # a bare `moe-lab`: what it can do
        parser.print_help()
        return 0
    least = 1 if args.func in (cmd_bench, cmd_tune) else 0  # T = 0: the demo shows it, but nothing to time
    if getattr(args, "tokens", None) and min(args.tokens) < least:
        why = " (T = 0 is an empty problem: nothing to time)" if least else ""
        return _refuse(args.command, f"--tokens must be >= {least}{why}, got {min(args.tokens)}")
    if getattr(args, "scale", None) is not None and args.scale < 1:
        return _refuse(args.command, f"--scale must be >= 1, got {args.scale}")
    if args.func is not cmd_doctor:  # doctor reports these among its findings
        problem = environment_problem()
        if problem:  # Triton missing, or Triton 3.6's interpreter under numpy >= 2.4: said, no traceback
            return _refuse(args.command, f"{problem} (`moe-lab doctor` checks the rest)")
        try:  # a bad MOE_LAB_TMA or MOE_LAB_GLUON: said here, not as a traceback from the first launch
            from ..plan import gluon_setting

            tma_support()
            gluon_setting()
        except ValueError as exc:
            print(f"moe-lab: {exc}", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
