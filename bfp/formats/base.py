"""The format protocol and registry: what every number format answers, and where each family registers.

A format is a small immutable value that says *what* to round to; ``bfp.quantize``
(``bfp/kernels``) takes one and rounds a tensor to it. Each family lives in its own module of
this package and registers itself here (``register_family``): its ``to_dict`` kind, its named
presets and aliases, names beyond them (``mxfp8_e4m3_rceil``, ``p3109_k8p4se``) and its spec
grammar in configs (``{"mx": "e4m3", "block": 32}``). The kernels layer registers which kernel
rounds each family (``register_kernel``): formats import nothing above them.

Every numeric rule (rounding, subnormals, overflow, NaN/Inf) is stated in the family's class
docstring and in ``docs/formats.md``.
"""
from __future__ import annotations

import dataclasses
import difflib
from enum import Enum
from typing import Any, Callable, NamedTuple, Optional, Union

class Rounding(str, Enum):
    """How a value between two representable neighbours is resolved.

    Let ``v = |x| / 2**q`` be the magnitude in units of the target LSB ``2**q``
    and ``k = floor(v)``, ``f = v - k`` its dropped fraction. The result is
    ``sign(x) * k' * 2**q`` (rounding acts on the magnitude; signs are kept):

    * ``TRUNCATE``: ``k' = k`` (toward zero; the original BFP simulator's mode).
    * ``NEAREST``: ``k' = k + 1`` if ``f > 1/2``, or ``f == 1/2`` and ``k`` is
      odd; else ``k`` (round half to even). A float without mantissa bits has one code per
      binade (``k`` is 1 for every normal value): there "odd" is its code's, the exponent field's.
    * ``STOCHASTIC``: ``k' = k + 1`` with probability ``floor(f * 2**32) / 2**32``
      (a counter-based 32-bit random number per element, compared with the top
      32 dropped bits), else ``k``. Unbiased to within 2**-32 LSB.
    """

    TRUNCATE = "truncate"
    NEAREST = "nearest"
    STOCHASTIC = "stochastic"

    def __str__(self) -> str:  # repr of formats shows rounding=nearest
        return self.value


class Encoding(str, Enum):
    """Which codes of the top exponent a Float spends on Inf/NaN.

    * ``IEEE``: the top exponent code is reserved for Inf (mantissa 0) and NaN
      (IEEE 754: float32, float16, bfloat16, float8_e5m2).
    * ``FN``: finite with NaN: the top exponent holds normal numbers except the
      all-ones mantissa, which is NaN; no Inf (float8_e4m3fn, OCP E4M3).
    * ``FINITE``: every code is a finite number; no Inf, no NaN (OCP FP6/FP4:
      float6_e3m2fn, float6_e2m3fn, float4_e2m1fn).
    """

    IEEE = "ieee"
    FN = "fn"
    FINITE = "finite"

    def __str__(self) -> str:
        return self.value


class Overflow(str, Enum):
    """What a finite value beyond the largest finite magnitude ``max`` becomes.

    * ``SATURATE``: ``±max`` (OCP "satfinite"; the default).
    * ``INF``: ``±inf`` (IEEE 754 behaviour; needs an ``IEEE`` encoding).
    """

    SATURATE = "saturate"
    INF = "inf"

    def __str__(self) -> str:
        return self.value


def _enum(enum_cls, value, what: str):
    try:
        return enum_cls(value.value if isinstance(value, Enum) else value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"unknown {what} {value!r}; allowed: {allowed}") from None


def _int_in(value, lo: int, hi: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
    return value


_FLOAT32_MAX = 3.4028234663852886e38
_RND = {"nearest": "/rn", "truncate": "/tr", "stochastic": "/sr"}  # rounding suffixes of short names

class Format:
    """Base class of all formats. The layers above ask a format what they need to know instead of
    checking its class (the defaults here are a block format's; each family overrides them):

    * ``elementwise``: every value rounds on its own, so a stack of tensors rounds in one call as
      each tensor alone (``Float``);
    * ``chunkable``: a run of whole tiles rounds as it would inside the whole tensor (no
      tensor-wide scale: ``NVFP4`` and ``Scaled`` are not);
    * ``transport_bytes()``: bytes of one element on a flat wire (a collective's buffer), None
      when the format's tiles cannot ride a flat cut;
    * ``aps_top()``: the exponent APS shifts the largest sum to (``Float``: ``emax``; block formats:
      0, shift-invariant up to their scale range);
    * ``tile_rows(shape)``: the extent along axis 0 of one tile on a tensor of ``shape``;
    * ``overflow_limit()``: the largest magnitude it represents without saturating (formats whose
      scales follow the tensor have no fixed ceiling: float32's largest);
    * ``short_name(name_of)``: its name in conversion reports (``name_of`` names an inner format);
    * ``history_length``: the amax history a layer keeps for it (delayed scaling; 0: none);
    * ``normal_emin()``: the exponent of its smallest normal number, where it has one element
      format (a tensor core counts a subnormal operand as that exponent), else None;
    * ``value_range()``: ``ValueRange(min_subnormal, min_normal, max)`` of a fixed-range element
      format (plots and overflow diagnostics), None for formats whose scale follows the tensor;
    * ``with_rounding(r)``: the same format rounding with ``r`` (ValueError where it cannot);
    * ``scale_axis()``: the tensor axis its blocks or scales follow (None: none), and
      ``contraction_axis()``: that axis where its 1-D blocks must lie along a GEMM's contraction;
    * ``adjustable_bits``: the bits dynamic precision may move (BlockFloat's), else None, and
      ``with_bits(b)``;
    * ``rht_fused_block()``: the block size a fused Hadamard-transform kernel rounds it with
      (NVFP4's 1-D blocks), else None;
    * ``legacy_spec()``: its entry in the original simulator's config form, None where that form
      cannot say it.
    """

    elementwise = False
    chunkable = True
    history_length = 0

    def normal_emin(self) -> Optional[int]:
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that ``format_from_dict`` turns back into ``self``."""
        raise NotImplementedError

    def transport_bytes(self) -> Optional[int]:
        return None

    def aps_top(self) -> int:
        return 0

    def tile_rows(self, shape: tuple[int, ...]) -> int:
        return 1

    def overflow_limit(self) -> float:
        return _FLOAT32_MAX

    def short_name(self, name_of: Optional[Callable[["Format"], str]] = None) -> str:
        return repr(self)


    def value_range(self) -> Optional["ValueRange"]:
        return None

    def with_rounding(self, rounding: Any) -> "Format":
        raise ValueError(f"cannot set rounding on {self!r}")

    def scale_axis(self) -> Optional[int]:
        return None

    def contraction_axis(self) -> Optional[int]:
        return None

    adjustable_bits: Optional[int] = None

    def with_bits(self, bits: int) -> "Format":
        raise ValueError(f"{self!r} has no bits to adjust")

    def legacy_spec(self) -> Optional[dict[str, Any]]:
        return None

    def rht_fused_block(self) -> Optional[int]:
        return None


class ElementFormat(Format):
    """A format whose every element rounds on its own to a fixed set of values (``Float``,
    ``P3109``): the protocol answers from its ``emin``, ``emax``, ``max``, ``min_subnormal`` and
    ``rounding`` (a dataclass field)."""

    elementwise = True

    def aps_top(self) -> int:
        return self.emax

    def overflow_limit(self) -> float:
        return self.max

    def normal_emin(self) -> Optional[int]:
        return self.emin

    def value_range(self) -> Optional["ValueRange"]:
        return ValueRange(self.min_subnormal, 2.0 ** self.emin, self.max)

    def with_rounding(self, rounding: Any) -> "Format":
        return dataclasses.replace(self, rounding=rounding)


class ValueRange(NamedTuple):
    """The magnitudes of a fixed-range element format: smallest subnormal (the smallest normal where
    it has none), smallest normal, largest finite."""

    min_subnormal: float
    min_normal: float
    max: float


def block_shape(block: Any, what: str) -> Union[int, tuple[int, ...]]:
    """A block size, or a tuple of them (a 2-D block, the last entry along the format's axis);
    a one-entry list is the plain size. ``ValueError`` naming ``what`` otherwise."""
    if isinstance(block, (list, tuple)):
        if not block or len(block) > 2:
            raise ValueError(f"{what} block must be a positive integer or a list of one or two (a 2-D block, "
                             f"the last along the axis), got {list(block)}")
        for b in block:
            _int_in(b, 1, 2 ** 31 - 1, f"{what} block entry")
        return int(block[0]) if len(block) == 1 else tuple(block)
    _int_in(block, 1, 2 ** 31 - 1, f"{what} block")
    return block


# -- the registry ----------------------------------------------------------------------

class Spec(NamedTuple):
    """A family's spec object in configs: ``{key: value, <keys>...}``, built by ``parse(value, opts)``
    (``opts``: the other keys but ``rounding``); ``example`` shows it in error messages."""

    key: str
    keys: tuple[str, ...]
    parse: Callable[[Any, dict[str, Any]], "Format"]
    example: str


_PRESETS: dict[str, Format] = {}
_ALIASES: dict[str, str] = {}
_FAMILIES: dict[str, Callable[..., "Format"]] = {}  # to_dict kind -> constructor
_NAMERS: list[Callable[[str], Optional["Format"]]] = []  # names beyond the presets (mxfp8_e4m3_rceil)
_NAME_HINTS: list[str] = []
_SPECS: dict[str, Spec] = {}
_KERNELS: dict[type, Any] = {}


def register_family(kind: str, make: Callable[..., "Format"], presets: dict[str, "Format"], *,
                    by_name: Optional[Callable[[str], Optional["Format"]]] = None, name_hint: str = "",
                    aliases: Optional[dict[str, str]] = None, spec: Optional[Spec] = None) -> None:
    """A format family, defined in its own module of this package: ``make(**d)`` builds one from its
    ``to_dict`` without ``kind`` (``format_from_dict``); its named presets, ``aliases`` (name ->
    preset) and ``by_name(key)``, a format for a lower-case name that is no preset (or None), serve
    ``format_from_name``; ``name_hint`` is added to its unknown-name error; ``spec`` is its object
    form in configs (``spec_families``)."""
    _FAMILIES[kind] = make
    _PRESETS.update(presets)
    _ALIASES.update(aliases or {})
    if by_name is not None:
        _NAMERS.append(by_name)
    if name_hint:
        _NAME_HINTS.append(name_hint)
    if spec is not None:
        _SPECS[spec.key] = spec


def spec_families() -> dict[str, Spec]:
    """Every family's spec object (key -> ``Spec``), in registration order."""
    return dict(_SPECS)


def register_kernel(family: type, kernel: Any) -> None:
    """The kernels layer says which kernel rounds ``family`` (``bfp.kernels`` fills this on import)."""
    _KERNELS[family] = kernel


def kernel_families() -> tuple[type, ...]:
    """The format families that have a registered kernel, in registration order."""
    return tuple(_KERNELS)


def kernel_for(fmt: "Format") -> Any:
    """The kernel registered for ``fmt``'s family; TypeError naming the registered families otherwise."""
    for cls in type(fmt).__mro__:
        if cls in _KERNELS:
            return _KERNELS[cls]
    raise TypeError(f"no kernel rounds {fmt!r}; formats with a kernel: "
                    f"{', '.join(c.__name__ for c in _KERNELS)} (use bfp.format_from_name for names)")


def format_names() -> list[str]:
    """The names ``format_from_name`` knows (aliases excluded)."""
    return list(_PRESETS)


def format_from_name(name: str) -> Format:
    """The preset called ``name`` (case-insensitive), e.g. ``"float8_e4m3fn"``, ``"fb16"``.

    Raises ``ValueError`` listing the known names for an unknown one.
    """
    names = format_names()
    if not isinstance(name, str):
        raise ValueError(f"format name must be a string, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _PRESETS:
        return _PRESETS[key]
    for by_name in _NAMERS:
        fmt = by_name(key)
        if fmt is not None:
            return fmt
    close = difflib.get_close_matches(key, names + list(_ALIASES), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown format name {name!r}{hint}; known: {', '.join(names)}"
                     + "".join(f" ({h})" for h in _NAME_HINTS))


def format_from_dict(d: dict[str, Any]) -> Format:
    """Inverse of ``Format.to_dict`` (used by checkpoints and saved configs)."""
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError(f"a format dict needs a 'kind' key, got {d!r}")
    d = dict(d)
    kind = d.pop("kind")
    try:
        if kind in _FAMILIES:
            return _FAMILIES[kind](**d)
    except TypeError as e:  # unknown or missing keys
        raise ValueError(f"bad {kind} format dict {d!r}: {e}") from None
    raise ValueError(f"unknown format kind {kind!r}; allowed: {', '.join(repr(k) for k in _FAMILIES)}")
