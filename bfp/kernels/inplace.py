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
path for element-wise formats on contiguous float32 CPU tensors; anything else
runs the expression itself (a NaN sum is ``t``'s NaN when ``t`` is one, else
``s``'s, quieted, as torch's add on x86). Autograd does not see these writes: use them on tensors outside the graph.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import Float, Format
from . import quantize
from .runtime import kernel
from .dispatch import _keys
from .plan import rule_for


def _fast(fmt: Format, *tensors: torch.Tensor) -> bool:
    return isinstance(fmt, Float) and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and t.numel() > 0
        for t in tensors)


def _bits(t: torch.Tensor):
    return t.detach().view(torch.int32).numpy().reshape(-1)


def quantize_(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Round ``x`` to ``fmt`` in place and return it (see the module docstring)."""
    if not _fast(fmt, x):
        return x.copy_(quantize(x, fmt, generator=generator))
    inplace_cpu = kernel("inplace", "cpu")  # Numba loads on first use
    rule = rule_for(fmt)
    inplace_cpu.round_inplace(_bits(x), rule, _keys(generator) if rule.mode == 2 else (0, 0))
    return x


def add_quantize_(s: torch.Tensor, t: torch.Tensor, fmt: Format, *,
                  generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``s = quantize(s + t, fmt)`` in place (same shapes); returns ``s``."""
    if s.shape != t.shape:
        raise ValueError(f"add_quantize_ needs tensors of one shape, got {tuple(s.shape)} and "
                         f"{tuple(t.shape)}")
    if not _fast(fmt, s, t):
        return s.copy_(quantize(s + t, fmt, generator=generator))
    inplace_cpu = kernel("inplace", "cpu")  # Numba loads on first use
    rule = rule_for(fmt)
    inplace_cpu.add_round(_bits(s), _bits(t), rule, _keys(generator) if rule.mode == 2 else (0, 0))
    return s
