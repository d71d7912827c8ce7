"""Per-layer precision: which format each of the nine quantization points uses.

The nine points of the original simulator, for a GEMM-like layer ``y = x W``:

==========  ===============================================================
``fw``      forward, weight                 ``fi``   forward, input
``fo``      forward, output
``bwo``     weight-gradient GEMM, output gradient
``bwi``     weight-gradient GEMM, input     ``bwg``  its result (weight grad)
``bio``     input-gradient GEMM, output gradient
``biw``     input-gradient GEMM, weight     ``big``  its result (input grad)
==========  ===============================================================

``LayerPrecision`` is an immutable value; layers hold one and swap it whole
(``layer.set_format(point, fmt)`` builds the replacement). ``Accumulator``, the
narrow-accumulator spec a precision may carry, is a value too and lives here so
that this layer needs nothing above formats; ``bfp.accumulate`` runs the GEMMs
it describes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .formats import Float, Format, as_float, format_from_dict
from .kernels.exact import check_exact

POINTS = ("fw", "fi", "fo", "bwo", "bwi", "bwg", "bio", "biw", "big")
# Points whose formats the dynamic controller moves together.
LINKED_PAIRS = (("fw", "fi"), ("bio", "biw"), ("bwo", "bwi"))
BACKWARD_SOURCES = ("full", "quantized")
# The GEMMs of a layer that an Accumulator can serve.
GEMMS = ("forward", "input_grad", "weight_grad")


def _check_gemms(value: Any, what: str) -> tuple[str, ...]:
    """``value`` as a tuple of GEMM names in ``GEMMS`` order; ValueError naming ``what`` otherwise."""
    gemms = (value,) if isinstance(value, str) else value
    try:
        gemms = tuple(gemms)
    except TypeError:
        raise ValueError(f"{what} gemms must be a sequence of names, got {value!r}") from None
    bad = [g for g in gemms if g not in GEMMS]
    if bad or not gemms:
        raise ValueError(f"{what} gemms {list(gemms)!r} invalid; allowed: a non-empty subset of {', '.join(GEMMS)}")
    return tuple(g for g in GEMMS if g in gemms)


@dataclass(frozen=True)
class Hadamard:
    """A random Hadamard transform of the weight-gradient GEMM's inputs (``bfp.hadamard``):
    ``block`` a power of two from 2 to 256 (16 in the NVFP4 recipe), ``seed`` its sign vector."""

    block: int = 16
    seed: int = 0

    def __post_init__(self):
        b = self.block
        if isinstance(b, bool) or not isinstance(b, int) or b < 2 or b > 256 or b & (b - 1):
            raise ValueError(f"Hadamard block must be a power of two from 2 to 256, got {b!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"Hadamard seed must be an integer in [0, 2**63), got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "seed": self.seed}


@dataclass(frozen=True)
class Accumulator:
    """An emulated accumulator: partial sums rounded to ``fmt``.

    ``chunk``: reduction elements summed in float32 before each rounding of the
    running sum (``1`` = round after every product and every add). ``kahan``:
    compensated summation in ``fmt``. ``gemms``: which GEMMs of a layer use it,
    any of ``"forward"``, ``"input_grad"``, ``"weight_grad"`` (all by default:
    a narrow accumulator in hardware serves every GEMM it runs).

    Per-product options (they need ``chunk=1``): ``mul``, a ``Float`` each
    product is rounded to before it is added (default: ``fmt``); ``fma``, no
    product rounding: the product is added to the running sum with one rounding
    (``mul`` must then be unset); ``exact``, every rounding sees the exact
    product or sum instead of its float32 rounding (``bfp.kernels.exact``).
    """

    fmt: Float
    chunk: int = 32
    kahan: bool = False
    gemms: tuple[str, ...] = GEMMS
    mul: Optional[Float] = None
    fma: bool = False
    exact: bool = False

    def __post_init__(self):
        as_float(self.fmt, "Accumulator fmt")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"Accumulator chunk must be a positive integer, got {self.chunk!r}")
        if not isinstance(self.kahan, bool):
            raise ValueError(f"Accumulator kahan must be True or False, got {self.kahan!r}")
        object.__setattr__(self, "gemms", _check_gemms(self.gemms, "Accumulator"))
        self._check_products()

    def _check_products(self):
        if self.mul is not None:
            as_float(self.mul, "Accumulator mul")
        for name in ("fma", "exact"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Accumulator {name} must be True or False, got {getattr(self, name)!r}")
        if self.fma and self.mul is not None:
            raise ValueError(f"Accumulator fma=True adds the unrounded product: mul must be None, "
                             f"got mul={self.mul!r}")
        if self.per_product and self.chunk != 1:
            raise ValueError(f"Accumulator mul/fma/exact act on every product and need chunk=1 "
                             f"(a larger chunk is a float32 dot product), got chunk={self.chunk}")
        if self.exact:
            check_exact(self.fmt, "Accumulator exact=True: fmt")
            if self.mul is not None:
                check_exact(self.mul, "Accumulator exact=True: mul")

    @property
    def per_product(self) -> bool:
        """True when products are treated one by one beyond the plain chunk=1 rule."""
        return self.mul is not None or self.fma or self.exact

    @property
    def product_format(self) -> Optional[Float]:
        """The format each product is rounded to (None with fma)."""
        return None if self.fma else (self.mul or self.fmt)

    def uses(self, gemm: str) -> bool:
        return gemm in self.gemms

    def __repr__(self) -> str:
        extra = ", kahan=True" if self.kahan else ""
        extra += "" if self.gemms == GEMMS else f", gemms={list(self.gemms)}"
        extra += "" if self.mul is None else f", mul=e{self.mul.exp}m{self.mul.man}"
        extra += ", fma=True" if self.fma else ""
        extra += ", exact=True" if self.exact else ""
        return f"Accumulator(e{self.fmt.exp}m{self.fmt.man}, chunk={self.chunk}{extra})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the per-product keys only where they differ from the defaults."""
        d = {"fmt": self.fmt.to_dict(), "chunk": self.chunk, "kahan": self.kahan,
             "gemms": list(self.gemms)}
        if self.mul is not None:
            d["mul"] = self.mul.to_dict()
        d.update({k: True for k in ("fma", "exact") if getattr(self, k)})
        return d


ROUNDINGS = ("truncate", "nearest")


@dataclass(frozen=True)
class FusedAccumulator:
    """A tensor core's multi-term fused adder: ``terms`` exact products and the running sum aligned
    to the largest exponent, cut to ``align_bits`` below it, summed exactly, the result cut to
    ``sum_bits``; every field and the arithmetic are in ``bfp.tensorcore``'s docstring, which
    computes it (``fused_matmul``) and names the hardware presets."""

    terms: int = 32
    align_bits: int = 13
    sum_bits: int = 13
    accumulator_in_alignment: bool = True
    align_rounding: str = "truncate"
    sum_rounding: str = "truncate"
    align_emin: int = -132
    sum_emin: int = -126
    product_exponent: str = "operands"
    operand_emin: Any = -6  # an int, (a, b) per operand, or None: each operand point's format's
    promote_every: int = 0
    split_k: int = 1
    gemms: tuple[str, ...] = GEMMS
    name: str = field(default="", compare=False)

    def __post_init__(self):
        for f in ("terms", "align_bits", "sum_bits", "split_k"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"FusedAccumulator {f} must be a positive integer, got {v!r}")
        if isinstance(self.promote_every, bool) or not isinstance(self.promote_every, int) or \
                self.promote_every < 0 or (self.promote_every and self.promote_every % self.terms):
            raise ValueError(f"FusedAccumulator promote_every must be 0 (one chain) or a positive multiple of "
                             f"terms {self.terms}, got {self.promote_every!r}")
        for f in ("align_rounding", "sum_rounding"):
            if getattr(self, f) not in ROUNDINGS:
                raise ValueError(f"FusedAccumulator {f} {getattr(self, f)!r} unknown; allowed: {', '.join(ROUNDINGS)}")
        emins = self.operand_emin if isinstance(self.operand_emin, tuple) else (self.operand_emin,)
        if self.operand_emin is not None and not all(isinstance(e, int) and not isinstance(e, bool)
                                                     for e in emins):
            raise ValueError(f"FusedAccumulator operand_emin must be an integer, a pair (a, b) of them, or None "
                             f"(each operand's format's), got {self.operand_emin!r}")
        object.__setattr__(self, "gemms", _check_gemms(self.gemms, "FusedAccumulator"))
        if self.product_exponent not in ("operands", "product"):
            raise ValueError(f"FusedAccumulator product_exponent {self.product_exponent!r} unknown; allowed: "
                             f"operands, product")


    def uses(self, gemm: str) -> bool:
        return gemm in self.gemms

    def emins(self) -> tuple[int, int]:
        """(a's, b's) smallest normal exponent of the operands (-126 where unknown)."""
        e = -126 if self.operand_emin is None else self.operand_emin
        return e if isinstance(e, tuple) else (e, e)

    def __repr__(self) -> str:
        if self.name:
            return f"FusedAccumulator({self.name!r})"
        return (f"FusedAccumulator(terms={self.terms}, align_bits={self.align_bits}, sum_bits={self.sum_bits}, "
                f"promote_every={self.promote_every})")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["gemms"] = list(self.gemms)
        if isinstance(self.operand_emin, tuple):
            d["operand_emin"] = list(self.operand_emin)
        return {"kind": "tensorcore", **d}


def accumulator_from_dict(d: dict[str, Any]) -> Union[Accumulator, "FusedAccumulator"]:
    """Inverse of ``Accumulator.to_dict`` (and ``FusedAccumulator.to_dict``, ``"kind": "tensorcore"``);
    unknown keys are rejected by name."""
    if isinstance(d, dict) and d.get("kind") == "tensorcore":
        names = {f.name for f in dataclasses.fields(FusedAccumulator)}
        unknown = set(d) - names - {"kind"}
        if unknown:
            raise ValueError(f"unknown tensor-core accumulator keys {sorted(unknown)}; allowed: "
                             f"{', '.join(sorted(names))}")
        kw = {k: v for k, v in d.items() if k != "kind"}
        if isinstance(kw.get("operand_emin"), list):
            kw["operand_emin"] = tuple(kw["operand_emin"])
        if "gemms" in kw:
            kw["gemms"] = tuple(kw["gemms"])
        return FusedAccumulator(**kw)
    if not isinstance(d, dict) or "fmt" not in d:
        raise ValueError(f"an accumulator dict needs a 'fmt' key, got {d!r}")
    allowed = ("fmt", "chunk", "kahan", "gemms", "mul", "fma", "exact")
    unknown = set(d) - set(allowed)
    if unknown:
        raise ValueError(f"unknown accumulator keys {sorted(unknown)}; allowed: {', '.join(allowed)}")
    kw = dict(d)
    for key in ("fmt", "mul"):
        if kw.get(key) is not None:
            kw[key] = format_from_dict(kw[key])
    return Accumulator(**kw)


def check_point(point: str) -> str:
    if point not in POINTS:
        raise ValueError(f"unknown quantization point {point!r}; allowed: {', '.join(POINTS)}")
    return point


@dataclass(frozen=True)
class LayerPrecision:
    """Formats for the nine points (``None`` = keep full precision) and options.

    ``backward_source``: ``"full"`` (default) quantizes the full-precision
    tensors saved by the forward pass at the backward points, so backward
    precision can exceed forward precision; ``"quantized"`` reproduces hardware
    that keeps only the quantized forward copies (``bwi`` then starts from the
    ``fi``-quantized input, ``biw`` from the ``fw``-quantized weight).

    ``accumulator``: an ``Accumulator`` (emulated by ``bfp.accumulate``) used by
    the layer's GEMMs, or ``None`` for ordinary float32 accumulation.

    ``rht``: a ``Hadamard`` transform of the weight-gradient GEMM's inputs before
    ``bwo``/``bwi`` round them (Linear and Matmul layers; ``bfp.hadamard``), or ``None``.
    """

    fw: Optional[Format] = None
    fi: Optional[Format] = None
    fo: Optional[Format] = None
    bwo: Optional[Format] = None
    bwi: Optional[Format] = None
    bwg: Optional[Format] = None
    bio: Optional[Format] = None
    biw: Optional[Format] = None
    big: Optional[Format] = None
    backward_source: str = "full"
    accumulator: Optional[Accumulator] = None
    rht: Optional[Hadamard] = None

    def __post_init__(self):
        for p in POINTS:
            f = getattr(self, p)
            if f is not None and not isinstance(f, Format):
                raise ValueError(f"point {p!r} needs a Format or None, got {f!r}")
        if self.accumulator is not None and not isinstance(self.accumulator, (Accumulator, FusedAccumulator)):
            raise ValueError(f"accumulator must be a bfp.accumulate.Accumulator, a FusedAccumulator or None, "
                             f"got {self.accumulator!r}")
        if self.rht is not None and not isinstance(self.rht, Hadamard):
            raise ValueError(f"rht must be a Hadamard or None, got {self.rht!r}")
        if self.backward_source not in BACKWARD_SOURCES:
            raise ValueError(f"backward_source must be one of {BACKWARD_SOURCES}, "
                             f"got {self.backward_source!r}")

    def formats(self) -> dict[str, Optional[Format]]:
        return {p: getattr(self, p) for p in POINTS}

    @property
    def enabled(self) -> bool:
        """True when any point quantizes, an accumulator is emulated or a Hadamard transform runs."""
        return (self.accumulator is not None or self.rht is not None
                or any(getattr(self, p) is not None for p in POINTS))

    def with_format(self, point: str, fmt: Optional[Format]) -> "LayerPrecision":
        return dataclasses.replace(self, **{check_point(point): fmt})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {p: (None if f is None else f.to_dict()) for p, f in self.formats().items()}
        d["backward_source"] = self.backward_source
        acc = self.accumulator
        d["accumulator"] = None if acc is None else acc.to_dict()
        if self.rht is not None:  # absent when off: older saved states stay equal
            d["rht"] = self.rht.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LayerPrecision":
        unknown = set(d) - set(POINTS) - {"backward_source", "accumulator", "rht"}
        if unknown:
            raise ValueError(f"unknown LayerPrecision keys {sorted(unknown)}; allowed: "
                             f"{', '.join(POINTS)}, backward_source, accumulator, rht")
        kw: dict[str, Any] = {p: (None if d.get(p) is None else format_from_dict(d[p])) for p in POINTS}
        kw["backward_source"] = d.get("backward_source", "full")
        if d.get("accumulator") is not None:
            kw["accumulator"] = accumulator_from_dict(d["accumulator"])
        if d.get("rht") is not None:
            kw["rht"] = hadamard_from_dict(d["rht"])
        return cls(**kw)

    def __repr__(self) -> str:
        on = ", ".join(f"{p}={getattr(self, p)!r}" for p in POINTS if getattr(self, p) is not None)
        extra = "" if self.backward_source == "full" else f", backward_source={self.backward_source!r}"
        extra += "" if self.accumulator is None else f", accumulator={self.accumulator!r}"
        extra += "" if self.rht is None else f", rht=Hadamard({self.rht.block}, seed={self.rht.seed})"
        return f"LayerPrecision({on or 'off'}{extra})"


def hadamard_from_dict(d: Any) -> Hadamard:
    """``{"block": 16, "seed": 0}`` (or a bare block size) as a ``Hadamard``."""
    if isinstance(d, int) and not isinstance(d, bool):
        return Hadamard(d)
    if not isinstance(d, dict) or set(d) - {"block", "seed"}:
        raise ValueError(f"rht must be a block size or {{\"block\": 16, \"seed\": 0}}, got {d!r}")
    return Hadamard(**d)
