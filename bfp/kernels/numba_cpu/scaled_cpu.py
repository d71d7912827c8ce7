"""Per-tensor scaled rounding (``bfp.formats.scaled``, one scale for the whole tensor) as Numba CPU
kernels: the finite amax in one pass, then ``q = fmt(clamp(x * scale)) / scale`` per element
in a second, fused pass: the same float32 operations as ``bfp.kernels.scaled``'s PyTorch
steps, in the same order, with ``fmt`` rounded by the shared element rule (``scalar.py``), so
the bits are the same (tests/test_scaled.py). Imported, and compiled, on first use.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit, prange

from ...formats import Float
from .cpu import specialise
from .rule_cpu import _elem, _elem_nearest, _nearest_ok, _rand32, _round_f, _tile_consts, scaled_consts
from .pages import advise
from ..plan import MODE, rule_for
from ..scalar import EXP_INF, MAG
from ..arrays import as_numpy

_MAG, _INF = np.int32(MAG), np.int32(EXP_INF)
STEP = 1 << 16  # elements per step of the parallel loops


@njit(parallel=True, cache=True)
def amax_bits(xi):
    """float32 bits of the largest finite magnitude (0: none)."""
    parts = np.zeros((xi.size + STEP - 1) // STEP, np.int32)
    for s in prange(parts.size):
        top = np.int32(0)
        for j in range(s * STEP, min(xi.size, s * STEP + STEP)):
            m = xi[j] & _MAG
            top = max(top, m if m < _INF else np.int32(0))
        parts[s] = top
    return parts.max() if parts.size else np.int32(0)


mode = 0  # a compile-time constant of each specialised kernel (bfp.kernels.numba_cpu.cpu.specialise)


def _scaled(xf, oi, scale, top, c, k0, k1):
    c0, c1, c2, c3 = _tile_consts(0, 0, 0, 0, 0, 0, c[0], c[1], c[2], c[3])
    fast = mode == 1 and _nearest_ok(0, c0, c1, c2, c[1])  # rule_cpu._elem_nearest: the same bits
    f_lo, f_top, f_hi, f_c23, f_qnan, f_ok = scaled_consts(c0, c1, c2, c3, c[1], c[6])
    for s in prange((xf.size + STEP - 1) // STEP):
        j0 = s * STEP
        fs, os = xf[j0:min(xf.size, j0 + STEP)], oi[j0:min(xf.size, j0 + STEP)]  # indices >= 0: vectorises
        if fast and f_ok:  # float32 lanes (rule_cpu._round_f): the same bits; a NaN stays as the product
            for k in range(fs.size):
                v = fs[k] * scale
                r = _round_f(min(max(v, -top), top), f_lo, f_top, f_hi, f_c23, f_qnan, c[4], c[5], c[6])
                os[k] = np.float32((v if v != v else r) / scale).view(np.int32)
            continue
        if fast:
            for k in range(fs.size):
                v = fs[k] * scale
                if v == v:
                    v = min(max(v, -top), top)
                qb = _elem_nearest(np.int64(np.float32(v).view(np.int32)), 0, c0, c1, c2, c3, c[1], c[4], c[5],
                                   c[6])
                os[k] = np.float32(np.int32(qb).view(np.float32) / scale).view(np.int32)
            continue
        for k in range(fs.size):
            v = fs[k] * scale
            if v == v:  # NaN stays as it is (clamp passes it)
                v = min(max(v, -top), top)
            r = _rand32(k0, k1, np.int64(j0 + k)) if mode == 2 else 0
            qb = _elem(np.int64(np.float32(v).view(np.int32)), 0, mode, c0, c1, c2, c3, c[1], c[4], c[5],
                       c[6], r)
            os[k] = np.float32(np.int32(qb).view(np.float32) / scale).view(np.int32)


@functools.lru_cache(maxsize=None)
def _kernel(rounding_mode: int):
    return specialise(_scaled, f"scaled_mode{rounding_mode}", True, mode=rounding_mode)


def amax(x32: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of a contiguous CPU float32 tensor (0-dim float32)."""
    bits = int(amax_bits(as_numpy(x32.view(torch.int32)).reshape(-1)))
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32)


def apply(x32: torch.Tensor, scale: torch.Tensor, fmt: Float, keys) -> torch.Tensor:
    """``fmt(clamp(x * scale, -fmt.max, fmt.max)) / scale`` of a contiguous CPU float32 tensor."""
    r = rule_for(fmt)
    consts = np.array([r.emin, r.man, r.maxkept, r.emaxq, r.ftz, r.ovf_inf, r.inf_nan], np.int64)
    out = torch.empty_like(x32)
    advise(out)
    _kernel(MODE[fmt.rounding])(as_numpy(x32).reshape(-1), as_numpy(out.view(torch.int32)).reshape(-1),
                                np.float32(scale.item()), np.float32(fmt.max), consts, keys[0], keys[1])
    return out
