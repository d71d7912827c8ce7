"""Turn a format and a tensor shape into the integer parameters every backend uses.

All three formats are one computation: cut the tensor into tiles (a tile of one
element for ``Float``), find each tile's largest finite magnitude, derive the
tile's scale exponent ``s`` from it, and round each element at an LSB that
depends on ``s`` (and, for float elements, on the element's own exponent).

=============  ==========================  ====================================
format         scale ``s`` of a tile       element LSB exponent ``q``
=============  ==========================  ====================================
Float          0                           ``max(e, emin) - man``
BlockFloat     ``Emax``                    ``s - bits + 1`` (kind FIXED)
MX (float)     ``clamp(Emax - emax_el)``   ``max(e, emin + s) - man``
MX (int8)      ``clamp(Emax)``             ``s - 6`` (kind FIXED)
=============  ==========================  ====================================

MX's ``s`` above is the floor scale mode; ``ceil``, ``even`` and ``rceil`` add one
to it where their test on the block maximum's significand says so (``formats.MX``),
before the E8M0 clamp.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from ..formats import BlockFloat, Encoding, Float, Format, Overflow, Rounding
from ..formats.mx import INT8, MX

KIND_FLOAT, KIND_FIXED = 0, 1
MODE = {Rounding.TRUNCATE: 0, Rounding.NEAREST: 1, Rounding.STOCHASTIC: 2}
SCALE_NONE, SCALE_BFP, SCALE_MX = 0, 1, 2
# MX scale modes: floor is SCALE_MX; the others raise the floor scale by one binade where their test says
MX_SCALE = {"floor": SCALE_MX, "ceil": 3, "even": 4, "rceil": 5}


class Rule(NamedTuple):
    """Integer parameters of the element rule (see ``scalar.quant_elem``)."""

    kind: int       # KIND_FLOAT or KIND_FIXED
    mode: int       # 0 truncate, 1 nearest, 2 stochastic
    scale: int      # SCALE_NONE, SCALE_BFP, SCALE_MX (floor) or another MX_SCALE mode
    soff: int       # MX: element emax subtracted from the tile exponent
    qoff: int       # FIXED: q = s + qoff
    lim: int        # FIXED: largest magnitude in LSBs
    emin: int       # FLOAT: smallest normal exponent (before + s)
    man: int        # FLOAT: mantissa bits
    maxkept: int    # FLOAT: largest finite significand, in LSBs of the top binade
    emaxq: int      # FLOAT: LSB exponent of the top binade (emax - man, before + s)
    ftz: int        # FLOAT: 1 = flush results below 2**(emin+s) to zero
    ovf_inf: int    # FLOAT: 1 = overflow to Inf, 0 = saturate
    inf_nan: int    # 1 = an Inf input becomes NaN (format has no Inf)


def _float_rule(f: Float, mode: int, scale: int, soff: int) -> Rule:
    fn = 1 if f.encoding is Encoding.FN else 0
    return Rule(KIND_FLOAT, mode, scale, soff, 0, 0, f.emin, f.man,
                2 ** (f.man + 1) - 1 - fn, f.emax - f.man, int(not f.subnormals),
                int(f.overflow is Overflow.INF), int(not f.has_inf))


_RULES: dict[type, Callable[[Format], Rule]] = {}


def register_rule(family: type, rule: Callable[[Format], Rule]) -> None:
    """A family the element rule rounds (Float, BlockFloat and MX below, P3109 in ``kernels/p3109``):
    ``rule(fmt)`` gives its parameters (register its kernel as ``dispatch.element_rule`` too)."""
    _RULES[family] = rule


def _mx_rule(fmt: MX) -> Rule:
    if fmt.element == INT8:
        return Rule(KIND_FIXED, MODE[Rounding.NEAREST], MX_SCALE[fmt.scale_mode], 0, -6, 127, 0, 0, 0, 0, 0, 0, 1)
    return _float_rule(fmt.element, MODE[fmt.rounding], MX_SCALE[fmt.scale_mode], fmt.element.emax)


register_rule(Float, lambda f: _float_rule(f, MODE[f.rounding], SCALE_NONE, 0))
register_rule(BlockFloat, lambda f: Rule(KIND_FIXED, MODE[f.rounding], SCALE_BFP, 0, 1 - f.bits, 2 ** f.bits - 1,
                                         0, 0, 0, 0, 0, 0, 0))
register_rule(MX, _mx_rule)


@functools.lru_cache(maxsize=256)
def rule_for(fmt: Format) -> Rule:
    """The element rule's parameters of ``fmt`` (cached: formats are frozen values,
    and this runs on every quantize call), from its family's registered rule."""
    rule = _RULES.get(type(fmt))
    if rule is None:
        raise TypeError(f"no element rule rounds {fmt!r}; families with one: "
                        f"{', '.join(c.__name__ for c in _RULES)}")
    return rule(fmt)


def tile_for(fmt: Format, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Tile shape over ``shape``, or None for element-wise formats."""
    if fmt.elementwise:
        return None
    if isinstance(fmt, BlockFloat):
        return fmt.group_for(len(shape))
    return fmt.tile(shape)  # MX: its block over the tensor


def canonical_4d(shape: tuple[int, ...], tile: tuple[int, ...]):
    """Fold ``shape``/``tile`` into at most 4 axes without changing the tiles.

    Adjacent axes merge when both are tiled by 1, both are covered whole by one
    tile, or an axis tiled by 1 is followed by one covered whole (then each tile
    is a run of consecutive elements). Returns ``(shape4, tile4)`` or None if more than 4 axes remain.
    """
    dims = [(d, min(t, d)) for d, t in zip(shape, tile) if d != 1]
    merged: list[tuple[int, int]] = []
    for d, t in dims:
        if merged:
            pd, pt = merged[-1]
            if (pt == 1 and t == 1) or (pt == pd and t == d):
                merged[-1] = (pd * d, pt * t)
                continue
            if pt == 1 and t == d:  # rows tiled whole = runs of d consecutive elements
                merged[-1] = (pd * d, d)
                continue
        merged.append((d, t))
    if len(merged) > 4:
        return None
    # Right-align: kernels sweep axis 3 (the contiguous run) in their inner loop.
    merged = [(1, 1)] * (4 - len(merged)) + merged
    return tuple(d for d, _ in merged), tuple(t for _, t in merged)
