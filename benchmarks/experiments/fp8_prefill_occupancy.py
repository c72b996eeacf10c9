"""Experiment: can more programs per SM, or longer K steps, speed up the FP8 prefill GEMMs?

Compiled for sm_90 (Triton 3.6), a block-scaled K step is: the step's wgmmas, `wgmma.wait_group 0`, then
the scaling FMAs; a second dot in the same step (BLOCK_SIZE_K = 256 over 128-channel blocks) is only
issued after the first has drained (Triton waits at once for a product that is not a dot's loop-carried
accumulator, whatever the source order). So one program's MMAs never overlap its own scaling, and what
keeps the tensor cores busy is other programs on the SM. The shipped tiles (64 x 128 x 128, 4 warps) take
158 to 176 registers per thread: two programs per SM for the up GEMM. Here each GEMM of the shipped FP8
configs at T = 4096 and 16384 runs as shipped and with:
  - maxnreg 168 (three programs per SM fit 65536 registers) at the shipped stages and at 3 stages;
  - maxnreg 128 with 2 stages (four programs);
  - BLOCK_SIZE_K = 256 (two dots per step: half the loop iterations and barriers) at 2 stages.
CUDA-graph medians with L2 flushed, the least of 3 rounds; registers and spills as compiled; outputs
(the up GEMM's rows in use, the down GEMM's) compared bitwise with the shipped config's. (The committed
2026-12-02 run compared whole buffers, unwritten rows included: its False entries mean nothing.)
Usage: python benchmarks/experiments/fp8_prefill_occupancy.py OUT.json
"""
import os
import sys
from dataclasses import replace

import torch

import moe_lab.grouped_matmul  # noqa: F401 (the module; `moe_lab.grouped_matmul` the attribute is the function)
from moe_lab import moe_align
from moe_lab.tools.bench import _layer_gemms
from moe_lab.configs import MoEConfig
from moe_lab.quantize import FP8_DTYPE
from moe_lab.tools.timing import graph_ms
from moe_lab.tuned import choose_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_decode_anatomy import point_inputs, write_results  # noqa: E402

gm = sys.modules["moe_lab.grouped_matmul"]
MODELS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")
VARIANTS = {  # name: (config changes, maxnreg or None)
    "shipped": ({}, None),
    "maxnreg168": ({}, 168),
    "maxnreg168 s3": ({"num_stages": 3}, 168),
    "maxnreg128 s2": ({"num_stages": 2}, 128),
    "k256 s2": ({"BLOCK_SIZE_K": 256, "num_stages": 2}, None),
}

_pdl_launch = gm.pdl_launch
_maxnreg = [None]


def _launch_options(device):
    """The launcher's extra launch options, with this experiment's register limit."""
    options = dict(_pdl_launch(device))
    if _maxnreg[0] is not None:
        options["maxnreg"] = _maxnreg[0]
    return options


gm.pdl_launch = _launch_options


def _compiled_registers():
    """{(n_regs, n_spills)} of the grouped matmul kernels compiled so far (best effort across Tritons)."""
    found = set()
    try:
        for kernel in (gm.grouped_matmul_kernel, gm.grouped_matmul_persistent_kernel):
            for cache in getattr(kernel, "device_caches", {}).values():
                for compiled in cache[0].values():
                    found.add((getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)))
    except (AttributeError, IndexError, KeyError, TypeError):  # another Triton's cache layout
        pass
    return found


def point(model, num_tokens):
    p, hs, w1, w2, tw, ti, w1_q, w2_q, scales = point_inputs(model, num_tokens)
    del w1, w2
    shipped = choose_config(num_tokens, p.num_experts, p.top_k, p.hidden_size, p.intermediate_size, FP8_DTYPE).config
    routing = moe_align(ti, p.num_experts, shipped.block_size_m)
    row = dict(model=model, T=num_tokens, shipped=dict(up=shipped.up.to_dict(), down=shipped.down.to_dict()))
    reference = None
    for name, (changes, maxnreg) in VARIANTS.items():
        cfg = MoEConfig(up=replace(shipped.up, **changes), down=replace(shipped.down, **changes))
        _maxnreg[0] = maxnreg
        before = _compiled_registers()
        try:
            up, down = _layer_gemms(hs, w1_q, w2_q, tw, routing, cfg, scales=scales)
            outs = []
            for gemm, fn in (("up", up), ("down", down)):
                row[f"{name} {gemm}"] = graph_ms(fn, rounds=3)
            up()
            down()
            # what the callables write: the up GEMM's rows in use (rows past them are never written) and the
            # down GEMM's per-slot rows; the variants share BLOCK_SIZE_M, so the row layouts match
            cells = dict(zip(up.__code__.co_freevars + down.__code__.co_freevars,
                             [c.cell_contents for c in up.__closure__ + down.__closure__]))
            outs = [cells["gate_up"][:int(routing.num_tokens_post_padded)], cells["out_k"]]
            if reference is None:
                reference = [o.clone() for o in outs]
            row[f"{name} bitwise"] = all(torch.equal(a, b) for a, b in zip(outs, reference)) and len(outs) == len(reference)
            row[f"{name} regs"] = sorted(str(r) for r in _compiled_registers() - before)
        except Exception as exc:
            row[f"{name} error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            _maxnreg[0] = None
    return row


def main():
    rows = []
    for model in MODELS:
        for t in (4096, 16384):
            r = point(model, t)
            rows.append(r)
            print(f"{model:<15} T={t:<5} ms (x shipped)", flush=True)
            for name in VARIANTS:
                if f"{name} error" in r:
                    print(f"    {name:<15} {r[f'{name} error']}", flush=True)
                    continue
                print(f"    {name:<15} up {r[f'{name} up']:.3f} ({r['shipped up'] / r[f'{name} up']:.2f}x)  down "
                      f"{r[f'{name} down']:.3f} ({r['shipped down'] / r[f'{name} down']:.2f}x)  bitwise "
                      f"{r[f'{name} bitwise']}  regs/spills {r[f'{name} regs']}", flush=True)
    write_results(sys.argv[1], rows)


if __name__ == "__main__":
    main()
