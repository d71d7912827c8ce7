"""The tensor-core multi-term fused adder as a Numba CPU kernel (the rule: ``bfp.tensorcore``'s
docstring; its float64 torch code is the reference these kernels equal bit for bit).

``fused_chain(a, b, ea, eb, out, *params)`` runs one accumulation chain over all of K for every output element
of ``a @ b``: ``a`` (M, K) and ``b`` (K, N) float64 with K a multiple of the step's ``terms``,
operand exponents precomputed (``operand_exponents``). Each step aligns its products and the
accumulator to the largest exponent ``E``, cuts each term to ``align_bits`` fraction bits below
``2**E`` (a product times ``2**(align_bits - E)`` is then an integer-valued float64, truncated
or rounded to nearest-even) and sums them: every term is an integer multiple of
``2**(E - align_bits)`` below ``2**(E + 1)``, so ``terms + 1`` of them add exactly in float64
in any order. The step's result is cut to ``sum_bits`` relative to its own exponent.

The same code runs on float32 arrays where that is exact (``float32_exact``): FP8-range operands,
whose products are exact in float32 and, scaled, below ``2**(align_bits + 2)``, so a step's sum
stays below ``2**24``; the accumulator in the alignment (a float32 ``v + c`` would round once
more); product exponents from the operands; ``align_bits <= 16`` and ``sum_bits <= 22``. That
case runs ``fused_gemm32`` (a batch of GEMMs, every chain of K, in one call), whose per-output
work is vectorised as well. A step whose products are all zero, with a
zero accumulator, would then scale by more than float32 holds: ``scale_cap`` (126) caps that
power of two, which changes nothing there (its terms are zero). Twice the lanes of float64.

Why this is fast: per row of ``a`` the loops run over the N outputs innermost, branch-free
(a zero operand's exponent is a large negative sentinel, so it never wins the alignment and its
product, 0, adds nothing), so LLVM vectorises them; rows run in parallel threads. Powers of two
and exponents (``math.ldexp``, ``math.frexp``) are computed once per output and step, not per
term. Results do not depend on the thread count.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from ..reference import ZERO_EXP, operand_exponents  # noqa: F401 (the kernels' callers use both here)
from ..arrays import as_numpy


def float32_exact(a: torch.Tensor, b: torch.Tensor, acc) -> bool:
    """Whether ``fused_chain`` on float32 copies equals the float64 run (module docstring)."""
    if not (acc.accumulator_in_alignment and acc.product_exponent == "operands" and acc.align_bits <= 16
            and acc.sum_bits <= 22):
        return False
    return all(_in_range(as_numpy(x.detach().cpu().contiguous()).reshape(-1), 2.0 ** -24, 2.0 ** 24) for x in (a, b))


# Below this many products (well under a millisecond on one core) a chain runs on the calling thread:
# under load a woken Numba thread waits for a time slice at every parallel call (4-16 ms), and a
# training step makes hundreds of calls (ResNet10 width 16, batch 8, any_fp8_h100, with another
# process on both cores: 9.0 s a step before, 5.9 s with this; quiet, batch 32: 1.4-1.6 s either
# way). cpu.SERIAL_BELOW is the same rule for the quantize kernels.
SERIAL_PRODUCTS = 1 << 18


@njit(cache=True)
def _in_range(x, lo, hi):
    """Every value zero or of magnitude in [lo, hi) (NaN and Inf are not), in one pass."""
    for v in x:
        m = abs(v)
        if m != 0.0 and not (lo <= m < hi):
            return False
    return True


@njit(cache=True, inline="always")
def _exp(x):
    return math.frexp(x)[1] - 1


@njit(cache=True, inline="always")
def _cut(x, e, bits, near):
    """``x`` to ``bits`` fraction bits below ``2**e``, toward zero or to nearest even."""
    scale = math.ldexp(1.0, bits - e)
    y = np.rint(x * scale) if near else np.trunc(x * scale)
    return y / scale


@njit(cache=True, inline="always")
def _add_terms(a, b, scale, s, i, g, terms, align_near, skip_zeros):
    """One step's products of row ``i``, each scaled to ``align_bits`` below the alignment and cut
    (to nearest even or toward zero), added into ``s`` (exact); the outputs innermost, vectorised.
    A zero operand's products are skipped when ``b`` is finite (no 0 * inf)."""
    n = b.shape[1]
    for t in range(g, g + terms):
        ai = a[i, t]
        if ai == 0.0 and skip_zeros:
            continue
        if align_near:
            for j in range(n):
                s[j] += np.rint(ai * b[t, j] * scale[j])
        else:
            for j in range(n):
                s[j] += np.trunc(ai * b[t, j] * scale[j])


@njit(cache=True, parallel=True)
def fused_chain(a, b, ea, eb, out, terms, align_emin, align_bits, align_near, sum_bits, sum_emin, sum_near,
                acc_in, operands, skip_zeros, scale_cap):
    m, k = a.shape
    n = b.shape[1]
    for i in prange(m):
        c = np.zeros(n, dtype=a.dtype)
        top = np.empty(n, dtype=np.int32)
        scale = np.empty(n, dtype=a.dtype)
        s = np.empty(n, dtype=a.dtype)
        for g in range(0, k, terms):
            top[:] = ZERO_EXP
            for t in range(g, g + terms):
                ai = a[i, t]
                if ai == 0.0 and skip_zeros:
                    continue
                if operands:
                    eai = ea[i, t]
                    for j in range(n):
                        e = eai + eb[t, j]
                        top[j] = e if e > top[j] else top[j]  # a select: vectorised
                else:  # the product's own exponent
                    for j in range(n):
                        p = ai * b[t, j]
                        if p != 0.0:
                            top[j] = max(top[j], np.int32(_exp(p)))
            for j in range(n):
                if acc_in and c[j] != 0.0:
                    top[j] = max(top[j], np.int32(_exp(c[j])))
                top[j] = max(top[j], np.int32(align_emin))
                scale[j] = math.ldexp(1.0, min(align_bits - top[j], scale_cap))
                if acc_in:
                    s[j] = np.rint(c[j] * scale[j]) if align_near else np.trunc(c[j] * scale[j])
                else:
                    s[j] = 0.0
            _add_terms(a, b, scale, s, i, g, terms, align_near, skip_zeros)
            for j in range(n):
                v = s[j] / scale[j]
                if not acc_in:
                    v = v + c[j]
                if v != 0.0 and not math.isinf(v) and not math.isnan(v):
                    v = _cut(v, max(_exp(v), sum_emin), sum_bits, sum_near)
                c[j] = 0.0 if v == 0.0 else v  # +0, never -0
        for j in range(n):
            out[i, j] = c[j]


@njit(cache=True, parallel=True)
def fused_gemm32(a, b, ea, eb, out, bounds, terms, align_emin, align_bits, align_near, sum_bits, sum_emin,
                 sum_near):
    """Every chain of a batch of GEMMs in one call, for float32 operands where ``float32_exact``
    holds (accumulator aligned, product exponents from the operands): ``a`` (B, M, K), ``b``
    (B, K, N), ``out`` (B, M, N) float32, all C-contiguous. ``bounds`` (int64, ascending, from 0 to
    K) cuts K into chains (``promote_every`` spans within ``split_k`` tiles): each chain starts
    from +0, its last step has the terms that are left (the zero padding of the reference adds
    nothing: a zero product is skipped and its exponent never wins), and the chains' results are
    added in order in float32 (round to nearest). Every per-output step runs in vectorisable
    passes, powers of two built from their exponent bits and exponents read from them (``c`` and
    a step's sum are normal float32 numbers or zero there), so no libm call runs per output;
    (batch, row) pairs run in parallel. Zero operands' products are skipped (operands are finite here)."""
    nb, m, k = a.shape
    n = b.shape[2]
    for idx in prange(nb * m):
        q, i = idx // m, idx % m
        aq, bq, eaq, ebq, oq = a[q], b[q], ea[q], eb[q], out[q]
        total = np.zeros(n, dtype=np.float32)
        c = np.zeros(n, dtype=np.float32)
        top = np.empty(n, dtype=np.int32)
        sbits = np.empty(n, dtype=np.int32)
        ibits = np.empty(n, dtype=np.int32)
        s = np.empty(n, dtype=np.float32)
        scale = sbits.view(np.float32)
        inv = ibits.view(np.float32)
        cb = c.view(np.int32)
        sb = s.view(np.int32)
        for ch in range(bounds.size - 1):
            c[:] = 0.0
            lo, hi = bounds[ch], bounds[ch + 1]
            for g in range(lo, hi, terms):
                count = min(terms, hi - g)
                for j in range(n):  # the accumulator's exponent joins the alignment
                    ec = ((cb[j] >> 23) & 0xFF) - 127
                    top[j] = ec if c[j] != 0.0 else ZERO_EXP
                for t in range(g, g + count):
                    ai = aq[i, t]
                    if ai == 0.0:
                        continue
                    eai = eaq[i, t]
                    for j in range(n):
                        e = eai + ebq[t, j]
                        top[j] = e if e > top[j] else top[j]
                for j in range(n):
                    tj = top[j] if top[j] > align_emin else np.int32(align_emin)
                    x = align_bits - tj
                    x = x if x < 126 else 126  # an all-zero step: any scale serves
                    sbits[j] = (127 + x) << 23
                    ibits[j] = (127 - x) << 23
                    s[j] = np.rint(c[j] * scale[j]) if align_near else np.trunc(c[j] * scale[j])
                _add_terms(aq, bq, scale, s, i, g, count, align_near, True)
                for j in range(n):
                    s[j] = s[j] * inv[j]  # the step's exact sum, a normal float32 or zero
                for j in range(n):
                    ev = ((sb[j] >> 23) & 0xFF) - 127
                    ev = ev if ev > sum_emin else np.int32(sum_emin)
                    x = sum_bits - ev
                    x = x if x < 126 else 126
                    sbits[j] = (127 + x) << 23
                    ibits[j] = (127 - x) << 23
                for j in range(n):
                    y = s[j] * scale[j]
                    y = np.rint(y) if sum_near else np.trunc(y)
                    v = y * inv[j]
                    c[j] = v if v != 0.0 else np.float32(0.0)  # +0, never -0
            for j in range(n):
                total[j] += c[j]  # float32, round to nearest, chains in order
        for j in range(n):
            oq[i, j] = total[j]


@njit(cache=True, parallel=True)
def exponents32(x, emin, out):
    """``operand_exponents`` of normal float32 values or zeros (``float32_exact``'s range), from
    their exponent bits: ``out`` (int32, ``x``'s shape, both 2-D contiguous)."""
    xb = x.view(np.int32)
    for i in prange(x.shape[0]):
        xs, fs, os = xb[i], x[i], out[i]  # row views: indices provably >= 0, so the loop vectorises
        for j in range(xs.size):
            e = ((xs[j] >> 23) & 0xFF) - 127
            e = e if e > emin else np.int32(emin)
            os[j] = e if fs[j] != 0.0 else ZERO_EXP
