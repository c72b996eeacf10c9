"""Launches through compiled handles (moe_lab._launch): the mechanics with a stand-in kernel, the interpreter
that never takes a handle, and on a GPU (marker `gpu`) the same bits as Triton's own launcher, with a
fallback to it for every change of what its specialization reads."""

import pytest
import torch

from moe_lab import _launch, fused_moe, get_preset
from moe_lab import plan as plan_module
from moe_lab.plan import cached_layer_plan, layer_key, layer_plan_cache

from .conftest import ON_GPU, random_layer


@pytest.fixture(autouse=True)
def _fresh_plans():
    plan_module.clear_layer_plans()
    yield
    plan_module.clear_layer_plans()


# --- The mechanics, with a stand-in for a JIT function and its CompiledKernel. ---


class _Compiled:
    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream, args)


class _Kernel:
    """A JIT function of signature (x, n, BLOCK: constexpr, MODE: constexpr = "a")."""

    def __init__(self):
        import inspect

        self.signature = inspect.signature(lambda x, n, BLOCK, MODE="a": None)
        self.compiled = _Compiled()
        self.jit = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit.append((grid, args, kwargs))
            return self.compiled

        return run


class _Runtime:
    def __init__(self):
        from triton.knobs import HookChain

        self.launch_enter_hook, self.launch_exit_hook = HookChain(), HookChain(reversed=True)


@pytest.fixture
def stand_in(monkeypatch):
    from triton.knobs import HookChain

    device = [0]
    runtime = _Runtime()
    monkeypatch.setattr(_launch, "_is_compiled", lambda result: isinstance(result, _Compiled))
    runtime_tuple = (runtime, lambda: device[0], lambda d: 100 + d, HookChain, False)
    monkeypatch.setattr(_launch, "_triton_runtime", runtime_tuple)
    return _Kernel(), device, runtime


def test_first_launch_through_triton_then_through_the_handle(stand_in):
    kernel, _, _ = stand_in
    site = _launch.LaunchSite()
    constexprs = dict(num_warps=4, BLOCK=64)  # MODE left at its default; num_warps is an option
    _launch.launch(kernel, (3,), ("x", 7), constexprs, site)
    assert kernel.jit == [((3,), ("x", 7), constexprs)] and kernel.compiled.runs == []
    _launch.launch(kernel, (5, 2), ("y", 9), constexprs, site)
    assert len(kernel.jit) == 1
    # As JITFunction.run calls it: grid, stream, function, metadata, hooks, then every parameter in order.
    assert kernel.compiled.runs == [(5, 2, 1, 100, "function", "packed", None, None, None, "y", 9, 64, "a")]


def test_no_site_and_another_device_go_through_triton(stand_in):
    kernel, device, _ = stand_in
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64))
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64))
    assert len(kernel.jit) == 2 and kernel.compiled.runs == []
    site = _launch.LaunchSite()
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64), site)
    device[0] = 1  # another current device: Triton's launcher again, and the handle is now that device's
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64), site)
    assert len(kernel.jit) == 4 and site.handles[id(kernel)].device == 1
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64), site)
    assert len(kernel.jit) == 4 and kernel.compiled.runs[0][3] == 101


def test_registered_launch_hooks_run_with_their_metadata(stand_in):
    kernel, _, runtime = stand_in
    site = _launch.LaunchSite()
    _launch.launch(kernel, (1,), ("x", 7), dict(BLOCK=64), site)
    seen = []
    runtime.launch_enter_hook.add(seen.append)
    _launch.launch(kernel, (2,), ("x", 7), dict(BLOCK=64), site)
    run = kernel.compiled.runs[0]
    assert run[6] == ("metadata", (2,), 100, ("x", 7, 64, "a"))
    assert run[7] is runtime.launch_enter_hook and run[8] is runtime.launch_exit_hook


def test_the_interpreter_takes_no_handle():
    """On the CPU every launch goes through the interpreter: a kept plan's sites hold no handle."""
    if ON_GPU:
        pytest.skip("the interpreter's case")
    hs, w1, w2, tw, ti = random_layer(3, 4, 2, 32, 32, torch.float32)
    for _ in range(2):
        fused_moe(hs, w1, w2, tw, ti)
    plan = cached_layer_plan(layer_key(hs, w1, w2, tw, ti))
    assert plan.sites and not any(site.handles for site in plan.sites.values())


# --- The direct launcher (Triton 3.6, 3.7): what the C launcher gets, against CudaLauncher.__call__. ---


class _Metadata:
    def __init__(self, tensordesc_meta):
        self.tensordesc_meta = tensordesc_meta


class _Source:
    def __init__(self, signature):
        self.signature = signature


class _CompiledForLauncher:
    def __init__(self, signature, tensordesc_meta):
        self.src, self.metadata = _Source(signature), _Metadata(tensordesc_meta)


class _Descriptor:  # a stand-in for a TensorDescriptor (weak-referenceable, as Triton's is)
    def __init__(self, name):
        self.name = name


def _cuda_launcher(monkeypatch, signature, tensordesc_meta, scratch=0):
    """Triton's CudaLauncher of this Triton without its compiled module: its C launcher records its
    arguments, descriptors expand to a stand-in CUtensorMap."""
    from triton.backends.nvidia import driver

    calls = []
    expansions = []

    def make_tensordesc_arg(arg, meta):
        expansions.append(arg.name)
        return [("cu_tensor_map", arg.name, meta["swizzle"]), 64, 1]

    monkeypatch.setattr(driver, "make_tensordesc_arg", make_tensordesc_arg)
    launcher = driver.CudaLauncher.__new__(driver.CudaLauncher)
    launcher.launch = driver.wrap_handle_tensordesc(lambda *a: calls.append(a), signature, tensordesc_meta)
    launcher.num_ctas, launcher.launch_cooperative_grid, launcher.launch_pdl = 1, False, True
    launcher.global_scratch_size = launcher.profile_scratch_size = scratch
    launcher.global_scratch_align = launcher.profile_scratch_align = 1
    launcher.arg_annotations, launcher.kernel_signature = "annotations", "kernel signature"
    return launcher, calls, expansions


@pytest.mark.parametrize("descriptors", [False, True])
def test_the_direct_launcher_passes_what_triton_passes(monkeypatch, descriptors):
    """Under each Triton: where `_Direct` applies (3.6, 3.7), its C launcher gets what CudaLauncher.__call__
    gives it, each descriptor expanded once per object; elsewhere there is none (Triton's launcher runs)."""
    import triton
    from triton.backends.nvidia.driver import CudaLauncher

    kinds = ["*bf16", "tensordesc<bf16[64, 64]>", ("i32", "i32"), "tensordesc<bf16[64, 64]>", "i32", "constexpr"]
    if not descriptors:
        kinds = [kind if not kind.startswith("tensordesc") else "*bf16" for kind in kinds if isinstance(kind, str)]
    signature = dict(zip(map(str, range(len(kinds))), kinds))
    meta = [dict(swizzle=128), dict(swizzle=64)] if descriptors else None
    launcher, calls, expansions = _cuda_launcher(monkeypatch, signature, meta)
    direct = _launch._Direct.of(launcher, _CompiledForLauncher(signature, meta), (64,))
    if not triton.__version__.startswith(("3.6.", "3.7.")):
        assert direct is None
        return
    a, b = _Descriptor("a"), _Descriptor("b")
    args = ("x", a, (3, 4), b, 7) if descriptors else ("x", (3, 4), 7)
    for _ in range(3):
        CudaLauncher.__call__(launcher, 5, 2, 1, 100, "function", "packed", None, None, None, *args, 64)
        direct(5, 2, 100, "function", "packed", args)
    assert len(calls) == 6 and all(call == calls[0] for call in calls)
    assert calls[0][:5] == (5, 2, 1, 100, "function")
    if descriptors:  # Triton's launcher expands both per launch, the direct one once each
        assert sorted(expansions) == ["a"] * 4 + ["b"] * 4


def test_no_direct_launcher_where_scratch_or_metadata_is_needed(monkeypatch):
    signature = {"0": "tensordesc<bf16[64, 64]>", "1": "i32"}
    launcher, _, _ = _cuda_launcher(monkeypatch, signature, [dict(swizzle=128)], scratch=256)
    assert _launch._Direct.of(launcher, _CompiledForLauncher(signature, [dict(swizzle=128)]), ()) is None
    launcher, _, _ = _cuda_launcher(monkeypatch, signature, None)
    assert _launch._Direct.of(launcher, _CompiledForLauncher(signature, None), ()) is None


# --- Programs: a recorded call's launches with another call's tensors (stand-in handles). ---


class _DirectStandIn:
    def __init__(self):
        self.calls = []

    def __call__(self, grid_x, grid_y, stream, function, packed_metadata, args):
        self.calls.append((grid_x, grid_y, stream, function, packed_metadata, list(args)))


class _HandleStandIn:
    function, packed_metadata, device = "function", "packed", 0

    def __init__(self):
        self.direct = _DirectStandIn()


def _program_call(hidden, weights, out, kept, descriptor):
    """One recorded launch, its arguments as `moe_lab.gemm` passes them: views of the roles (at offsets), a kept
    buffer, a descriptor of the weights, plain values, a tuple."""
    return ((hidden[1:], hidden.stride(0), 1), descriptor, (weights, 4.5), out, kept[2:], None, 7, True)


def test_a_program_launches_with_the_new_calls_pointers(stand_in):
    """Pointers into each role at the recorded offsets (ints), kept buffers as they were, a descriptor made
    again from the new roles, values and tuples as recorded; the current stream; nothing launched where a
    launch hook is registered."""
    _, _, runtime = stand_in
    handle, kept = _HandleStandIn(), torch.zeros(8)
    roles = (torch.zeros(4, 3), torch.zeros(5), torch.zeros(4, 3), None)
    descriptor = object()

    def made(obj):
        return (lambda tensors: ("descriptor of", tensors[1])) if obj is descriptor else None

    recorded = [(handle, 1, 6, _program_call(roles[0], roles[1], roles[2], kept, descriptor))]
    program = _launch.Program.of(recorded, roles, [kept], made)
    assert program is not None
    new = (torch.zeros(4, 3), torch.zeros(5), torch.zeros(4, 3), None)
    assert program.run(new)
    ((grid_x, grid_y, stream, function, packed, args),) = handle.direct.calls
    assert (grid_x, grid_y, stream, function, packed) == (6, 1, 100, "function", "packed")
    hidden = new[0].data_ptr()
    assert args[0] == (hidden + 3 * 4, 3, 1)  # hidden[1:]: one row of 3 float32 on
    assert args[1] == ("descriptor of", new[1])
    assert args[2] == (new[1].data_ptr(), 4.5)
    assert args[3:] == [new[2].data_ptr(), kept.data_ptr() + 2 * 4, None, 7, True]
    runtime.launch_enter_hook.add(lambda metadata: None)
    assert not program.run(new) and len(handle.direct.calls) == 1


def test_no_program_where_a_launch_or_an_argument_cannot_be_replayed(stand_in):
    """A launch through Triton (None), no launch, a temporary tensor (no role, not kept), two roles sharing
    memory, an object nobody makes again: no program."""
    handle, kept = _HandleStandIn(), torch.zeros(8)
    roles = (torch.zeros(4, 3), torch.zeros(5), torch.zeros(4, 3), None)
    descriptor = object()
    made = lambda obj: (lambda tensors: obj) if obj is descriptor else None  # noqa: E731
    call = _program_call(roles[0], roles[1], roles[2], kept, descriptor)
    assert _launch.Program.of([(handle, 1, 6, call)], roles, [kept], made) is not None
    assert _launch.Program.of([(handle, 1, 6, call), None], roles, [kept], made) is None
    assert _launch.Program.of([], roles, [kept], made) is None
    assert _launch.Program.of([(handle, 1, 6, call)], roles, [], made) is None  # kept[2:] is no role now
    assert _launch.Program.of([(handle, 1, 6, call)], roles, [kept], lambda obj: None) is None
    aliased = (roles[0], roles[1], roles[0][1:], None)  # out inside hidden_states: which role is ambiguous
    assert _launch.Program.of([(handle, 1, 6, call)], aliased, [kept], made) is None


def test_one_tensor_in_two_roles_replays_only_so(stand_in):
    """Recorded with out=hidden_states (one tensor in two roles): replayed where the next call does the same,
    not where its two roles are two tensors."""
    handle, kept = _HandleStandIn(), torch.zeros(8)
    x, w = torch.zeros(4, 3), torch.zeros(5)
    call = _program_call(x, w, x, kept, None)
    program = _launch.Program.of([(handle, 1, 6, call)], (x, w, x, None), [kept], lambda obj: None)
    y = torch.zeros(4, 3)
    assert program.run((y, w, y, None)) and handle.direct.calls[-1][5][3] == y.data_ptr()
    assert not program.run((y, w, torch.zeros(4, 3), None)) and len(handle.direct.calls) == 1


def test_a_launch_past_the_direct_launcher_makes_the_recording_unreplayable(stand_in):
    """A handle launching through compiled.run (no direct launcher: scratch memory, Triton 3.8+; or a launch hook
    registered meanwhile, by another thread) is noted in the recording: no program that would leave it out."""
    kernel, _, runtime = stand_in
    direct_kernel, site, x = _Kernel(), _launch.LaunchSite(), torch.zeros(4)
    for k in (direct_kernel, kernel):
        _launch.launch(k, (1,), (x, 7), dict(BLOCK=64), site)  # the first launches take the handles
    site.handles[id(direct_kernel)].direct = _DirectStandIn()
    assert site.handles[id(kernel)].direct is None
    with _launch.recording() as launches:
        _launch.launch(direct_kernel, (1,), (x, 7), dict(BLOCK=64), site)
        _launch.launch(kernel, (1,), (x, 7), dict(BLOCK=64), site)
    assert len(kernel.compiled.runs) == 1 and launches[1] is None
    assert _launch.Program.of(launches, (x,), [], lambda obj: None) is None
    site.handles[id(kernel)].direct = _DirectStandIn()
    with _launch.recording() as launches:
        _launch.launch(direct_kernel, (1,), (x, 7), dict(BLOCK=64), site)
        runtime.launch_enter_hook.add(lambda metadata: None)
        _launch.launch(kernel, (1,), (x, 7), dict(BLOCK=64), site)
    assert len(kernel.compiled.runs) == 2 and launches[1] is None
    assert _launch.Program.of(launches, (x,), [], lambda obj: None) is None


def test_a_program_keeps_no_tensor_of_the_recorded_call(stand_in):
    """The roles' tensors and the weights' descriptors of the recorded call are put in per run, not kept: a
    program (kept with its workspace) does not hold the recorded layer's weights or output alive."""
    import gc
    import weakref

    handle, kept = _HandleStandIn(), torch.zeros(8)
    roles = (torch.zeros(4, 3), torch.zeros(5), torch.zeros(4, 3), None)
    descriptor = _Descriptor("w")

    def made(obj):
        return (lambda tensors: ("descriptor of", tensors[1])) if isinstance(obj, _Descriptor) else None

    recorded = [(handle, 1, 6, _program_call(roles[0], roles[1], roles[2], kept, descriptor))]
    program = _launch.Program.of(recorded, roles, [kept], made)
    refs = [weakref.ref(obj) for obj in (*roles[:3], descriptor)]
    del roles, descriptor, recorded
    gc.collect()
    assert program is not None and all(ref() is None for ref in refs)
    new = (torch.zeros(4, 3), torch.zeros(5), torch.zeros(4, 3), None)
    assert program.run(new) and handle.direct.calls[-1][5][1] == ("descriptor of", new[1])


# --- On a GPU: the handles against Triton's own launcher. ---


def _count_jit_launches(monkeypatch):
    """The kernels launched through Triton's launcher (`JITFunction.run`) from now on."""
    from triton.runtime.jit import JITFunction

    launches, run = [], JITFunction.run

    def counted(self, *args, **kwargs):
        launches.append(self)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counted)
    return launches


def _layer(num_tokens, fp8, seed=0):
    preset = get_preset("qwen3-30b-a3b")
    hs, w1, w2, (tw, ti) = preset.build(num_tokens, dtype=torch.bfloat16, device="cuda", seed=seed)
    scales = {}
    if fp8:
        w1, w2, scales = preset.quantize_fp8(w1, w2)
    return hs, w1, w2, tw, ti, scales


def _jit_path(*args, **kwargs):
    """The layer's output with every launch through Triton's launcher (no plan kept, so no handle)."""
    with layer_plan_cache(False):
        return fused_moe(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("use_tma", [False, "auto"])
@pytest.mark.parametrize(
    "num_tokens,fp8,persistent",
    [(1, False, False), (8, False, False), (64, False, False), (64, False, True), (1, True, False), (64, True, False)],
)
def test_handles_give_the_bits_of_the_jit_path(monkeypatch, num_tokens, fp8, persistent, use_tma):
    """Qwen3-30B-A3B at decode sizes (T = 1: slot order; 8: the one-program align; 64: three align launches),
    bf16 and block-scaled FP8, pointer and TMA loads, the per-tile and the persistent kernel: a call of a kept
    plan launches no kernel through Triton and writes every row, bit for bit as Triton's launcher does."""
    from moe_lab import GemmConfig, MoEConfig

    hs, w1, w2, tw, ti, scales = _layer(num_tokens, fp8)
    config = None
    if persistent:
        config = MoEConfig(GemmConfig(64, 128, 64, 8, 4, 3, persistent=True), GemmConfig(64, 64, 64, 8, 4, 3))
    kw = dict(use_tma=use_tma, config=config, **scales)
    fused_moe(hs, w1, w2, tw, ti, out=torch.empty_like(hs), **kw)  # takes the handles (`out` given: part of the key)
    (plan,) = plan_module._layer_plans.values()
    assert any(site.handles for site in plan.sites.values())
    hs2, _, _, tw2, ti2, _ = _layer(num_tokens, False, seed=1)  # new values, the same facts
    launches = _count_jit_launches(monkeypatch)
    out = torch.full_like(hs2, float("nan"))
    fused_moe(hs2, w1, w2, tw2, ti2, out=out, **kw)
    assert launches == []
    monkeypatch.undo()
    assert torch.equal(out, _jit_path(hs2, w1, w2, tw2, ti2, **kw))


@pytest.mark.gpu
def test_a_change_of_alignment_or_dtype_goes_through_triton_again(monkeypatch):
    """Inputs offset by one element (data_ptr % 16 changes), other dtypes: another key, launched through
    Triton first (then through its own handles), the same bits as Triton's launcher; the first inputs still
    take their handles."""
    num_tokens = 8
    hs, w1, w2, tw, ti, _ = _layer(num_tokens, False)
    first = fused_moe(hs, w1, w2, tw, ti)
    fused_moe(hs, w1, w2, tw, ti)

    def offset(t):
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        return view

    changed = [
        (offset(hs), w1, w2, tw, ti),
        (hs, w1, w2, offset(tw), ti),
        (hs, w1, w2, tw, offset(ti)),
        (hs, w1, w2, tw, ti.long()),
        (hs.half(), w1.half(), w2.half(), tw, ti),
    ]
    for args in changed:
        launches = _count_jit_launches(monkeypatch)
        out = fused_moe(*args)
        assert launches, "a new key's first call goes through Triton's launcher"
        launches.clear()
        again = fused_moe(*args)
        assert launches == []
        monkeypatch.undo()
        reference = _jit_path(*args)
        assert torch.equal(out, reference) and torch.equal(again, reference)
    launches = _count_jit_launches(monkeypatch)
    assert torch.equal(fused_moe(hs, w1, w2, tw, ti), first) and launches == []


@pytest.mark.gpu
def test_handles_follow_the_current_stream_and_a_cuda_graph():
    num_tokens = 64
    hs, w1, w2, tw, ti, _ = _layer(num_tokens, False)
    reference = _jit_path(hs, w1, w2, tw, ti)
    fused_moe(hs, w1, w2, tw, ti)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        on_stream = fused_moe(hs, w1, w2, tw, ti)
    stream.synchronize()
    assert torch.equal(on_stream, reference)
    out = torch.full_like(hs, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe(hs, w1, w2, tw, ti, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference)


@pytest.mark.gpu
def test_launch_hooks_see_every_launch():
    """A profiler's launch hook (Triton's `knobs.runtime.launch_enter_hook`) sees launches through handles,
    named, as it sees Triton's."""
    from triton import knobs

    hs, w1, w2, tw, ti, _ = _layer(64, False)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _jit_path(hs, w1, w2, tw, ti)
        through_triton = list(seen)
        fused_moe(hs, w1, w2, tw, ti)
        seen.clear()
        fused_moe(hs, w1, w2, tw, ti)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen == through_triton and len(seen) >= 4


def _programs(plan) -> list:
    """The programs of a plan's kept chunks (one workspace per chunk on this stream)."""
    return [workspace.program for workspace in plan.workspaces.values()]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        "T=1",
        "T=8",
        "T=64",
        "T=64 persistent",
        "no tma",
        "unfused",
        "expert_map",
        "in place",
        "chunks",
        "gpt-oss",
        "fp8",
    ],
)
def test_programs_replay_the_bits_of_the_jit_path(monkeypatch, case):
    """From the second call of a key on a stream, a kept chunk's launches replay (`moe_lab._launch.Program`)
    with the call's own tensors: another layer's weights of the same shapes, new routing, a new `out`, bit for bit
    as Triton's launcher writes them, no kernel through Triton. FP8 calls (temporaries between the launches)
    make no program, nor do calls with the activation unfused (its output is allocated per call); both launch
    through their handles."""
    from moe_lab import GPT_OSS, GemmConfig, MoEConfig
    from moe_lab._kernels.activation import silu_and_mul_kernel

    num_tokens = {"T=1": 1, "T=8": 8, "chunks": 24, "gpt-oss": 8}.get(case, 64)
    hs, w1, w2, tw, ti, scales = _layer(num_tokens, case == "fp8")
    kw = dict(scales)
    if case == "T=64 persistent":
        kw["config"] = MoEConfig(GemmConfig(64, 128, 64, 8, 4, 3, persistent=True), GemmConfig(64, 64, 64, 8, 4, 3))
    if case == "unfused":
        kw["config"] = {"up": {"fuse_swiglu": False}}
    if case == "no tma":  # weights by pointer: no descriptor to make again
        kw["use_tma"] = False
    if case == "expert_map":  # 256 global experts, this rank's 128 at the odd ones
        emap = torch.full((256,), -1, dtype=torch.int32, device="cuda")
        emap[1::2] = torch.arange(128, dtype=torch.int32, device="cuda")
        kw["expert_map"], ti = emap, (ti * 2 + 1 - (ti % 3 == 0).int()).int()  # some slots on other ranks
    if case == "chunks":
        kw["chunk_size"] = 8
    if case == "gpt-oss":
        e, two_i, h = w1.shape
        kw.update(activation=GPT_OSS, w1_bias=torch.randn(e, two_i, device="cuda").bfloat16() * 0.1)
        kw["w2_bias"] = torch.randn(e, h, device="cuda").bfloat16() * 0.1
    in_place = case == "in place"
    for _ in range(2):  # the plan (and handles), then its workspaces and programs
        x = hs.clone()
        fused_moe(x, w1, w2, tw, ti, out=x if in_place else torch.empty_like(hs), **kw)
    (plan,) = plan_module._layer_plans.values()
    programs = _programs(plan)
    assert len(programs) == (3 if case == "chunks" else 1)
    if case in ("fp8", "unfused"):  # quantized inputs, or silu_and_mul (no handle, a new output), between GEMMs
        assert programs == [None]
    else:
        assert all(programs)
    hs2, w1b, w2b, tw2, ti2, _ = _layer(num_tokens, False, seed=1)  # another layer's weights, new routing
    if case == "fp8":
        w1b, w2b = w1, w2
    if case == "expert_map":
        ti2 = (ti2 * 2 + 1 - (ti2 % 5 == 0).int()).int()
    for weights in ((w1b, w2b), (w1, w2)):
        launches = _count_jit_launches(monkeypatch)
        x = hs2.clone()
        out = x if in_place else torch.full_like(hs2, float("nan"))
        result = fused_moe(x, *weights, tw2, ti2, out=out, **kw)
        assert launches == ([silu_and_mul_kernel] if case == "unfused" else []) and result is out  # (no handle)
        monkeypatch.undo()
        assert torch.equal(out, _jit_path(hs2, *weights, tw2, ti2, **kw)), weights is (w1b, w2b)
