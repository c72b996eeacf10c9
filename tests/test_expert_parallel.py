"""Expert parallelism on the CPU: 2 and 4 processes over gloo (a file:// rendezvous, no network), one spawn
per world size running every case, each rank's tokens checked against one process's `fused_moe` of the
whole batch: bitwise in all_to_all mode (the interpreter runs one config at every shape, so the received
rows sum K in the same steps), to rounding in all_reduce mode."""

import datetime
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_lab import fused_moe, quantize_weights_fp8, relative_error
from moe_lab.expert_parallel import MODES, expert_map_for_rank, expert_range, fused_moe_expert_parallel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (tokens per rank for 4 ranks (2 ranks take the first two), E, k, dtype, experts the router may pick)
CASES = {
    "bf16, uneven tokens, an idle rank, E=6": ((3, 0, 5, 1), 6, 2, torch.bfloat16, None),
    "experts no token chose (only ranks 0 and 1 receive)": ((4, 2, 3, 0), 6, 2, torch.bfloat16, (0, 1, 2)),
    "float32, top_k=1, E=5": ((2, 5, 0, 3), 5, 1, torch.float32, None),
    "top_k=E=5": ((1, 3, 2, 2), 5, 5, torch.bfloat16, None),
    "fp8 weights, block scales": ((3, 1, 4, 0), 6, 2, torch.bfloat16, None),
}
HIDDEN, INTER = 64, 64


def _case(name, world):
    """The whole batch (every rank's tokens, rank after rank) and this case's layer, the same on every rank."""
    counts, num_experts, top_k, dtype, allowed = CASES[name]
    counts = counts[:world]
    gen = torch.Generator().manual_seed(len(name))
    total = sum(counts)
    hs = torch.randn(total, HIDDEN, generator=gen).to(dtype)
    w1 = (torch.randn(num_experts, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5).to(dtype)
    w2 = (torch.randn(num_experts, HIDDEN, INTER, generator=gen) / INTER**0.5).to(dtype)
    pool = torch.tensor(allowed or range(num_experts))
    ids = pool[torch.rand(total, len(pool), generator=gen).topk(top_k, dim=1).indices].int()
    weights = torch.softmax(torch.randn(total, top_k, generator=gen), dim=-1)
    scales = {}
    if name.startswith("fp8"):
        (w1, s1), (w2, s2) = quantize_weights_fp8(w1, (32, 32)), quantize_weights_fp8(w2, (32, 32))
        scales = dict(w1_scale=s1, w2_scale=s2, block_shape=(32, 32))
    return counts, num_experts, hs, w1, w2, weights, ids, scales


def _local(rank, world, num_experts, w1, w2, scales):
    lo, hi = expert_range(num_experts, rank, world)
    local = {k: (v[lo:hi] if k.endswith("_scale") else v) for k, v in scales.items()}
    return w1[lo:hi], w2[lo:hi], local


def _one_process(world):
    """Each case's `fused_moe` of the whole batch in one process (computed once, in the parent)."""
    outputs = {}
    with torch.no_grad():
        for name in CASES:
            _, _, hs, w1, w2, weights, ids, scales = _case(name, world)
            outputs[name] = fused_moe(hs, w1, w2, weights, ids, **scales)
    return outputs


def _worker(rank, world, init_file, single_outputs):
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    torch.set_grad_enabled(False)
    for name in CASES:
        counts, num_experts, hs, w1, w2, weights, ids, scales = _case(name, world)
        single = single_outputs[name]
        mine = slice(sum(counts[:rank]), sum(counts[: rank + 1]))
        w1_local, w2_local, local_scales = _local(rank, world, num_experts, w1, w2, scales)
        out = torch.full((counts[rank], HIDDEN), float("nan"), dtype=hs.dtype)  # unwritten rows show
        fused_moe_expert_parallel(
            hs[mine], w1_local, w2_local, weights[mine], ids[mine], num_experts=num_experts, out=out, **local_scales
        )
        assert torch.equal(out, single[mine]), f"{name}: rank {rank} of {world} differs from one process"
        if name.startswith("bf16"):  # the other mode: every rank the whole batch, the shares all-reduced
            shared = fused_moe_expert_parallel(
                hs, w1_local, w2_local, weights, ids, num_experts=num_experts, mode="all_reduce"
            )
            assert relative_error(shared, single) < 1e-2, f"all_reduce: rank {rank} of {world}"
            # an out whose rows have gaps (fused_moe takes it; the collective reduces dense memory)
            base = torch.full((hs.shape[0], 2 * HIDDEN), 7.0, dtype=hs.dtype)
            fused_moe_expert_parallel(
                hs, w1_local, w2_local, weights, ids, num_experts=num_experts, mode="all_reduce", out=base[:, :HIDDEN]
            )
            assert torch.equal(base[:, :HIDDEN], shared) and bool((base[:, HIDDEN:] == 7).all()), "strided out"
            # num_experts as a 0-d tensor, as the package's ints take it
            again = fused_moe_expert_parallel(
                hs[mine], w1_local, w2_local, weights[mine], ids[mine], num_experts=torch.tensor(num_experts)
            )
            assert torch.equal(again, single[mine]), "num_experts as a 0-d tensor"

    # A non-contiguous batch: hidden states a column slice, topk_ids and topk_weights transposed views.
    counts, num_experts, hs, w1, w2, weights, ids, _ = _case("bf16, uneven tokens, an idle rank, E=6", world)
    mine = slice(sum(counts[:rank]), sum(counts[: rank + 1]))
    wide = torch.cat((hs, hs), dim=1)[mine, HIDDEN:]
    w1_local, w2_local, _ = _local(rank, world, num_experts, w1, w2, {})
    got = fused_moe_expert_parallel(
        wide, w1_local, w2_local, weights[mine].T.contiguous().T, ids[mine].T.contiguous().T, num_experts=num_experts
    )
    assert torch.equal(got, single_outputs["bf16, uneven tokens, an idle rank, E=6"][mine]), f"non-contiguous: {rank}"

    # Bad input: raised before any collective, or (an expert out of range on one rank) on every rank alike.
    with pytest.raises(ValueError, match="mode must be one of 'all_to_all', 'all_reduce', got 'ring'"):
        fused_moe_expert_parallel(hs[mine], w1_local, w2_local, weights[mine], ids[mine], num_experts=6, mode="ring")
    lo, hi = expert_range(num_experts, rank, world)
    with pytest.raises(
        ValueError, match=rf"w1_local must be \[E_local, 2I, H\] with this rank's .* pass w1\[{lo}:{hi}\]"
    ):
        fused_moe_expert_parallel(hs[mine], w1, w2, weights[mine], ids[mine], num_experts=num_experts)
    bad = ids[mine].clone()
    if rank == 0:
        bad[0, 0] = num_experts
    with pytest.raises(ValueError, match=r"topk_ids must hold experts in \[0, 6\): rank 0 of the group has 1 outside"):
        fused_moe_expert_parallel(hs[mine], w1_local, w2_local, weights[mine], bad, num_experts=num_experts)
    args = (hs[mine], w1_local, w2_local, weights[mine], ids[mine])
    with pytest.raises(ValueError, match="expert_map is set per rank by fused_moe_expert_parallel"):
        fused_moe_expert_parallel(*args, num_experts=num_experts, expert_map=torch.arange(num_experts))
    with pytest.raises(ValueError, match=r"shared experts \(shared_w1, shared_w2\) are not split over ranks"):
        fused_moe_expert_parallel(*args, num_experts=num_experts, shared_w1=w1[:1], shared_w2=w2[:1])
    # Ranks that disagree on the dtype, each consistent with its own weights: all raise.
    mixed = (hs[mine].float(), w1_local.float(), w2_local.float()) if rank == 1 else args[:3]
    with pytest.raises(ValueError, match=r"the same H and dtype on every rank of the group, got rank 0: H=\d+ "):
        fused_moe_expert_parallel(*mixed, *args[3:], num_experts=num_experts)
    # A mistake on the last rank only (all experts, a w2 of the wrong I, a bad config): it raises its own
    # error, the others one that names it, none waits for the others in a collective.
    last = rank == world - 1
    mistakes = {
        r"w1_local must be \[E_local, 2I, H\]": dict(w1_local=w1),
        r"w2 must have shape \[E, H, I\]": dict(w2_local=w2_local[:, :, :-1]),
        "config": dict(config="fastest"),
        "hidden_states is float32 but w1 is bfloat16": dict(hidden_states=hs[mine].float()),
        "all tensors must be on one device": dict(topk_ids=ids[mine].to("meta")),  # the counts' device is not it
        "return_info is fused_moe's alone": dict(return_info=True),
        "out must be bfloat16": dict(out=torch.empty(args[0].shape, dtype=torch.float64)),  # checked before
    }
    for own_error, mistake in mistakes.items():
        call = dict(zip(("hidden_states", "w1_local", "w2_local", "topk_weights", "topk_ids"), args))
        if last:
            call.update(mistake)
        call["num_experts"] = num_experts
        expected = own_error if last else rf"rank {world - 1} of the group refused its arguments"
        with pytest.raises((TypeError, ValueError), match=expected):
            fused_moe_expert_parallel(**call)
    # An out over this rank's weights (every rank alike, each with tokens): refused before any exchange.
    alias = w1_local.reshape(-1)[: hs.numel()].view(hs.shape)
    for mode in MODES:  # each mode names this function's arguments
        with pytest.raises(ValueError, match="out shares memory with w1_local"):
            fused_moe_expert_parallel(
                hs, w1_local, w2_local, weights, ids, num_experts=num_experts, out=alias, mode=mode
            )
        grad = torch.empty(hs.shape, dtype=hs.dtype, requires_grad=True)
        with torch.enable_grad(), pytest.raises(ValueError, match="out requires grad: fused_moe_expert_parallel"):
            fused_moe_expert_parallel(
                hs, w1_local, w2_local, weights, ids, num_experts=num_experts, out=grad, mode=mode
            )
    # Ranks that disagree on E (6, and 7 on the last rank, whose block has as many experts either way, so its own
    # checks pass): the counts' exchange finds them apart, every rank raises.
    with pytest.raises(ValueError, match=r"num_experts must be the same on every rank of the group, got rank 0: 6"):
        fused_moe_expert_parallel(*args, num_experts=num_experts + (1 if last else 0))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_matches_one_process_bitwise(world, tmp_path):
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), _one_process(world)), nprocs=world)


def test_expert_range_splits_in_contiguous_blocks():
    assert [expert_range(6, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert [expert_range(256, r, 64)[1] - expert_range(256, r, 64)[0] for r in range(64)] == [4] * 64
    assert expert_map_for_rank(5, 1, 2, torch.device("cpu")).tolist() == [-1, -1, -1, 0, 1]
    with pytest.raises(ValueError, match=r"world_size must be at most num_experts=3 \(each rank holds"):
        expert_range(3, 0, 4)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\) \(world_size=2\), got 2"):
        expert_range(4, 2, 2)
    with pytest.raises(ValueError, match="rank must be >= 0, got -1"):
        expert_range(4, -1, 2)
    with pytest.raises(TypeError, match="rank must be an int, got bool"):
        expert_range(4, True, 2)
    assert expert_range(4, np.int64(1), 2) == (2, 4)  # a rank read from a config


def test_docs_promise_only_the_count_of_local_experts_is_checked():
    """Which experts w1_local holds cannot be checked (another block of the right size runs): the docstring and
    docs/expert_parallel.md say only the count is checked and that the caller passes w[lo:hi] of expert_range."""
    doc = " ".join(fused_moe_expert_parallel.__doc__.split())
    assert "a w1_local whose number of experts is not this rank's block's" in doc
    assert "does not hold this rank's block" not in doc
    assert "pass `w1[lo:hi]` and `w2[lo:hi]`" in doc
    with open(os.path.join(ROOT, "docs", "expert_parallel.md")) as f:
        page = " ".join(f.read().split())
    assert "Each rank must pass exactly `w1[lo:hi]` and `w2[lo:hi]` of its `expert_range`" in page


def test_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already up")
    hs = torch.zeros(1, 4)
    with pytest.raises(RuntimeError, match="needs torch.distributed initialized"):
        fused_moe_expert_parallel(hs, hs, hs, hs, hs, num_experts=2)


def test_benchmark_script_runs_on_two_cpu_processes(tmp_path):
    """benchmarks/expert_parallel.py's logic (correctness, both modes, bytes, timing) at a tiny size."""
    result = tmp_path / "ep.json"
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "expert_parallel.py"), "--cpu", "--world", "2"]
        + ["--models", "qwen3-30b-a3b", "--tokens", "2", "--experts", "16", "--json", str(result)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),  # this checkout's moe_lab in the spawned processes too
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "all_to_all" in run.stdout and "all_reduce" in run.stdout and "FAIL" not in run.stdout
    assert result.exists()


def _script(*parts):
    """examples/expert_parallel.py or benchmarks/expert_parallel.py as a module (its main() not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ep_script_" + parts[0], os.path.join(ROOT, *parts))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world", "0"], "argument --world: must be >= 1, got 0"),
        (["--world", "-1"], "argument --world: must be >= 1, got -1"),
        (["--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
        (["--tokens", "-2"], "argument --tokens: must be >= 1, got -2"),
        (["--tokens", "1.5"], "argument --tokens: must be an int >= 1, got '1.5'"),
        (["--model", "nope"], "argument --model: invalid choice: 'nope'"),
        (["--world", "9", "--model", "mixtral-8x7b"], "--world 9: at most mixtral-8x7b's 8 experts"),
    ],
)
def test_example_checks_its_arguments_before_spawning(argv, message, capsys):
    example = _script("examples", "expert_parallel.py")
    with pytest.raises(SystemExit) as exit_info:
        example.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_example_takes_any_preset_in_any_case():
    example = _script("examples", "expert_parallel.py")
    assert example.parse_args(["--model", "GPT-OSS-20B", "--world", "32"]).model == "gpt-oss-20b"
    with pytest.raises(SystemExit):  # under torchrun the world size is WORLD_SIZE's
        example.parse_args(["--model", "mixtral-8x7b"], world_from_torchrun=16)


def test_example_runs_gpt_oss_with_its_kind_of_experts():
    """gpt-oss's activation and biases (each rank its block of the biases), not SwiGLU without biases."""
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "expert_parallel.py"), "--model", "gpt-oss-20b"]
        + ["--world", "2", "--tokens", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count(": ok") == 4 and "FAIL" not in run.stdout
    assert "all_to_all: gpt-oss-20b" in run.stdout and "(bitwise equal: True)" in run.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cpu", "--world", "0"], "argument --world: must be >= 1, got 0"),
        (["--cpu", "--scale", "0"], "argument --scale: must be >= 1, got 0"),
        (["--cpu", "--tokens", "1", "0"], "argument --tokens: must be >= 1, got 0"),
        (["--cpu", "--iters", "0"], "argument --iters: must be >= 1, got 0"),
        (["--cpu", "--experts", "0"], "argument --experts: must be >= 1, got 0"),
        (["--cpu", "--models", "nope"], "argument --models: invalid choice: 'nope'"),
        (["--cpu", "--world", "9", "--models", "mixtral-8x7b"], "--world 9: at most mixtral-8x7b's 8 experts"),
        (["--cpu", "--world", "5", "--experts", "4", "--models", "olmoe-1b-7b"], "--experts 4: olmoe-1b-7b routes"),
        (["--cpu", "--world", "3", "--experts", "2", "--models", "mixtral-8x7b"], "--world 3: at most --experts 2"),
        (["--cpu", "--json", "/proc/x.json"], "--json /proc/x.json: cannot write there"),
        (["--cpu", "--json", ""], "--json '': give a file name"),
    ],
)
def test_benchmark_checks_its_arguments_before_spawning(argv, message, capsys, tmp_path):
    benchmark = _script("benchmarks", "expert_parallel.py")
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        benchmark.main(["--cpu", "--json", str(tmp_path)])  # a folder
    assert f"--json '{tmp_path}': give a file name" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):  # under a file
        benchmark.main(["--cpu", "--json", str(tmp_path / "file" / "ep.json")])
    assert f"{tmp_path / 'file'} is not a folder" in capsys.readouterr().err
    args = benchmark.parse_args(["--cpu", "--json", str(tmp_path / "new" / "ep.json"), "--models", "GPT-OSS-20B"])
    assert (
        args.models == ["gpt-oss-20b"] and (tmp_path / "new").is_dir() and not (tmp_path / "new" / "ep.json").exists()
    )
