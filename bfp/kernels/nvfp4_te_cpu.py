"""NVFP4 in TransformerEngine's convention (``bfp.kernels.nvfp4_te``) as one Numba CPU pass over
1-D blocks along the rows: per block its maximum, its E4M3 scale and its elements, each step the
float32 operation of the PyTorch code, in the same order, so the bits are the same (tests/
test_nvfp4_te.py). The tensor's amax, ``S_enc`` and ``S_dec`` come from the caller. Imported, and
compiled, on first use.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import prange

from ..formats.nvfp4 import E2M1_MAX, E4M3_MAX, NVFP4
from .cpu import _elem, _elem_nearest, _rand32, _tile_consts, specialise
from .nvfp4_cpu import _consts
from .nvfp4_codes import E2M1, E4M3
from .plan import MODE
from .scalar import EXP_INF, MAG

_MAG, _INF = np.int32(MAG), np.int32(EXP_INF)
_FMAX, _SIX, _E4 = np.float32(3.4028234663852886e38), np.float32(E2M1_MAX), np.float32(E4M3_MAX)
mode, block = 1, 16  # compile-time constants of each specialised kernel (cpu.specialise)


def _te_rows(xi, xf, oi, rows, n, mult, s_dec, e4, e2, k0, k1):
    c4 = _tile_consts(0, 0, 0, 0, 0, 0, e4[0], e4[1], e4[2], e4[3])
    c2 = _tile_consts(0, 0, 0, 0, 0, 0, e2[0], e2[1], e2[2], e2[3])
    nb = (n + block - 1) // block
    for t in prange(rows * nb):
        a = (t // nb) * n + (t % nb) * block
        end = min(a + block, (t // nb) * n + n)
        top = np.float32(0.0)
        for j in range(a, end):  # the block's largest magnitude: NaN takes no part, Inf does
            if (xi[j] & _MAG) <= _INF:
                top = max(top, abs(xf[j]))
        sb = min(max(min(top * mult, _FMAX), -_E4), _E4)
        sbb = _elem(np.int64(np.float32(sb).view(np.int32)), 0, 1, c4[0], c4[1], c4[2], c4[3], e4[1], e4[4],
                    e4[5], e4[6], 0)
        sb8 = np.int32(sbb).view(np.float32)
        enc = min(np.float32(1.0) / (sb8 * s_dec), _FMAX)
        xs, fs, os = xi[a:end], xf[a:end], oi[a:end]  # slices: indices provably >= 0
        for k in range(xs.size):
            xb = xs[k]
            nan = (xb & _MAG) > _INF
            v = min(max(fs[k] * enc, -_SIX), _SIX)
            vb = np.int64(xb) if nan else np.int64(np.float32(v).view(np.int32))
            if mode == 1:  # E2M1 is on cpu._elem_nearest's path (tests/test_kernels_nearest.py)
                qb = _elem_nearest(vb, 0, c2[0], c2[1], c2[2], c2[3], e2[1], e2[4], e2[5], e2[6])
            else:
                r = _rand32(k0, k1, np.int64(a + k)) if mode == 2 else 0
                qb = _elem(vb, 0, mode, c2[0], c2[1], c2[2], c2[3], e2[1], e2[4], e2[5], e2[6], r)
            q = np.int32(qb).view(np.float32)
            os[k] = np.int32(qb) if nan else np.float32(q * sb8 * s_dec).view(np.int32)


@functools.lru_cache(maxsize=None)
def _kernel(rounding_mode: int, blk: int):
    return specialise(_te_rows, f"nvfp4_te_rows_mode{rounding_mode}_b{blk}", True, mode=rounding_mode, block=blk)


def rows(xm: torch.Tensor, fmt: NVFP4, keys, mult: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """NVFP4 (TE convention, 1-D blocks along the last axis) of the contiguous CPU float32 ``xm``."""
    n = xm.shape[-1]
    out = torch.empty_like(xm)
    _kernel(MODE[fmt.rounding], fmt.block)(
        xm.view(torch.int32).numpy().reshape(-1), xm.numpy().reshape(-1), out.view(torch.int32).numpy().reshape(-1),
        xm.numel() // n, n, np.float32(mult.item()), np.float32(s_dec.item()), _consts(E4M3),
        _consts(E2M1[fmt.rounding]), np.int64(keys[0]), np.int64(keys[1]))
    return out
