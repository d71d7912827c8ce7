"""Per-tensor scaled FP8 (``bfp.formats.scaled``, ``granularity="tensor"``, current or delayed) in Triton.

Two launches and no host round trip: the amax pass of ``nvfp4.py`` (each program's largest finite
magnitude) and a torch ``amax`` of its partial maxima, or the delayed recipe's amax given as a
device tensor; then ``_scaled``, element-wise: the scale from the amax (``fmt.max / amax`` as an
IEEE division, 1 where the amax is 0, at most float32's max, its exponent alone with ``pow2``),
``y = clamp(x * scale, -max, max)`` (NaN kept, as torch's clamp), ``q = fmt(y)`` by the integer
element rule, and ``q / scale`` as an IEEE division (``tl.math.div_rn``): the steps of
``kernels/scaled.py`` in its order, so the bits equal the PyTorch reference's, and no step divides
by a reciprocal (PyTorch's CUDA kernels do, pytorch/pytorch issues 191495 and 186618). Launched
with ``enable_fp_fusion=False``.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..scalar import _tile_consts
from .nvfp4 import ELEMS, _amax, _clamp, _f32
from .rule import EXP_INF, quant_elem, rand32

F32_MAX = tl.constexpr(3.4028234663852886e38)
TINY_BITS = tl.constexpr(0x00800000)  # the smallest normal float32, 2**-126


@triton.jit
def _scaled(x_ptr, o_ptr, keys_ptr, amax_ptr, n, FMAX: tl.constexpr, POW2: tl.constexpr, QT: tl.constexpr,
            P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr, KIND: tl.constexpr, MODE: tl.constexpr,
            MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr, BLOCK: tl.constexpr,
            IDX64: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK) if IDX64 else pid * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n
    x = tl.load(x_ptr + offs, mask=msk, other=0.0)
    amax = tl.load(amax_ptr).to(tl.float32)
    tiny = tl.full([], TINY_BITS, tl.int32).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, tl.math.div_rn(_f32(FMAX), tl.maximum(amax, tiny)), _f32(1.0))
    scale = tl.minimum(scale, _f32(F32_MAX))
    if POW2:
        scale = (scale.to(tl.int32, bitcast=True) & EXP_INF).to(tl.float32, bitcast=True)
    y = _clamp(x * scale, _f32(-FMAX), _f32(FMAX))
    r = tl.zeros(offs.shape, tl.uint32)
    if MODE == 2:
        r = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), offs, IDX64)
    q = quant_elem(y.to(tl.int32, bitcast=True), QT, P2Q, HI, LO, r, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN, QT < -127)
    tl.store(o_ptr + offs, tl.math.div_rn(q.to(tl.float32, bitcast=True), scale), mask=msk)


@functools.lru_cache(maxsize=64)
def _consts(rule) -> tuple:
    return _tile_consts(0, rule.kind, 0, 0, rule.qoff, rule.lim, rule.emin, rule.man, rule.maxkept, rule.emaxq)


def amax(x32: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of contiguous float32 ``x32`` as a 0-dim float32 device tensor."""
    n = x32.numel()
    grid = (-(-n // ELEMS),)
    part = torch.empty(grid[0], dtype=torch.int32, device=x32.device)
    _amax[grid](x32, part, n, BLOCK=ELEMS, IDX64=n + 2 * ELEMS >= 2 ** 31)
    return part.amax().view(torch.float32)


def tensorwise(x32: torch.Tensor, fmax: float, pow2: bool, rule, keys, given_amax=None) -> torch.Tensor:
    """Scaled rounding of contiguous float32 ``x32`` with one scale (``kernels/scaled.py``'s steps):
    ``rule`` the element format's, ``keys`` an int64 device tensor (stochastic) or None,
    ``given_amax`` the delayed recipe's amax (a device tensor) or None (this tensor's)."""
    top = amax(x32) if given_amax is None else given_amax.to(device=x32.device, dtype=torch.float32).reshape(())
    out = torch.empty_like(x32)
    n = x32.numel()
    qt, p2q, hi, lo = _consts(rule)
    _scaled[(-(-n // ELEMS),)](x32, out, x32 if keys is None else keys, top, n, FMAX=fmax, POW2=pow2, QT=qt, P2Q=p2q,
                               HI=hi, LO=lo, KIND=rule.kind, MODE=rule.mode, MAN=rule.man, FTZ=rule.ftz,
                               OVF_INF=rule.ovf_inf, INF_NAN=rule.inf_nan, BLOCK=ELEMS,
                               IDX64=n + 2 * ELEMS >= 2 ** 31, enable_fp_fusion=False)
    return out
