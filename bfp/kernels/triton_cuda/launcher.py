"""Launch a Triton kernel through its compiled kernel, cached per plan, instead of ``JITFunction.run``.

``kernel[grid](*args, **constexprs)`` binds every argument, specialises it (alignment, divisibility,
equal to 1), builds a cache key and looks the compiled kernel up on every call: 10-20 us of host
time for a kernel of 30-odd parameters, more than the quantization of a small tensor costs on a
GPU. A training step repeats the same launches, so ``run`` does that work once a plan: the first
call goes through ``kernel[grid]`` (which compiles, launches and returns the ``CompiledKernel``),
later calls hand the arguments straight to the compiled kernel's launcher, as ``JITFunction.run``
itself does after its lookup (``kernel.run(grid, stream, function, packed_metadata, ...)``).

The cache key is the caller's plan key (everything the constexprs and integer arguments depend
on) plus what the JIT specialises on that the plan does not fix: each tensor's dtype and whether
its address is 16-byte aligned, and the device. Under the interpreter, or while a launch hook is
set (a profiler's), every call takes ``kernel[grid]`` unchanged.
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.driver import driver

_CACHE: dict = {}
_MAX = 4096  # distinct plans x devices; a bound, not an eviction policy (a model has a few dozen)


def _interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def _hooked(hook) -> bool:
    """Whether a launch hook is set (triton 3.8 keeps an always-present, empty ``HookChain``)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _spec(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    return None


def run(kernel, grid: tuple, args: tuple, kw: dict, plan_key) -> None:
    """``kernel[grid](*args, **kw)``, through the cached compiled kernel after the first call of a
    plan (``plan_key``: hashable, fixing ``kw`` and the integer arguments)."""
    if _interpreted(kernel) or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, **kw)
        return
    device = args[0].device.index
    key = (plan_key, device, tuple(_spec(a) for a in args))
    entry = _CACHE.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **kw)
        if len(_CACHE) < _MAX and compiled is not None:
            tail = tuple(kw[name] for name in kernel.arg_names[len(args):])  # the constexprs, in order
            _CACHE[key] = (compiled, tail)
        return
    compiled, tail = entry
    stream = driver.active.get_current_stream(device)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)
