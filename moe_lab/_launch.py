"""Launching a cached plan's kernels through their compiled handles, without Triton's launcher.

`kernel[grid](*args, **constexprs)` (Triton's `JITFunction.run`) binds the arguments, computes each one's
specialization, builds the cache key, looks the compiled kernel up and builds the launch metadata before it
launches: tens of microseconds of host time per launch, several launches per `fused_moe` call. A call whose
`LayerKey` is known launches the same kernels with the same specializations as the call that made its plan,
so the plan keeps the `CompiledKernel` each of its launches returned and launches it directly after that.

Contract of `launch(kernel, grid, args, constexprs, site)`:
- `args` are the kernel's runtime arguments, positional and in order; `constexprs` its constexpr arguments and
  Triton's options (num_warps, num_stages), by name.
- `site` None: `kernel[grid](*args, **constexprs)`, always (the public ops, a plan not kept).
- `site` a `LaunchSite` (one stage of one chunk of a kept `moe_lab.plan.LayerPlan`): its first launch of
  `kernel`, and any launch while another CUDA device is current, goes through `kernel[grid]` and keeps the
  `CompiledKernel` returned; later launches call it as `JITFunction.run` does in Triton 3.6 to 3.9:
  `compiled.run(grid_x, grid_y, 1, stream, compiled.function, compiled.packed_metadata, launch_metadata,
  enter_hook, exit_hook, *args, *constexpr values in signature order)` (the launcher skips the constexprs),
  with the current stream, and Triton's launch hooks (`triton.knobs.runtime.launch_enter_hook` and
  `launch_exit_hook`) and their metadata where any hook is registered.
- The caller guarantees that every launch of `kernel` at one site has the same specialization. Triton's cache
  key holds, per argument: a tensor's dtype and whether its data_ptr is a multiple of 16; an int's 32/64-bit
  range, whether it equals 1 (then a constant) and whether it is a multiple of 16; None; a bool's or a float's
  type only; a tensor descriptor's dtype and block shape; a tuple element by element (Triton 3.6 to 3.9 alike),
  besides the constexprs and options. In `fused_moe` each of these is a function of the call's `LayerKey`
  (every input's shape, strides, dtype and data_ptr % 16, the config) and its plan: the other tensors are
  buffers the call allocates (PyTorch's CUDA allocator returns blocks aligned to 512 bytes) or views of
  inputs at offsets the key decides. A call with any of them changed has another key, so another plan,
  whose first launches go through Triton.
- Read when a kernel's handle is taken, not per launch: Triton's global knobs that enter its options
  (TRITON_DEBUG, instrumentation) and the check that the kernel's global constants have not changed.
- Under the interpreter `kernel[grid]` returns no `CompiledKernel`: nothing is kept, every launch goes through
  `kernel[grid]`.

Under Triton 3.6 and 3.7 a handle also skips the Python of `compiled.run` (Triton's `CudaLauncher.__call__`:
scratch checks, then a loop that expands each tensor descriptor argument, encoding its CUtensorMap, on every
launch): `_Direct` calls the C launcher underneath with the arguments that `CudaLauncher.__call__` passes it,
each descriptor expanded by Triton's own `make_tensordesc_arg` once per descriptor object (a kept buffer's or a
weight's descriptor lives across calls; the CUtensorMap it encodes holds the descriptor's address, shape,
strides and box, all fixed for the object's life). Only where no launch hook is registered, the kernel needs
no scratch memory and every descriptor has its metadata; Triton 3.8 and later changed the launcher (the
expansion moved into C), so their handles call `compiled.run` as above. tests/test_launch.py checks, under
each Triton, that `_Direct` hands the C launcher what `CudaLauncher.__call__` does.

A kept chunk's calls go one step further (`Program`): `moe_lab.layer` records the direct launches of one call on
its workspace and launches them again for the next calls, only the pointers into that call's own tensors (and
its weights' descriptors) put in, so a decode call's host work is its key, its output's allocation and the C
launcher's calls.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# (triton.knobs.runtime, current device, current stream, HookChain, whether one device is visible), once a GPU
# launch ran
_triton_runtime = None


class LaunchSite:
    """Where one stage of one cached plan launches (`moe_lab.plan.LayerPlan.site`): the compiled handle of
    each kernel it launched (an align stage launches up to three), taken on its first launch."""

    __slots__ = ("handles",)

    def __init__(self):
        self.handles: Dict[int, _Handle] = {}  # by id(kernel): a JITFunction's hash takes a lock


class _Handle:
    """A kernel as compiled for one site: what `launch` passes to `compiled.run`."""

    __slots__ = ("compiled", "device", "run", "function", "packed_metadata", "constexpr_values", "direct")

    def __init__(self, compiled, device: int, constexpr_values: tuple):
        self.compiled = compiled
        self.device = device
        self.run = compiled.run  # (a property: the launcher, loaded with the module by the first launch)
        self.function = compiled.function
        self.packed_metadata = compiled.packed_metadata
        self.constexpr_values = constexpr_values
        self.direct = _Direct.of(self.run, compiled, constexpr_values)


def launch(kernel, grid: Tuple[int, ...], args: tuple, constexprs: dict, site: Optional[LaunchSite] = None) -> None:
    """Launch `kernel` over `grid` (one or two dimensions): through its compiled handle at `site` where it has
    one for the current device, else through `kernel[grid]` (keeping the handle at `site`). See the module's
    docstring for the contract."""
    handle = site.handles.get(id(kernel)) if site is not None else None
    if handle is not None:
        knobs, current_device, current_stream, hook_chain, one_device = _triton_runtime
        if one_device or current_device() == handle.device:
            stream = current_stream(handle.device)
            enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
            if _idle(enter, hook_chain) and _idle(leave, hook_chain):
                if handle.direct is not None:
                    grid_y = grid[1] if len(grid) > 1 else 1
                    handle.direct(grid[0], grid_y, stream, handle.function, handle.packed_metadata, args)
                    recorded = _recording.launches
                    if recorded is not None:
                        recorded.append((handle, grid_y, grid[0], args))
                    return
                metadata = enter = leave = None
            else:
                metadata = handle.compiled.launch_metadata(grid, stream, *args, *handle.constexpr_values)
            if _recording.launches is not None:
                _recording.launches.append(None)  # (not through the direct launcher: not replayable either)
            handle.run(
                grid[0],
                grid[1] if len(grid) > 1 else 1,
                1,
                stream,
                handle.function,
                handle.packed_metadata,
                metadata,
                enter,
                leave,
                *args,
                *handle.constexpr_values,
            )
            return
    if _recording.launches is not None:
        _recording.launches.append(None)  # (not through a direct handle: the recording cannot be replayed)
    compiled = kernel[grid](*args, **constexprs)
    if site is not None and _is_compiled(compiled):
        site.handles[id(kernel)] = _Handle(compiled, _triton_runtime[1](), _constexpr_values(kernel, args, constexprs))


def current_stream(device_index: int) -> int:
    """The current CUDA stream of device `device_index`, as the handle of a launch takes it."""
    if _triton_runtime is not None:
        return _triton_runtime[2](device_index)
    from triton.runtime import driver

    return driver.active.get_current_stream(device_index)


def _idle(hook, hook_chain) -> bool:
    """A launch hook that does nothing: None, or an empty chain of hooks."""
    return hook is None or (type(hook) is hook_chain and not hook.calls)


def _constexpr_values(kernel, args: tuple, constexprs: dict) -> tuple:
    """The values of the kernel's parameters after the positional `args`, in signature order (its
    constexprs, given by name or left at their defaults): the rest of what `JITFunction.run` passes."""
    params = list(kernel.signature.parameters.values())[len(args) :]
    return tuple(constexprs[p.name] if p.name in constexprs else p.default for p in params)


def _is_compiled(result) -> bool:
    """Whether a launch returned a compiled kernel (a GPU launch; the interpreter returns none); the first
    one also fetches what `launch` reads of Triton per launch."""
    global _triton_runtime
    from triton.compiler.compiler import CompiledKernel

    if not isinstance(result, CompiledKernel):
        return False
    if _triton_runtime is None:
        from triton import knobs
        from triton.runtime import driver

        try:
            from triton.knobs import HookChain
        except ImportError:  # (every supported Triton has it; an older one passes its hooks as they are)
            HookChain = None
        active = driver.active
        import torch

        one_device = torch.cuda.device_count() == 1  # (fixed once CUDA is initialized)
        _triton_runtime = (knobs.runtime, active.get_current_device, active.get_current_stream, HookChain, one_device)
    return True


class _Direct:
    """The C launcher under one compiled kernel's `CudaLauncher` (Triton 3.6 and 3.7), called with what
    `CudaLauncher.__call__` passes it on a launch without hooks and scratch memory; tensor descriptor
    arguments expanded once per descriptor object (see the module's docstring)."""

    __slots__ = ("c_launch", "flat", "cooperative", "pdl", "annotations", "kernel_signature", "descriptors", "tail")

    @classmethod
    def of(cls, launcher, compiled, constexpr_values: tuple) -> Optional["_Direct"]:
        """The direct launcher of `launcher` (`compiled.run`), or None where this module does not know how
        Triton calls its C launcher (another Triton or backend, scratch memory, a descriptor without metadata).
        `constexpr_values`: what `compiled.run` gets after the runtime arguments (the launcher skips them)."""
        import triton

        if type(launcher).__name__ != "CudaLauncher" or not triton.__version__.startswith(("3.6.", "3.7.")):
            return None
        if launcher.global_scratch_size or launcher.profile_scratch_size or getattr(launcher, "gsan_enabled", False):
            return None
        signature = list(compiled.src.signature.values())
        positions = [i for i, kind in enumerate(signature) if isinstance(kind, str) and kind.startswith("tensordesc")]
        metadata = getattr(compiled.metadata, "tensordesc_meta", None) or [None] * len(positions)
        if len(metadata) != len(positions) or any(meta is None for meta in metadata):
            return None
        c_launch = launcher.launch
        if positions:  # Triton's wrapper that expands the descriptors closes over the C launcher
            code = getattr(c_launch, "__code__", None)
            if code is None or "launcher" not in code.co_freevars:
                return None
            c_launch = c_launch.__closure__[code.co_freevars.index("launcher")].cell_contents
        direct = cls()
        direct.c_launch = c_launch
        direct.flat = triton.__version__.startswith("3.6.")  # 3.6: flat; 3.7: annotations, then a sequence
        direct.cooperative, direct.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        direct.annotations = getattr(launcher, "arg_annotations", None)
        direct.kernel_signature = getattr(launcher, "kernel_signature", None)
        direct.descriptors = tuple(zip(positions, metadata))[::-1]  # from the last: a splice shifts what follows
        direct.tail = tuple(constexpr_values)
        return direct

    def __call__(self, grid_x: int, grid_y: int, stream: int, function, packed_metadata, args: tuple) -> None:
        if self.descriptors:  # (as Triton's wrapper passes them: a list)
            args = [*args, *self.tail]
            for position, meta in self.descriptors:
                args[position : position + 1] = _expanded(args[position], meta)
        else:
            args = (*args, *self.tail)
        if self.flat:
            self.c_launch(
                grid_x, grid_y, 1, stream, function, self.cooperative, self.pdl, None, None,
                packed_metadata, None, None, None, *args,
            )  # fmt: skip
        else:
            self.c_launch(
                grid_x, grid_y, 1, stream, function, self.cooperative, self.pdl, packed_metadata, None, None, None,
                None, None, self.annotations, self.kernel_signature, args,
            )  # fmt: skip


# Each tensor descriptor's expansion (Triton's make_tensordesc_arg: its CUtensorMap, shape, strides), by id while
# the descriptor lives; the expansion holds no tensor, so an entry does not keep memory alive.
_EXPANSIONS: Dict[int, tuple] = {}


def _expanded(descriptor, meta) -> list:
    entry = _EXPANSIONS.get(id(descriptor))
    if entry is not None and entry[0]() is descriptor and (entry[1] is meta or entry[1] == meta):
        return entry[2]
    from triton.backends.nvidia.driver import make_tensordesc_arg

    expansion = make_tensordesc_arg(descriptor, meta)
    if entry is None or entry[0]() is not descriptor:  # (another kernel's metadata for a kept one: not kept)
        key = id(descriptor)
        ref = weakref.ref(descriptor, lambda _, key=key: _EXPANSIONS.pop(key, None))
        _EXPANSIONS[key] = (ref, meta, expansion)
    return expansion


# --- Replaying a kept call's launches with another call's tensors. ---


class _Recording(threading.local):
    """This thread's launches under `recording()`: (handle, grid_y, grid_x, args) per direct launch, None for any
    other; None outside the block."""

    launches: Optional[list] = None


_recording = _Recording()


@contextlib.contextmanager
def recording():
    """Collect this thread's launches made in the block (through `launch`); yields the list, which `Program.of`
    reads."""
    before, _recording.launches = _recording.launches, []
    try:
        yield _recording.launches
    finally:
        _recording.launches = before


class Program:
    """The launches of one recorded call, launched again with another call's tensors, its *roles*: each argument
    as recorded, except pointers into a role's memory, given as the role's data pointer plus the recorded byte
    offset (an int: the C launcher then neither calls data_ptr() nor asks the driver about the pointer), and
    objects made from the roles (`Program.of`'s `made`: a weight's tensor descriptor).

    Valid where the caller guarantees what `launch`'s handles assume (same specializations), and more: every
    argument not derived from a role is the same for the next call (sizes and strides of the call's key,
    `constant` buffers it keeps alive), each role's views lie at the same offsets, and the block's GPU work is
    all `launch`es (a kernel launched otherwise would be left out: `moe_lab.layer` records only calls whose other
    work makes views and temporaries, and a temporary is no role and no constant, so no program is made)."""

    __slots__ = ("steps", "device", "same", "keep")

    @classmethod
    def of(
        cls,
        recorded: Sequence,
        roles: Sequence[Optional[object]],
        constants: Sequence[object],
        made: Callable[[object], Optional[Callable[[Sequence], object]]],
    ) -> Optional["Program"]:
        """The program of `recorded` (what `recording()` collected), or None where it cannot be replayed: a
        launch not through a direct handle, no launch, two roles sharing memory (but for one tensor in two roles),
        or a tensor argument that is no view of a role or of a `constants` tensor. `roles`: the call's tensors
        (None where absent); `constants`: the buffers the next calls launch on again (kept alive by the program;
        tensors or tensor descriptors); `made(obj)`: for an argument that is neither a tensor nor a plain value,
        the function of the roles that makes it again, or None (then it must be one of `constants`)."""
        import torch

        if not recorded or any(entry is None for entry in recorded):
            return None
        by_storage, same = {}, []
        for index, role in enumerate(roles):
            if isinstance(role, torch.Tensor):
                storage = role.untyped_storage().data_ptr()
                first = by_storage.setdefault(storage, index)
                if first != index:
                    if roles[first] is not role:
                        return None  # (which role a pointer names would be a guess)
                    same.append((first, index))  # one tensor in two roles (out=hidden_states): so must the next call
        constant_ids = {id(c) for c in constants}
        constant_storages = {c.untyped_storage().data_ptr() for c in constants if isinstance(c, torch.Tensor)}

        def resolve(arg):
            """(patch kind, a, b) or ("value", arg, None); None where unattributable."""
            if isinstance(arg, torch.Tensor):
                storage = arg.untyped_storage().data_ptr()
                role = by_storage.get(storage)
                if role is not None:
                    return ("pointer", role, arg.data_ptr() - roles[role].data_ptr())
                return ("value", arg.data_ptr(), None) if storage in constant_storages else None
            if arg is None or isinstance(arg, (bool, int, float, str)):
                return ("value", arg, None)
            if id(arg) in constant_ids:
                return ("value", arg, None)
            make = made(arg)
            return ("made", make, None) if make is not None else None

        steps = []
        for handle, grid_y, grid_x, args in recorded:
            template, patches = list(args), []
            for top, arg in enumerate(args):
                inner = list(arg) if isinstance(arg, tuple) else None  # (a tuple argument: element by element)
                for sub, item in enumerate(arg) if inner is not None else ((-1, arg),):
                    found = resolve(item)
                    if found is None:
                        return None
                    if found[0] != "value":  # put in per run: the template keeps none of this call's objects
                        patches.append((top, sub, *found))
                    value = found[1] if found[0] == "value" else None
                    if inner is None:
                        template[top] = value
                    else:
                        inner[sub] = value
                if inner is not None:
                    template[top] = tuple(inner)
            steps.append((handle.direct, grid_x, grid_y, handle.function, handle.packed_metadata, template, patches))
        program = cls()
        program.steps = tuple(steps)
        program.device = recorded[0][0].device
        program.same = tuple(same)
        program.keep = tuple(constants)
        return program

    def run(self, roles: Sequence[Optional[object]]) -> bool:
        """Launch every step with `roles` (the recorded call's order) on the current stream, and True; False,
        launching nothing, where a launch hook is registered, another CUDA device is current, or one tensor held
        two roles in the recorded call and does not now (then launch as the plan does)."""
        knobs, current_device, current_stream, hook_chain, one_device = _triton_runtime
        if not (_idle(knobs.launch_enter_hook, hook_chain) and _idle(knobs.launch_exit_hook, hook_chain)):
            return False
        if not one_device and current_device() != self.device:
            return False
        for first, other in self.same:
            if roles[first] is not roles[other]:
                return False
        stream = current_stream(self.device)
        pointers = [role.data_ptr() if role is not None else 0 for role in roles]
        for direct, grid_x, grid_y, function, packed_metadata, template, patches in self.steps:
            args: List = list(template)
            for top, sub, kind, a, b in patches:
                value = pointers[a] + b if kind == "pointer" else a(roles)
                if sub < 0:
                    args[top] = value
                else:
                    inner = list(args[top])
                    inner[sub] = value
                    args[top] = tuple(inner)
            direct(grid_x, grid_y, stream, function, packed_metadata, args)
        return True
