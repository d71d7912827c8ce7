"""IEEE P3109 formats (the interim report's binary formats of width K and precision P), named
as the ``gfloat`` package names them: ``p3109_k8p4se`` is K = 8, P = 4, signed, extended domain.

Encoding (K bits, no two's complement):

* **signed** (``s``): a sign bit and K-1 magnitude bits: K-P exponent bits, P-1 fraction bits,
  bias ``floor(2**(K-P-1))``; the code 0x80 (the sign bit alone) is the one NaN: there is no
  negative zero. **unsigned** (``u``): K magnitude bits: K-P+1 exponent bits, bias ``2**(K-P)``;
  the all-ones code is NaN.
* **extended domain** (``e``): the largest magnitude code is ±Inf. **finite** (``f``): it is a
  number; the format has no Inf.
* subnormals always: exponent field 0 means ``2**(1-bias) * fraction / 2**(P-1)``. With P = 1
  there is no fraction: one code per binade, and "even" in round-to-nearest-even is the code's
  (the exponent field's parity).

Projection (rounding a float32 ``x``), as the report and ``gfloat.round_float`` define it:

* ``rounding``: ``nearest`` (ties to even, on codes), ``truncate`` (toward zero) or
  ``stochastic`` (bfpsim's: see ``Rounding``; gfloat's ``StochasticFastest`` with 32 random
  bits). Round toward ±Inf and ties-away are not offered (ValueError).
* ``saturation``: ``satfinite`` (default): a finite value rounded past the largest finite
  magnitude ``max``, and ±Inf, become ±max. ``ovfinf``: they become ±Inf (extended domain) or NaN
  (finite domain); Inf stays Inf (NaN in the finite domain); truncation never rounds past max.
  ``satpropagate``: finite values as ``satfinite``, infinities as ``ovfinf``.
* zeros: every zero result is +0 (one zero). NaN stays NaN.
* unsigned formats have no negative numbers: a negative ``x`` that rounds to zero gives +0;
  otherwise +0 under ``satfinite`` (the nearest value the format has) and NaN under the other
  two. (gfloat 0.5 leaves negative inputs of unsigned formats undefined; this is bfpsim's rule.)

The kernels round it with the shared element rule (``bfp.kernels.p3109``); tests check every
code, every midpoint ±1 float32 ulp and the overflow edges against ``gfloat``.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional

from .base import _RND, ElementFormat, Rounding, Spec, _enum, _int_in, register_family

SATURATIONS = ("satfinite", "satpropagate", "ovfinf")
DOMAINS = ("extended", "finite")
_NAME = re.compile(r"p3109_k(\d+)p(\d+)([su])([ef])(?:_(rz|sr))?(?:_(satfinite|satpropagate|ovfinf))?")


@dataclass(frozen=True)
class P3109(ElementFormat):
    """A P3109 format of width ``k`` (3..8) and precision ``p`` (1..k-1 signed, 1..k unsigned);
    numerics in the module docstring."""

    k: int
    p: int
    signed: bool = True
    domain: str = "extended"
    rounding: Rounding = Rounding.NEAREST
    saturation: str = "satfinite"

    def __post_init__(self):
        _int_in(self.k, 3, 8, "P3109 k (width in bits)")
        if not isinstance(self.signed, bool):
            raise ValueError(f"P3109 signed must be True or False, got {self.signed!r}")
        _int_in(self.p, 1, self.k - 1 if self.signed else self.k,
                f"P3109 p (precision) of a {'signed' if self.signed else 'unsigned'} k={self.k} format")
        if self.domain not in DOMAINS:
            raise ValueError(f"P3109 domain {self.domain!r} unknown; allowed: {', '.join(DOMAINS)}")
        if self.saturation not in SATURATIONS:
            raise ValueError(f"P3109 saturation {self.saturation!r} unknown; allowed: {', '.join(SATURATIONS)}")
        object.__setattr__(self, "rounding", _enum(Rounding, self.rounding, "rounding"))

    # -- derived constants -------------------------------------------------------------
    @property
    def man(self) -> int:
        """Fraction bits (P - 1)."""
        return self.p - 1

    @property
    def bias(self) -> int:
        return 2 ** (self.k - self.p - 1) if self.signed else 2 ** (self.k - self.p)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def top_code(self) -> int:
        """The largest magnitude code that is a finite number."""
        codes = 2 ** (self.k - 1) if self.signed else 2 ** self.k - 1  # magnitude codes, NaN excluded
        return codes - 1 - (self.domain == "extended")

    def significand_of(self, code: int) -> tuple[int, int]:
        """``(kept, q)``: magnitude ``kept * 2**q`` of magnitude code ``code``."""
        field, frac = code >> self.man, code & (2 ** self.man - 1)
        if field == 0:
            return frac, self.emin - self.man
        return 2 ** self.man + frac, field - self.bias - self.man

    @property
    def emax(self) -> int:
        kept, q = self.significand_of(self.top_code)
        return q + kept.bit_length() - 1

    @property
    def max(self) -> float:
        kept, q = self.significand_of(self.top_code)
        return kept * 2.0 ** q

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man)

    @property
    def has_inf(self) -> bool:
        return self.domain == "extended"

    @property
    def name(self) -> str:
        """gfloat's name of the format (without rounding and saturation)."""
        return f"p3109_k{self.k}p{self.p}{'s' if self.signed else 'u'}{self.domain[0]}"

    # -- the protocol (the rest from ElementFormat) --------------------------------------
    def transport_bytes(self) -> Optional[int]:
        return 1

    def short_name(self, name_of=None) -> str:
        sat = "" if self.saturation == "satfinite" else f"/{self.saturation}"
        rnd = "" if self.rounding is Rounding.NEAREST else _RND[self.rounding.value]
        return f"{self.name[6:]}{rnd}{sat}"

    def __repr__(self) -> str:
        rnd = "" if self.rounding is Rounding.NEAREST else f", rounding={self.rounding}"
        sat = "" if self.saturation == "satfinite" else f", saturation={self.saturation}"
        return f"P3109({self.name}{rnd}{sat})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "p3109", "k": self.k, "p": self.p, "signed": self.signed, "domain": self.domain,
                "rounding": self.rounding.value, "saturation": self.saturation}


def _by_name(key: str) -> Optional[P3109]:
    """``p3109_k8p4se``, with ``_rz`` / ``_sr`` and ``_satpropagate`` / ``_ovfinf`` (or ``_satfinite``)
    appended; None for other names."""
    m = _NAME.fullmatch(key)
    if m is None:
        return None
    k, p, s, d, rnd, sat = m.groups()
    rounding = {"rz": "truncate", "sr": "stochastic", None: "nearest"}[rnd]
    return P3109(int(k), int(p), s == "s", "extended" if d == "e" else "finite", rounding, sat or "satfinite")


def _spec(value: Any, opts: dict[str, Any]) -> P3109:
    """``{"p3109": "k8p4se"}`` (or a full name, or ``[k, p]`` with ``signed``/``domain``) and
    ``saturation``."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return P3109(*value, **opts)
    fmt = _by_name(value if str(value).startswith("p3109_") else f"p3109_{value}") if isinstance(value, str) else None
    if fmt is None:
        raise ValueError(f"'p3109' needs a name such as 'k8p4se' or [k, p], got {value!r}")
    return dataclasses.replace(fmt, **opts)


register_family("p3109", P3109, {"p3109_k8p3se": P3109(8, 3), "p3109_k8p4se": P3109(8, 4)},
                by_name=_by_name,
                name_hint="any IEEE P3109 name as gfloat spells it, p3109_k<K>p<P><s|u><e|f> (K 3..8), "
                          "with _rz or _sr and _satpropagate or _ovfinf appended, e.g. p3109_k8p4se_sr",
                spec=Spec("p3109", ("p3109", "signed", "domain", "rounding", "saturation"), _spec,
                          '{"p3109": "k8p4se", "saturation": "ovfinf"}'))
