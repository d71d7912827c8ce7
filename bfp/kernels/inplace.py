"""In-place rounding for callers that own their buffers (the accumulator emulation).

``bfp.quantize`` always returns a fresh tensor; on a CPU, writing 4 bytes an
element into fresh pages costs as much as the rounding itself. The
accumulator emulation rounds tensors it has just made (chunk GEMM results) and
a running sum it owns, so it can round them where they are:

``quantize_(x, fmt)``
    ``x.copy_(quantize(x, fmt))`` in one pass.
``add_quantize_(s, t, fmt)``
    ``s.copy_(quantize(s + t, fmt))`` in one pass: the float32 addition (IEEE,
    round to nearest even, subnormals kept, as torch's) and the rounding of the
    sum are fused, so no sum tensor is made.

Both give the same bits as those expressions, draw the same random keys from
``generator`` (one 64-bit draw, stochastic rounding only), and use the fast
path for element-wise formats on contiguous float32 tensors (Numba on the CPU,
``numba_cpu/inplace_cpu``; Triton on CUDA, ``triton_cuda/inplace``); anything else
runs the expression itself (a NaN sum is ``t``'s NaN when ``t`` is one, else
``s``'s, quieted, as torch's add on x86). Autograd does not see these writes: use them on tensors outside the graph.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import Float, Format
from . import quantize
from .runtime import backend_for, kernel
from .dispatch import _keys, device_keys
from .plan import rule_for
from .arrays import as_numpy


def _fast(fmt: Format, *tensors: torch.Tensor) -> bool:
    return isinstance(fmt, Float) and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and t.numel() > 0
        for t in tensors)


def _triton(fmt: Format, backend: Optional[str], *tensors: torch.Tensor):
    """The Triton in-place kernels where they run these tensors (CUDA, or ``backend="triton"``)."""
    if not isinstance(fmt, Float) or backend_for(tensors[0], backend) != "triton":
        return None
    if not all(t.dtype == torch.float32 and t.is_contiguous() and t.numel() > 0 for t in tensors):
        return None
    return kernel("inplace", "triton")


def _bits(t: torch.Tensor):
    return as_numpy(t.detach().view(torch.int32)).reshape(-1)


def quantize_(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None,
              backend: Optional[str] = None) -> torch.Tensor:
    """Round ``x`` to ``fmt`` in place and return it (see the module docstring)."""
    rule = rule_for(fmt) if isinstance(fmt, Float) else None
    if (tk := _triton(fmt, backend, x)) is not None:
        tk.round_inplace(x.detach(), rule, device_keys(generator, x.device) if rule.mode == 2 else None)
        return x
    if not _fast(fmt, x) or backend_for(x, backend) != "cpu":
        return x.copy_(quantize(x, fmt, generator=generator, backend=backend))
    inplace_cpu = kernel("inplace", "cpu")  # Numba loads on first use
    inplace_cpu.round_inplace(_bits(x), rule, _keys(generator) if rule.mode == 2 else (0, 0))
    return x


def add_quantize_(s: torch.Tensor, t: torch.Tensor, fmt: Format, *,
                  generator: Optional[torch.Generator] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``s = quantize(s + t, fmt)`` in place (same shapes); returns ``s``."""
    if s.shape != t.shape:
        raise ValueError(f"add_quantize_ needs tensors of one shape, got {tuple(s.shape)} and "
                         f"{tuple(t.shape)}")
    rule = rule_for(fmt) if isinstance(fmt, Float) else None
    if (tk := _triton(fmt, backend, s, t)) is not None:
        tk.add_round(s.detach(), t.detach(), rule, device_keys(generator, s.device) if rule.mode == 2 else None)
        return s
    if not _fast(fmt, s, t) or backend_for(s, backend) != "cpu":
        return s.copy_(quantize(s + t, fmt, generator=generator, backend=backend))
    inplace_cpu = kernel("inplace", "cpu")  # Numba loads on first use
    inplace_cpu.add_round(_bits(s), _bits(t), rule, _keys(generator) if rule.mode == 2 else (0, 0))
    return s
