"""Overflow of simulated gradient formats: a per-step flag the quantization points raise.

A dynamic loss scaler learns its scale from overflows. Real float16 overflows
show up as Inf/NaN in the parameter gradients; a simulated gradient format
does not overflow that way: ``float8_e5m2`` with ``overflow="saturate"``
(the default) turns 2^16 x a gradient into +-57344, a finite value, and the
scaler would never back off while every step trains on clipped gradients.

So the backward quantization points (``bio``, ``bwo``, ``big``, ``bwg``, see
``bfp.functional``) report what they are about to round: while a
``OverflowFlag`` is *watching* (``with watching(flag): loss.backward()``),
each point computes ``amax = max |t|`` of its input and raises the flag when
``not amax <= overflow_limit(fmt)``. The comparison is written that way so that
one test catches the three cases:

* a finite magnitude beyond the format's largest finite value (the point will
  saturate it, or round it to Inf where ``overflow="inf"``); values between
  ``max`` and ``max + ulp/2``, which round to ``max``, count as overflow too:
  the test is on the input, not on the rounded result;
* ``+-Inf`` (greater than every finite limit);
* NaN (the max, ``torch.linalg.vector_norm(t, inf)``, propagates NaN, and every
  comparison with NaN is False).

The limits (``overflow_limit``): ``Float``: its ``max``; ``MX``: the element's
``max`` times the largest E8M0 scale ``2**127`` (MX only saturates beyond
that); ``BlockFloat``: float32's largest value, so only Inf/NaN count (a
shared exponent has float32's range; the rounding clamp of the largest element
of a tile is rounding, not range overflow).

Cost: one max-magnitude reduction (no ``|t|`` temporary) per gradient point and backward, kept
on the tensor's device (no host sync) and folded into one boolean tensor that
``OverflowFlag.pop`` hands to the loss scaler, which reads it with the same
single sync it already needs for the parameter gradients. Nothing is checked
while no flag is watching (one global lookup per point), and the quantized
values never change: the check only reads the tensor.

The flag is a module global, not thread-local: autograd runs CUDA backward
ops on its own device threads, which must see the flag the step set.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch

from .formats import Format

__all__ = ["GRADIENT_POINTS", "OverflowFlag", "overflow_limit", "watching", "check", "active"]

#: The backward points whose values scale with the loss scale, and the gradient all-reduce
#: (``reduce``: each worker's gradient before it is rounded to the reduction's format, and every
#: partial sum before it is rounded, ``bfp.distributed.reduce``).
GRADIENT_POINTS = ("bio", "bwo", "big", "bwg", "reduce")

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def overflow_limit(fmt: Format) -> float:
    """The largest magnitude ``fmt`` represents without saturating (see the module docstring)."""
    if isinstance(fmt, Format):
        return fmt.overflow_limit()
    raise ValueError(f"overflow_limit: unknown format {fmt!r}")


class OverflowFlag:
    """One boolean tensor, raised by any watched point that overflows, until ``pop``."""

    def __init__(self):
        self._found: Optional[torch.Tensor] = None
        self.points: list[str] = []   # names of the points that checked, in order (for tests/debugging)

    def check(self, point: str, t: torch.Tensor, fmt: Format) -> None:
        if t.numel() == 0:
            return
        bad = ~(torch.linalg.vector_norm(t.detach(), math.inf) <= overflow_limit(fmt))  # max |t|, no |t| copy
        self._found = bad if self._found is None else self._found.logical_or(bad.to(self._found.device))
        self.points.append(point)

    def pop(self) -> Optional[torch.Tensor]:
        """The flag of everything checked since the last ``pop`` (None: nothing was checked); resets."""
        found, self._found = self._found, None
        self.points = []
        return found


_ACTIVE: Optional[OverflowFlag] = None


@contextlib.contextmanager
def watching(flag: Optional[OverflowFlag]) -> Iterator[None]:
    """Gradient points check into ``flag`` inside the block (``None``: nothing is checked)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, flag
    try:
        yield
    finally:
        _ACTIVE = previous


def active() -> bool:
    """Whether a flag is watching: the backward points' inputs are then read (``check``)."""
    return _ACTIVE is not None


def check(point: str, t: torch.Tensor, fmt: Optional[Format]) -> None:
    """Called by ``bfp.functional`` before a backward point rounds ``t`` to ``fmt``."""
    if _ACTIVE is not None and fmt is not None and point in GRADIENT_POINTS:
        _ACTIVE.check(point, t, fmt)
