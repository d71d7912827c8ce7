"""The rule form's values: format specs and precision specs.

A format is a name (``"fb16"``) or a spec object (``{"bfp": 4, "group": [..]}``,
``{"float": [4, 3]}``, ``{"mx": "e2m1"}``, ``{"name": .., "rounding": ..}``,
or a saved ``Format.to_dict()``); a precision is ``"full"``, a format for the
six GEMM operands, or an object of per-point formats and options. Both parse
to the value types of ``bfp.formats`` and ``bfp.precision`` and write back
(``precision_spec``).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..formats import Format, format_from_dict, format_from_name, spec_families
from ..precision import (BACKWARD_SOURCES, POINTS, Accumulator, LayerPrecision, accumulator_from_dict,
                         hadamard_from_dict)
from ..tensorcore import FUSED_PRESETS, accumulator_from_name
from .errors import ConfigError, _fail, _unknown_keys

# The six GEMM operands (``"operands"`` in the rule form sets all of them).
OPERANDS = ("fw", "fi", "bwo", "bwi", "bio", "biw")
FULL = "full"  # the precision value that keeps a layer in full precision


def format_spec_keys() -> dict[str, tuple[str, ...]]:
    """Each family's spec key -> the keys its object takes (the families own them:
    ``bfp.formats.spec_families``), and ``{"name": .., "rounding": ..}``."""
    return {**{k: sp.keys for k, sp in spec_families().items()}, "name": ("name", "rounding")}


def _format_allowed() -> str:
    objs = ", ".join(sp.example for sp in spec_families().values())
    return ("a format name (bfp.format_names(), e.g. 'fb16', 'float8_e4m3fn', 'mxfp8_e4m3'), null, or an object "
            f"{objs}, {{\"name\": name, \"rounding\": ..}} or a saved format dict with \"kind\"")


def with_rounding(fmt: Format, rounding: str) -> Format:
    """``fmt`` with its rounding mode replaced (an MX format's element rounding)."""
    return fmt.with_rounding(rounding)


def parse_format(value: Any, rounding: Optional[str] = None, source: str = "<dict>",
                 where: str = "") -> Optional[Format]:
    """A format name or spec (see ``_format_allowed``) as a ``Format``; ``None`` for null.

    ``rounding``, when given, replaces the rounding of a named format and is
    the default of a spec that does not set its own.
    """
    try:
        if value is None:
            return None
        if isinstance(value, str):
            fmt = format_from_name(value)
            return fmt if rounding is None else with_rounding(fmt, rounding)
        if not isinstance(value, dict):
            raise ValueError(f"{value!r} is not a format")
        if "kind" in value:  # a saved Format.to_dict(): complete as it stands
            return format_from_dict(value)
        keys = format_spec_keys()
        family = [k for k in keys if k in value]
        if len(family) != 1:
            raise ValueError(f"{value!r} needs exactly one of {', '.join(repr(k) for k in keys)}")
        family = family[0]
        _unknown_keys(value, keys[family], source, where)
        rnd = value.get("rounding", rounding)
        opts = {k: v for k, v in value.items() if k not in (family, "rounding")}
        specs = spec_families()
        fmt = specs[family].parse(value[family], opts) if family in specs else format_from_name(value["name"])
        return fmt if rnd is None else with_rounding(fmt, rnd)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise _fail(source, where, f"{e}; allowed: {_format_allowed()}") from None


SPEC_KEYS = POINTS + ("operands", "rounding", "backward_source", "accumulator", "rht")
INHERITED_KEYS = ("rounding", "backward_source", "accumulator", "rht")


def parse_precision(value: Any, inherited: Optional[Mapping[str, Any]] = None, source: str = "<dict>",
                    where: str = "") -> Optional[LayerPrecision]:
    """A precision spec of the rule form as a ``LayerPrecision``; ``None`` for ``"full"``/null.

    A string other than ``"full"`` is a format for all six GEMM operands. An
    object takes ``operands`` (fw, fi, bwo, bwi, bio, biw), the nine point
    keys (which override ``operands``; null = off), ``rounding``,
    ``backward_source``, ``accumulator`` and ``rht`` (a Hadamard transform of the
    weight-gradient inputs: a block size or ``{"block": 16, "seed": 0}``); the last four
    default to the config's top-level values (``inherited``).
    """
    if value is None or value == FULL:
        return None
    if isinstance(value, str):
        value = {"operands": value}
    if not isinstance(value, dict):
        raise _fail(source, where, f"precision {value!r} invalid; allowed: \"full\", null, a format name, "
                                   f"or an object with keys {', '.join(SPEC_KEYS)}")
    _unknown_keys(value, SPEC_KEYS, source, where)
    spec = {**(inherited or {}), **value}
    rounding = spec.get("rounding")
    if rounding is not None and rounding not in ("truncate", "nearest", "stochastic"):
        raise _fail(source, f"{where}.rounding", f"{rounding!r} unknown; allowed: 'truncate', 'nearest', 'stochastic'")
    kw: dict[str, Any] = {}
    ops = parse_format(value.get("operands"), rounding, source, f"{where}.operands")
    for p in POINTS:
        if p in value:
            kw[p] = parse_format(value[p], rounding, source, f"{where}.{p}")
        elif p in OPERANDS:
            kw[p] = ops
    bsrc = spec.get("backward_source", "full")
    if bsrc not in BACKWARD_SOURCES:
        raise _fail(source, f"{where}.backward_source", f"{bsrc!r} unknown; allowed: {', '.join(BACKWARD_SOURCES)}")
    kw["backward_source"] = bsrc
    kw["accumulator"] = parse_accumulator(spec.get("accumulator"), source, f"{where}.accumulator")
    if spec.get("rht") is not None:  # {"block": 16, "seed": 0} or a block size
        try:
            kw["rht"] = hadamard_from_dict(spec["rht"])
        except (ValueError, TypeError) as e:
            raise _fail(source, f"{where}.rht", str(e)) from None
    try:
        return LayerPrecision(**kw)
    except ValueError as e:
        raise _fail(source, where, str(e)) from None


def _tensorcore(value: Any, source: str, where: str):
    """A tensor core's fused adder: a preset name (``"h100_fp8"``), ``{"tensorcore": NAME, <fields to
    override, e.g. "gemms">}``, or a full ``FusedAccumulator.to_dict``."""
    try:
        if isinstance(value, str):
            return accumulator_from_name(value)
        if "tensorcore" in value:
            base = accumulator_from_name(value["tensorcore"]).to_dict()
            return accumulator_from_dict({**base, **{k: v for k, v in value.items() if k != "tensorcore"}})
        return accumulator_from_dict(value)
    except (ValueError, TypeError) as e:
        raise _fail(source, where, str(e)) from None


def parse_accumulator(value: Any, source: str = "<dict>", where: str = "") -> Optional[Accumulator]:
    """``{"fmt": <format name or spec>, "chunk": 32, "kahan": false, "gemms": [...], "mul": <format>,
    "fma": false, "exact": false}`` (the last three optional), a tensor core's adder (a preset name
    such as ``"h100_fp8_fast"``, or ``{"tensorcore": NAME, ...overrides}``; ``bfp.tensorcore``), or null."""
    if value is None:
        return None
    if value in FUSED_PRESETS if isinstance(value, str) else \
            isinstance(value, dict) and ("tensorcore" in value or value.get("kind") == "tensorcore"):
        return _tensorcore(value, source, where)
    if not isinstance(value, dict) or "fmt" not in value:
        raise _fail(source, where, f"{value!r} invalid; allowed: null or {{\"fmt\": format, \"chunk\": int, "
                                   "\"kahan\": bool, \"gemms\": [\"forward\", \"input_grad\", \"weight_grad\"], "
                                   "\"mul\": format, \"fma\": bool, \"exact\": bool}, or a tensor-core preset "
                                   f"name ({', '.join(FUSED_PRESETS)})")
    formats = {k: parse_format(value[k], None, source, f"{where}.{k}").to_dict()
               for k in ("fmt", "mul") if value.get(k) is not None}
    try:
        return accumulator_from_dict({**value, **formats})
    except ValueError as e:
        raise _fail(source, where, str(e)) from None


def precision_spec(precision: Optional[LayerPrecision]) -> Any:
    """The rule-form spec that ``parse_precision`` loads back as ``precision``."""
    if precision is None:
        return FULL
    d = precision.to_dict()
    return {k: v for k, v in d.items() if k in POINTS or v is not None}
