"""Launch a Triton kernel through its compiled kernel, cached per plan, instead of ``JITFunction.run``.

``kernel[grid](*args, **constexprs)`` binds every argument, specialises it (alignment, divisibility,
equal to 1), builds a cache key and looks the compiled kernel up on every call: 10-20 us of host
time for a kernel of 30-odd parameters, more than the quantization of a small tensor costs on a
GPU. A training step repeats the same launches, so ``run`` does that work once a plan: the first
call goes through ``kernel[grid]`` (which compiles, launches and returns the ``CompiledKernel``),
later calls hand the arguments straight to the compiled kernel's launcher, as ``JITFunction.run``
itself does after its lookup (``kernel.run(grid, stream, function, packed_metadata, ...)``).

The cache key is the caller's plan key (everything the constexprs, the integer arguments and the
tensors' dtypes depend on) and the device; only launches whose tensors are all 16-byte aligned
are cached (what a torch allocation gives; the JIT then specialises on nothing the key does not
fix), others take ``kernel[grid]`` every time, as do all launches under the interpreter or while
a launch hook is set (a profiler's).

Triton compiles for and launches on the *current* CUDA device; every launch here (``run``,
``launch``) first makes its first tensor's device current (``on_device``), so a tensor on
``cuda:1`` runs on ``cuda:1`` whatever device the caller's code made current.
"""
from __future__ import annotations

import contextlib

import torch
from triton import knobs
from triton.runtime.driver import driver

_CACHE: dict = {}
_MAX = 4096  # distinct plans x devices; a bound, not an eviction policy (a model has a few dozen)


def _interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def _hooked() -> bool:
    """Whether a launch hook is set (triton 3.8 keeps always-present ``HookChain`` objects, empty
    unless a profiler adds to them; an older triton has None or a function)."""
    rt = knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def on_device(t):
    """A context in which ``t``'s CUDA device is the current one (nothing for a CPU tensor, which
    only the interpreter launches)."""
    d = t.device
    return torch.cuda.device(d) if d.type == "cuda" else contextlib.nullcontext()


def launch(kernel, grid: tuple, *args, **kw):
    """``kernel[grid](*args, **kw)`` on the device of ``args[0]`` (a tensor), the JIT's own lookup."""
    with on_device(args[0]):
        return kernel[grid](*args, **kw)


def run(kernel, grid: tuple, tensors: tuple, scalars: tuple, kw: dict, plan_key) -> None:
    """``_run`` on the device of ``tensors[0]`` (``on_device``)."""
    with on_device(tensors[0]):
        _run(kernel, grid, tensors, scalars, kw, plan_key)


def _run(kernel, grid: tuple, tensors: tuple, scalars: tuple, kw: dict, plan_key) -> None:
    """``kernel[grid](*tensors, *scalars, **kw)``, through the cached compiled kernel after the
    first call of a plan (``plan_key``: hashable, fixing ``kw``, the scalars and the tensors'
    dtypes). Only launches whose tensors are all 16-byte aligned are cached (the JIT's
    specialisation then depends on nothing else); others take ``kernel[grid]`` every time."""
    for t in tensors:
        if t.data_ptr() & 15:
            kernel[grid](*tensors, *scalars, **kw)
            return
    key = (plan_key, tensors[0].get_device())
    entry = _CACHE.get(key)
    if entry is None or _hooked():
        compiled = kernel[grid](*tensors, *scalars, **kw)
        if entry is None and len(_CACHE) < _MAX and not _interpreted(kernel) and compiled is not None:
            n = len(tensors) + len(scalars)
            tail = tuple(kw[name] for name in kernel.arg_names[n:])  # the constexprs, in order
            # the C launcher and its fixed arguments, as ``CompiledKernel.__getitem__``'s runner passes them
            _CACHE[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail)
        return
    launch, function, metadata, tail = entry
    launch(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
           driver.active.get_current_stream(key[1]), function, metadata, None, None, None, *tensors, *scalars, *tail)
