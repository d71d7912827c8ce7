"""NVFP4 as Numba CUDA kernels (the rule is ``bfp.formats.nvfp4``'s docstring). Imported, and compiled,
on first use; with ``NUMBA_ENABLE_CUDASIM=1`` they run on the CPU, which is how the tests check
them against the reference without a GPU.

Three steps, on torch's current stream: block maxima by ``atomic.max`` on float32 magnitudes,
the tensor's maximum (one number to the host: the tensor scale is chosen there, as the reference
does), then one thread per element. Every operation is float32 arithmetic, correctly rounded
on the device, or integer arithmetic; no bit reinterpretation of floats is needed:

* the E4M3 block scale (a float32 in E4M3's normal range [2**-6, 448] after the clamp) is
  rounded to 3 mantissa bits by adding and subtracting ``2**(e + 20)``, ``e`` its binary
  exponent (the float32 ulp of that number is the E4M3 step; ties go to the even multiple,
  the even mantissa);
* E2M1 nearest the same way with ``2**22``, ``2**23``, ``2**24`` (steps 0.5, 1, 2);
* E2M1 stochastic: ``k = floor(|v| / step)``, the dropped fraction ``f`` (exact in
  float32) as the 32-bit integer ``f * 2**32``, rounded up when it plus the element's
  counter-based random number carries out of 32 bits: ``Rounding.STOCHASTIC``'s rule.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import cuda

from ..formats.nvfp4 import E2M1_MAX, E4M3_MAX, E4M3_TINY, NVFP4
from .cuda import SIMULATOR, THREADS, _device_array, _rand32

F32 = np.float32
SIX, TINY, TOP = F32(E2M1_MAX), F32(E4M3_TINY), F32(E4M3_MAX)


@cuda.jit(device=True, inline=True)
def _block(i, n, nb, block):
    return (i // n) * nb + (i % n) // block


@cuda.jit
def _block_max(xf, bmax, n, nb, block):
    for i in range(cuda.grid(1), xf.size, cuda.gridsize(1)):
        a = abs(xf[i])
        if a < F32(math.inf):  # finite (NaN compares false)
            cuda.atomic.max(bmax, _block(i, n, nb, block), a)


@cuda.jit(device=True, inline=True)
def _e4m3(s):
    """``s`` in [2**-6, 448] rounded to E4M3 (nearest-even)."""
    _, e = math.frexp(s)  # s = m * 2**e, 0.5 <= m < 1: the E4M3 step is 2**(e - 4)
    big = F32(math.ldexp(F32(1.0), e + 19))
    return (s + big) - big


@cuda.jit(device=True, inline=True)
def _e2m1(v, mode, r):
    """``v`` (finite, |v| <= 6) rounded to E2M1 (mode 1 nearest-even, 2 stochastic), sign kept."""
    a = abs(v)
    step = F32(0.5) if a < F32(2.0) else (F32(1.0) if a < F32(4.0) else F32(2.0))
    if mode == 1:
        big = step * F32(8388608.0)  # 2**23 x step: its float32 ulp is the step
        q = (a + big) - big
    else:
        k = math.floor(a / step)
        frac = np.int64((a / step - F32(k)) * F32(4294967296.0))
        q = (F32(k) + F32((frac + r) >> 32)) * step
    return F32(math.copysign(q, v))


@cuda.jit
def _quantize(xf, of, bmax, n, nb, block, pts, mode, k0, k1):
    for i in range(cuda.grid(1), xf.size, cuda.gridsize(1)):
        x = xf[i]
        if abs(x) < F32(math.inf):
            sbs = min(max((bmax[_block(i, n, nb, block)] / SIX) / pts, TINY), TOP)
            ts = pts * _e4m3(sbs)
            r = _rand32(k0, k1, np.int64(i)) if mode == 2 else 0
            of[i] = _e2m1(min(max(x / ts, -SIX), SIX), mode, r) * ts
        else:  # Inf becomes the quiet NaN 0x7FC00000, a NaN is copied as it is (E2M1 has neither)
            of[i] = x if x != x else F32(math.nan)


def quantize(xm: torch.Tensor, fmt: NVFP4, keys, mode: int, tensor_scale) -> torch.Tensor:
    """NVFP4 of float32 ``xm`` (block axis last, contiguous, on the GPU or, in the simulator,
    the CPU); ``tensor_scale(top_bits, fmt)`` gives the tensor scale from the maximum's bits."""
    if not SIMULATOR and not cuda.is_available():
        raise RuntimeError("Numba cannot see a CUDA GPU: install a CUDA-enabled numba "
                           "(pip install numba-cuda) or pass CPU tensors")
    n = xm.shape[-1]
    nb = -(-n // fmt.block)
    out = torch.empty_like(xm)
    bmax_t = torch.zeros(xm.numel() // n * nb, dtype=torch.float32, device=xm.device)
    flat = xm.reshape(-1)
    # One view per tensor: the simulator copies each host array in and out around a launch.
    xf, of = _device_array(flat), _device_array(out.view(-1))
    bmax = _device_array(bmax_t)
    blocks = max(1, min(-(-xm.numel() // THREADS), 2 if SIMULATOR else 65535))
    launch = (blocks, THREADS)
    if xm.is_cuda:
        launch += (cuda.external_stream(torch.cuda.current_stream(xm.device).cuda_stream),)
    _block_max[launch](xf, bmax, n, nb, fmt.block)
    top = int(bmax_t.max().view(torch.int32)) if bmax_t.numel() else 0
    if top == 0:
        return None  # nothing finite and nonzero: the caller's reference handles it
    _quantize[launch](xf, of, bmax, n, nb, fmt.block, F32(tensor_scale(top, fmt)), mode,
                      keys[0], keys[1])
    return out
