"""OCP Microscaling (MX v1.0) block formats: elements of a ``Float`` (or MXINT8) sharing one
E8M0 power-of-two scale per block, with the scale's rounding modes.

A family of its own in the ``bfp.formats`` package (as ``nvfp4`` and ``scaled``): it registers
its ``to_dict`` kind ``"mx"``, the presets ``mxfp8_e4m3`` ... ``mxint8`` and the names with a
scale mode (``mxfp8_e4m3_rceil``) with ``bfp.formats``. Numerics in ``MX``'s docstring and
``docs/formats.md``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

from .base import _RND, Format, Overflow, Rounding, Spec, block_shape, format_from_dict, format_from_name, register_family
from .float import Float, float_element

__all__ = ["INT8", "MX", "MX_SCALE_MODES"]

INT8 = "int8"


MX_SCALE_MODES = ("floor", "ceil", "even", "rceil")


@dataclass(frozen=True)
class MX(Format):
    """OCP Microscaling (MX v1.0) block format.

    ``block`` consecutive elements along ``axis`` (aligned from index 0; the tail
    block is smaller) share an E8M0 scale ``2**s`` with
    ``s = floor(log2(amax)) - emax_elem`` clamped to E8M0's ``[-127, 127]``,
    ``amax`` the largest finite magnitude of the block. Each element is then
    ``element`` rounded as ``Float`` rounds, scaled by ``2**s`` (exactly: no
    division happens), with its rounding (nearest-even by default), its
    subnormals, and saturation to ``±max * 2**s``. ``element="int8"`` is
    MXINT8: two's complement with an implicit ``2**-6``, i.e. magnitudes
    rounded to multiples of ``2**(s-6)`` and clamped to ``127 * 2**(s-6)``
    (``emax_elem = 0``).

    ``block`` may be a tuple (a 2-D block, e.g. ``(16, 16)``): its last entry runs along
    ``axis``, the one before along ``axis - 1``, and so on; the block's elements share one
    scale. A weight and its transpose then see the same tiles (the NVFP4 recipe's 16x16
    weight blocks).

        ``scale_mode`` chooses how the scale follows ``amax`` (the E8M0 clamp comes after):

    * ``"floor"`` (OCP MX v1.0): ``s = floor(log2 amax) - emax_elem``. The block
      maximum lands in the element's top binade and may exceed the element's
      largest value (E4M3: up to ~1.99 x 2^8 against 448 = 1.75 x 2^8): it saturates.
    * ``"ceil"``: ``s = ceil(log2 amax) - emax_elem``, one binade up unless amax is
      a power of two: nothing saturates, small values lose a bit more.
    * ``"even"``: ``amax`` first rounded to the element's mantissa bits (half up,
      microxcaling/torchao "EVEN"), then floor: one binade up exactly when amax
      would round into the next binade.
    * ``"rceil"`` (NVIDIA's MXFP8 recipe, cuBLAS block scaling):
      ``s = ceil(log2(amax / element max))``, the smallest scale at which the
      block maximum fits without saturating. Computed exactly here; torchao
      (0.18) divides, ``amax / max`` in float32, then takes ``ceil(torch.log2(...))``
      in float32, whose log2 of ``2**k * (1 + ulp)`` rounds to exactly ``k``: one
      binade lower than the exact rule there.

    Blocks of zeros are left alone. NaN and ±Inf do not take part in ``amax``;
    NaN stays NaN and Inf becomes NaN (MX elements have no Inf). Unlike the OCP
    spec, which would make the whole block NaN, the finite members are kept:
    a simulator should not hide where a non-finite value came from.
    """

    element: Union[Float, str]
    block: int = 32
    axis: int = -1
    scale_mode: str = "floor"

    def __post_init__(self):
        el = self.element
        if isinstance(el, str) and el != INT8:
            el = format_from_name(el)
            if not isinstance(el, Float):
                raise ValueError(f"MX element must be a Float format or 'int8', got {self.element!r}")
        if not (isinstance(el, Float) or el == INT8):
            raise ValueError(f"MX element must be a Float format or 'int8', got {el!r}")
        if isinstance(el, Float) and el.overflow is not Overflow.SATURATE:
            raise ValueError("MX elements saturate (OCP MX v1.0): use overflow='saturate'")
        object.__setattr__(self, "element", el)
        object.__setattr__(self, "block", block_shape(self.block, "MX"))
        if self.scale_mode not in MX_SCALE_MODES:
            raise ValueError(f"MX scale_mode {self.scale_mode!r} unknown; allowed: {', '.join(MX_SCALE_MODES)}")
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ValueError(f"MX axis must be an integer, got {self.axis!r}")

    @property
    def rounding(self) -> Rounding:
        return self.element.rounding if isinstance(self.element, Float) else Rounding.NEAREST

    @property
    def emax_elem(self) -> int:
        return self.element.emax if isinstance(self.element, Float) else 0

    @property
    def element_max(self) -> float:
        """Largest element magnitude before the block scale ``2**s``: the Float's ``max``,
        or MXINT8's ``127 * 2**-6``."""
        return self.element.max if isinstance(self.element, Float) else 127 * 2.0 ** -6

    def tile(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The block's extent over every axis of a tensor of ``shape`` (its last axis on ``axis``)."""
        ndim = max(len(shape), 1)
        axis = self.axis + ndim if self.axis < 0 else self.axis
        if not 0 <= axis < ndim:
            raise ValueError(f"MX axis {self.axis} is out of range for a tensor of shape {tuple(shape)}")
        block = self.block if isinstance(self.block, tuple) else (self.block,)
        if axis - len(block) + 1 < 0:
            raise ValueError(f"MX block {'x'.join(map(str, block))} ending on axis {self.axis} needs {len(block)} "
                             f"axes up to it; a tensor of shape {tuple(shape)} has {axis + 1}")
        tile = [1] * ndim
        for k, b in enumerate(reversed(block)):
            tile[axis - k] = b
        return tuple(tile)

    def tile_rows(self, shape: tuple[int, ...]) -> int:
        return self.tile(shape)[0] if shape else 1

    def scale_axis(self) -> Optional[int]:
        return self.axis

    def contraction_axis(self) -> Optional[int]:
        return self.axis if isinstance(self.block, int) else None

    def with_rounding(self, rounding: Any) -> "MX":
        if not isinstance(self.element, Float):
            if Rounding(rounding) is not Rounding.NEAREST:
                raise ValueError(f"MX int8 elements round to nearest only, got rounding={rounding!r}")
            return self
        return dataclasses.replace(self, element=dataclasses.replace(self.element, rounding=rounding))

    def overflow_limit(self) -> float:
        return self.element_max * 2.0 ** 127

    def short_name(self, name_of=None) -> str:
        el = "int8" if isinstance(self.element, str) else f"e{self.element.exp}m{self.element.man}"
        extra = "" if self.rounding.value == "nearest" else _RND[self.rounding.value]
        mode = "" if self.scale_mode == "floor" else f"/{self.scale_mode}"
        block = "x".join(map(str, self.block)) if isinstance(self.block, tuple) else self.block
        return f"mx:{el}/{block}@{self.axis}{mode}{extra}"

    def __repr__(self) -> str:
        el = "int8" if self.element == INT8 else f"e{self.element.exp}m{self.element.man}"
        rnd = "" if self.rounding is Rounding.NEAREST else f", rounding={self.rounding}"
        sm = "" if self.scale_mode == "floor" else f", scale_mode={self.scale_mode}"
        block = "x".join(map(str, self.block)) if isinstance(self.block, tuple) else self.block
        return f"MX({el}, block={block}, axis={self.axis}{rnd}{sm})"

    def to_dict(self) -> dict[str, Any]:
        el = self.element if self.element == INT8 else self.element.to_dict()
        d = {"kind": "mx", "element": el, "block": list(self.block) if isinstance(self.block, tuple) else self.block,
             "axis": self.axis}
        if self.scale_mode != "floor":  # older saved dicts have none: floor
            d["scale_mode"] = self.scale_mode
        return d


def _from_dict(element: Any, **kw: Any) -> MX:
    return MX(element if element == INT8 else format_from_dict(element), **kw)


def _by_name(key: str) -> Optional[MX]:
    """An MX preset's name with a scale mode appended (``mxfp8_e4m3_rceil``), else None."""
    base, _, mode = key.rpartition("_")
    if mode not in MX_SCALE_MODES or not base:
        return None
    try:
        fmt = format_from_name(base)
    except ValueError:
        return None
    return dataclasses.replace(fmt, scale_mode=mode) if isinstance(fmt, MX) else None


register_family("mx", _from_dict, {
    "mxfp8_e4m3": MX("float8_e4m3fn"), "mxfp8_e5m2": MX("float8_e5m2"), "mxfp6_e3m2": MX("float6_e3m2fn"),
    "mxfp6_e2m3": MX("float6_e2m3fn"), "mxfp4_e2m1": MX("float4_e2m1fn"), "mxint8": MX(INT8)},
    by_name=_by_name,
    spec=Spec("mx", ("mx", "block", "axis", "rounding", "scale_mode"), lambda v, o: MX(float_element(v), **o),
              '{"mx": element, "block": 32, "axis": -1, "scale_mode": "rceil"}'),
    name_hint=f"an MX name may end in a scale mode: _{', _'.join(MX_SCALE_MODES)}, e.g. mxfp8_e4m3_rceil")
