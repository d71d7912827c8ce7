"""``BlockFloat(bits, group)``: block floating point of the original BFP simulator (FlexBlock),
one shared exponent per tile of ``group`` shape, ``bits`` magnitude bits per element; its presets
FB12/FB16/FB24 and its config spec ``{"bfp": bits, "group": [..]}``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .base import _RND, Format, Rounding, Spec, _enum, _int_in, register_family


def _canon_group(group) -> tuple[int, ...]:
    if isinstance(group, int) and not isinstance(group, bool):
        group = (group,)
    try:
        group = tuple(group)
    except TypeError:
        raise ValueError(f"group must be a sequence of positive integers, got {group!r}") from None
    if not group or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in group):
        raise ValueError(f"group must be a non-empty sequence of positive integers, got {group!r}")
    return group


@dataclass(frozen=True)
class BlockFloat(Format):
    """Block floating point with the original BFP simulator's semantics.

    The tensor is cut into aligned tiles of shape ``group`` starting at index 0
    of every axis; a tile at the end of an axis is smaller (53 channels in groups
    of 8: six tiles of 8 and one of 5). If ``group`` has more entries than the
    tensor has axes only the first ``ndim`` are used (a 2-D Linear weight uses
    the first two); if it has fewer, the missing trailing axes get tile size 1.

    Per tile: ``Emax = max floor(log2|x|)`` over its finite nonzero elements
    (float32 exponents; float32 subnormals count with their true exponent), the
    LSB is ``2**(Emax - bits + 1)``, so ``bits`` counts magnitude bits including
    the leading one of the largest element; the sign is extra. Each magnitude is
    rounded to a multiple of the LSB with ``rounding``:

    * ``truncate`` (default, the original's only mode): toward zero.
      ``bits=4``: ``[1.9, 0.3, 0.1, -0.05] -> [1.875, 0.25, 0, -0]``.
    * ``nearest``: half to even, the magnitude clamped to ``2**bits - 1`` LSBs
      (a largest element that would round up to ``2**(Emax+1)`` saturates).
    * ``stochastic``: see ``Rounding``; clamped like ``nearest``.

    No subnormal/overflow cases exist beyond that clamp. A tile of zeros is left
    alone; zeros keep their sign. NaN and ±Inf are passed through unchanged and
    do not take part in the shared exponent, so they never corrupt the finite
    members of their tile (the original flushed the whole tile to zero).
    """

    bits: int
    group: tuple[int, ...]
    rounding: Rounding = Rounding.TRUNCATE

    def __post_init__(self):
        _int_in(self.bits, 1, 24, "BlockFloat bits")
        object.__setattr__(self, "group", _canon_group(self.group))
        object.__setattr__(self, "rounding", _enum(Rounding, self.rounding, "rounding"))

    def group_for(self, ndim: int) -> tuple[int, ...]:
        """The tile shape used on a tensor of rank ``ndim``."""
        g = self.group[:ndim]
        return g + (1,) * (ndim - len(g))

    @property
    def adjustable_bits(self) -> int:  # type: ignore[override]
        return self.bits

    def with_bits(self, bits: int) -> "BlockFloat":
        return dataclasses.replace(self, bits=int(bits))

    def with_rounding(self, rounding: Any) -> "BlockFloat":
        return dataclasses.replace(self, rounding=rounding)

    def legacy_spec(self) -> Optional[dict[str, Any]]:
        """``{"bits", "group"}`` in the original simulator's config form: truncating BlockFloat only."""
        return {"bits": self.bits, "group": self.group} if self.rounding is Rounding.TRUNCATE else None

    def tile_rows(self, shape: tuple[int, ...]) -> int:
        return self.group_for(len(shape))[0] if shape else 1

    def short_name(self, name_of=None) -> str:
        s = f"bfp{self.bits}[{','.join(map(str, self.group))}]"
        return s + ("" if self.rounding.value == "truncate" else _RND[self.rounding.value])

    def __repr__(self) -> str:
        return f"BlockFloat(bits={self.bits}, group={list(self.group)}, rounding={self.rounding})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "blockfloat", "bits": self.bits, "group": list(self.group),
                "rounding": self.rounding.value}


def _spec(value: Any, opts: dict[str, Any]) -> BlockFloat:
    if "group" not in opts:
        raise ValueError("a {\"bfp\": bits} spec needs \"group\": [..], e.g. [1,16,1,1]")
    return BlockFloat(value, opts["group"])


register_family("blockfloat", BlockFloat, {
    # The original simulator's presets: FB12 / FB16 / FB24.
    "fb12": BlockFloat(4, (1, 24, 3, 3)),
    "fb16": BlockFloat(8, (1, 12, 3, 3)),
    "fb24": BlockFloat(16, (1, 6, 3, 3)),
}, spec=Spec("bfp", ("bfp", "group", "rounding"), _spec, '{"bfp": bits, "group": [..]}'))
