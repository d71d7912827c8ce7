"""Number formats: small immutable values that say *what* to round to.

Formats know nothing about kernels; ``bfp.quantize`` (``bfp/kernels``) takes a
format and rounds a tensor to it. Two families live here:

``Float(exp, man)``
    Any sign/exponent/mantissa float with 1 <= exp <= 8, 0 <= man <= 23
    (IEEE-like, OCP FP8/FP6/FP4, bfloat16, float16, tf32 ...).
``BlockFloat(bits, group)``
    Block floating point of the original BFP simulator (FlexBlock): one shared
    exponent per tile of ``group`` shape, ``bits`` magnitude bits per element.
Families built on these live in their own modules and register their presets and
``to_dict`` kind here (``register_family``): ``bfp.mx.MX`` (OCP Microscaling v1.0: an
E8M0 power-of-two scale per block, elements in a small Float or INT8),
``bfp.nvfp4.NVFP4`` and ``bfp.scaled.Scaled``.

Every numeric rule (rounding, subnormals, overflow, NaN/Inf) is stated in the
class docstrings below and in ``docs/formats.md``.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Union


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
      format (a tensor core counts a subnormal operand as that exponent), else None.
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


@dataclass(frozen=True)
class Float(Format):
    """A binary floating-point format with ``exp`` exponent and ``man`` mantissa bits.

    Values: ``±2**e * (1 + m / 2**man)`` for normal exponents
    ``emin <= e <= emax`` and, with ``subnormals``, ``±2**emin * (m / 2**man)``;
    ``bias = 2**(exp-1) - 1`` and ``emin = 1 - bias``. The largest exponent and
    magnitude depend on the ``encoding`` (see ``Encoding``).

    Numerics of ``quantize(x, Float(...))`` on float32 ``x``:

    * rounding: ``rounding`` (``Rounding``), at the LSB ``2**(max(e, emin) - man)``
      where ``e = floor(log2|x|)``; a rounding carry into the next binade is kept.
    * subnormals: with ``subnormals=True`` gradual underflow as IEEE 754;
      with ``False`` the value is rounded as if subnormals existed and a result
      below the smallest normal ``2**emin`` is flushed to a zero of ``x``'s sign.
    * overflow: a rounded finite magnitude above ``max`` becomes ``±max``
      (``overflow="saturate"``) or ``±inf`` (``"inf"``, IEEE encoding only).
    * NaN stays NaN. ``±inf`` stays ``±inf`` where the encoding has Inf and
      becomes NaN where it has not (``FN``/``FINITE``): never a finite value.
    * zeros keep their sign; results that round to zero are signed zeros.
    """

    exp: int
    man: int
    rounding: Rounding = Rounding.NEAREST
    subnormals: bool = True
    overflow: Overflow = Overflow.SATURATE
    encoding: Encoding = Encoding.IEEE

    def __post_init__(self):
        _int_in(self.exp, 1, 8, "Float exp (exponent bits)")
        _int_in(self.man, 0, 23, "Float man (mantissa bits)")
        object.__setattr__(self, "rounding", _enum(Rounding, self.rounding, "rounding"))
        object.__setattr__(self, "overflow", _enum(Overflow, self.overflow, "overflow"))
        object.__setattr__(self, "encoding", _enum(Encoding, self.encoding, "encoding"))
        if not isinstance(self.subnormals, bool):
            raise ValueError(f"subnormals must be True or False, got {self.subnormals!r}")
        if self.encoding is Encoding.IEEE and self.exp < 2:
            raise ValueError("Float(exp=1) with encoding='ieee' has no normal numbers; "
                             "use encoding='finite' (or 'fn') for a 1-bit exponent")
        if self.encoding is Encoding.FN and self.man < 1:
            raise ValueError("encoding='fn' needs man >= 1 (the all-ones mantissa is NaN)")
        if self.overflow is Overflow.INF and self.encoding is not Encoding.IEEE:
            raise ValueError(f"overflow='inf' needs encoding='ieee': encoding={self.encoding.value!r} "
                             "has no Inf; use overflow='saturate'")

    # -- derived constants -------------------------------------------------
    @property
    def bias(self) -> int:
        return 2 ** (self.exp - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = 2 ** self.exp - 1  # largest exponent code
        return (top - 1 if self.encoding is Encoding.IEEE else top) - self.bias

    elementwise = True

    def transport_bytes(self) -> Optional[int]:
        """Storage of one element: 1 byte up to 8 bits, 2 up to 16, else 4."""
        bits = 1 + self.exp + self.man
        return 1 if bits <= 8 else 2 if bits <= 16 else 4

    def aps_top(self) -> int:
        return self.emax

    def overflow_limit(self) -> float:
        return self.max

    def normal_emin(self) -> Optional[int]:
        return self.emin

    def short_name(self, name_of=None) -> str:
        return f"e{self.exp}m{self.man}" + ("" if self.rounding.value == "nearest" else _RND[self.rounding.value])

    @property
    def max(self) -> float:
        """Largest finite magnitude."""
        drop = 1 if self.encoding is Encoding.FN else 0  # all-ones mantissa is NaN
        return (2.0 - 2.0 ** (drop - self.man)) * 2.0 ** self.emax

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man) if self.subnormals else 2.0 ** self.emin

    @property
    def has_inf(self) -> bool:
        return self.encoding is Encoding.IEEE

    @property
    def bits(self) -> int:
        """Storage bits: sign + exponent + mantissa."""
        return 1 + self.exp + self.man

    def __repr__(self) -> str:
        extra = "" if self.subnormals else ", subnormals=False"
        extra += "" if self.encoding is Encoding.IEEE else f", encoding={self.encoding}"
        return (f"Float(e{self.exp}m{self.man}, rounding={self.rounding}, "
                f"overflow={self.overflow}{extra})")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "float", "exp": self.exp, "man": self.man, "rounding": self.rounding.value,
                "subnormals": self.subnormals, "overflow": self.overflow.value,
                "encoding": self.encoding.value}


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


# -- named presets -----------------------------------------------------------------

def _presets() -> dict[str, Format]:
    fn, fin = Encoding.FN, Encoding.FINITE
    f = {
        "float32": Float(8, 23),
        "tf32": Float(8, 10),
        "bfloat16": Float(8, 7),
        "float16": Float(5, 10),
        "float8_e4m3fn": Float(4, 3, encoding=fn),
        "float8_e5m2": Float(5, 2),
        "float6_e3m2fn": Float(3, 2, encoding=fin),
        "float6_e2m3fn": Float(2, 3, encoding=fin),
        "float4_e2m1fn": Float(2, 1, encoding=fin),
    }
    f.update({
        # The original simulator's presets: FB12 / FB16 / FB24.
        "fb12": BlockFloat(4, (1, 24, 3, 3)),
        "fb16": BlockFloat(8, (1, 12, 3, 3)),
        "fb24": BlockFloat(16, (1, 6, 3, 3)),
    })
    return f


_PRESETS: dict[str, Format] = {}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "fp8_e4m3": "float8_e4m3fn",
            "fp8_e5m2": "float8_e5m2", "e3m2": "float6_e3m2fn", "e2m3": "float6_e2m3fn",
            "e2m1": "float4_e2m1fn", "fp4": "float4_e2m1fn"}


_FAMILIES: dict[str, Callable[..., "Format"]] = {}  # to_dict kind -> constructor, of families in other modules
_NAMERS: list[Callable[[str], Optional["Format"]]] = []  # names beyond the presets (mxfp8_e4m3_rceil)
_NAME_HINTS: list[str] = []


def register_family(kind: str, make: Callable[..., "Format"], presets: dict[str, "Format"], *,
                    by_name: Optional[Callable[[str], Optional["Format"]]] = None, name_hint: str = "") -> None:
    """A format family defined in its own module (``bfp.mx``, ``bfp.nvfp4``): ``make(**d)`` builds
    one from its ``to_dict`` without ``kind`` (``format_from_dict``); its named presets and
    ``by_name(key)``, a format for a lower-case name that is no preset (or None), serve
    ``format_from_name``; ``name_hint`` is added to its unknown-name error."""
    _FAMILIES[kind] = make
    format_names()
    _PRESETS.update(presets)
    if by_name is not None:
        _NAMERS.append(by_name)
    if name_hint:
        _NAME_HINTS.append(name_hint)


def format_names() -> list[str]:
    """The names ``format_from_name`` knows (aliases excluded)."""
    if not _PRESETS:
        _PRESETS.update(_presets())
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
        if kind == "float":
            return Float(**d)
        if kind == "blockfloat":
            return BlockFloat(**d)
        if kind in _FAMILIES:
            return _FAMILIES[kind](**d)
    except TypeError as e:  # unknown or missing keys
        raise ValueError(f"bad {kind} format dict {d!r}: {e}") from None
    raise ValueError(f"unknown format kind {kind!r}; allowed: 'float', 'blockfloat'"
                     + "".join(f", {k!r}" for k in _FAMILIES))
