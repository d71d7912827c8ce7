"""Readable PyTorch reference of the quantization rule (any rank, any device).

This is the specification the Numba kernels must equal bit for bit. It works on
float32 bit patterns held in int64 tensors, step by step as ``scalar.py`` does
per element; it is slower but short.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan import KIND_FIXED, MX_SCALE, SCALE_MX, SCALE_NONE, Rule
from ..scalar import EXP_INF, INF_NAN, INF_SAT, MAG, NEG_NAN, NEG_ZERO, NO_NEG_ZERO, QNAN


def _ilog2(v: torch.Tensor) -> torch.Tensor:
    """floor(log2 v) for integer v > 0 (< 2**53: float64 is exact there)."""
    return torch.frexp(v.clamp(min=1).double())[1].long() - 1


def _flog2(m: torch.Tensor) -> torch.Tensor:
    e = m >> 23
    return torch.where(e > 0, e - 127, _ilog2(m) - 149)


def _bits_of(kept: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """float32 bits of kept * 2**q."""
    p = _ilog2(kept)
    ex = p + q + 126
    normal = (ex << 23) + (kept << (23 - p).clamp(min=0))
    sub = kept << (23 - p + ex).clamp(min=0)
    return torch.where(kept == 0, 0, torch.where(ex >= 0, normal, sub))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def rand32(k0: int, k1: int, n: int, device) -> torch.Tensor:
    """The counter-based random numbers of flat indices 0..n-1."""
    i = torch.arange(n, device=device, dtype=torch.int64)
    return _mix32(_mix32((i & 0xFFFFFFFF) ^ k0) ^ ((i >> 32) & 0xFFFFFFFF) ^ k1)


def _round_mag(m, q, mode: int, lim: int, r, code_parity=None):
    """(kept, exact) of magnitude bits m rounded at LSB 2**q. ``code_parity``: the parity of the
    kept value's code where it is not the kept significand's (a float without mantissa bits: the
    exponent field's)."""
    e = m >> 23
    sig = (m & 0x7FFFFF) | torch.where(e > 0, 0x800000, 0)
    d = q - (e.clamp(min=1) - 150)
    dd = d.clamp(1, 31)
    kept = sig >> dd
    rem = sig & (torch.bitwise_left_shift(torch.ones_like(dd), dd) - 1)
    if mode == 1:  # nearest, ties to even
        half = torch.bitwise_left_shift(torch.ones_like(dd), dd - 1)
        odd = kept & 1 if code_parity is None else kept.clamp(max=1) & code_parity
        kept = kept + ((rem > half) | ((rem == half) & odd.bool())).long()
    elif mode == 2:  # stochastic: carry out of (top 32 dropped bits + r)
        r32 = torch.where(d <= 32, rem << (32 - d).clamp(min=0), rem >> (d - 32).clamp(0, 31))
        kept = kept + ((r32 + r) >> 32)
    return kept.clamp(max=lim), d <= 0


def tile_max(m: torch.Tensor, tile: tuple[int, ...]) -> torch.Tensor:
    """Each element's tile maximum of m (tiles aligned at 0, tail tiles smaller)."""
    shape = m.shape
    pad = []
    for d, t in zip(reversed(shape), reversed(tile)):
        pad += [0, (-d) % t]
    mp = F.pad(m, pad) if any(pad) else m  # zero padding never wins a max of m >= 0
    split = []
    for d, t in zip(mp.shape, tile):
        split += [d // t, t]
    red = mp.reshape(split).amax(dim=tuple(range(1, 2 * len(tile), 2)), keepdim=True)
    full = red.expand(split).reshape(mp.shape)
    return full[tuple(slice(0, d) for d in shape)]


def _scale_step(tmax: torch.Tensor, scale: int, top: int) -> torch.Tensor:
    """1 where an MX scale mode other than floor moves the block's scale one binade up
    (``top``: the element's largest significand in its LSBs; see ``scalar._tile_consts``)."""
    mb = top.bit_length() - 1
    t = tmax.clamp(min=1)
    sig = torch.where((t >> 23) > 0, (t & 0x7FFFFF) | 0x800000, t << (23 - _ilog2(t)).clamp(min=0))
    if scale == MX_SCALE["ceil"]:
        up = sig != 0x800000
    elif scale == MX_SCALE["even"]:
        up = (sig + (1 << (22 - mb)) >= 0x1000000) if mb < 23 else torch.zeros_like(sig, dtype=torch.bool)
    else:
        up = sig > (top << (23 - mb))
    return (up & (tmax > 0)).long()


def quantize_bits(xb: torch.Tensor, rule: Rule, tile, keys) -> torch.Tensor:
    """Quantized float32 bits (int64) of float32 bits ``xb`` (int64, any shape)."""
    kind, mode, scale, soff, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    m = xb & MAG
    finite = m < EXP_INF
    mf = torch.where(finite, m, 0)
    if scale == SCALE_NONE:
        s = torch.zeros_like(m)
    else:
        tmax = tile_max(mf, tile)
        s = torch.where(tmax > 0, _flog2(tmax.clamp(min=1)) - soff, 0)
        if scale > SCALE_MX:
            s = s + _scale_step(tmax, scale, lim if kind == KIND_FIXED else maxkept)
        if scale >= SCALE_MX:
            s = s.clamp(-127, 127)
    r = rand32(keys[0], keys[1], xb.numel(), xb.device).view(xb.shape) if mode == 2 else None
    mm = mf.clamp(min=1)  # zeros and non-finite are replaced at the end
    if kind == KIND_FIXED:
        q = s + qoff
        kept, exact = _round_mag(mm, q, mode, lim, r)
        rb = torch.where(exact, mm, _bits_of(kept, q))
    else:
        es = emin + s
        q = torch.maximum(_flog2(mm), es) - man
        kept, exact = _round_mag(mm, q, mode, 2 ** 31 - 1, r, (q - es + 1) & 1 if man == 0 else None)
        rb = torch.where(exact, mm, _bits_of(kept, q))
        maxb = _bits_of(torch.full_like(s, maxkept), emaxq + s)
        over = maxb if ovf_inf == 0 or mode == 0 else torch.full_like(maxb, EXP_INF if ovf_inf == 1 else QNAN)
        rb = torch.where(rb > maxb, over, rb)
        if ftz:
            rb = torch.where(rb < _bits_of(torch.ones_like(s), es), 0, rb)
    out = torch.where(xb < 0, rb - 2 ** 31, rb)
    out = torch.where(m == 0, xb, out)
    nonfinite = xb
    if inf_nan & INF_NAN:
        nonfinite = torch.where(m == EXP_INF, QNAN, xb)
    elif inf_nan & INF_SAT:  # ±max, the sign kept
        top = maxb if kind != KIND_FIXED else torch.zeros_like(m)
        nonfinite = torch.where(m == EXP_INF, torch.where(xb < 0, top - 2 ** 31, top), xb)
    out = torch.where(finite, out, nonfinite)
    if inf_nan & (NO_NEG_ZERO | NEG_NAN | NEG_ZERO):  # P3109: one zero; unsigned: no negative values
        mag = out & MAG
        out = torch.where(mag == 0, 0, out)
        neg = (xb < 0) & (mag != 0) & (mag <= EXP_INF)
        if inf_nan & NEG_ZERO:
            out = torch.where(neg, 0, out)
        elif inf_nan & NEG_NAN:
            out = torch.where(neg, QNAN, out)
    return out


def quantize_reference(x32: torch.Tensor, rule: Rule, tile, keys) -> torch.Tensor:
    """float32 in, float32 out (new tensor)."""
    xb = x32.contiguous().view(torch.int32).long()
    ob = quantize_bits(xb, rule, tile, keys)
    return ob.to(torch.int32).view(torch.float32).reshape(x32.shape)


ZERO_EXP = -(1 << 20)  # the exponent of a zero operand: loses every alignment (two sum to -2**21: int32)


def operand_exponents(x: torch.Tensor, emin: int) -> torch.Tensor:
    """floor(log2|x|) of each value, at least ``emin`` (an operand below the input format's
    smallest normal counts as its minimum normal exponent); ``ZERO_EXP`` for zeros (int32): the
    operand exponents of the tensor-core accumulators' kernels (Numba and Triton), on any device."""
    _, e = torch.frexp(x)
    e = torch.clamp(e.to(torch.int32) - 1, min=emin)
    return torch.where(x == 0, torch.full_like(e, ZERO_EXP), e)
