"""In-place Numba CPU kernels for element-wise formats (``bfp.kernels.inplace``'s fast path): the
running sum of the accumulator emulation, ``s = q(s + t)``, and ``x = q(x)``. Templates compiled
per (element kind, rounding mode) by ``cpu._specialise``, with ``cpu.py``'s element rule inlined;
imported, and compiled, on first use.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import prange

from .cpu import _kernel_cache, _specialise, threads_for
from .rule_cpu import _elem, _elem_nearest, _nearest_ok, _rand32, _tile_consts
from ..scalar import EXP_INF, MAG


def _round_inplace(xb, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1):
    """``_elementwise`` on one buffer: ``xb[i] = q(xb[i])``. One array, so the loop
    needs no aliasing check to vectorise, and no fresh output pages."""
    qt, p2q, hi, lo = _tile_consts(0, KIND, 0, 0, qoff, lim, emin, man, maxkept, emaxq)
    if MODE == 1 and _nearest_ok(KIND, qt, p2q, hi, man):
        for i in prange(xb.size):
            xb[i] = _elem_nearest(np.int64(xb[i]), KIND, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan)
        return
    for i in prange(xb.size):
        r = _rand32(k0, k1, np.int64(i)) if MODE == 2 else 0
        xb[i] = _elem(np.int64(xb[i]), KIND, MODE, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, r)


def _add_round(sb, tb, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1):
    """The running sum of an emulated accumulator: ``s[i] = q(s[i] + t[i])`` on float32
    bits, in place. The addition is one IEEE float32 add (round to nearest even,
    subnormals kept, no fast-math), the same operation as torch's ``s + t``. A NaN
    sum is the quieted NaN of ``t`` if ``t`` is one, else of ``s``: what torch's x86
    add returns, made explicit because the compiler may swap the operands of an
    add. The stochastic draw uses the flat index as ``_elementwise`` does."""
    qt, p2q, hi, lo = _tile_consts(0, KIND, 0, 0, qoff, lim, emin, man, maxkept, emaxq)
    for i in prange(sb.size):
        t = np.int64(tb[i])
        v = np.int64(np.float32(np.int32(sb[i]).view(np.float32) + np.int32(t).view(np.float32))
                     .view(np.int32))
        if (t & MAG) > EXP_INF:
            v = t | 0x400000
        r = _rand32(k0, k1, np.int64(i)) if MODE == 2 else 0
        sb[i] = _elem(v, KIND, MODE, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, r)


@functools.lru_cache(maxsize=None)
def inplace_kernels(KIND: int, MODE: int):
    """``(round_inplace, add_round)`` for element-wise formats, compiled on first use."""
    with _kernel_cache():
        return (_specialise(_round_inplace, KIND, MODE, parallel=True),
                _specialise(_add_round, KIND, MODE, parallel=True))


def round_inplace(xb: np.ndarray, rule, keys) -> None:
    """Quantize flat int32 bits ``xb`` in place to an element-wise format."""
    kind, mode, _, _, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    with threads_for(xb.size):
        inplace_kernels(kind, mode)[0](xb, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf,
                                       inf_nan, *keys)


def add_round(sb: np.ndarray, tb: np.ndarray, rule, keys) -> None:
    """``s = q(s + t)`` in place on flat int32 bits, element-wise format."""
    kind, mode, _, _, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    with threads_for(sb.size):
        inplace_kernels(kind, mode)[1](sb, tb, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf,
                                       inf_nan, *keys)
