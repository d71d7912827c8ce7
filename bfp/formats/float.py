"""``Float(exp, man)``: any sign/exponent/mantissa float with 1 <= exp <= 8, 0 <= man <= 23
(IEEE-like, OCP FP8/FP6/FP4, bfloat16, float16, tf32 ...), its presets and its config spec.

Every numeric rule (rounding, subnormals, overflow, NaN/Inf) is stated in the class docstring
and in ``docs/formats.md``.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

from .base import (_RND, ElementFormat, Encoding, Overflow, Rounding, Spec, _enum, _int_in, format_from_name,
                   register_family)


@dataclass(frozen=True)
class Float(ElementFormat):
    """A binary floating-point format with ``exp`` exponent and ``man`` mantissa bits.

    Values: ``±2**e * (1 + m / 2**man)`` for normal exponents
    ``emin <= e <= emax`` and, with ``subnormals``, ``±2**emin * (m / 2**man)``;
    ``bias = 2**(exp-1) - 1`` and ``emin = 1 - bias``. The largest exponent and
    magnitude depend on the ``encoding`` (see ``Encoding``). The simulated values are float32, so
    ``exp=8`` needs ``encoding="ieee"`` (emax 127): the others would reach 2**128, which float32
    cannot hold (saturation to such a max would give Inf).

    Numerics of ``quantize(x, Float(...))`` on float32 ``x``:

    * rounding: ``rounding`` (``Rounding``), at the LSB ``2**(max(e, emin) - man)``
      where ``e = floor(log2|x|)``; a rounding carry into the next binade is kept.
    * subnormals: with ``subnormals=True`` gradual underflow as IEEE 754;
      with ``False`` the value is rounded as if subnormals existed and a result
      below the smallest normal ``2**emin`` is flushed to a zero of ``x``'s sign.
    * overflow: a rounded finite magnitude above ``max`` becomes ``±max``
      (``overflow="saturate"``) or ``±inf`` (``"inf"``, IEEE encoding only). ``truncate``
      never rounds past ``max``: a finite value beyond it gives ``±max`` either way (as IEEE
      754's round toward zero).
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
        if self.exp == 8 and self.encoding is not Encoding.IEEE:  # emax 128: past float32's largest value
            raise ValueError(f"Float(exp=8) with encoding={self.encoding.value!r} reaches 2**128 and above, "
                             "which float32 (where the simulated values live) cannot hold; use "
                             "encoding='ieee' (emax 127) or exp <= 7")
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

    def transport_bytes(self) -> Optional[int]:
        """Storage of one element: 1 byte up to 8 bits, 2 up to 16, else 4."""
        bits = 1 + self.exp + self.man
        return 1 if bits <= 8 else 2 if bits <= 16 else 4


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


def float_element(value: Any, what: str = "element") -> Union[Float, str]:
    """A block format's element: ``"int8"``, ``[exp, man]`` or a Float format name."""
    if value == "int8":
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return Float(*value)
    fmt = format_from_name(value)
    if not isinstance(fmt, Float):
        raise ValueError(f"{value!r} is not a Float format")
    return fmt


def as_float(fmt: Any, what: str) -> Float:
    """``fmt`` where it is a ``Float`` (an accumulator's, a block format's element); ValueError naming
    ``what`` otherwise."""
    if not isinstance(fmt, Float):
        raise ValueError(f"{what} must be a Float format, got {fmt!r}")
    return fmt


def is_float(fmt: Any) -> bool:
    """Whether ``fmt`` is a ``Float`` (for callers outside the format package)."""
    return isinstance(fmt, Float)


def _spec(value: Any, opts: dict[str, Any]) -> Float:
    base = Float(*value) if isinstance(value, (list, tuple)) and len(value) == 2 else float_element(value)
    if not isinstance(base, Float):
        raise ValueError(f"'float' needs [exp, man] or a Float format name, got {value!r}")
    return dataclasses.replace(base, **opts)


_FN, _FIN = Encoding.FN, Encoding.FINITE
_ROUNDING_SUFFIX = {"": Rounding.NEAREST, "_rn": Rounding.NEAREST, "_tr": Rounding.TRUNCATE,
                    "_rz": Rounding.TRUNCATE, "_sr": Rounding.STOCHASTIC}


def _by_name(key: str) -> Optional[Float]:
    """``e<E>m<M>`` (``E`` 1..8, ``M`` 0..23) for any ``Float(E, M)`` that is no preset, with an
    optional ``_tr``/``_rz`` (truncation) or ``_sr`` (stochastic) rounding: IEEE encoding (Inf and
    NaN at the top exponent), a 1-bit exponent ``finite`` (it has no IEEE normal numbers). The
    OCP names (e4m3, e5m2, e3m2, e2m3, e2m1) are the presets' aliases and keep their encodings."""
    m = re.fullmatch(r"e(\d)m(\d{1,2})(_rn|_tr|_rz|_sr)?", key)
    if m is None:
        return None
    exp, man = int(m[1]), int(m[2])
    if not (1 <= exp <= 8 and 0 <= man <= 23):
        return None
    return Float(exp, man, rounding=_ROUNDING_SUFFIX[m[3] or ""], encoding=_FIN if exp == 1 else Encoding.IEEE)


register_family("float", Float, {
    "float32": Float(8, 23),
    "tf32": Float(8, 10),
    "bfloat16": Float(8, 7),
    "float16": Float(5, 10),
    "float8_e4m3fn": Float(4, 3, encoding=_FN),
    "float8_e5m2": Float(5, 2),
    "float6_e3m2fn": Float(3, 2, encoding=_FIN),
    "float6_e2m3fn": Float(2, 3, encoding=_FIN),
    "float4_e2m1fn": Float(2, 1, encoding=_FIN),
}, aliases={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "fp8_e4m3": "float8_e4m3fn",
            "fp8_e5m2": "float8_e5m2", "e3m2": "float6_e3m2fn", "e2m3": "float6_e2m3fn",
            "e2m1": "float4_e2m1fn", "fp4": "float4_e2m1fn"},
    by_name=_by_name, name_hint="any e<E>m<M>, E 1..8 and M 0..23, is Float(E, M): e3m0, e5m10, e8m7_sr ...",
    spec=Spec("float", ("float", "rounding", "subnormals", "overflow", "encoding"), _spec, '{"float": [exp, man]}'))
