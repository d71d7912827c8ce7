"""Rounding exact results: a float64 value plus its error term, rounded once to a ``Float``.

``quantize`` takes float32 (a float64 input is first rounded to float32, so a
product or sum rounded to float32 and then to the format is rounded twice:
``(1 + 2**-12)**2`` is ``1 + 2**-11 + 2**-24`` exactly, float32 makes it the
tie ``1 + 2**-11`` and fp16 then rounds the tie to even, ``1.0``, where the
exact value rounds to ``1 + 2**-10``). ``round_exact`` avoids the double rounding:

1. The exact value is ``hi + lo`` with float64 ``hi`` and ``|lo| <= ulp(hi)/2``
   (``two_sum`` gives such a pair for a sum of two float64 numbers; a product
   of two float32 numbers is exact in float64, ``lo = 0``).
2. It is rounded *to odd* to float64, then to odd to float32: the nearest
   neighbour below or above whose last mantissa bit is 1 wherever the value is
   not representable (its sticky bit is kept in that last bit). Rounding to odd
   twice equals rounding to odd once.
3. The float32 number is rounded to the format by ``quantize``: for a format
   with at most 22 significant bits (``man <= 21``) every float32 ulp is at
   most a quarter of the format's, and rounding the round-to-odd value to
   nearest-even or toward zero gives exactly the rounding of the exact value
   (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
   algorithms using rounding to odd", IEEE TC 2008). ``man = 23`` (float32's
   own precision, with ``exp = 8``: float32's own grid) rounds the float64
   round-to-odd value to nearest float32 (53 bits >= 24 + 2) and lets
   ``quantize`` apply the format's range and subnormal rule. Other formats
   (``man = 22``; ``man = 23`` with fewer exponent bits, truncation or
   stochastic rounding) have no such route and are refused.

Stochastic rounding sees the round-to-odd float32 value: its probability is
that of the exact value to within one float32 ulp (``2**(man-23)`` of the
format's LSB). Values beyond float32's range become float32's largest value
(odd) of their sign before step 3, so every format overflows them by its own
rule. NaN and ±Inf pass through unchanged to ``quantize``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import Float, Rounding
from . import quantize


def check_exact(fmt: Float, what: str) -> None:
    """Raise ValueError if ``round_exact`` cannot round exactly to ``fmt``."""
    if fmt.man <= 21 or (fmt.man == 23 and fmt.exp == 8 and fmt.rounding is Rounding.NEAREST):
        return
    raise ValueError(f"{what} {fmt!r}: exact rounding goes through float32 rounded to odd and "
                     f"needs man <= 21, or float32's own grid (exp=8, man=23) with nearest rounding; "
                     f"got exp={fmt.exp}, man={fmt.man}, rounding={fmt.rounding}")


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly (Knuth's TwoSum;
    ``e`` is 0 where ``s`` is not finite)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, torch.where(torch.isfinite(s), e, torch.zeros_like(e))


def _to_odd(y: torch.Tensor, inexact: torch.Tensor, up: torch.Tensor, ints: torch.dtype) -> torch.Tensor:
    """``y`` moved one ulp toward the exact value where it is inexact and its last bit even."""
    even = (y.view(ints) & 1) == 0
    step = torch.nextafter(y, torch.where(up, torch.inf, -torch.inf).to(y.dtype))
    return torch.where(inexact & even, step, y)


def round_to_odd32(hi: torch.Tensor, lo: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 of the exact value ``hi + lo`` (float64) rounded to odd."""
    hi = hi.double()
    if lo is not None:  # round to odd to float64 first
        hi = _to_odd(hi, lo != 0, lo > 0, torch.int64)
    y = hi.float()
    yd = y.double()
    return _to_odd(y, (yd != hi) & torch.isfinite(hi), hi > yd, torch.int32)


def nearest32(hi: torch.Tensor, lo: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 of the exact value ``hi + lo`` (float64) rounded to nearest-even: what one
    float32 operation (a product, a sum, ``fmaf``) returns."""
    hi = hi.double()
    return (hi if lo is None else _to_odd(hi, lo != 0, lo > 0, torch.int64)).float()


def round_exact(hi: torch.Tensor, lo: Optional[torch.Tensor], fmt: Float, *,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """float32 tensor: the exact value ``hi + lo`` (float64 tensors; ``lo`` None = 0) rounded once
    to ``fmt`` by its rule (see the module docstring)."""
    check_exact(fmt, "round_exact format")
    x32 = round_to_odd32(hi, lo) if fmt.man <= 21 else nearest32(hi, lo)
    return quantize(x32, fmt, generator=generator)
