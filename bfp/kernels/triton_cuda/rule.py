"""The element rule of ``kernels/scalar.py`` as Triton functions over blocks of elements.

The same integer arithmetic on float32 bit patterns, in 32-bit lanes (``scalar.py`` holds them in
int64 for Numba's sake; every value here fits 32 bits, and 64-bit integer operations cost a GPU two
to four instructions each): magnitudes, exponents and rounded bits are int32, the random numbers of
stochastic rounding and the sums whose carry decides it are uint32 (the carry of ``a + r`` is
``a + r < a`` after the 32-bit wrap). Written branch-free with ``tl.where`` so it runs on whole
blocks. Nearest, truncation and stochastic rounding go by float32 adds where that is exact by
construction (``_magic_round``: ``quant_const`` for element-wise rules, ``quant_tile`` in tiles;
about a third of the integer rule's instructions, and on the FP32 pipe, which issues at twice the
integer ALU's rate); bfloat16-range formats, nearest on one-code-per-binade formats and ranges
the adds cannot cover keep the integer rule (``quant_elem``). The float steps are IEEE ``add.rn.f32``/``mul.rn.f32`` without
flush-to-zero (Triton emits no ``.ftz`` for them; launches turn FMA fusion off), never libdevice.
The one other float instruction is an integer-to-float32 conversion of a value below 2**24, exact
in every rounding mode (``ilog2_small``). Triton's interpreter (CI, on the CPU: NumPy float32)
and a GPU compute the same bits, and both equal ``scalar.py`` and the PyTorch reference (the
conformance tests).

Where ``scalar.py``'s int64 values would leave 32 bits, the cases are named: a clamp bound above
every finite float32 (an exponent field past 254, only for scales near E8M0's top) is kept as
``0x7FFFFFFF``, which compares with every finite rounded value as the int64 bound does; shift
amounts are clamped into 0..31 wherever a lane the result does not use could carry one outside it
(such a shift is undefined in LLVM and in NumPy alike). Globals a kernel reads are constexpr.
"""
from __future__ import annotations

import triton
import triton.language as tl

MAG = tl.constexpr(0x7FFFFFFF)
EXP_INF = tl.constexpr(0x7F800000)
QNAN = tl.constexpr(0x7FC00000)
SIGN = tl.constexpr(-2147483648)  # the sign bit of an int32


@triton.jit
def ilog2(v):
    """floor(log2(v)) for 0 < v < 2**31 (0 for v == 0), as ``scalar.ilog2``."""
    p = tl.where(v >= 65536, 16, 0)
    v = v >> p
    t = tl.where(v >= 256, 8, 0)
    v = v >> t
    p += t
    t = tl.where(v >= 16, 4, 0)
    v = v >> t
    p += t
    t = tl.where(v >= 4, 2, 0)
    v = v >> t
    p += t
    return p + tl.where(v >= 2, 1, 0)


@triton.jit
def ilog2_small(v):
    """floor(log2(v)) for 0 < v < 2**24 (-127 for v == 0): the exponent field of ``v`` converted to
    float32, which is exact below 2**24 in every rounding mode, so the interpreter and a GPU agree
    bit for bit (one conversion instead of ``ilog2``'s five steps). The rule needs it only for
    subnormal magnitudes (< 2**23)."""
    return (v.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127


@triton.jit
def pow2_bits(q):
    """float32 bits of 2**q; 0 below the smallest subnormal (``scalar._pow2_bits``)."""
    sub = tl.full(q.shape, 1, tl.int32) << tl.minimum(tl.maximum(q + 149, 0), 30)
    return tl.where(q >= -126, (q + 127) << 23, tl.where(q >= -149, sub, 0))


@triton.jit
def bits_of(KEPT: tl.constexpr, P: tl.constexpr, q):
    """float32 bits of KEPT * 2**q (``scalar._bits_of``) for a constant ``KEPT`` > 0 whose
    floor(log2) is ``P`` (KEPT < 2**24 in every rule); ``0x7FFFFFFF`` past float32's exponent
    field (module docstring)."""
    ex = P + q + 126
    sub = tl.full(q.shape, KEPT, tl.int32) << tl.minimum(tl.maximum(23 - P + ex, 0), 30)
    top = (tl.minimum(ex, 254) << 23) + (KEPT << (23 - P))  # ex is the biased exponent minus one
    return tl.where(ex >= 255, MAG, tl.where(ex >= 0, top, sub))


@triton.jit
def mix32(x):
    x ^= x >> 16
    x = x * 0x21F0AAAD
    x ^= x >> 15
    x = x * 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def rand32(k0, k1, i, IDX64: tl.constexpr):
    """``scalar._rand32`` for flat indices ``i`` (int64 when ``IDX64``, else int32 >= 0) and uint32
    keys: uint32 results."""
    lo = i.to(tl.uint32)
    if IDX64:
        hi = (i >> 32).to(tl.uint32)
        return mix32(mix32(lo ^ k0) ^ hi ^ k1)
    return mix32(mix32(lo ^ k0) ^ k1)


@triton.jit
def carry(a, r):
    """The carry out of the uint32 sum ``a + r``: 1 where it wraps, else 0 (int32)."""
    return ((a + r) < a).to(tl.int32)


@triton.jit
def tile_consts(tmax, KIND: tl.constexpr, SCALE: tl.constexpr, SOFF: tl.constexpr, QOFF: tl.constexpr,
                LIM: tl.constexpr, PLIM: tl.constexpr, EMIN: tl.constexpr, MAN: tl.constexpr,
                MAXKEPT: tl.constexpr, PMAXKEPT: tl.constexpr, EMAXQ: tl.constexpr, TOP: tl.constexpr,
                MB: tl.constexpr):
    """``scalar._tile_consts`` for a block of tile maxima ``tmax`` (int32 magnitude bits):
    ``(qt, p2q, hi, lo)``. ``PLIM``/``PMAXKEPT``: floor(log2) of ``LIM``/``MAXKEPT``; ``TOP``
    the element's largest significand (``LIM`` or ``MAXKEPT``) and ``MB`` its floor(log2): the host's."""
    e = tmax >> 23
    fl = tl.where(e > 0, e - 127, ilog2_small(tmax) - 149)
    s = tl.where(tmax != 0, fl - SOFF, 0)
    if SCALE >= 3:  # MX scale modes other than floor: one binade up or not
        norm = tmax << tl.minimum(tl.maximum(23 - ilog2_small(tmax & 0x7FFFFF), 0), 23)
        sig = tl.where(e > 0, (tmax & 0x7FFFFF) | 0x800000, norm)
        if SCALE == 3:  # ceil
            up = (sig != 0x800000).to(tl.int32)
        elif SCALE == 4:  # even
            if MB < 23:
                up = (sig + (1 << (22 - MB)) >= 0x1000000).to(tl.int32)
            else:
                up = tl.zeros_like(sig)
        else:  # rceil
            up = (sig > (TOP << (23 - MB))).to(tl.int32)
        s = tl.where(tmax != 0, s + up, s)
    if SCALE >= 2:  # E8M0 range
        s = tl.minimum(tl.maximum(s, -127), 127)
    if KIND == 1:
        q = s + QOFF
        hi = tl.where(q >= -149, bits_of(LIM, PLIM, q), MAG)
        return q, pow2_bits(q), hi, tl.zeros_like(q)
    es = EMIN + s
    return es, pow2_bits(es - MAN), bits_of(MAXKEPT, PMAXKEPT, EMAXQ + s), pow2_bits(es)


@triton.jit
def quant_elem(b, qt, p2q, hi, lo, r, KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr,
               FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr, SUB_LOG: tl.constexpr = True):
    """``scalar._quant_elem`` over a block: the quantized float32 bits (int32) of the float32 bits
    ``b`` (int32); ``r``: uint32 random numbers (stochastic mode). ``SUB_LOG`` False: the caller
    knows every ``qt`` is at least -127 (an element-wise format's emin), so a subnormal input's own
    exponent is not needed (it is at most -127 and loses the max to ``qt``)."""
    m = b & MAG
    e = m >> 23
    if KIND == 1:
        q = qt
    elif SUB_LOG:
        fl = tl.where(e == 0, ilog2_small((m & 0x7FFFFF) | 1) - 149, e - 127)
        q = tl.maximum(fl, qt) - MAN
    else:  # qt >= -127 everywhere: a float32 subnormal's floor(log2) (<= -127) never wins the max
        q = tl.maximum(e - 127, qt) - MAN
    d = q - (tl.maximum(e, 1) - 150)
    ds = tl.minimum(tl.maximum(d, 1), 23)
    rem = m & ((1 << ds) - 1)
    sig = (m & 0x7FFFFF) | ((e > 0).to(tl.int32) << 23)
    if MODE == 1:  # nearest, ties to even
        half = 1 << (ds - 1)
        if KIND == 0 and MAN == 0:  # one code per binade: a code's parity is its exponent field's
            odd = ((m >> ds) != 0).to(tl.int32) & ((q - qt + 1) & 1)
        else:
            odd = ((m >> ds) & 1) | ((ds == 23) & (e > 0)).to(tl.int32)
        up = ((rem > half) | ((rem == half) & (odd != 0))).to(tl.int32)
        upb = ((d == 24) & (sig > 0x800000)).to(tl.int32)
    elif MODE == 2:  # stochastic: carry out of (top 32 dropped bits + r)
        up = carry(rem.to(tl.uint32) << (32 - ds), r)
        su = sig.to(tl.uint32)
        r32 = tl.where(d <= 32, su << tl.minimum(tl.maximum(32 - d, 0), 31), su >> tl.minimum(tl.maximum(d - 32, 0), 31))
        upb = carry(r32, r)
    else:
        up = tl.zeros_like(m)
        upb = tl.zeros_like(m)
    rb = m - rem + (up << ds)
    rb = tl.where(d > 23, upb * p2q, rb)
    rb = tl.where(d <= 0, m, rb)
    return finish(b, rb, hi, lo, KIND, MODE, FTZ, OVF_INF, INF_NAN)


@triton.jit
def finish(b, rb, hi, lo, KIND: tl.constexpr, MODE: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
           INF_NAN: tl.constexpr):
    """``scalar._finish``: clamp or overflow at ``hi``, flush below ``lo``, sign, Inf/NaN inputs and
    the special-value switches."""
    m = b & MAG
    neg = b < 0
    sign = b & SIGN
    if KIND == 1:
        rb = tl.minimum(rb, hi)
    else:
        if OVF_INF == 0 or MODE == 0:
            rb = tl.where(rb > hi, hi, rb)
        elif OVF_INF == 1:
            rb = tl.where(rb > hi, EXP_INF, rb)
        else:
            rb = tl.where(rb > hi, QNAN, rb)
        if FTZ:
            rb = tl.where(rb < lo, 0, rb)
    rb = rb | sign
    special = b  # Inf and NaN inputs keep their bits unless a switch says otherwise
    if INF_NAN & 1:
        special = tl.where(m == EXP_INF, QNAN, special)
    elif INF_NAN & 2:
        special = tl.where(m == EXP_INF, hi | sign, special)
    rb = tl.where(m >= EXP_INF, special, rb)
    if INF_NAN >= 4:  # P3109: one zero; unsigned formats have no negative values
        mag = rb & MAG
        if INF_NAN & 16:
            rb = tl.where(neg & (mag <= EXP_INF), 0, rb)
        elif INF_NAN & 8:
            rb = tl.where(neg & (mag <= EXP_INF) & (mag != 0), QNAN, rb)
        rb = tl.where((rb & MAG) == 0, 0, rb)
    return rb


@triton.jit
def _magic_round(a, c, r, MODE: tl.constexpr):
    """``a`` (float32, >= 0) rounded to a multiple of ``g = c * 2**-23`` (``c`` a power of two of at
    least 2**-126 with ``a < c``): ``(a + c) - c`` is IEEE round-to-nearest-even of ``a`` to that
    grid (the sum lies in ``[c, 2c]``, whose spacing is the grid, and the difference is exact by
    Sterbenz); truncation steps down one grid unit where it rounded up (exact: a multiple of the
    grid below 2**24 units). Stochastic (``r``: uint32 draws; needs ``c <= 2**126``): the truncation
    ``t``, the dropped part ``f = a - t`` (exact), ``F = floor(f / g * 2**32)`` (two products by
    powers of two, ``1 / c`` then ``2**55``: exact, except that ``f / c`` below 2**-126 may lose bits
    in the subnormal range, where ``F < 2**-71`` floors to 0 either way; the conversion truncates),
    and one grid unit more where
    ``F + r`` carries out of 32 bits: the integer rule's test, ``rem * 2**(32 - ds) + r >= 2**32``,
    on the same bits. Every step is exact or one IEEE rounding, so the interpreter's NumPy float32
    and a GPU's ``add.f32``/``mul.f32``/``cvt.rzi.u32.f32`` (no FTZ, fusion off) agree."""
    t = (a + c) - c
    if MODE == 0:
        t = tl.where(t > a, t - c * 1.1920928955078125e-07, t)
    elif MODE == 2:  # (truncation spelled again: sharing ``g`` with it moved tile constants off ptxas's uniform path)
        g = c * 1.1920928955078125e-07
        t = tl.where(t > a, t - g, t)
        inv = (2130706432 - c.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)  # 1 / c: (254 - E_c) << 23
        f = (((a - t) * inv) * 36028797018963968.0).to(tl.uint32)  # (a - t) / g * 2**32: * 2**-(q + 23) * 2**55
        t = tl.where(carry(f, r) != 0, t + g, t)
    return t


@triton.jit
def quant_const(b, r, QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr, KIND: tl.constexpr,
                MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr):
    """``quant_elem`` for an element-wise rule (every constant the host's) by ``_magic_round`` where
    its range holds: a float element format of at most 21 mantissa bits (nearest: at least 1, a
    one-code-per-binade format's ties go to the even code, not the even multiple), emin >= -127,
    an LSB of at least 2**-149, and a top binade whose grid is at most 2**103, so ``c`` <= 2**126
    and nothing overflows; otherwise the integer rule. Magnitudes at or
    above ``2**(emax + 1)`` (and Inf/NaN, whose result ``finish`` replaces) are first clamped to
    it: they round above ``HI`` either way."""
    TOPE: tl.constexpr = (HI >> 23) + 1  # biased exponent of 2**(emax + 1)
    if KIND == 0 and MAN >= (1 if MODE == 1 else 0) and MAN <= 21 and QT >= -127 and QT - MAN >= -149 \
            and TOPE - 127 - MAN <= 103 and TOPE <= 254:
        mc = tl.minimum(b & MAG, TOPE << 23)
        q = tl.maximum((mc >> 23) - 127, QT) - MAN
        c = ((q + 150) << 23).to(tl.float32, bitcast=True)
        t = _magic_round(mc.to(tl.float32, bitcast=True), c, r, MODE)
        return finish(b, t.to(tl.int32, bitcast=True), HI, LO, KIND, MODE, FTZ, OVF_INF, INF_NAN)
    return quant_elem(b, QT, P2Q, HI, LO, r, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN, QT < -127)


@triton.jit
def quant_tile(b, tmax, qt, p2q, hi, lo, r, KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr,
               EMIN: tl.constexpr, EMAXQ: tl.constexpr, LIM: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
               INF_NAN: tl.constexpr):
    """``quant_elem`` in a tile whose constants ``tile_consts`` gave from its largest finite magnitude
    ``tmax``, by ``_magic_round`` where it holds (fixed-point elements of at most 23 bits; float
    elements of at most 21 mantissa bits, at least 1 for nearest), the integer rule otherwise. A
    tile whose element grid passes 2**103 works 64 binades down (``down``/``up``: exact powers of
    two, chosen once a tile; an element that underflows there is far below half the grid and
    rounds to zero, or for stochastic rounding below 2**-32 of it, either way), so ``c`` never
    passes 2**126. Magnitudes are clamped to
    ``tmax`` first: only Inf and NaN exceed it, and ``finish`` replaces their result."""
    if (KIND == 1 and LIM < 8388608) or (KIND == 0 and MAN >= (1 if MODE == 1 else 0) and MAN <= 21):
        mc = tl.minimum(b & MAG, tmax)
        if KIND == 1:
            kt = tl.where(qt > (103 if MODE == 2 else 104), 64, 0)
            c = ((tl.maximum(qt - kt, -149) + 150) << 23).to(tl.float32, bitcast=True)
        else:  # the element's own binade, at least the tile's smallest normal (``qt`` = emin + s)
            kt = tl.where(qt - EMIN + EMAXQ > (103 if MODE == 2 else 104), 64, 0)
            e = mc >> 23
            fl = tl.where(e == 0, ilog2_small((mc & 0x7FFFFF) | 1) - 149, e - 127)
            c = ((tl.maximum(tl.maximum(fl, qt) - MAN - kt, -149) + 150) << 23).to(tl.float32, bitcast=True)
        down = ((127 - kt) << 23).to(tl.float32, bitcast=True)
        up = ((127 + kt) << 23).to(tl.float32, bitcast=True)
        t = _magic_round(mc.to(tl.float32, bitcast=True) * down, c, r, MODE) * up
        return finish(b, t.to(tl.int32, bitcast=True), hi, lo, KIND, MODE, FTZ, OVF_INF, INF_NAN)
    return quant_elem(b, qt, p2q, hi, lo, r, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN)
