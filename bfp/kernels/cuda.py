"""Numba CUDA kernels. Imported, and compiled, on first use.

Zero-copy on torch tensors (``__cuda_array_interface__``) and launched on
torch's current stream. The element rule is ``scalar.py``'s, compiled with
``cuda.jit(device=True)``: the very code the CPU kernels run. With
``NUMBA_ENABLE_CUDASIM=1`` the same kernels run on the CPU (on NumPy arrays),
which is how the tests check them without a GPU.

Tiled formats take two launches: tile maxima by ``atomic.max`` on the float32
magnitude bits (integer order equals value order), then the element pass.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import config, cuda

from .scalar import EXP_INF, MAG, build

SIMULATOR = bool(config.ENABLE_CUDASIM)
THREADS = 16 if SIMULATOR else 256  # simulated threads are Python threads: keep few

_elem, _tile_consts, _rand32, *_ = build(cuda.jit(device=True, inline=True))


@cuda.jit(device=True, inline=True)
def _store(ob, i, o):
    ob[i] = o if o < 0x80000000 else o - 0x100000000  # unsigned bits -> int32


@cuda.jit(device=True, inline=True)
def _count(counts, nz, zc):
    if nz:
        cuda.atomic.add(counts, 0, nz)
        cuda.atomic.add(counts, 1, zc)


@cuda.jit(device=True, inline=True)
def _quant_one(xb, ob, i, kind, mode, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, k0, k1):
    """Quantize element i; returns (1 if it was nonzero, 1 if it became zero)."""
    b = np.int64(xb[i])
    r = _rand32(k0, k1, np.int64(i)) if mode == 2 else 0
    o = _elem(b, kind, mode, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, r)
    _store(ob, i, o)
    nz = (b & MAG) != 0
    return nz, nz and (o & MAG) == 0


@cuda.jit
def _elementwise(xb, ob, kind, mode, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan,
                 k0, k1, counts, stats):
    qt, p2q, hi, lo = _tile_consts(0, kind, 0, 0, qoff, lim, emin, man, maxkept, emaxq)
    nz = 0
    zc = 0
    for i in range(cuda.grid(1), xb.size, cuda.gridsize(1)):
        a, z = _quant_one(xb, ob, i, kind, mode, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, k0, k1)
        nz += a
        zc += z
    if stats:
        _count(counts, nz, zc)


@cuda.jit(device=True, inline=True)
def _tile_index(i, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3):
    i3 = i % D3
    i2 = (i // D3) % D2
    i1 = (i // (D3 * D2)) % D1
    i0 = i // (D3 * D2 * D1)
    return ((i0 // G0 * n1 + i1 // G1) * n2 + i2 // G2) * n3 + i3 // G3


@cuda.jit
def _tile_max(xb, tmax, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3):
    for i in range(cuda.grid(1), xb.size, cuda.gridsize(1)):
        m = np.int64(xb[i]) & MAG
        if 0 < m < EXP_INF:
            t = _tile_index(i, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3)
            cuda.atomic.max(tmax, t, np.int32(m))


@cuda.jit
def _tiled(xb, ob, tmax, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3, kind, mode, scale, soff, qoff, lim,
           emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1, counts, stats):
    nz = 0
    zc = 0
    for i in range(cuda.grid(1), xb.size, cuda.gridsize(1)):
        t = _tile_index(i, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3)
        qt, p2q, hi, lo = _tile_consts(np.int64(tmax[t]), kind, scale, soff, qoff, lim, emin, man,
                                       maxkept, emaxq)
        a, z = _quant_one(xb, ob, i, kind, mode, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, k0, k1)
        nz += a
        zc += z
    if stats:
        _count(counts, nz, zc)


def _device_array(t: torch.Tensor):
    if t.is_cuda:
        # No stream sync: the kernels run on torch's current stream, ordered after
        # the work that produced ``t`` (Numba would otherwise sync on every call).
        return cuda.as_cuda_array(t, sync=False)
    if SIMULATOR:
        return t.numpy()
    raise ValueError("the CUDA backend needs CUDA tensors (or NUMBA_ENABLE_CUDASIM=1 for the simulator)")


def run(x32: torch.Tensor, out: torch.Tensor, rule, shape4, tile4, keys, stats: bool):
    """Quantize contiguous float32 ``x32`` into ``out``; returns the counts tensor or None."""
    if not SIMULATOR and not cuda.is_available():
        raise RuntimeError("Numba cannot see a CUDA GPU: install a CUDA-enabled numba "
                           "(pip install numba-cuda) or pass CPU tensors")
    kind, mode, scale, soff, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    k0, k1 = keys
    n = x32.numel()
    dev = x32.device
    counts = torch.zeros(2, dtype=torch.int64, device=dev)
    xb = _device_array(x32.view(torch.int32).reshape(-1))
    ob = _device_array(out.view(torch.int32).reshape(-1))
    cn = _device_array(counts)
    blocks = max(1, min(-(-n // THREADS), 2 if SIMULATOR else 65535))
    launch = (blocks, THREADS)
    if x32.is_cuda:
        launch += (cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream),)
    if n == 0:
        return counts if stats else None
    if shape4 is None:
        _elementwise[launch](xb, ob, kind, mode, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf,
                             inf_nan, k0, k1, cn, stats)
    else:
        D0, D1, D2, D3 = shape4
        G0, G1, G2, G3 = tile4
        n1, n2, n3 = -(-D1 // G1), -(-D2 // G2), -(-D3 // G3)
        tmax_t = torch.zeros(-(-D0 // G0) * n1 * n2 * n3, dtype=torch.int32, device=dev)
        tmax = _device_array(tmax_t)
        _tile_max[launch](xb, tmax, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3)
        _tiled[launch](xb, ob, tmax, D1, D2, D3, G0, G1, G2, G3, n1, n2, n3, kind, mode, scale, soff,
                       qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1, cn, stats)
    return counts if stats else None
