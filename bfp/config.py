"""Network configs: which layers of a model quantize, and to which formats.

Two JSON forms load into the same typed objects (``docs/configs.md`` has every
key, the shorthands and examples):

* the original simulator's form (``conf_net/ResNet18_FB12.json``): a
  ``"default"`` entry plus entries keyed by module name (``"net.conv1"``), each
  with the nine ``<point>``/``<point>_bit``/``<point>_dim`` keys or
  ``{"type": "default"}`` for full precision;
* the rule form (``{"version": 1, "rules": [...]}``): per point a format name or
  spec, rounding, backward source, accumulator, and ordered rules matched on
  module names (exact, glob or ``re:`` regex), first match wins.

``NetConfig`` holds the ordered rules and resolves them to a
``LayerPrecision`` (or ``None`` = full precision) per module name. It knows
module names and type names only; swapping modules is ``bfp.convert``'s job.
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from .formats import MX, BlockFloat, Float, Format, format_from_dict, format_from_name
from .precision import BACKWARD_SOURCES, POINTS, LayerPrecision


class ConfigError(ValueError):
    """A network config that cannot be loaded or applied.

    The message names the source (file path or ``<dict>``), the key and what is
    allowed there.
    """


# Module types a config can address: the float type names of bfp.layers' Q-layers.
CONVERTIBLE_TYPES = ("Conv1d", "Conv2d", "Linear", "Matmul")
# The six GEMM operands (``"operands"`` in the rule form sets all of them).
OPERANDS = ("fw", "fi", "bwo", "bwi", "bio", "biw")
FULL = "full"  # the precision value that keeps a layer in full precision


def _fail(source: str, where: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {where}: {msg}" if where else f"{source}: {msg}")


def _unknown_keys(keys, allowed, source: str, where: str) -> None:
    bad = [k for k in keys if k not in allowed]
    if not bad:
        return
    hints = []
    for k in bad:
        close = difflib.get_close_matches(str(k), list(allowed), n=1)
        hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise _fail(source, where, f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(hints)}; "
                               f"allowed: {', '.join(allowed)}")


def _suggest(name: str, candidates, n: int = 3) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""


# -- the original simulator's form ----------------------------------------------------

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
LEGACY_PREFIX = "net."


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
    bad = [f"{p}={f!r}" for p, f in precision.formats().items()
           if f is not None and not (isinstance(f, BlockFloat) and f.rounding.value == "truncate")]
    if bad or precision.backward_source != "full" or precision.accumulator is not None:
        why = ", ".join(bad) or f"backward_source={precision.backward_source!r}, accumulator={precision.accumulator!r}"
        raise _fail("generate_config", where, f"the legacy form holds only truncating BlockFloat points, got {why}; "
                                              "save NetConfig.to_dict() or bfp.precision_state(model) instead")
    out: dict[str, Any] = {"type": "Linear" if linear else "Conv2d"}
    bits: dict[str, int] = {}
    dims: dict[str, tuple] = {}
    for p in POINTS:
        f = getattr(precision, p)
        bits[p], dims[p] = (f.bits, f.group) if f is not None else _legacy_inherited(p, bits, dims, linear)
        out.update({p: f is not None, f"{p}_bit": bits[p], f"{p}_dim": list(dims[p])})
    return out


# -- the rule form: formats and precision specs ---------------------------------------

FORMAT_SPEC_KEYS = {
    "bfp": ("bfp", "group", "rounding"),
    "float": ("float", "rounding", "subnormals", "overflow", "encoding"),
    "mx": ("mx", "block", "axis", "rounding"),
    "name": ("name", "rounding"),
}
_FORMAT_ALLOWED = ("a format name (bfp.format_names(), e.g. 'fb16', 'float8_e4m3fn', 'mxfp8_e4m3'), "
                   "null, or an object {\"bfp\": bits, \"group\": [..]}, {\"float\": [exp, man]}, "
                   "{\"mx\": element, \"block\": 32, \"axis\": -1}, {\"name\": name, \"rounding\": ..} "
                   "or a saved format dict with \"kind\"")


def with_rounding(fmt: Format, rounding: str) -> Format:
    """``fmt`` with its rounding mode replaced (an MX format's element rounding)."""
    if isinstance(fmt, (Float, BlockFloat)):
        return dataclasses.replace(fmt, rounding=rounding)
    if isinstance(fmt, MX):
        if not isinstance(fmt.element, Float):
            if rounding != "nearest":
                raise ValueError(f"MX int8 elements round to nearest only, got rounding={rounding!r}")
            return fmt
        return dataclasses.replace(fmt, element=dataclasses.replace(fmt.element, rounding=rounding))
    raise ValueError(f"cannot set rounding on {fmt!r}")


def _float_element(value: Any) -> Union[Float, str]:
    if value == "int8":
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return Float(*value)
    el = format_from_name(value)
    if not isinstance(el, Float):
        raise ValueError(f"{value!r} is not a Float format")
    return el


def parse_format(value: Any, rounding: Optional[str] = None, source: str = "<dict>",
                 where: str = "") -> Optional[Format]:
    """A format name or spec (see ``_FORMAT_ALLOWED``) as a ``Format``; ``None`` for null.

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
        family = [k for k in FORMAT_SPEC_KEYS if k in value]
        if len(family) != 1:
            raise ValueError(f"{value!r} needs exactly one of {', '.join(repr(k) for k in FORMAT_SPEC_KEYS)}")
        family = family[0]
        _unknown_keys(value, FORMAT_SPEC_KEYS[family], source, where)
        rnd = value.get("rounding", rounding)
        opts = {k: v for k, v in value.items() if k not in (family, "rounding")}
        if family == "bfp":
            if "group" not in opts:
                raise ValueError("a {\"bfp\": bits} spec needs \"group\": [..], e.g. [1,16,1,1]")
            fmt: Format = BlockFloat(value["bfp"], opts["group"])
        elif family == "float":
            f = value["float"]
            base = Float(*f) if isinstance(f, (list, tuple)) and len(f) == 2 else _float_element(f)
            if not isinstance(base, Float):
                raise ValueError(f"'float' needs [exp, man] or a Float format name, got {f!r}")
            fmt = dataclasses.replace(base, **opts)
        elif family == "mx":
            fmt = MX(_float_element(value["mx"]), **opts)
        else:
            fmt = format_from_name(value["name"])
        return fmt if rnd is None else with_rounding(fmt, rnd)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise _fail(source, where, f"{e}; allowed: {_FORMAT_ALLOWED}") from None


SPEC_KEYS = POINTS + ("operands", "rounding", "backward_source", "accumulator")
INHERITED_KEYS = ("rounding", "backward_source", "accumulator")


def parse_precision(value: Any, inherited: Optional[Mapping[str, Any]] = None, source: str = "<dict>",
                    where: str = "") -> Optional[LayerPrecision]:
    """A precision spec of the rule form as a ``LayerPrecision``; ``None`` for ``"full"``/null.

    A string other than ``"full"`` is a format for all six GEMM operands. An
    object takes ``operands`` (fw, fi, bwo, bwi, bio, biw), the nine point
    keys (which override ``operands``; null = off), ``rounding``,
    ``backward_source`` and ``accumulator``; the last three default to the
    config's top-level values (``inherited``).
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
    try:
        return LayerPrecision(**kw)
    except ValueError as e:
        raise _fail(source, where, str(e)) from None


def parse_accumulator(value: Any, source: str = "<dict>", where: str = ""):
    """``{"fmt": <format name or spec>, "chunk": 32, "kahan": false, "gemms": [...]}`` or null."""
    if value is None:
        return None
    if not isinstance(value, dict) or "fmt" not in value:
        raise _fail(source, where, f"{value!r} invalid; allowed: null or {{\"fmt\": format, \"chunk\": int, "
                                   "\"kahan\": bool, \"gemms\": [\"forward\", \"input_grad\", \"weight_grad\"]}")
    from .accumulate import accumulator_from_dict  # lazy: the layer above formats
    fmt = parse_format(value["fmt"], None, source, f"{where}.fmt")
    try:
        return accumulator_from_dict({**value, "fmt": fmt.to_dict()})
    except ValueError as e:
        raise _fail(source, where, str(e)) from None


def precision_spec(precision: Optional[LayerPrecision]) -> Any:
    """The rule-form spec that ``parse_precision`` loads back as ``precision``."""
    if precision is None:
        return FULL
    d = precision.to_dict()
    return {k: v for k, v in d.items() if k in POINTS or v is not None}


# -- rules and the config -------------------------------------------------------------

MATCH_KINDS = ("exact", "glob", "regex", "first", "last")


def _match_kind(pattern: str) -> str:
    if pattern.startswith("re:"):
        return "regex"
    if pattern in ("@first", "@last"):
        return pattern[1:]
    return "glob" if any(c in pattern for c in "*?[") else "exact"


@dataclass(frozen=True)
class Rule:
    """Layers whose name matches ``match`` (and whose type is in ``types``, if
    given) get ``precision`` (``None`` = full precision).

    ``match``: a module name (exact), a glob (``layer*.conv1``, fnmatch on the
    whole name), ``re:<regex>`` (full match), or ``@first``/``@last`` (the
    first/last convertible module in registration order). A leading ``net.``
    (the original's prefix) also matches names without it. ``required``: a
    rule that matches no module is an error unless False.
    """

    match: str
    precision: Optional[LayerPrecision]
    types: tuple[str, ...] = ()
    required: bool = True
    where: str = ""
    kind: str = ""

    def __post_init__(self):
        if not isinstance(self.match, str) or not self.match:
            raise ValueError(f"rule match must be a non-empty string, got {self.match!r}")
        object.__setattr__(self, "kind", self.kind or _match_kind(self.match))
        if self.kind not in MATCH_KINDS:
            raise ValueError(f"rule kind {self.kind!r} unknown; allowed: {', '.join(MATCH_KINDS)}")
        if self.kind == "regex":
            try:
                re.compile(self.match[3:])
            except re.error as e:
                raise ValueError(f"bad regular expression {self.match[3:]!r}: {e}") from None
        types = (self.types,) if isinstance(self.types, str) else self.types
        if not isinstance(types, (list, tuple)):
            raise ValueError(f"rule types must be a list of type names, got {self.types!r}; allowed: "
                             f"{', '.join(CONVERTIBLE_TYPES)}")
        types = tuple(types)
        bad = [t for t in types if t not in CONVERTIBLE_TYPES]
        if bad:
            raise ValueError(f"rule types {bad} unknown; allowed: {', '.join(CONVERTIBLE_TYPES)}")
        object.__setattr__(self, "types", types)
        if self.precision is not None and not isinstance(self.precision, LayerPrecision):
            raise ValueError(f"rule precision must be a LayerPrecision or None, got {self.precision!r}")

    def matches(self, name: str, type_name: Optional[str] = None, order: tuple[str, ...] = ()) -> bool:
        if self.types and type_name not in self.types:
            return False
        if self.kind in ("first", "last"):
            return bool(order) and name == order[0 if self.kind == "first" else -1]
        pats = [self.match[3:] if self.kind == "regex" else self.match]
        if self.kind != "regex" and pats[0].startswith(LEGACY_PREFIX):
            pats.append(pats[0][len(LEGACY_PREFIX):])
        for pat in pats:
            if (self.kind == "exact" and name == pat or self.kind == "glob" and fnmatch.fnmatchcase(name, pat)
                    or self.kind == "regex" and re.fullmatch(pat, name)):
                return True
        return False


@dataclass(frozen=True)
class NetConfig:
    """Ordered rules (first match wins) and the precision of convertible
    layers that no rule matches (``default``; ``None`` leaves them alone).

    ``source`` names where it came from (a path, a preset, ``<dict>``) in
    error messages.
    """

    rules: tuple[Rule, ...] = ()
    default: Optional[LayerPrecision] = None
    source: str = "<dict>"
    description: str = ""

    def __post_init__(self):
        object.__setattr__(self, "rules", tuple(self.rules))
        for r in self.rules:
            if not isinstance(r, Rule):
                raise ValueError(f"NetConfig rules must be Rule objects, got {r!r}")

    def resolve(self, name: str, type_name: Optional[str] = None,
                order: tuple[str, ...] = ()) -> Optional[LayerPrecision]:
        """The precision of the layer called ``name`` (``None`` = full precision)."""
        for rule in self.rules:
            if rule.matches(name, type_name, order):
                return rule.precision
        return self.default

    def assign(self, layers: Mapping[str, str], modules: Optional[Mapping[str, str]] = None
               ) -> dict[str, Optional[LayerPrecision]]:
        """Precision per convertible layer: ``layers`` maps each name to its type
        name (``Conv2d``, ``Linear``, ...), in registration order.

        Raises ``ConfigError`` naming every required rule that matches no
        layer, with the closest real names; ``modules`` (every module name ->
        class name) lets the message say when a name is a module of a type
        that cannot be converted.
        """
        order = tuple(layers)
        used: set[int] = set()
        out: dict[str, Optional[LayerPrecision]] = {}
        for name, type_name in layers.items():
            out[name] = self.default
            for i, rule in enumerate(self.rules):
                if rule.matches(name, type_name, order):
                    used.add(i)
                    out[name] = rule.precision
                    break
        problems = []
        for i, rule in enumerate(self.rules):
            if i in used or not rule.required:
                continue
            if any(rule.matches(n, t, order) for n, t in layers.items()):
                problems.append(f"{rule.where or repr(rule.match)}: every layer it matches is taken by an "
                                "earlier rule (first match wins)")
                continue
            plain = rule.match[len(LEGACY_PREFIX):] if rule.match.startswith(LEGACY_PREFIX) else rule.match
            what = f"{rule.where or repr(rule.match)}"
            if modules and rule.kind == "exact" and (plain in modules or rule.match in modules):
                cls = modules.get(plain) or modules.get(rule.match)
                problems.append(f"{what}: module {plain!r} is a {cls}, which cannot be converted "
                                f"(convertible: {', '.join(CONVERTIBLE_TYPES)})")
            else:
                typed = f" of type {'/'.join(rule.types)}" if rule.types else ""
                problems.append(f"{what}: matches no convertible layer{typed} of the model"
                                f"{_suggest(plain, layers)}")
        if problems:
            hint = ("; convertible layers: " + ", ".join(list(layers)[:12])
                    + (", ..." if len(layers) > 12 else "") if layers else "; the model has no convertible layer")
            if not used and len(problems) > 1:
                hint += "; no rule matched anything: is this config written for another model?"
            raise ConfigError(f"{self.source}: " + "; ".join(problems) + hint
                              + " (a rule with \"required\": false may match nothing)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The rule form (formats as saved dicts) that ``load_config`` loads back."""
        rules = []
        for r in self.rules:
            d: dict[str, Any] = {"match": r.match, "precision": precision_spec(r.precision)}
            if r.types:
                d["types"] = list(r.types)
            if not r.required:
                d["required"] = False
            rules.append(d)
        out: dict[str, Any] = {"version": 1}
        if self.description:
            out["description"] = self.description
        out["default"] = precision_spec(self.default)
        out["rules"] = rules
        return out


# -- loading ---------------------------------------------------------------------------

NEW_KEYS = ("version", "description", "default", "rules", "rounding", "backward_source", "accumulator")
RULE_KEYS = ("match", "precision", "types", "required")


def _parse_rules_form(d: dict, source: str) -> NetConfig:
    _unknown_keys(d, NEW_KEYS, source, "")
    if d.get("version", 1) != 1:
        raise _fail(source, "version", f"{d['version']!r} unsupported; allowed: 1")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise _fail(source, "description", f"must be a string, got {desc!r}")
    inherited = {k: d[k] for k in INHERITED_KEYS if k in d}
    default = parse_precision(d.get("default", FULL), inherited, source, "default")
    raw = d.get("rules", [])
    if not isinstance(raw, list):
        raise _fail(source, "rules", f"must be a list of {{\"match\": .., \"precision\": ..}} objects, got {raw!r}")
    rules = []
    for i, r in enumerate(raw):
        where = f"rules[{i}]"
        if not isinstance(r, dict):
            raise _fail(source, where, f"must be an object with keys {', '.join(RULE_KEYS)}, got {r!r}")
        _unknown_keys(r, RULE_KEYS, source, where)
        for key in ("match", "precision"):
            if key not in r:
                raise _fail(source, where, f"missing {key!r}; a rule needs \"match\" and \"precision\"")
        required = r.get("required", True)
        if not isinstance(required, bool):
            raise _fail(source, f"{where}.required", f"{required!r} invalid; allowed: true, false")
        prec = parse_precision(r["precision"], inherited, source, f"{where}.precision")
        try:
            rules.append(Rule(r["match"], prec, r.get("types", ()), required, f"{where} {r['match']!r}"))
        except ValueError as e:
            raise _fail(source, where, str(e)) from None
    return NetConfig(tuple(rules), default, source, desc)


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


def config_from_dict(d: Any, source: str = "<dict>") -> NetConfig:
    """A ``NetConfig`` from either JSON form (the rule form has ``version`` or ``rules``)."""
    if not isinstance(d, dict):
        raise _fail(source, "", f"a network config must be a JSON object, got {type(d).__name__}")
    if "version" in d or "rules" in d:
        return _parse_rules_form(d, source)
    return _parse_legacy_form(d, source)


def preset_dirs() -> list[Path]:
    """Where preset names are looked up, in order: ``./conf_net`` (the working
    directory), the repository's ``conf_net/`` next to the package (source
    checkouts and editable installs), and ``bfp/conf_net`` inside an installed
    package (the same files, shipped as package data)."""
    here = Path(__file__).resolve().parent
    dirs = [Path.cwd() / "conf_net", here.parent / "conf_net", here / "conf_net"]
    out: list[Path] = []
    for p in dirs:
        if p.is_dir() and all(p.resolve() != q.resolve() for q in out):
            out.append(p)
    return out


def preset_names() -> list[str]:
    """Every preset name ``load_config`` finds (file names without ``.json``)."""
    return sorted({p.stem for d in preset_dirs() for p in d.glob("*.json")})


def find_preset(name: str) -> Path:
    """The file of preset ``name`` (``"ResNet18_FB12"`` or ``"ResNet18_FB12.json"``)."""
    stem = name[:-5] if name.endswith(".json") else name
    for d in preset_dirs():
        p = d / f"{stem}.json"
        if p.is_file():
            return p
    names = preset_names()
    raise ConfigError(f"{name}: no such config file or preset{_suggest(stem, names)}; presets "
                      f"(in {', '.join(str(d) for d in preset_dirs()) or 'no conf_net folder'}): {', '.join(names)}")


ConfigLike = Union[str, "os.PathLike[str]", dict, NetConfig]


def load_config(config: ConfigLike) -> NetConfig:
    """A ``NetConfig`` from a preset name, a JSON file path, a dict or a ``NetConfig``."""
    if isinstance(config, NetConfig):
        return config
    if isinstance(config, dict):
        return config_from_dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a preset name, a path, a dict or a NetConfig, got {config!r}")
    path = Path(config)
    if not path.is_file():
        path = find_preset(str(config))
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return config_from_dict(d, str(path))
