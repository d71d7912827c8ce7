"""``Rule`` and ``NetConfig``, the typed objects both JSON forms load into, and
the parser of the rule form (``{"version": 1, "rules": [...]}``).

``NetConfig`` holds the ordered rules and resolves them to a
``LayerPrecision`` (or ``None`` = full precision) per module name. It knows
module names and type names only; swapping modules is ``bfp.convert``'s job.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..layers import CONVERTIBLE
from ..precision import POINTS, LayerPrecision
from .errors import ConfigError, _fail, _suggest, _unknown_keys
from .specs import FULL, INHERITED_KEYS, parse_precision, precision_spec

# Module types a config can address: the float type names of bfp.layers' Q-layers.
CONVERTIBLE_TYPES = tuple(f.__name__ for f in CONVERTIBLE)
# The original simulator's module-name prefix: a rule naming "net.conv1" also matches "conv1".
LEGACY_PREFIX = "net."

MATCH_KINDS = ("exact", "glob", "regex", "first", "last")
# Dimensions of the tensors every point of a layer type quantizes (inputs, weights, outputs and
# their gradients); an MX axis must lie in [-rank, rank). Linear and Matmul take 2 or more
# dimensions: 2 is what every one of their tensors has.
TENSOR_RANK = {"Conv1d": 3, "Conv2d": 4, "Linear": 2, "Matmul": 2}
# The contraction axis of each GEMM operand, by layer type and point: where a block format's
# blocks (MX, NVFP4 with 1-D blocks) must lie. Linear: x (..., C) and W (O, C) forward, the output
# gradient (.., O) and W along O for the input gradient, g and x along the rows (-2) for the weight
# gradient. Matmul a @ b: a along -1, b along -2 forward; g along -1 and b along -1 for a's
# gradient; g and a along -2 for b's. Conv: channels (1) forward and for the input gradient's g,
# the weight's O (0) for biw, the batch (0) for the weight gradient.
_CONV_AXES = {"fi": 1, "fw": 1, "bio": 1, "biw": 0, "bwo": 0, "bwi": 0}
CONTRACTION_AXIS = {"Conv1d": _CONV_AXES, "Conv2d": _CONV_AXES,
                    "Linear": {"fi": -1, "fw": -1, "bio": -1, "biw": 0, "bwo": -2, "bwi": -2},
                    "Matmul": {"fi": -1, "fw": -2, "bio": -1, "biw": -1, "bwo": -2, "bwi": -2}}


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
    first/last GEMM the model computes, in the execution order of a traced forward
    (``bfp.convert(..., example_input=...)``); without a trace, registration order). A leading ``net.``
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
        rule = self.deciding_rule(name, type_name, order)
        return self.default if rule is None else rule.precision

    def deciding_rule(self, name: str, type_name: Optional[str] = None,
                      order: tuple[str, ...] = ()) -> Optional[Rule]:
        """The first rule that matches layer ``name`` (None: the default decides)."""
        return next((r for r in self.rules if r.matches(name, type_name, order)), None)

    def assign(self, layers: Mapping[str, str], modules: Optional[Mapping[str, str]] = None,
               order: Optional[tuple[str, ...]] = None) -> dict[str, Optional[LayerPrecision]]:
        """Precision per convertible layer: ``layers`` maps each name to its type
        name (``Conv2d``, ``Linear``, ...); ``order`` is what ``@first``/``@last`` mean (the
        execution order of a traced forward; default: ``layers``' registration order).

        Raises ``ConfigError`` naming every required rule that matches no
        layer, with the closest real names; ``modules`` (every module name ->
        class name) lets the message say when a name is a module of a type
        that cannot be converted.
        """
        order = tuple(layers) if order is None else tuple(order)
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
                probs = (" (attention probabilities have no layer of their own: they are the fi point of "
                         "the pv product, e.g. *.attn.pv, and their gradient its bio)"
                         if plain.endswith(".p") and any(n.endswith(".pv") for n in layers) else "")
                problems.append(f"{what}: matches no convertible layer{typed} of the model"
                                f"{_suggest(plain, layers)}{probs}")
        for name, type_name in layers.items():
            self._check_axes(name, type_name, out[name])
        if problems:
            hint = ("; convertible layers: " + ", ".join(list(layers)[:12])
                    + (", ..." if len(layers) > 12 else "") if layers else "; the model has no convertible layer")
            if not used and len(problems) > 1:
                hint += "; no rule matched anything: is this config written for another model?"
            raise ConfigError(f"{self.source}: " + "; ".join(problems) + hint
                              + " (a rule with \"required\": false may match nothing)")
        return out

    def _check_axes(self, name: str, type_name: str, precision: Optional[LayerPrecision]) -> None:
        """An MX axis outside the layer's tensors, or a Hadamard transform on a layer without
        one, fails here, naming the config and the layer, not at the first training step."""
        if precision is not None and precision.rht is not None and type_name not in ("Linear", "Matmul"):
            raise ConfigError(f"{self.source}: layer {name!r} ({type_name}): rht (a Hadamard transform of the "
                              f"weight-gradient inputs) is implemented for Linear and Matmul layers only")
        if precision is not None and precision.rht is not None and precision.bwo is None and precision.bwi is None:
            raise ConfigError(f"{self.source}: layer {name!r} ({type_name}): rht transforms the weight-gradient "
                              f"GEMM's inputs, the bwo and bwi points, and this layer quantizes neither: it would "
                              f"do nothing; give bwo/bwi a format, or leave rht out")
        rank = TENSOR_RANK.get(type_name)
        if precision is None or rank is None:
            return
        for point in POINTS:
            fmt = getattr(precision, point)
            if fmt is not None and fmt.scale_axis() is not None and not -rank <= fmt.scale_axis() < rank:
                raise ConfigError(f"{self.source}: layer {name!r} ({type_name}), point {point}: "
                                  f"{type(fmt).__name__} axis "
                                  f"{fmt.scale_axis()} is out of range; a {type_name}'s tensors have {rank} "
                                  f"dimensions, allowed axes: {-rank}..{rank - 1}")
            want = CONTRACTION_AXIS[type_name].get(point)
            along = fmt.contraction_axis() if fmt is not None else None
            if want is not None and along is not None and along % rank != want % rank:
                raise ConfigError(f"{self.source}: layer {name!r} ({type_name}), point {point}: "
                                  f"{type(fmt).__name__} blocks lie along axis {along}, but this point's "
                                  f"GEMM contracts along axis {want}; give the point its own format with "
                                  f"\"axis\": {want} (the any_mxfp8 / any_nvfp4 presets list the axis of "
                                  f"every point)")

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


# -- the rule form ------------------------------------------------------------------

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
