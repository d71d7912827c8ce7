"""The backend room's runtime: which backends exist, which kernels each has, and the one fallback policy.

Backends live in folders of their own under ``bfp/kernels/``:

============  =======================  ==============================================================
backend       folder                   runs
============  =======================  ==============================================================
reference     ``reference/`` (and the  PyTorch steps, any device: the specification every kernel equals
              families' PyTorch code)  bit for bit
cpu           ``numba_cpu/``           Numba kernels on CPU tensors (parallel)
triton        ``triton_cuda/``         Triton kernels on CUDA tensors (CPU tensors under
                                       ``TRITON_INTERPRET=1``, how CI checks them)
============  =======================  ==============================================================

A backend's kernels are registered here by (entry point, backend) as ``"module:attribute"`` paths
inside ``bfp.kernels``, imported on first use (Numba and Triton load only when a kernel of theirs
runs). ``kernel(entry, backend)`` returns the callable, or None where that backend has none.

**Fallback policy** (the one rule every caller applies): where the backend a tensor runs on has
no kernel for an entry point, the PyTorch reference runs it, on the tensor's own device; it gives
the same bits, more slowly. ``covers()`` lists what each backend runs natively. Adding a backend
means its folder and its lines in ``KERNELS``; no module outside ``bfp/kernels/`` names a backend's
module (``tests/test_layering.py`` checks it).
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Optional

import torch

BACKENDS = ("reference", "cpu", "triton")
ALIASES = {"cuda": "triton"}  # the GPU backend's earlier name

# (entry point, backend) -> "module:attribute" in bfp.kernels ("module" alone: the module itself)
KERNELS: dict[tuple[str, str], str] = {
    ("rule", "cpu"): "numba_cpu.cpu:run",                      # Float, BlockFloat, MX, P3109
    ("rule", "triton"): "triton_cuda:run",
    ("rule_prepare", "triton"): "triton_cuda.element:prepare",  # the same launch, its plan looked up once
    ("nvfp4", "cpu"): "numba_cpu.nvfp4_cpu:quantize",          # NVFP4 (1-D blocks any axis, 2-D tiles)
    ("nvfp4", "triton"): "triton_cuda.nvfp4:quantize",         # NVFP4, both conventions, 1-D blocks and 2-D tiles
    ("nvfp4_prepare", "triton"): "triton_cuda.nvfp4:prepare",  # the same launches, their plans looked up once
    ("nvfp4_te", "cpu"): "numba_cpu.nvfp4_te_cpu:quantize",    # NVFP4 in TransformerEngine's order
    ("scaled", "cpu"): "numba_cpu.scaled_cpu:apply",           # per-tensor scaled FP8, fused
    ("scaled_tensorwise", "triton"): "triton_cuda.scaled:tensorwise",  # the same, amax and scale on the device
    ("scaled_rowwise", "triton"): "triton_cuda.scaled:rowwise",  # rowwise along any axis, one pass
    ("amax", "cpu"): "numba_cpu.scaled_cpu:amax",
    ("amax", "triton"): "triton_cuda.scaled:amax",
    ("inplace", "cpu"): "numba_cpu.inplace_cpu",               # rounded running sums (accumulators)
    ("inplace", "triton"): "triton_cuda.inplace",
    ("hadamard_rows", "cpu"): "numba_cpu.hadamard_cpu:transform_rows",
    ("hadamard_rows", "triton"): "triton_cuda.hadamard:transform_rows",
    ("hadamard_nvfp4", "cpu"): "numba_cpu.nvfp4_rht:transform_quantize",  # the transform fused into NVFP4
    ("hadamard_nvfp4", "triton"): "triton_cuda.hadamard:transform_quantize",
    ("fused_accumulator", "cpu"): "numba_cpu.fused",           # tensor-core chains
    ("fused_accumulator", "triton"): "triton_cuda.fused:fused_bmm",  # a batch of them, one launch
    ("threads", "cpu"): "numba_cpu.cpu:threads_for",
    ("pages", "cpu"): "numba_cpu.pages:advise",                 # huge pages for large fresh CPU outputs
}


def register(entry: str, backend: str, target: str) -> None:
    """Add or replace ``entry``'s kernel on ``backend``: ``target`` is ``"module:attribute"`` in bfp.kernels."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    KERNELS[(entry, backend)] = target
    kernel.cache_clear()
    PREPARED.clear()


# Launches the family kernels prepared with a backend's kernels (``dispatch._fast``), emptied when
# a kernel is registered so none outlives the kernel it was prepared with.
PREPARED: dict = {}


@functools.lru_cache(maxsize=None)
def kernel(entry: str, backend: str) -> Optional[Any]:
    """The kernel of ``entry`` on ``backend``, imported on first use; None where the backend has
    none (then the caller runs the reference: the module docstring's fallback policy)."""
    target = KERNELS.get((entry, ALIASES.get(backend, backend)))
    if target is None:
        return None
    module, _, attr = target.partition(":")
    mod = importlib.import_module(f"{__package__}.{module}")
    return getattr(mod, attr) if attr else mod


def covers() -> dict[str, list[str]]:
    """Backend -> the entry points it runs natively (the rest take the reference on its device)."""
    out: dict[str, list[str]] = {b: [] for b in BACKENDS}
    for entry, backend in KERNELS:
        out[backend].append(entry)
    out["reference"] = sorted({e for e, _ in KERNELS})
    return out


def device_backend(x: torch.Tensor) -> str:
    """The backend a tensor runs on by default: Numba for CPU tensors, Triton for CUDA ones."""
    return "triton" if x.is_cuda else "cpu"


def backend_for(x: torch.Tensor, backend: Optional[str]) -> str:
    """``backend`` (an alias resolved, checked), or ``x``'s device's default."""
    backend = ALIASES.get(backend, backend) or device_backend(x)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)} (or 'cuda', the "
                         f"Triton kernels' earlier name)")
    return backend


def kernel_for(entry: str, x: torch.Tensor, backend: Optional[str] = None) -> Optional[Callable]:
    """``entry``'s kernel on ``backend`` (default: ``x``'s device's) where it can run ``x`` (Numba:
    CPU tensors; Triton: CUDA tensors, or CPU tensors under its interpreter), else None (the
    caller's reference runs: the fallback policy)."""
    backend = backend_for(x, backend)
    if backend == "reference" or (backend == "cpu" and x.device.type != "cpu"):
        return None
    return kernel(entry, backend)
