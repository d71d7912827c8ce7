"""Per-layer precision: which format each of the nine quantization points uses.

The nine points of the original simulator, for a GEMM-like layer ``y = x W``:

==========  ===============================================================
``fw``      forward, weight                 ``fi``   forward, input
``fo``      forward, output
``bwo``     weight-gradient GEMM, output gradient
``bwi``     weight-gradient GEMM, input     ``bwg``  its result (weight grad)
``bio``     input-gradient GEMM, output gradient
``biw``     input-gradient GEMM, weight     ``big``  its result (input grad)
==========  ===============================================================

``LayerPrecision`` is an immutable value; layers hold one and swap it whole
(``layer.set_format(point, fmt)`` builds the replacement).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .formats import Format, format_from_dict

POINTS = ("fw", "fi", "fo", "bwo", "bwi", "bwg", "bio", "biw", "big")
# Points whose formats the dynamic controller moves together.
LINKED_PAIRS = (("fw", "fi"), ("bio", "biw"), ("bwo", "bwi"))
BACKWARD_SOURCES = ("full", "quantized")


def check_point(point: str) -> str:
    if point not in POINTS:
        raise ValueError(f"unknown quantization point {point!r}; allowed: {', '.join(POINTS)}")
    return point


@dataclass(frozen=True)
class LayerPrecision:
    """Formats for the nine points (``None`` = keep full precision) and options.

    ``backward_source``: ``"full"`` (default) quantizes the full-precision
    tensors saved by the forward pass at the backward points, so backward
    precision can exceed forward precision; ``"quantized"`` reproduces hardware
    that keeps only the quantized forward copies (``bwi`` then starts from the
    ``fi``-quantized input, ``biw`` from the ``fw``-quantized weight).

    ``accumulator``: an accumulator-emulation spec (``bfp.accumulate``) used by
    the layer's GEMMs, or ``None`` for ordinary float32 accumulation.
    """

    fw: Optional[Format] = None
    fi: Optional[Format] = None
    fo: Optional[Format] = None
    bwo: Optional[Format] = None
    bwi: Optional[Format] = None
    bwg: Optional[Format] = None
    bio: Optional[Format] = None
    biw: Optional[Format] = None
    big: Optional[Format] = None
    backward_source: str = "full"
    accumulator: Any = None

    def __post_init__(self):
        for p in POINTS:
            f = getattr(self, p)
            if f is not None and not isinstance(f, Format):
                raise ValueError(f"point {p!r} needs a Format or None, got {f!r}")
        if self.accumulator is not None:
            from .accumulate import Accumulator  # lazy: the layer above formats
            if not isinstance(self.accumulator, Accumulator):
                raise ValueError(f"accumulator must be a bfp.accumulate.Accumulator or None, "
                                 f"got {self.accumulator!r}")
        if self.backward_source not in BACKWARD_SOURCES:
            raise ValueError(f"backward_source must be one of {BACKWARD_SOURCES}, "
                             f"got {self.backward_source!r}")

    def formats(self) -> dict[str, Optional[Format]]:
        return {p: getattr(self, p) for p in POINTS}

    @property
    def enabled(self) -> bool:
        """True when any point quantizes or an accumulator is emulated."""
        return self.accumulator is not None or any(getattr(self, p) is not None for p in POINTS)

    def with_format(self, point: str, fmt: Optional[Format]) -> "LayerPrecision":
        return dataclasses.replace(self, **{check_point(point): fmt})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {p: (None if f is None else f.to_dict()) for p, f in self.formats().items()}
        d["backward_source"] = self.backward_source
        acc = self.accumulator
        d["accumulator"] = None if acc is None else acc.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LayerPrecision":
        unknown = set(d) - set(POINTS) - {"backward_source", "accumulator"}
        if unknown:
            raise ValueError(f"unknown LayerPrecision keys {sorted(unknown)}; allowed: "
                             f"{', '.join(POINTS)}, backward_source, accumulator")
        kw: dict[str, Any] = {p: (None if d.get(p) is None else format_from_dict(d[p])) for p in POINTS}
        kw["backward_source"] = d.get("backward_source", "full")
        if d.get("accumulator") is not None:
            from .accumulate import accumulator_from_dict  # lazy: layer above formats
            kw["accumulator"] = accumulator_from_dict(d["accumulator"])
        return cls(**kw)

    def __repr__(self) -> str:
        on = ", ".join(f"{p}={getattr(self, p)!r}" for p in POINTS if getattr(self, p) is not None)
        extra = "" if self.backward_source == "full" else f", backward_source={self.backward_source!r}"
        extra += "" if self.accumulator is None else f", accumulator={self.accumulator!r}"
        return f"LayerPrecision({on or 'off'}{extra})"
