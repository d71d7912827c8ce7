"""NVFP4 (bfpsim's convention, ``bfp.formats.nvfp4``) in Triton, for 1-D blocks along a contiguous last axis.

Three launches, none of which waits on the host: ``_amax`` (each program's largest finite
magnitude, int32 bits), a torch ``amax`` of those few partial maxima (a 0-dim device tensor), and
``_quantize``: one program owns ``TPP`` whole blocks; it reads the tensor's amax, derives the tensor
scale ``pts`` itself, then per block the E4M3 block scale and per element the E2M1 code, exactly
as the PyTorch reference (``kernels/nvfp4.py``):

    pts = max(amax / 2688, 2**-149)            (1 without the tensor scale)
    sb8 = e4m3(clamp((amax_b / 6) / pts, 2**-6, 448))    nearest-even, the element rule
    ts  = pts * sb8;  v = clamp(x / ts, -6, 6);  out = e2m1(v) * ts

The roundings of E4M3 and E2M1 are the integer element rule (``rule.py``); the float32 operations
between them are IEEE divisions (``tl.math.div_rn``: Triton's ``/`` is an approximate division on a
GPU) and products, launched with ``enable_fp_fusion=False`` so no multiply-add is fused, which is
what NumPy does in the interpreter: the two agree bit for bit. A clamp keeps a NaN quotient NaN
(as torch's does) by an explicit test. A tensor with no finite nonzero value rounds every element
by the E2M1 rule directly (zeros stay, Inf becomes NaN), as the reference does.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..nvfp4_codes import E2M1, E4M3
from ..plan import rule_for
from ..scalar import _tile_consts
from .rule import EXP_INF, MAG, quant_elem, rand32

ELEMS = 2048


@triton.jit
def _amax(x_ptr, part_ptr, n, BLOCK: tl.constexpr, IDX64: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK) if IDX64 else pid * BLOCK + tl.arange(0, BLOCK)
    m = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.int32, bitcast=True) & MAG
    tl.store(part_ptr + pid, tl.max(tl.where(m < EXP_INF, m, 0), axis=0))


@triton.jit
def _f32(v: tl.constexpr):
    """A float32 constant (a bare float literal is float64 in the interpreter)."""
    return tl.full([], v, tl.float32)


@triton.jit
def _clamp(v, lo, hi):
    """min(max(v, lo), hi), NaN kept (torch's clamp)."""
    return tl.where(v != v, v, tl.minimum(tl.maximum(v, lo), hi))


@triton.jit
def _round(v_bits, qt: tl.constexpr, p2q: tl.constexpr, hi: tl.constexpr, lo: tl.constexpr, r,
           KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
           INF_NAN: tl.constexpr):
    return quant_elem(v_bits, qt, p2q, hi, lo, r, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN, False)


@triton.jit
def _quantize(x_ptr, o_ptr, keys_ptr, amax_ptr, n_rows, C, n_blocks_row,
              BLK: tl.constexpr, PB: tl.constexpr, TPP: tl.constexpr, TENSOR_SCALE: tl.constexpr,
              E4: tl.constexpr, E2: tl.constexpr, MODE: tl.constexpr, IDX64: tl.constexpr):
    # E4 / E2: (qt, p2q, hi, lo, kind, man, ftz, ovf_inf, inf_nan) of the E4M3 and E2M1 rules
    pid = tl.program_id(0)
    t = pid * TPP + tl.arange(0, TPP)[:, None]
    if IDX64:
        t = t.to(tl.int64)
    s = tl.arange(0, PB)[None, :]
    row = t // n_blocks_row
    col = (t % n_blocks_row) * BLK + s
    msk = (row < n_rows) & (s < BLK) & (col < C)
    off = row * C + col
    b = tl.load(x_ptr + off, mask=msk, other=0.0).to(tl.int32, bitcast=True)
    m = b & MAG
    finite = m < EXP_INF
    r = tl.zeros(b.shape, tl.uint32)
    if MODE == 2:
        r = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), off, IDX64)
    amax_bits = tl.load(amax_ptr)
    if amax_bits == 0:  # nothing finite and nonzero: each element by the E2M1 rule (zeros stay, Inf -> NaN)
        out = _round(b, E2[0], E2[1], E2[2], E2[3], r, E2[4], MODE, E2[5], E2[6], E2[7], E2[8]).to(tl.float32,
                                                                                                     bitcast=True)
    else:
        if TENSOR_SCALE:
            pts = tl.maximum(tl.math.div_rn(amax_bits.to(tl.float32, bitcast=True), _f32(2688.0)),
                             tl.full([], 1, tl.int32).to(tl.float32, bitcast=True))  # 2**-149
        else:
            pts = _f32(1.0)
        amax_b = tl.max(tl.where(msk & finite, m, 0), axis=1, keep_dims=True).to(tl.float32, bitcast=True)
        sbs = _clamp(tl.math.div_rn(tl.math.div_rn(amax_b, _f32(6.0)), pts), _f32(0.015625), _f32(448.0))
        sb8 = _round(sbs.to(tl.int32, bitcast=True), E4[0], E4[1], E4[2], E4[3], 0, E4[4], 1, E4[5], E4[6], E4[7],
                     E4[8]).to(tl.float32, bitcast=True)
        ts = pts * sb8
        x = b.to(tl.float32, bitcast=True)
        v = tl.where(finite, _clamp(tl.math.div_rn(x, ts), _f32(-6.0), _f32(6.0)), x)
        q = _round(v.to(tl.int32, bitcast=True), E2[0], E2[1], E2[2], E2[3], r, E2[4], MODE, E2[5], E2[6], E2[7],
                   E2[8])
        qf = q.to(tl.float32, bitcast=True)
        out = tl.where(finite, qf * ts, qf)
    tl.store(o_ptr + off, out, mask=msk)


@functools.lru_cache(maxsize=16)
def _consts(fmt_rule) -> tuple:
    """(qt, p2q, hi, lo, kind, man, ftz, ovf_inf, inf_nan) of an element-wise rule."""
    qt, p2q, hi, lo = _tile_consts(0, fmt_rule.kind, 0, 0, fmt_rule.qoff, fmt_rule.lim, fmt_rule.emin, fmt_rule.man,
                                   fmt_rule.maxkept, fmt_rule.emaxq)
    return (qt, p2q, hi, lo, fmt_rule.kind, fmt_rule.man, fmt_rule.ftz, fmt_rule.ovf_inf, fmt_rule.inf_nan)


def quantize_rows(xm: torch.Tensor, block: int, rounding, tensor_scale: bool, keys) -> torch.Tensor:
    """NVFP4 of contiguous float32 ``xm`` in 1-D blocks of ``block`` along its last axis (tail blocks
    shorter); ``keys``: the stochastic keys as an int64 tensor on ``xm``'s device, or None."""
    C = xm.shape[-1] if xm.dim() else 1
    n, rows = xm.numel(), xm.numel() // max(C, 1)
    out = torch.empty_like(xm)
    idx64 = n + 2 * ELEMS >= 2 ** 31
    grid_a = (-(-n // ELEMS),)
    part = torch.empty(grid_a[0], dtype=torch.int32, device=xm.device)
    _amax[grid_a](xm, part, n, BLOCK=ELEMS, IDX64=idx64)
    amax = part.amax()
    pb = 1 << max(block - 1, 0).bit_length()
    nbr = -(-C // block)
    tpp = max(1, ELEMS // pb)
    e2 = rule_for(E2M1[rounding])
    _quantize[(-(-(rows * nbr) // tpp),)](xm, out, xm if keys is None else keys, amax, rows, C, nbr, BLK=block, PB=pb,
                                          TPP=tpp, TENSOR_SCALE=tensor_scale, E4=_consts(rule_for(E4M3)),
                                          E2=_consts(e2), MODE=e2.mode, IDX64=idx64, enable_fp_fusion=False)
    return out
