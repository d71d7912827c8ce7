"""NVFP4 of a Hadamard-transformed tensor in one go (the NVFP4 recipe's weight-gradient
operands): ``quantize(transform_rows(t, rht), NVFP4 along the rows)`` without writing the
transformed tensor. Imported, and compiled, on first use.

Both passes of ``nvfp4_cpu``'s column kernels (block maxima, then scales and elements) load
each block of ``b`` rows (zero past the input's last row) into a scratch array and run the
transform's butterflies and factors there first (``bfp.kernels.numba_cpu.hadamard_cpu.load_transformed``),
so the result is bit for bit ``nvfp4_cpu.quantize(hadamard_cpu.transform_rows(t))``
(tests/test_hadamard.py), stochastic draws included (indexed in the padded tensor, as there).
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch
from numba import prange

from ...formats.nvfp4 import NVFP4
from .cpu import _rand32, specialise
from ..dispatch import nvfp4_keys
from .hadamard_cpu import load_transformed, work_items
from ..nvfp4 import quantize as nvfp4_reference
from ..nvfp4_codes import tensor_scale
from .nvfp4_cpu import COLS, _block_scale, _finite_mag, _out
from .pages import advise
from ..plan import MODE
from ..arrays import as_numpy


mode = 1  # a compile-time constant of each specialised kernel (bfp.kernels.numba_cpu.cpu.specialise)


def _block_max(x, factor, bmax, A, Rin, nb, C, b):
    ncc, per, nrr = work_items(nb, C, COLS)
    for s in prange(A * nrr * ncc):
        a, rr, cc = s // (nrr * ncc), (s // ncc) % nrr, s % ncc
        c0 = cc * COLS
        w = min(C, c0 + COLS) - c0
        t = np.empty((b, w), np.float32)
        for rb in range(rr * per, min(nb, rr * per + per)):
            load_transformed(x, t, factor, a, rb, Rin, C, c0, w, b)
            out = (a * nb + rb) * C + c0
            for c in range(w):
                top = np.int32(0)
                for i in range(b):
                    top = max(top, _finite_mag(np.float32(t[i, c]).view(np.int32)))
                bmax[out + c] = top


def _block_quantize(x, factor, oi, bmax, A, Rin, nb, C, b, pts, k0, k1):
    ncc, per, nrr = work_items(nb, C, COLS)
    R = nb * b
    for s in prange(A * nrr * ncc):
        a, rr, cc = s // (nrr * ncc), (s // ncc) % nrr, s % ncc
        c0 = cc * COLS
        w = min(C, c0 + COLS) - c0
        t = np.empty((b, w), np.float32)
        ts = np.empty(w, np.float32)
        for rb in range(rr * per, min(nb, rr * per + per)):
            load_transformed(x, t, factor, a, rb, Rin, C, c0, w, b)
            for c in range(w):
                ts[c] = _block_scale(bmax[(a * nb + rb) * C + c0 + c], pts)
            for i in range(b):
                r = rb * b + i
                row = (a * R + r) * C + c0
                for c in range(w):
                    v = t[i, c]
                    vb = np.float32(v).view(np.int32)
                    if mode == 1:
                        oi[row + c] = _out(vb, v, ts[c], 1, 0)
                    else:  # the index with the block axis (rows) moved last, as nvfp4_cpu
                        k = (a * C + c0 + c) * R + r
                        oi[row + c] = _out(vb, v, ts[c], 2, _rand32(k0, k1, np.int64(k)))


@functools.lru_cache(maxsize=None)
def kernels(rounding_mode: int):
    """The two passes for rounding ``rounding_mode``, cached on disk."""
    return tuple(specialise(t, f"nvfp4_rht{t.__name__}_mode{rounding_mode}", True, mode=rounding_mode)
                 for t in (_block_max, _block_quantize))


def quantize(t: torch.Tensor, factor: torch.Tensor, fmt: NVFP4, keys):
    """NVFP4 (1-D blocks of ``len(factor)`` along dim -2) of the transformed contiguous CPU
    float32 ``t``, rows padded to whole blocks; None when the transformed tensor has no finite
    nonzero element (the caller then takes the reference path)."""
    b = factor.numel()
    Rin, C = t.shape[-2], t.shape[-1]
    A = t.numel() // max(Rin * C, 1)
    nb = -(-Rin // b)
    if A * nb * C == 0:
        return None
    block_max, block_quantize = kernels(MODE[fmt.rounding])
    x, f = as_numpy(t.reshape(-1)), as_numpy(factor)
    bmax = np.empty(A * nb * C, np.int32)
    block_max(x, f, bmax, A, Rin, nb, C, b)
    top = int(bmax.max())
    if top == 0:
        return None
    out = torch.empty(*t.shape[:-2], nb * b, C, dtype=torch.float32)
    advise(out)
    block_quantize(x, f, as_numpy(out.view(torch.int32)).reshape(-1), bmax, A, Rin, nb, C, b,
                   tensor_scale(top, fmt), keys[0], keys[1])
    return out


def transform_quantize(t: torch.Tensor, factor: torch.Tensor, fmt: NVFP4, generator,
                       transformed: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``quantize`` with the rounding keys drawn from ``generator`` as ``bfp.quantize`` draws them;
    where nothing finite and nonzero comes out (or ``t`` is empty), NVFP4's reference on
    ``transformed()`` with the same keys."""
    keys = nvfp4_keys(fmt, generator)
    out = quantize(t.contiguous(), factor, fmt, keys) if t.numel() else None
    if out is None:
        x = transformed()
        return x.clone() if x.numel() == 0 else nvfp4_reference(x, fmt, keys, "reference")
    return out
