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
from .plan import MODE, rule_for
from .reference import quantize_bits, tile_max
from .scalar import EXP_INF, MAG

E4M3 = Float(4, 3, encoding=Encoding.FN)
E2M1 = {r: Float(2, 1, r, encoding=Encoding.FINITE) for r in (Rounding.NEAREST, Rounding.STOCHASTIC)}
PTS_DIV = np.float32(E4M3_MAX * E2M1_MAX)  # 2688: the tensor scale puts the largest block scale at 448
PTS_MIN = np.float32(2.0 ** -149)


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
def _cpu_kernels(mode: int):
    """The Numba kernels for rounding ``mode`` (a compile-time constant, so the element loop
    carries no code of the other mode and vectorises), compiled on first use."""
    from numba import njit, prange
    from .cpu import _elem, _rand32, _tile_consts

    @njit(parallel=True, cache=False)
    def amax_bits(xi):
        """The largest finite magnitude's float32 bits (0: none)."""
        step = 1 << 16
        parts = np.zeros((xi.size + step - 1) // step, np.int32)
        mag, inf, zero = np.int32(MAG), np.int32(EXP_INF), np.int32(0)
        for c in prange(parts.size):
            top = zero
            for j in range(c * step, min((c + 1) * step, xi.size)):  # int32 lanes: vectorises
                mj = xi[j] & mag
                top = max(top, mj if mj < inf else zero)
            parts[c] = top
        return parts.max() if parts.size else 0

    @njit(parallel=True, cache=False)
    def kernel(xi, xf, oi, rows, n, block, pts, e4, e2, k0, k1):
        c4 = _tile_consts(0, 0, 0, 0, 0, 0, e4[0], e4[1], e4[2], e4[3])
        c2 = _tile_consts(0, 0, 0, 0, 0, 0, e2[0], e2[1], e2[2], e2[3])
        nb = (n + block - 1) // block
        six, lo, hi = np.float32(E2M1_MAX), np.float32(E4M3_TINY), np.float32(E4M3_MAX)
        for t in prange(rows * nb):
            a = (t // nb) * n + (t % nb) * block
            b = min(a + block, (t // nb) * n + n)
            amax = np.int32(0)
            for j in range(a, b):
                mj = xi[j] & np.int32(MAG)
                amax = max(amax, mj if mj < np.int32(EXP_INF) else np.int32(0))
            sbs = (np.int32(amax).view(np.float32) / six) / pts
            sbs = min(max(sbs, lo), hi)
            sb8 = np.int32(_elem(np.int64(np.float32(sbs).view(np.int32)), 0, 1, c4[0], c4[1], c4[2], c4[3],
                                 e4[1], e4[4], e4[5], e4[6], 0)).view(np.float32)
            ts = pts * sb8
            for j in range(a, b):  # branch-free: non-finite inputs go to the element rule as they are
                xb = np.int64(xi[j])
                fin = (xb & MAG) < EXP_INF
                v = min(max(xf[j] / ts, -six), six)
                vb = np.int64(np.float32(v).view(np.int32)) if fin else xb
                r = _rand32(k0, k1, np.int64(j)) if mode == 2 else 0
                qb = _elem(vb, 0, mode, c2[0], c2[1], c2[2], c2[3], e2[1], e2[4], e2[5], e2[6], r)
                o = np.float32(np.int32(qb).view(np.float32) * ts).view(np.int32)
                oi[j] = o if fin else np.int32(qb)
    return amax_bits, kernel


def _consts(fmt_float: Float) -> np.ndarray:
    r = rule_for(fmt_float)
    return np.array([r.emin, r.man, r.maxkept, r.emaxq, r.ftz, r.ovf_inf, r.inf_nan], np.int64)


def cpu(xm: torch.Tensor, fmt: NVFP4, keys) -> torch.Tensor:
    """The Numba kernels on a CPU float32 ``xm`` (block axis last, contiguous)."""
    amax_bits, kernel = _cpu_kernels(MODE[fmt.rounding])
    xb = xm.view(torch.int32).numpy().reshape(-1)
    top = int(amax_bits(xb))
    if top == 0:
        return reference(xm, fmt, keys)
    out = torch.empty_like(xm)
    n = xm.shape[-1]
    kernel(xb, xm.numpy().reshape(-1), out.view(torch.int32).numpy().reshape(-1), xm.numel() // n, n, fmt.block,
           tensor_scale(top, fmt), _consts(E4M3), _consts(E2M1[fmt.rounding]), keys[0], keys[1])
    return out


def quantize(x32: torch.Tensor, fmt: NVFP4, keys, backend: str) -> torch.Tensor:
    """NVFP4 of float32 ``x32`` (a new tensor); ``backend`` "cpu" runs the Numba kernel on CPU
    tensors, anything else the PyTorch reference."""
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
    out = cpu(xm, fmt, keys) if backend == "cpu" and not xm.is_cuda else reference(xm, fmt, keys)
    return out.movedim(-1, axis).reshape(x32.shape)
