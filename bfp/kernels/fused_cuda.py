"""The tensor-core multi-term fused adder as a Numba CUDA kernel: one thread per output element,
the same float64 arithmetic, in the same order, as ``bfp.kernels.fused`` (the rule:
``bfp.tensorcore``). Every value is exact or correctly rounded float64 arithmetic, identical on a
device and on the CPU; round to nearest even is ``_rne`` (floor and a tie check), since ``rint``
is not a CUDA intrinsic Numba offers. With ``NUMBA_ENABLE_CUDASIM=1`` it runs on the CPU, which
is how the tests check it against the reference without a GPU.
"""
from __future__ import annotations

import math

import torch
from numba import cuda

from .cuda import SIMULATOR, THREADS, _device_array
from .fused import ZERO_EXP


@cuda.jit(device=True, inline=True)
def _rne(y):
    r = math.floor(y + 0.5)
    if r - y == 0.5 and r % 2.0 != 0.0:  # a tie went up to an odd integer: to even instead
        r -= 1.0
    return r


@cuda.jit(device=True, inline=True)
def _round(y, near):
    return _rne(y) if near else math.trunc(y)


@cuda.jit(device=True, inline=True)
def _exp(x):
    return math.frexp(x)[1] - 1


@cuda.jit
def _fused_chain(a, b, ea, eb, out, terms, align_emin, align_bits, align_near, sum_bits, sum_emin, sum_near,
                 acc_in, operands):
    idx = cuda.grid(1)
    m, k = a.shape
    n = b.shape[1]
    if idx >= m * n:
        return
    i, j = idx // n, idx % n
    c = 0.0
    for g in range(0, k, terms):
        top = ZERO_EXP
        for t in range(g, g + terms):
            p = a[i, t] * b[t, j]
            if p != 0.0:
                top = max(top, ea[i, t] + eb[t, j] if operands else _exp(p))
        if acc_in and c != 0.0:
            top = max(top, _exp(c))
        top = max(top, align_emin)
        scale = math.ldexp(1.0, int(align_bits - top))
        s = _round(c * scale, align_near) if acc_in else 0.0
        for t in range(g, g + terms):
            s += _round(a[i, t] * b[t, j] * scale, align_near)
        v = s / scale
        if not acc_in:
            v = v + c
        if v != 0.0 and not math.isinf(v) and not math.isnan(v):
            sc = math.ldexp(1.0, int(sum_bits - max(_exp(v), sum_emin)))
            v = _round(v * sc, sum_near) / sc
        c = 0.0 if v == 0.0 else v
    out[i, j] = c


def fused_chain(a, b, ea, eb, out, *params) -> None:
    """``bfp.kernels.fused.fused_chain`` on the device (or the simulator): float64 CUDA tensors
    ``a``, ``b``, ``out`` and int64 ``ea``, ``eb``."""
    if not SIMULATOR and not cuda.is_available():
        raise RuntimeError("Numba cannot see a CUDA GPU: install a CUDA-enabled numba (pip install numba-cuda) "
                           "or pass CPU tensors")
    arrays = [_device_array(t if isinstance(t, torch.Tensor) else torch.from_numpy(t)) for t in (a, b, ea, eb, out)]
    total = out.shape[0] * out.shape[1]
    if total:
        _fused_chain[(total + THREADS - 1) // THREADS, THREADS](*arrays, *params)
