"""The original simulator's JSON form (``conf_net/ResNet18_FB12.json``).

A ``"default"`` entry plus entries keyed by module name (``"net.conv1"``), each
with the nine ``<point>``/``<point>_bit``/``<point>_dim`` keys or
``{"type": "default"}`` for full precision. Every entry loads as an exact-name
``Rule`` whose switched-on points are truncating ``BlockFloat`` formats;
``legacy_dict`` writes a precision back in this form.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from ..formats import BlockFloat, Format  # BlockFloat: the legacy form's one format
from ..precision import POINTS, LayerPrecision
from .errors import _fail, _unknown_keys
from .rules import LEGACY_PREFIX, NetConfig, Rule

# Missing keys of a legacy entry, as the original parser filled them in:
# switch on/off, then bits and group taken from another point or a constant.
LEGACY_ON = {"fw": True, "fi": True, "fo": False, "bwo": True, "bwi": True, "bwg": False,
             "bio": True, "biw": True, "big": False}
LEGACY_BIT_FROM: dict[str, Union[str, int]] = {
    "fw": 8, "fi": "fw", "fo": "fw", "bwo": "fi", "bwi": "fi", "bwg": "fw",
    "bio": "fi", "biw": "fw", "big": "fi"}
LEGACY_DIM_FROM: dict[str, Union[str, tuple]] = {
    "fw": (16, 1, 3, 3), "fi": (4, 1, 3, 3), "fo": (1, 1, 1, 1), "bwo": "fi", "bwi": "fi",
    "bwg": (4, 1, 3, 3), "bio": "fi", "biw": "fw", "big": (1, 1, 1, 1)}
LEGACY_KEYS = ("type",) + tuple(k for p in POINTS for k in (p, f"{p}_bit", f"{p}_dim"))
# "type" of a legacy entry: full precision, or which tensor rank the shorthands build for.
LEGACY_FULL_TYPES = ("default", "torch.nn.conv2d", "torch.nn.linear", "torch.conv2d")
LEGACY_LAYER_TYPES = ("conv2d", "linear")
# Shorthand "<dir>,N": N is the group's element count; the original built these
# 4-D shapes around the 3x3 kernel (N/9 or N/3 along the named axis).
SHORTHANDS = {"wi": lambda n: (n // 9, 1, 3, 3), "wo": lambda n: (1, n // 9, 3, 3),
              "fc": lambda n: (1, n // 9, 3, 3), "fx": lambda n: (1, 1, n // 3, 3),
              "fy": lambda n: (1, 1, 3, n // 3)}
_SHORTHAND_DIVISOR = {"wi": 9, "wo": 9, "fc": 9, "fx": 3, "fy": 3}


def legacy_group(value: Any, linear: bool = False, source: str = "<dict>", where: str = "") -> tuple[int, ...]:
    """A legacy ``<point>_dim`` value as a group shape.

    ``[x, y, z, w]`` is used as written; ``1`` is "no grouping" (all ones);
    ``"<dir>,N"`` (dir in wi, wo, fc, fx, fy) is the original's shorthand for a
    group of N elements: on a Conv2d entry ``wi`` -> ``(N/9, 1, 3, 3)``,
    ``wo``/``fc`` -> ``(1, N/9, 3, 3)``, ``fx`` -> ``(1, 1, N/3, 3)``,
    ``fy`` -> ``(1, 1, 3, N/3)``; on an entry with ``"type": "Linear"`` every
    direction gives ``(N, 1)``.
    """
    allowed = "a list of positive integers like [1,24,3,3], 1, or a shorthand '<dir>,N' with dir in wi, wo, fc, fx, fy"
    if isinstance(value, bool):
        raise _fail(source, where, f"group {value!r} invalid; allowed: {allowed}")
    if value == 1:
        return (1, 1) if linear else (1, 1, 1, 1)
    if isinstance(value, (list, tuple)):
        if not value or len(value) > 4 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
            raise _fail(source, where, f"group {value!r} invalid; allowed: {allowed} (at most 4 entries)")
        return tuple(value)
    if isinstance(value, str):
        parts = value.replace(" ", "").split(",")
        d = parts[0].lower()
        if len(parts) != 2 or d not in SHORTHANDS or not parts[1].isdigit() or int(parts[1]) < 1:
            raise _fail(source, where, f"group shorthand {value!r} invalid; allowed: {allowed}")
        n = int(parts[1])
        if linear:
            return (n, 1)
        div = _SHORTHAND_DIVISOR[d]
        if n % div:
            raise _fail(source, where, f"group shorthand {value!r}: on a Conv2d entry N must be a multiple "
                                       f"of {div} ('{d},N' spans the 3x3 kernel); use an explicit list instead")
        return SHORTHANDS[d](n)
    raise _fail(source, where, f"group {value!r} invalid; allowed: {allowed}")


def _legacy_bits(value: Any, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 24:
        raise _fail(source, where, f"bits {value!r} impossible; allowed: an integer in 1..24 "
                                   "(magnitude bits per element, sign extra)")
    return value


def _legacy_inherited(point: str, bits: dict, dims: dict, linear: bool) -> tuple[int, tuple[int, ...]]:
    """The bits and group a legacy entry gives ``point`` when it does not set them."""
    src_b, src_d = LEGACY_BIT_FROM[point], LEGACY_DIM_FROM[point]
    bit = bits[src_b] if isinstance(src_b, str) else src_b
    dim = dims[src_d] if isinstance(src_d, str) else (src_d[:2] if linear else src_d)
    return bit, dim


def legacy_entry(entry: Any, source: str = "<dict>", where: str = "") -> Optional[LayerPrecision]:
    """One legacy entry as a ``LayerPrecision`` (``None`` for ``{"type": "default"}``).

    Missing keys take the original's defaults: fw/fi/bwo/bwi/bio/biw on,
    fo/bwg/big off; ``fw_bit`` 8; fi's bits and group inherited by
    bio/bwo/bwi, fw's by biw (``LEGACY_BIT_FROM``/``LEGACY_DIM_FROM``).
    Every switched-on point becomes ``BlockFloat(bit, dim, rounding="truncate")``.
    """
    if not isinstance(entry, dict):
        raise _fail(source, where, f"entry must be an object of legacy keys, got {entry!r}")
    _unknown_keys(entry, LEGACY_KEYS, source, where)
    kind = entry.get("type", "conv2d")
    if not isinstance(kind, str) or kind.lower() not in LEGACY_FULL_TYPES + LEGACY_LAYER_TYPES:
        raise _fail(source, f"{where}.type", f"{kind!r} unknown; allowed: 'default' (full precision), "
                                             "'Conv2d', 'Linear'")
    if kind.lower() in LEGACY_FULL_TYPES:
        if len(entry) > 1:
            raise _fail(source, where, f"a {{\"type\": {kind!r}}} entry keeps the layer in full precision "
                                       f"and takes no other keys, got {sorted(set(entry) - {'type'})}")
        return None
    linear = kind.lower() == "linear"
    bits: dict[str, int] = {}
    dims: dict[str, tuple[int, ...]] = {}
    formats: dict[str, Optional[Format]] = {}
    for p in POINTS:  # fw and fi come first, so inheritance sees them resolved
        on = entry.get(p, LEGACY_ON[p])
        if not isinstance(on, bool):
            raise _fail(source, f"{where}.{p}", f"{on!r} invalid; allowed: true, false")
        bits[p], dims[p] = _legacy_inherited(p, bits, dims, linear)
        if f"{p}_bit" in entry:
            bits[p] = _legacy_bits(entry[f"{p}_bit"], source, f"{where}.{p}_bit")
        if f"{p}_dim" in entry:
            dims[p] = legacy_group(entry[f"{p}_dim"], linear, source, f"{where}.{p}_dim")
        formats[p] = BlockFloat(bits[p], dims[p], rounding="truncate") if on else None
    return LayerPrecision(**formats)


def legacy_dict(precision: Optional[LayerPrecision], linear: bool = False, where: str = "") -> dict[str, Any]:
    """The explicit legacy entry (all 27 keys) that ``legacy_entry`` loads back as ``precision``.

    Points that are off get the values the original would have inherited.
    Raises ``ConfigError`` where the legacy form cannot say it (non-BFP
    formats, non-truncating rounding, backward_source or accumulator).
    """
    if precision is None or not precision.enabled:
        return {"type": "default"}
    bad = [f"{p}={f!r}" for p, f in precision.formats().items() if f is not None and f.legacy_spec() is None]
    if bad or precision.backward_source != "full" or precision.accumulator is not None:
        why = ", ".join(bad) or f"backward_source={precision.backward_source!r}, accumulator={precision.accumulator!r}"
        raise _fail("generate_config", where, f"the legacy form holds only truncating BlockFloat points, got {why}; "
                                              "save NetConfig.to_dict() or bfp.precision_state(model) instead")
    out: dict[str, Any] = {"type": "Linear" if linear else "Conv2d"}
    bits: dict[str, int] = {}
    dims: dict[str, tuple] = {}
    for p in POINTS:
        f = getattr(precision, p)
        spec = f.legacy_spec() if f is not None else None
        bits[p], dims[p] = (spec["bits"], spec["group"]) if spec else _legacy_inherited(p, bits, dims, linear)
        out.update({p: f is not None, f"{p}_bit": bits[p], f"{p}_dim": list(dims[p])})
    return out


def _parse_legacy_form(d: dict, source: str) -> NetConfig:
    default = None
    rules = []
    seen: dict[str, str] = {}
    for key, entry in d.items():
        if key == "default":
            default = legacy_entry(entry, source, "default")
            continue
        if not isinstance(entry, dict):
            raise _fail(source, key, f"a layer entry must be an object of legacy keys, got {entry!r} (top-level "
                                     "keys of the original form are \"default\" and module names; for the rule "
                                     "form add \"version\": 1)")
        plain = key[len(LEGACY_PREFIX):] if key.startswith(LEGACY_PREFIX) else key
        if plain in seen:
            raise _fail(source, key, f"names the same layer as {seen[plain]!r}")
        seen[plain] = key
        rules.append(Rule(key, legacy_entry(entry, source, key), where=repr(key), kind="exact"))
    return NetConfig(tuple(rules), default, source)
