"""The element rule, once, for every fast backend.

``build(jit)`` compiles these plain-integer functions with ``numba.njit`` (CPU)
or ``numba.cuda.jit(device=True)`` (CUDA), so both fast paths run literally the
same code. All arithmetic is on float32 *bit patterns* held in int64: no
float rounding happens anywhere, which is what makes the result exact and
identical across backends. ``reference.py`` spells the same rule in PyTorch.
(The CPU's nearest rounding may take ``rule_cpu._elem_nearest``, one float32 add and
subtract proven equal to this rule where it applies, ending in ``_finish``.)

Notation: ``m`` is the magnitude bits of a finite float32 (``bits & 0x7fffffff``),
``q`` the exponent of the target LSB, ``kept`` the magnitude in LSB units.
"""

import builtins

MAG = 0x7FFFFFFF  # magnitude bits of a float32
EXP_INF = 0x7F800000
QNAN = 0x7FC00000
# The element rule's special-value switches (``Rule.inf_nan``, a bit set):
INF_NAN = 1        # an Inf input becomes NaN (the format has no Inf)
INF_SAT = 2        # an Inf input becomes ±max (P3109's saturating projections)
NO_NEG_ZERO = 4    # every zero result is +0 (the format has one zero)
NEG_NAN = 8        # unsigned: a negative input that does not round to 0 becomes NaN
NEG_ZERO = 16      # unsigned, saturating: a negative input becomes +0, the nearest value it has
# ``Rule.ovf_inf``: what a finite value rounded past max becomes: 0 ±max, 1 ±Inf, 2 NaN; truncation
# never rounds past max (IEEE 754's round toward zero gives ±max there).


def ilog2(v):
    """floor(log2(v)) for 0 < v < 2**32, branch-free (binary search, unrolled)."""
    p = 0
    for sh in (16, 8, 4, 2, 1):
        t = (v >= (1 << sh)) * sh
        v >>= t
        p += t
    return p


def _flog2(m):
    """floor(log2 |x|) of a nonzero finite float32 with magnitude bits m."""
    e = m >> 23
    if e > 0:
        return e - 127
    return ilog2(m) - 149


def _bits_of(kept, q):
    """float32 bits of kept * 2**q (0 <= kept < 2**25, result >= 2**-149)."""
    if kept == 0:
        return 0
    p = ilog2(kept)
    ex = p + q + 126  # biased exponent minus one (the implicit bit adds it back)
    if ex >= 0:
        return (ex << 23) + (kept << (23 - p))
    return kept << (23 - p + ex)  # subnormal: shift = q + 149


def _mix32(x):
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    x ^= x >> 15
    return x


def _rand32(k0, k1, i):
    """Counter-based 32-bit random number for flat element index i."""
    return _mix32(_mix32((i & 0xFFFFFFFF) ^ k0) ^ ((i >> 32) & 0xFFFFFFFF) ^ k1)


def _flog2_subnormal(m):
    """floor(log2) of a float32 subnormal with magnitude bits m (portable form)."""
    return ilog2(m | 1) - 149


def _pow2_bits(q):
    """float32 bits of 2**q; 0 below the smallest subnormal (then never used)."""
    if q >= -126:
        return (q + 127) << 23
    if q >= -149:
        return 1 << (q + 149)
    return 0


def _tile_consts(tmax, kind, scale, soff, qoff, lim, emin, man, maxkept, emaxq):
    """Per-tile constants from the tile's largest finite magnitude bits ``tmax``.

    Returns ``(qt, p2q, hi, lo)``. FIXED: ``qt`` is the LSB exponent ``q``,
    ``p2q`` the bits of ``2**q``, ``hi`` of the clamp ``lim * 2**q``. FLOAT:
    ``qt = emin + s`` (smallest normal exponent after scaling), ``p2q`` the bits of
    its LSB ``2**(qt - man)``, ``hi`` of the largest finite value, ``lo`` of ``2**qt``.
    """
    s = 0
    if scale != 0 and tmax != 0:
        s = _flog2(tmax) - soff
        if scale >= 3:  # MX scale modes other than floor: one binade up or not
            top = lim if kind == 1 else maxkept  # the element's largest significand, in its LSBs
            mb = ilog2(top)
            if (tmax >> 23) > 0:
                sig = (tmax & 0x7FFFFF) | 0x800000
            else:
                sig = tmax << (23 - ilog2(tmax))  # normalised: leading one at bit 23
            if scale == 3:  # ceil: any bit below the leading one
                s += int(sig != 0x800000)
            elif scale == 4:  # even: the block max rounded (half up) to the element's bits
                s += int(mb < 23) * int(sig + (1 << (22 - min(mb, 22))) >= 0x1000000)
            else:  # rceil: the smallest s with amax <= element max * 2**s
                s += int(sig > (top << (23 - mb)))
        if scale >= 2:  # E8M0 range
            s = min(max(s, -127), 127)
    if kind == 1:
        q = s + qoff
        return q, _pow2_bits(q), _bits_of(lim, q) if q >= -149 else 0x7FFFFFFF, 0
    es = emin + s
    return es, _pow2_bits(es - man), _bits_of(maxkept, emaxq + s), _pow2_bits(es)


def _quant_elem(xb, kind, mode, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, r):
    """Quantized float32 bits of the float32 with bits ``xb`` (sign-extended int32).

    Works on the magnitude bits ``m`` directly: for 1 <= d <= 23 dropped bits the
    rounded value is ``m - rem + (up << d)`` (a carry into the exponent field is
    the correct next binade); for d >= 24 the value is below one LSB and rounds
    to 0 or ``2**q``. Written without data-dependent branches so it vectorises.
    """
    m = xb & 0x7FFFFFFF
    e = m >> 23
    if kind == 1:
        q = qt
    else:
        fl = e - 127
        if e == 0:
            fl = flog2_subnormal(m)  # noqa: F821 (bound by build())
        q = max(fl, qt) - man
    d = q - (max(e, 1) - 150)
    ds = min(max(d, 1), 23)
    rem = m & ((1 << ds) - 1)
    sig = (m & 0x7FFFFF) | (int(e > 0) << 23)
    up = 0
    upb = 0
    if mode == 1:  # nearest, ties to even
        half = 1 << (ds - 1)
        odd = ((m >> ds) & 1) | (int(ds == 23) & int(e > 0))
        if kind == 0 and man == 0:  # one code per binade: a code's parity is its exponent field's
            odd = int((m >> ds) != 0) & ((q - qt + 1) & 1)
        up = int(rem > half) | (int(rem == half) & odd)
        upb = int(d == 24) & int(sig > 0x800000)
    elif mode == 2:  # stochastic: carry out of (top 32 dropped bits + r)
        up = ((rem << (32 - ds)) + r) >> 32
        r32 = (sig << max(32 - d, 0)) >> min(max(d - 32, 0), 63)
        upb = (r32 + r) >> 32
    rb = m - rem + (up << ds)
    if d > 23:
        rb = upb * p2q
    if d <= 0:
        rb = m
    return _finish(xb, rb, kind, mode, hi, lo, ftz, ovf_inf, inf_nan)


def _finish(xb, rb, kind, mode, hi, lo, ftz, ovf_inf, inf_nan):
    """The rule's end, after the magnitude bits ``m = xb & MAG`` were rounded to ``rb`` (as if the
    format's exponent range had no top): the clamp or overflow at ``hi``, flush below ``lo``, the
    sign, Inf and NaN inputs, and the special-value switches. Shared by the integer rounding above
    and the CPU's float32 shortcut for nearest rounding (``rule_cpu._elem_nearest``)."""
    m = xb & 0x7FFFFFFF
    if kind == 1:
        rb = min(rb, hi)
    else:
        if rb > hi:
            rb = hi if (ovf_inf == 0) | (mode == 0) else (EXP_INF if ovf_inf == 1 else QNAN)
        if ftz and rb < lo:
            rb = 0
    rb |= xb & 0x80000000
    if m >= EXP_INF:
        rb = xb
        if m == EXP_INF:
            if inf_nan & 1:
                rb = QNAN
            elif inf_nan & 2:
                rb = hi | (xb & 0x80000000)
    if inf_nan >= 4:  # P3109: one zero; unsigned formats have no negative values
        if (rb & 0x7FFFFFFF) == 0:
            rb = 0
        elif (xb < 0) & ((rb & 0x7FFFFFFF) <= EXP_INF):
            if inf_nan & 16:
                rb = 0
            elif inf_nan & 8:
                rb = QNAN
    return rb


def build(jit, flog2_subnormal=None):
    """Compile the rule with ``jit``; returns ``(quant_elem, tile_consts, rand32, finish)``.

    ``flog2_subnormal`` may replace the portable ``_flog2_subnormal`` with a
    faster backend-specific one (it must return the same values).
    """
    g = {"__builtins__": builtins}
    for f in (ilog2, _flog2, _flog2_subnormal, _bits_of, _mix32, _rand32, _pow2_bits, _tile_consts,
              _finish, _quant_elem):
        # Re-bind globals so each compiled function calls the compiled helpers.
        fn = type(f)(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
        g[f.__name__] = jit(fn)
    g.update(EXP_INF=EXP_INF, QNAN=QNAN)
    g["flog2_subnormal"] = flog2_subnormal or g["_flog2_subnormal"]
    return g["_quant_elem"], g["_tile_consts"], g["_rand32"], g["_finish"]
