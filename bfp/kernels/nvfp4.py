"""NVFP4 quantization (the rule is ``bfp.nvfp4``'s docstring): a PyTorch reference, which also
runs CUDA tensors, and a Numba CPU kernel doing the same float32 operations in the same order.

The E4M3 block scales and the E2M1 elements are rounded by the integer element rule of
``scalar.py`` (the one every format uses), so only the divisions and products between them
are float32 arithmetic, and those are correctly rounded on every backend.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..formats import Encoding, Float, Rounding
from ..nvfp4 import E2M1_MAX, E4M3_MAX, E4M3_TINY, NVFP4
from .pages import advise
from .plan import MODE, rule_for
from .reference import quantize_bits, tile_max
from .scalar import EXP_INF, MAG, QNAN

E4M3 = Float(4, 3, encoding=Encoding.FN)
E2M1 = {r: Float(2, 1, r, encoding=Encoding.FINITE) for r in (Rounding.NEAREST, Rounding.STOCHASTIC)}
PTS_DIV = np.float32(E4M3_MAX * E2M1_MAX)  # 2688: the tensor scale puts the largest block scale at 448
PTS_MIN = np.float32(2.0 ** -149)
CHUNK = 1024  # blocks per step of the CPU kernels' parallel loops


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32).long()


def _float(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.int32).view(torch.float32)


def tensor_scale(amax_bits: int, fmt: NVFP4) -> np.float32:
    """``pts`` from the tensor's largest finite magnitude (its float32 bits)."""
    if not fmt.tensor_scale:
        return np.float32(1.0)
    amax = np.array([amax_bits], np.int32).view(np.float32)[0]
    return max(np.float32(amax / PTS_DIV), PTS_MIN)


def reference(xm: torch.Tensor, fmt: NVFP4, keys, tile=None) -> torch.Tensor:
    """NVFP4 of float32 ``xm`` whose block axis is the last, contiguous (any device); ``tile``:
    the block's shape over ``xm`` (default ``fmt.block`` along the last axis)."""
    xb = _bits(xm)
    m = xb & MAG
    finite = m < EXP_INF
    mf = torch.where(finite, m, 0)
    amax_bits = int(mf.max()) if mf.numel() else 0
    e2m1 = rule_for(E2M1[fmt.rounding])
    if amax_bits == 0:  # nothing finite and nonzero: zeros stay, Inf becomes NaN
        return _float(quantize_bits(xb, e2m1, None, keys)).view(xm.shape)
    pts = torch.tensor(tensor_scale(amax_bits, fmt), device=xm.device)
    tile = tile or (1,) * (xm.dim() - 1) + (fmt.block,)
    sb = _float(tile_max(mf, tile)) / torch.tensor(np.float32(E2M1_MAX), device=xm.device)
    sbs = (sb / pts).clamp(E4M3_TINY, E4M3_MAX)
    sb8 = _float(quantize_bits(_bits(sbs), rule_for(E4M3), None, keys))
    ts = pts * sb8
    v = torch.where(finite.view(xm.shape), (xm / ts).clamp(-E2M1_MAX, E2M1_MAX), xm)
    q = _float(quantize_bits(_bits(v), e2m1, None, keys)).view(xm.shape)
    return torch.where(finite.view(xm.shape), q * ts, q)


@functools.lru_cache(maxsize=None)
def _cpu_kernels(mode: int, block: int):
    """The Numba kernels for rounding ``mode`` and ``block`` (compile-time constants, so the
    loops carry no code of the other mode and the block loops have a fixed trip count and
    vectorise), compiled on first use."""
    from numba import njit, prange
    from .cpu import _elem, _rand32, _tile_consts

    mag, inf, sign = np.int32(MAG), np.int32(EXP_INF), np.int32(-2 ** 31)

    @njit(inline="always")
    def _finite_max(xi, a, count):
        top = np.int32(0)
        for k in range(count):  # int32 lanes: vectorises
            mj = xi[a + k] & mag
            top = max(top, mj if mj < inf else np.int32(0))
        return top

    @njit(parallel=True, cache=False)
    def block_max(xi, bmax, rows, n):
        """Each block's largest finite magnitude (float32 bits; 0: none) into ``bmax``.
        The parallel loop runs over runs of ``CHUNK`` blocks: one prange step per block
        costs twice as much on this CPU."""
        nb = (n + block - 1) // block
        steps = (rows * nb + CHUNK - 1) // CHUNK
        if n % block == 0:  # block t is xi[t * block:(t + 1) * block]: a fixed trip count
            for c in prange(steps):
                for t in range(c * CHUNK, min(rows * nb, c * CHUNK + CHUNK)):
                    bmax[t] = _finite_max(xi, t * block, block)
        else:
            for c in prange(steps):
                for t in range(c * CHUNK, min(rows * nb, c * CHUNK + CHUNK)):
                    a = (t // nb) * n + (t % nb) * block
                    bmax[t] = _finite_max(xi, a, min(block, (t // nb) * n + n - a))

    @njit(inline="always")
    def _e4m3_scale(sbs):
        """``sbs`` (float32 in [2**-6, 448]: E4M3's normal range) rounded to E4M3, nearest-even:
        the float32 mantissa cut to 3 bits by an integer add (a carry moves the exponent up)."""
        b = np.float32(sbs).view(np.int32)
        b = (b + np.int32(0x7FFFF) + ((b >> 20) & np.int32(1))) & np.int32(~0xFFFFF)
        return np.int32(b).view(np.float32)

    @njit(inline="always")
    def _e2m1_nearest(v):
        """``v`` (float32, ``|v| <= 6``, finite) rounded to E2M1, nearest-even, sign kept.

        E2M1's steps are 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]; adding and
        subtracting ``2**22``, ``2**23`` or ``2**24`` (whose float32 ulp is that step)
        rounds ``|v|`` to a multiple of the step, ties to the even multiple, which is
        the even E2M1 mantissa code: one float32 rounding, so exact. The sign is
        ``v``'s bit (a zero result keeps it)."""
        a = abs(v)
        big = np.float32(4194304.0) if a < np.float32(2.0) else (
            np.float32(8388608.0) if a < np.float32(4.0) else np.float32(16777216.0))
        r = (a + big) - big
        return np.int32(np.float32(r).view(np.int32) | (np.float32(v).view(np.int32) & sign)).view(np.float32)

    @njit(inline="always")
    def _nearest_out(xb, x, ts):
        """The output bits of one element, nearest rounding: E2M1's grid by float32 adds, no
        integer rule, so the loop vectorises; Inf becomes NaN, NaN stays as it is."""
        v = min(max(x / ts, -np.float32(E2M1_MAX)), np.float32(E2M1_MAX))
        o = np.float32(_e2m1_nearest(v) * ts).view(np.int32)
        return o if (xb & mag) < inf else (np.int32(QNAN) if (xb & mag) == inf else xb)

    @njit(parallel=True, cache=False)
    def kernel(xi, xf, oi, bmax, rows, n, pts, e2, k0, k1):
        c2 = _tile_consts(0, 0, 0, 0, 0, 0, e2[0], e2[1], e2[2], e2[3])
        nb = (n + block - 1) // block
        whole = n % block == 0
        six, lo, hi = np.float32(E2M1_MAX), np.float32(E4M3_TINY), np.float32(E4M3_MAX)
        for c in prange((rows * nb + CHUNK - 1) // CHUNK):
            for t in range(c * CHUNK, min(rows * nb, c * CHUNK + CHUNK)):
                a = (t // nb) * n + (t % nb) * block
                b = min(a + block, (t // nb) * n + n)
                sbs = (np.int32(bmax[t]).view(np.float32) / six) / pts
                ts = pts * _e4m3_scale(min(max(sbs, lo), hi))
                if mode == 1 and whole:  # the same as below with a fixed trip count
                    a = t * block
                    for k in range(block):
                        oi[a + k] = _nearest_out(xi[a + k], xf[a + k], ts)
                    continue
                for j in range(a, b):
                    xb = xi[j]
                    fin = (xb & mag) < inf
                    v = min(max(xf[j] / ts, -six), six)
                    if mode == 1:
                        oi[j] = _nearest_out(xb, xf[j], ts)
                    else:  # non-finite inputs go to the element rule as they are
                        vb = np.int64(np.float32(v).view(np.int32)) if fin else np.int64(xb)
                        r = _rand32(k0, k1, np.int64(j)) if mode == 2 else 0
                        qb = _elem(vb, 0, mode, c2[0], c2[1], c2[2], c2[3], e2[1], e2[4], e2[5], e2[6], r)
                        o = np.float32(np.int32(qb).view(np.float32) * ts).view(np.int32)
                        oi[j] = o if fin else np.int32(qb)
    return block_max, kernel


def _consts(fmt_float: Float) -> np.ndarray:
    r = rule_for(fmt_float)
    return np.array([r.emin, r.man, r.maxkept, r.emaxq, r.ftz, r.ovf_inf, r.inf_nan], np.int64)


def cpu(xm: torch.Tensor, fmt: NVFP4, keys) -> torch.Tensor:
    """The Numba kernels on a CPU float32 ``xm`` (block axis last, contiguous): the block maxima
    (their maximum is the tensor's), then the scales and elements block by block."""
    block_max, kernel = _cpu_kernels(MODE[fmt.rounding], fmt.block)
    xb = xm.view(torch.int32).numpy().reshape(-1)
    n = xm.shape[-1]
    rows = xm.numel() // n if n else 0
    bmax = np.empty(rows * ((n + fmt.block - 1) // fmt.block), np.int32)
    block_max(xb, bmax, rows, n)
    top = int(bmax.max()) if bmax.size else 0
    if top == 0:
        return reference(xm, fmt, keys)
    out = torch.empty_like(xm)
    advise(out)  # huge pages for the untouched output (pages.py)
    kernel(xb, xm.numpy().reshape(-1), out.view(torch.int32).numpy().reshape(-1), bmax, rows, n,
           tensor_scale(top, fmt), _consts(E2M1[fmt.rounding]), keys[0], keys[1])
    return out


def quantize(x32: torch.Tensor, fmt: NVFP4, keys, backend: str) -> torch.Tensor:
    """NVFP4 of float32 ``x32`` (a new tensor); ``backend`` "cpu" runs the Numba kernel on CPU
    tensors, "cuda" the Numba CUDA kernels (``nvfp4_cuda``; 1-D blocks), "reference" the PyTorch
    reference (2-D blocks always)."""
    axis = fmt.axis + x32.dim() if fmt.axis < 0 else fmt.axis
    if not 0 <= axis < max(x32.dim(), 1):
        raise ValueError(f"NVFP4 axis {fmt.axis} is out of range for a tensor of shape {tuple(x32.shape)}")
    if isinstance(fmt.block, tuple):  # 2-D blocks: the reference, on the tensor as it is
        if axis - len(fmt.block) + 1 < 0:
            raise ValueError(f"NVFP4 block {'x'.join(map(str, fmt.block))} ending on axis {fmt.axis} needs "
                             f"{len(fmt.block)} axes up to it; a tensor of shape {tuple(x32.shape)} has {axis + 1}")
        tile = [1] * x32.dim()
        for k, b in enumerate(reversed(fmt.block)):
            tile[axis - k] = b
        return reference(x32.contiguous(), fmt, keys, tuple(tile))
    xm = x32.reshape(1) if x32.dim() == 0 else x32
    xm = xm.movedim(axis, -1).contiguous()
    out = None
    if backend == "cpu" and not xm.is_cuda:
        out = cpu(xm, fmt, keys)
    elif backend == "cuda":
        from . import nvfp4_cuda  # Numba CUDA loads on first use
        out = nvfp4_cuda.quantize(xm, fmt, keys, MODE[fmt.rounding], tensor_scale)
    out = reference(xm, fmt, keys) if out is None else out
    return out.movedim(-1, axis).reshape(x32.shape)
