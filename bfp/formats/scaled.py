"""FP8 with a scaling factor: torchao's and TransformerEngine's "current scaling" of a float
format by the tensor's (or each row's) amax, as a ``Format`` the quantization points take.

``quantize(x, Scaled(fmt, granularity, axis, pow2))``, every step float32, in this order
(torchao's ``Float8Tensor`` casting with ``ScalingType.DYNAMIC``):

1. ``amax``: the largest finite magnitude of the tensor (``granularity="tensor"``) or of each
   slice along ``axis`` (``"row"``: one scale per row of a ``[M, K]`` activation with
   ``axis=-1``, torchao's rowwise scaling). An amax of zero gives scale 1.
2. ``scale = fmt.max / amax`` (float32 division); with ``pow2`` rounded down to a power of
   two (``2**floor(log2 scale)``, torchao's ``round_scales_to_power_of_2``), which makes the
   scaling itself exact.
3. ``q = fmt(clamp(x * scale, -fmt.max, fmt.max))``: ``x * scale`` rounded to float32, then
   to ``fmt`` with its own rounding (nearest-even by default; stochastic allowed).
4. The result is ``q / scale`` (float32 division: what dequantising computes).

Overflow: none: step 3 clamps (saturation), so an Inf input becomes ``±fmt.max / scale``
(torchao's clamp does the same). NaN stays NaN and takes no part in amax. Underflow: values
below ``fmt``'s smallest subnormal after scaling flush to zero, as in ``fmt``.
Double rounding (``x * scale`` to float32, then to ``fmt``; without ``pow2``) is the
recipe's own and is reproduced.

Delayed scaling (``history=N``, TransformerEngine's default recipe, per tensor only): step 1
uses the largest amax of the point's previous ``N`` roundings instead of this tensor's (scale
1 before the first), and this tensor's amax then enters the history (the oldest leaves), in
training mode only (evaluation reads the history, never moves it). A
value above ``fmt.max / scale`` therefore saturates: the overflow delayed scaling trades for
not reading the tensor first. The history is state of the layer that owns the point (a
buffer ``amax_history_<point>``, saved in checkpoints and restored bit for bit); it is kept
per process and updated at every rounding (each emulated worker's micro-batch adds one
entry), where TransformerEngine reduces amax over ranks. ``bfp.quantize`` alone, without a
layer, refuses a delayed format.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .base import Format, Spec, format_from_dict, format_from_name, register_family
from .float import Float, float_element

GRANULARITIES = ("tensor", "row")


@dataclass(frozen=True)
class Scaled(Format):
    """``fmt`` (a ``Float``) after scaling by ``fmt.max / amax`` (module docstring)."""

    fmt: Float
    granularity: str = "tensor"
    axis: int = -1
    pow2: bool = False
    history: int = 0

    def __post_init__(self):
        fmt = format_from_name(self.fmt) if isinstance(self.fmt, str) else self.fmt
        if isinstance(fmt, dict):
            fmt = format_from_dict(fmt)
        if not isinstance(fmt, Float):
            raise ValueError(f"Scaled needs a Float format to scale into, got {self.fmt!r}")
        object.__setattr__(self, "fmt", fmt)
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"Scaled granularity {self.granularity!r} unknown; allowed: {', '.join(GRANULARITIES)}")
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ValueError(f"Scaled axis must be an integer, got {self.axis!r}")
        if not isinstance(self.pow2, bool):
            raise ValueError(f"Scaled pow2 must be True or False, got {self.pow2!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or not 0 <= self.history <= 4096:
            raise ValueError(f"Scaled history must be an integer in [0, 4096] (0: current scaling), "
                             f"got {self.history!r}")
        if self.history and self.granularity != "tensor":
            raise ValueError("Scaled history (delayed scaling) is per tensor: use granularity='tensor'")

    @property
    def delayed(self) -> bool:
        return self.history > 0

    @property
    def rounding(self):
        return self.fmt.rounding

    chunkable = False  # its scale comes from the whole tensor (or whole rows)

    @property
    def history_length(self) -> int:
        return self.history

    def scale_axis(self) -> Optional[int]:
        return self.axis

    def with_rounding(self, rounding: Any) -> "Scaled":
        return dataclasses.replace(self, fmt=dataclasses.replace(self.fmt, rounding=rounding))

    def short_name(self, name_of=None) -> str:
        where = "t" if self.granularity == "tensor" else f"r@{self.axis}"
        inner = name_of(self.fmt) if name_of is not None else self.fmt.short_name()
        return f"{inner}*{where}" + ("/pow2" if self.pow2 else "")

    def __repr__(self) -> str:
        where = "tensor" if self.granularity == "tensor" else f"row, axis={self.axis}"
        extra = (", pow2" if self.pow2 else "") + (f", history={self.history}" if self.history else "")
        return f"Scaled(e{self.fmt.exp}m{self.fmt.man}, {where}{extra})"

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": "scaled", "fmt": self.fmt.to_dict(), "granularity": self.granularity, "axis": self.axis,
             "pow2": self.pow2}
        if self.history:
            d["history"] = self.history
        return d


def _presets() -> dict[str, Scaled]:
    out = {}
    for el in ("e4m3", "e5m2"):
        fmt = format_from_name(el)
        out[f"fp8_{el}_tensorwise"] = Scaled(fmt)
        out[f"fp8_{el}_rowwise"] = Scaled(fmt, "row")
        out[f"fp8_{el}_rowwise_pow2"] = Scaled(fmt, "row", pow2=True)
        out[f"fp8_{el}_delayed"] = Scaled(fmt, history=16)  # TransformerEngine's default history: 1024
    return out


register_family("scaled", Scaled, _presets(),
                spec=Spec("scaled", ("scaled", "granularity", "axis", "pow2", "rounding"),
                          lambda v, o: Scaled(float_element(v), **o), '{"scaled": "e4m3", "granularity": "row"}'))
