"""The element rule compiled for the CPU, and its float32 shortcuts for nearest rounding.

``scalar.build`` compiles the integer rule with ``numba.njit`` (``_elem``, ``_tile_consts``,
``_finish``; the counter-based random numbers are ``_rand32``, scalar's hash in 32-bit lanes).
Numba widens integer arithmetic to 64 bits, so the integer rule runs on four lanes of a 256-bit
vector; the shortcuts below do the rounding itself as float32 arithmetic
(eight lanes), proven equal to the integer rule where their conditions hold:

* ``_elem_nearest``: the magnitude rounded as ``(a + c) - c`` with ``c`` a power of two from the
  exponent bits (integer constants), then the rule's own ``_finish``;
* ``_elem_scaled``: an MX element of a block with scale ``2**s`` as the element format's own
  rule on ``x * 2**-s``, times ``2**s``, in float32 throughout (``c`` from ``_ufp``).

``cpu._cache_dir`` hashes this file (and every kernel module): the kernels inline it.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from ..scalar import EXP_INF, MAG, QNAN, build


@njit(inline="always")
def _flog2_subnormal(m):
    # int -> float32 is exact below 2**24; its exponent field is floor(log2 m).
    return ((np.float32(m).view(np.int32) >> 23) - 127) - 149


_elem, _tile_consts, _rand32_64, _finish = build(njit(inline="always"), _flog2_subnormal)


@intrinsic
def _rand32(typingctx, k0, k1, i):
    """``scalar._rand32`` (keys below 2**32, as ``dispatch._keys`` draws them) written as 32-bit LLVM
    operations, so a loop of them vectorises on eight 32-bit lanes (Numba's integer arithmetic is
    64-bit: four lanes; ``_rand32_64``, the same numbers). 0 <= result < 2**32, as an int64."""
    def codegen(context, builder, signature, args):
        k0, k1, i = args
        i32 = ir.IntType(32)

        def mix(x):
            for shift, mult in ((16, 0x21F0AAAD), (15, 0x735A2D97)):
                x = builder.mul(builder.xor(x, builder.lshr(x, ir.Constant(i32, shift))), ir.Constant(i32, mult))
            return builder.xor(x, builder.lshr(x, ir.Constant(i32, 15)))
        lo = builder.trunc(i, i32)
        hi = builder.trunc(builder.lshr(i, ir.Constant(ir.IntType(64), 32)), i32)
        x = mix(builder.xor(lo, builder.trunc(k0, i32)))
        x = mix(builder.xor(builder.xor(x, hi), builder.trunc(k1, i32)))
        return builder.zext(x, ir.IntType(64))
    return types.int64(types.int64, types.int64, types.int64), codegen


@njit(inline="always")
def _nearest_ok(kind, qt, p2q, hi, man):
    """Whether ``_elem_nearest`` gives the element rule's bits for these tile constants: the
    constant ``c`` below is a normal float32 for every input, the grid (the format's LSB) is at
    least 2**-125, so a float32 subnormal input (below half of it) rounds to 0 whether or not the
    CPU treats subnormals as zero (DAZ/FTZ), and a format with no mantissa bits (one code per
    binade, ties by the exponent field's parity) keeps the integer rule, as does one with 23
    mantissa bits (``c`` must exceed every value of the binade, so ``man <= 22``)."""
    if kind == 1:  # FIXED: c = 2**(q + 23) above every value that is not clamped to hi
        return (qt >= -125) & (qt <= 103) & (hi < ((qt + 150) << 23))
    return (man >= 1) & (man <= 22) & (qt - man >= -125) & ((hi & EXP_INF) + ((24 - man) << 23) < EXP_INF)


@njit(inline="always")
def _elem_nearest(xb, kind, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan):
    """The element rule (``scalar._quant_elem``) for nearest rounding, where ``_nearest_ok``: the
    magnitude ``a`` rounded to its LSB ``2**k`` as ``(a + c) - c`` in float32 with
    ``c = 2**(k + 23)``, whose float32 ulp is ``2**k`` for every sum up to ``2 * c``: one IEEE
    float32 rounding, ties to the even multiple, which is the even code (``man >= 1``); a carry is
    the next binade, as in the integer rule. ``k`` is the fixed LSB of a BlockFloat tile, or for a
    float the LSB of ``a``'s binade clamped to [the format's smallest normal, one above its
    largest] (a value beyond that overflows either way). No variable shifts and no branches, so
    the loops vectorise; the end (clamp or overflow, flush, sign, Inf and NaN) is the
    rule's own ``_finish``. Equal to the integer rule on all 2**32 inputs of the formats in
    tests/test_kernels_nearest.py."""
    m = xb & MAG
    if kind == 1:
        cb = p2q + (23 << 23)
    else:
        cb = min(max(m & EXP_INF, lo), (hi & EXP_INF) + (1 << 23)) + ((23 - man) << 23)
    c = np.int32(cb).view(np.float32)
    rb = np.int64(np.float32((np.int32(m).view(np.float32) + c) - c).view(np.int32))
    return _finish(xb, rb, kind, 1, hi, lo, ftz, ovf_inf, inf_nan)


@njit(inline="always")
def _ufp(a):
    """``2**floor(log2 a)`` (the unit in the first place) of a normal float32 ``a > 0`` below
    ``2**100``, in float32 arithmetic: ``|q - (1 - u) q|`` with ``q = (2**23 + 1) a``,
    ``u = 2**-24`` (S. M. Rump, "Ultimately fast accurate summation", SIAM J. Sci. Comput. 31(5),
    2009, Algorithm 3.5; exact in round-to-nearest without overflow or underflow, which the
    bound on ``a`` ensures; tests/test_kernels_nearest.py checks whole binades)."""
    q = a * np.float32(8388609.0)
    return np.abs(q - np.float32(1 - 2.0 ** -24) * q)


@njit(inline="always")
def scaled_consts(e0, e1, e2, e3, man, inf_nan):
    """float32 constants of ``_elem_scaled`` from the element format's own tile constants
    (``_tile_consts`` at scale 0): ``(lo, top, hi, c23, qnan, ok)``: its smallest normal
    ``2**emin``, one binade above its largest finite value, the largest finite value, ``2**(23 -
    man)``, the quiet NaN, and whether ``_elem_scaled`` gives the integer rule's bits (the nearest
    shortcut applies and ``_ufp`` is exact on ``[lo, top]``, within ``2**-100 .. 2**100``)."""
    ebits = (e2 & EXP_INF) + (1 << 23)
    ok = (_nearest_ok(0, e0, e1, e2, man) & (ebits <= ((127 + 100) << 23))
          & (e3 >= ((127 - 100) << 23)))
    return (np.int32(e3).view(np.float32), np.int32(ebits).view(np.float32), np.int32(e2).view(np.float32),
            np.int32((127 + 23 - man) << 23).view(np.float32), np.int32(QNAN).view(np.float32), ok)


@njit(inline="always")
def scale_pair(lo_bits, emin):
    """An MX tile's scale ``2**s`` from its ``lo`` constant (``_tile_consts``: ``2**(emin + s)``):
    ``(float32 bits of 2**-s, of 2**s, whether |s| > 126)`` (outside that the two are not normal
    floats and ``_elem_scaled`` does not apply)."""
    s = ((lo_bits >> 23) - 127) - emin
    return (127 - s) << 23, (127 + s) << 23, (s < -126) | (s > 126)


@njit(inline="always")
def fixed_c(p2q):
    """float32 bits of ``c = 2**(q + 23)`` from a fixed-point tile's ``p2q`` (bits of ``2**q``)."""
    return p2q + (23 << 23)


@njit(inline="always")
def _special_f(r, y, a, hi, qnan, inf_nan):
    """``_finish``'s last steps in floats: ``y``'s sign on the rounded magnitude ``r``, then an Inf
    input stays Inf, becomes NaN (``inf_nan & 1``) or the signed largest value (``& 2``); P3109's
    switches (``inf_nan >= 4``): a zero result is +0, and a negative input with a non-NaN result
    becomes +0 (``& 16``) or NaN (``& 8``)."""
    r = np.copysign(r, y)
    if a == np.float32(np.inf):
        r = qnan if inf_nan & 1 else (np.copysign(hi, y) if inf_nan & 2 else y)
    if inf_nan >= 4:
        if r == np.float32(0.0):
            r = np.float32(0.0)
        elif (y < np.float32(0.0)) & (r == r):
            if inf_nan & 16:
                r = np.float32(0.0)
            elif inf_nan & 8:
                r = qnan
    return r


@njit(inline="always")
def _round_f(y, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan):
    """A float format's nearest rounding of the float32 ``y`` (not a NaN) in float32 lanes (constants:
    ``scaled_consts``): ``a = |y|`` rounds to ``(a + c) - c`` with ``c = _ufp(clamp(a, lo, top)) *
    2**(23 - man)``, the power of two ``_elem_nearest`` builds from the exponent bits; then
    ``_finish``'s steps as float compares and selects: above ``hi`` saturate (``ovf_inf`` 0), Inf (1)
    or NaN (2); under ``lo`` flush when ``ftz``; the sign and Inf inputs (``_special_f``)."""
    a = np.abs(y)
    c = _ufp(min(max(a, lo), top)) * c23
    r = (a + c) - c
    if r > hi:
        r = hi if ovf_inf == 0 else (np.float32(np.inf) if ovf_inf == 1 else qnan)
    if ftz and r < lo:
        r = np.float32(0.0)
    return _special_f(r, y, a, hi, qnan, inf_nan)


@njit(inline="always")
def _elem_f(xj, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan):
    """An element-wise float format's nearest rounding of the float32 bits ``xj`` in float32 lanes
    (``_round_f``); a NaN input is returned as it is. The integer rule's bits where
    ``scaled_consts`` says ok."""
    x = np.int32(xj).view(np.float32)
    r = _round_f(x, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan)
    return xj if x != x else np.float32(r).view(np.int32)


@njit(inline="always")
def _elem_scaled(xj, inv, fac, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan):
    """An MX element (a float format, nearest rounding) of a block with scale ``2**s``: the element
    format's own rule (``_round_f``) on ``y = x * 2**-s``, times ``2**s`` (``inv``, ``fac``: float32
    ``2**-s``, ``2**s``). The integer rule's bits wherever ``scaled_consts`` says ok (the
    multiplications by ``2**-s`` and ``2**s`` are exact where ``cpu._strip`` takes this path;
    tests/test_kernels_nearest.py compares it with ``_elem_nearest`` input by input). A NaN input
    is returned as it is (a product would quiet a signaling NaN)."""
    x = np.int32(xj).view(np.float32)
    r = _round_f(x * inv, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan)
    q = np.float32(r * fac)
    return xj if x != x else q.view(np.int32)


@njit(inline="always")
def _fixed_f(xj, c, u, hi, qnan, inf_nan, trunc):
    """A fixed-point tile's nearest rounding or truncation (BlockFloat, MX int) in float32 lanes:
    ``t = (a + c) - c`` with ``c = 2**(q + 23)`` (float32 bits ``p2q + (23 << 23)``) is ``a``
    rounded to the grid ``u = 2**q`` (every sum lies in ``[c, 2c)``, whose ulp is ``u``, or is
    clamped anyway); truncation (``trunc``) steps back one ``u`` where that went up (exact: a
    multiple of ``u`` under ``2**23 u``); then the clamp at ``hi`` (float32 of the tile's largest
    value), the sign and Inf inputs (``_special_f``); a NaN input is returned as it is. The
    integer rule's bits where ``_nearest_ok`` (kind FIXED) holds and ``inf_nan < 4``."""
    x = np.int32(xj).view(np.float32)
    a = np.abs(x)
    t = (a + c) - c
    if trunc and t > a:
        t = t - u
    r = _special_f(min(t, hi), x, a, hi, qnan, inf_nan)
    return xj if x != x else np.float32(r).view(np.int32)

