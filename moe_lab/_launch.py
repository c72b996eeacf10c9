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
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

_triton_runtime = None  # (triton.knobs.runtime, current device, current stream, HookChain), once a GPU launch ran


class LaunchSite:
    """Where one stage of one cached plan launches (`moe_lab.plan.LayerPlan.site`): the compiled handle of
    each kernel it launched (an align stage launches up to three), taken on its first launch."""

    __slots__ = ("handles",)

    def __init__(self):
        self.handles: Dict[object, _Handle] = {}


class _Handle:
    """A kernel as compiled for one site: what `launch` passes to `compiled.run`."""

    __slots__ = ("compiled", "device", "run", "function", "packed_metadata", "constexpr_values")

    def __init__(self, compiled, device: int, constexpr_values: tuple):
        self.compiled = compiled
        self.device = device
        self.run = compiled.run  # (a property: the launcher, loaded with the module by the first launch)
        self.function = compiled.function
        self.packed_metadata = compiled.packed_metadata
        self.constexpr_values = constexpr_values


def launch(kernel, grid: Tuple[int, ...], args: tuple, constexprs: dict, site: Optional[LaunchSite] = None) -> None:
    """Launch `kernel` over `grid` (one or two dimensions): through its compiled handle at `site` where it has
    one for the current device, else through `kernel[grid]` (keeping the handle at `site`). See the module's
    docstring for the contract."""
    handle = site.handles.get(kernel) if site is not None else None
    if handle is not None:
        knobs, current_device, current_stream, hook_chain = _triton_runtime
        if current_device() == handle.device:
            stream = current_stream(handle.device)
            enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
            if _idle(enter, hook_chain) and _idle(leave, hook_chain):
                metadata = enter = leave = None
            else:
                metadata = handle.compiled.launch_metadata(grid, stream, *args, *handle.constexpr_values)
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
    compiled = kernel[grid](*args, **constexprs)
    if site is not None and _is_compiled(compiled):
        site.handles[kernel] = _Handle(compiled, _triton_runtime[1](), _constexpr_values(kernel, args, constexprs))


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
        _triton_runtime = (knobs.runtime, active.get_current_device, active.get_current_stream, HookChain)
    return True
