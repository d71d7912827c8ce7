"""NVFP4 as Numba CPU kernels (the rule is ``bfp.formats.nvfp4``'s docstring). Imported, and compiled,
on first use; they equal ``bfp.kernels.nvfp4.reference`` bit for bit (tests/test_nvfp4.py).

The tensor is seen as ``(A, R, C)``: ``R`` the block axis, ``A`` the axes before it, ``C``
those after it, with no copy. Two passes: the block maxima (their maximum is the tensor's,
from which the tensor scale comes), then the scales and elements block by block.
``C == 1`` (blocks along the last axis) runs the *row* kernels, one block of contiguous
elements at a time; ``C > 1`` the *column* kernels, which take 16 rows at a time and run
along the columns, so a block axis that is not the last (the weight-gradient operands along
their rows, a convolution's batch axis) needs no transposing copy; with fewer than ``FLAT``
columns (a 3x3 convolution's weight in 16x16 tiles: 9; a Linear weight's: 1) a block's rows
are one contiguous run, and the loops run along it instead. Stochastic rounding
draws each element's number by its index in the tensor with the block axis moved last,
as the reference does, so both kernels give the same bits.

For nearest rounding the E4M3 scale's mantissa is cut with one integer add and E2M1 is
rounded by adding and subtracting ``2**22``, ``2**23`` or ``2**24`` (whose float32 ulp is
E2M1's step there: one float32 rounding, ties to the even multiple, the even code), so
the element loop has no integer rule and vectorises. Stochastic rounding takes the same
float32 steps with the integer rule's decision written in float32 (``_e2m1_stochastic``).
NVFP4 has no truncation.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit, prange

from ...formats.nvfp4 import E2M1_MAX, E4M3_MAX, E4M3_TINY, NVFP4
from .cpu import specialise
from .rule_cpu import _rand32
from ..nvfp4_codes import CHUNK, tensor_scale
from .pages import advise
from ..plan import MODE
from ..scalar import EXP_INF, MAG, QNAN
from ..arrays import as_numpy

_MAG, _INF, _SIGN, _QNAN = np.int32(MAG), np.int32(EXP_INF), np.int32(-2 ** 31), np.int32(QNAN)
_SIX, _LO, _HI = np.float32(E2M1_MAX), np.float32(E4M3_TINY), np.float32(E4M3_MAX)
COLS = 2048  # columns per step of the column kernels' parallel loops
FLAT = 16  # fewer columns: the column kernels run along a block's rows as one contiguous run


@njit(inline="always")
def _finite_mag(xb):
    m = xb & _MAG
    return m if m < _INF else np.int32(0)


@njit(inline="always")
def _block_mag(xb, with_inf):
    """Magnitude bits for a block maximum: NaN takes no part, nor Inf unless ``with_inf`` (TE's)."""
    m = xb & _MAG
    return m if (m < _INF) | (with_inf & (m == _INF)) else np.int32(0)


@njit(inline="always")
def _e4m3_scale(sbs):
    """``sbs`` (float32 in [2**-6, 448]: E4M3's normal range) rounded to E4M3, nearest-even:
    the float32 mantissa cut to 3 bits by an integer add (a carry moves the exponent up)."""
    b = np.float32(sbs).view(np.int32)
    b = (b + np.int32(0x7FFFF) + ((b >> 20) & np.int32(1))) & np.int32(~0xFFFFF)
    return np.int32(b).view(np.float32)


@njit(inline="always")
def _block_scale(bmax_bits, pts):
    """``ts = pts * e4m3(clamp(amax_b / 6 / pts))`` of a block maximum's float32 bits."""
    sbs = (np.int32(bmax_bits).view(np.float32) / _SIX) / pts
    return pts * _e4m3_scale(min(max(sbs, _LO), _HI))


@njit(inline="always")
def _e2m1_nearest(v):
    """``v`` (float32, ``|v| <= 6``, finite) rounded to E2M1, nearest-even, sign kept."""
    a = abs(v)
    big = np.float32(4194304.0) if a < np.float32(2.0) else (
        np.float32(8388608.0) if a < np.float32(4.0) else np.float32(16777216.0))
    r = (a + big) - big
    return np.int32(np.float32(r).view(np.int32) | (np.float32(v).view(np.int32) & _SIGN)).view(np.float32)


_ONE, _TWO24M1, _INV256 = np.float32(1.0), np.float32(16777215.0), np.float32(1.0 / 256.0)


@njit(inline="always")
def _e2m1_stochastic(v, r):
    """``v`` (float32, ``|v| <= 6``, finite) rounded to E2M1 stochastically with the element's
    32-bit random number ``r``, sign kept: the integer rule's decision (``scalar._quant_elem``,
    mode 2: up iff ``F + r >= 2**32``, ``F`` the dropped part ``frac(|v| / u) * 2**32`` of the
    step ``u``, cut to an integer where it has bits below 1) in float32 lanes. With ``r = 256 h + l``
    and ``g = F / 256`` that is ``g >= K - l / 256``, ``K = 2**24 - h``: ``floor(g) >= K``, or
    ``floor(g) == K - 1`` and ``frac(g) >= 1 - l / 256``; every quantity is exact in float32
    (``|v| / u`` scales by a power of two, ``g`` has ``|v|``'s 24 bits, ``h < 2**24``)."""
    a = abs(v)
    iu = np.float32(2.0) if a < np.float32(2.0) else (_ONE if a < np.float32(4.0) else np.float32(0.5))
    t = a * iu  # |v| / u, exact
    n = np.floor(t)
    g = (t - n) * np.float32(16777216.0)
    gi = np.floor(g)
    k1 = _TWO24M1 - np.float32(np.int32(r >> 8))  # K - 1
    w = _ONE - np.float32(np.int32(r & 255)) * _INV256
    up = (gi > k1) | ((gi == k1) & (g - gi >= w))
    q = (n + (_ONE if up else np.float32(0.0))) / iu
    return np.int32(np.float32(q).view(np.int32) | (np.float32(v).view(np.int32) & _SIGN)).view(np.float32)


@njit(inline="always")
def _out(xb, x, ts, rmode, r):
    """Output bits of one element, rounding ``rmode`` (1 nearest, 2 stochastic with ``r``; passed
    in: an inlined helper sees this module's globals); Inf becomes NaN, NaN stays as it is."""
    v = min(max(x / ts, -_SIX), _SIX)
    q = _e2m1_nearest(v) if rmode == 1 else _e2m1_stochastic(v, r)
    o = np.float32(q * ts).view(np.int32)
    return o if (xb & _MAG) < _INF else (_QNAN if (xb & _MAG) == _INF else xb)


# Compile-time constants of each specialised kernel (bfp.kernels.numba_cpu.cpu.specialise): the rounding
# mode, the block (b1 elements along the block axis; b0 rows of a 2-D tile, 1 for 1-D blocks),
# whether an infinite element counts in a block's maximum (TE's convention, nvfp4_te_cpu).
mode, block, b0, b1, two_d, with_inf = 1, 16, 1, 16, False, False


def _row_max(xi, bmax, rows, n):
    nb = (n + block - 1) // block
    steps = (rows * nb + CHUNK - 1) // CHUNK
    for s in prange(steps):  # runs of CHUNK blocks: one prange step per block costs twice as much
        for t in range(s * CHUNK, min(rows * nb, s * CHUNK + CHUNK)):
            a = (t // nb) * n + (t % nb) * block
            count = block if n % block == 0 else min(block, (t // nb) * n + n - a)
            top = np.int32(0)
            for k in range(count):
                top = max(top, _finite_mag(xi[a + k]))
            bmax[t] = top


def _row_quantize(xi, xf, oi, bmax, rows, n, pts, k0, k1):
    nb = (n + block - 1) // block
    for s in prange((rows * nb + CHUNK - 1) // CHUNK):
        for t in range(s * CHUNK, min(rows * nb, s * CHUNK + CHUNK)):
            ts = _block_scale(bmax[t], pts)
            a = (t // nb) * n + (t % nb) * block
            if n % block == 0:  # a fixed trip count: vectorises
                a = t * block
                xs, fs, os = xi[a:a + block], xf[a:a + block], oi[a:a + block]
                for k in range(block):
                    r = _rand32(k0, k1, np.int64(a + k)) if mode == 2 else 0
                    os[k] = _out(xs[k], fs[k], ts, mode, r)
                continue
            for j in range(a, min(a + block, (t // nb) * n + n)):
                r = _rand32(k0, k1, np.int64(j)) if mode == 2 else 0
                oi[j] = _out(xi[j], xf[j], ts, mode, r)


@njit(inline="always")
def _col_tasks(R, C, b1):
    """Work items of the column kernels: (a, b0 block, a run of row blocks, a run of columns),
    about COLS x 16 rows each, so narrow tensors (few columns) still give long items."""
    nb = (R + b1 - 1) // b1
    ncc = (C + COLS - 1) // COLS
    per = max(1, COLS // min(C, COLS))  # row blocks per item
    nrr = (nb + per - 1) // per
    return nb, ncc, per, nrr


@njit(inline="always")
def _col_item(s, nb0, nrr, ncc, C):
    """Work item ``s``: (a, i0, a * nb0 + i0, its run of row blocks, its columns c0:c1)."""
    a0, rr, cc = s // (nrr * ncc), (s // ncc) % nrr, s % ncc
    return a0 // nb0, a0 % nb0, a0, rr, cc * COLS, min(C, cc * COLS + COLS)


def _col_max(xi, bmax, A, R0, R, C):
    """bmax[((a * nb0 + i0) * nb + rb) * C + c]: the largest magnitude bits (``_block_mag``) of the
    tile of rows i0*b0.. of axis R0 and rb*b1.. of axis R, column c (b0 = 1: 1-D blocks, R0 = 1)."""
    nb, ncc, per, nrr = _col_tasks(R, C, b1)
    nb0 = (R0 + b0 - 1) // b0
    for s in prange(A * nb0 * nrr * ncc):
        a, i0, a0, rr, c0, c1 = _col_item(s, nb0, nrr, ncc, C)
        run = np.empty(b1 * C if C < FLAT else 0, np.int32)
        for rb in range(rr * per, min(nb, rr * per + per)):
            out = (a0 * nb + rb) * C
            bm = bmax[out + c0:out + c1]  # slices: indices provably >= 0, so the loops vectorise
            bm[:] = 0
            if C < FLAT:  # few columns: a block's rows are one contiguous run of n elements
                n = (min(R, rb * b1 + b1) - rb * b1) * C
                tmp = run[:n]
                tmp[:] = 0
                for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                    start = ((a * R0 + r0) * R + rb * b1) * C
                    xs = xi[start:start + n]
                    for j in range(n):
                        tmp[j] = max(tmp[j], _block_mag(xs[j], with_inf))
                for j in range(n):
                    bm[j % C] = max(bm[j % C], tmp[j])
                continue
            for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                for r in range(rb * b1, min(R, rb * b1 + b1)):
                    row = ((a * R0 + r0) * R + r) * C
                    xs = xi[row + c0:row + c1]
                    for c in range(c1 - c0):  # along the columns
                        bm[c] = max(bm[c], _block_mag(xs[c], with_inf))


def _col_quantize(xi, xf, oi, bmax, A, R0, R, C, pts, k0, k1):
    nb, ncc, per, nrr = _col_tasks(R, C, b1)
    nb0 = (R0 + b0 - 1) // b0
    for s in prange(A * nb0 * nrr * ncc):
        a, i0, a0, rr, c0, c1 = _col_item(s, nb0, nrr, ncc, C)
        ts = np.empty(c1 - c0, np.float32)
        w = c1 - c0
        m = b1 * C if C < FLAT else 0
        tse, kofs = np.empty(m, np.float32), np.empty(m, np.int64)
        for j in range(m):  # the run's element j: column j % C, row j // C of the block
            kofs[j] = (j % C) * R + j // C
        for rb in range(rr * per, min(nb, rr * per + per)):
            bm = bmax[(a0 * nb + rb) * C + c0:(a0 * nb + rb) * C + c1]
            for c in range(w):
                ts[c] = _block_scale(bm[c], pts)
            if C < FLAT:  # few columns: a block's rows are one contiguous run of n elements
                n = (min(R, rb * b1 + b1) - rb * b1) * C
                for j in range(n):
                    tse[j] = ts[j % C]
                for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                    start = ((a * R0 + r0) * R + rb * b1) * C
                    xs, fs, os = xi[start:start + n], xf[start:start + n], oi[start:start + n]
                    for j in range(n):
                        if mode == 1:
                            os[j] = _out(xs[j], fs[j], tse[j], 1, 0)
                        else:  # as below: 1-D (a, c, r) with r = rb * b1 + j // C; 2-D as it is
                            k = start + j if two_d else a * C * R + rb * b1 + kofs[j]
                            os[j] = _out(xs[j], fs[j], tse[j], 2, _rand32(k0, k1, np.int64(k)))
                continue
            for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                for r in range(rb * b1, min(R, rb * b1 + b1)):
                    row = ((a * R0 + r0) * R + r) * C + c0
                    xs, fs, os = xi[row:row + w], xf[row:row + w], oi[row:row + w]  # indices >= 0
                    for c in range(w):
                        if mode == 1:
                            os[c] = _out(xs[c], fs[c], ts[c], 1, 0)
                        else:  # 1-D: the index with the block axis moved last; 2-D: as it is
                            k = row + c if two_d else (a * C + c0 + c) * R + r
                            os[c] = _out(xs[c], fs[c], ts[c], 2, _rand32(k0, k1, np.int64(k)))


@functools.lru_cache(maxsize=None)
def kernels(rounding_mode: int, blk):
    """The four kernels for rounding ``rounding_mode`` and block ``blk`` (an int, or (b0, b1) for
    2-D tiles), compiled with both as constants (the loops carry no code of the other mode, whole
    blocks have a fixed trip count) and cached on disk under a name that says both."""
    tile = isinstance(blk, tuple)
    r0, r1 = blk if tile else (1, blk)
    bound = dict(mode=rounding_mode, block=r1, b0=r0, b1=r1, two_d=tile, with_inf=False)
    tag = f"mode{rounding_mode}_b{r0}x{r1}{'_2d' if tile else ''}"
    return tuple(specialise(t, f"nvfp4_{t.__name__.lstrip('_')}_{tag}", True, **bound)
                 for t in (_row_max, _row_quantize, _col_max, _col_quantize))


def quantize(x: torch.Tensor, axis: int, fmt: NVFP4, keys):
    """NVFP4 of a contiguous CPU float32 ``x`` with blocks along ``axis`` (normalised, >= 0; a 2-D
    block also along ``axis - 1``), in ``x``'s layout; None when the tensor has no finite nonzero
    element (the caller's reference handles that case)."""
    shape = x.shape
    two_d = isinstance(fmt.block, tuple)
    b0, b1 = fmt.block if two_d else (1, fmt.block)
    lead = axis - 1 if two_d else axis  # 2-D tiles: axis - 1 is their first axis
    A = int(np.prod(shape[:lead], dtype=np.int64))
    R0 = shape[axis - 1] if two_d else 1
    R = shape[axis]
    C = int(np.prod(shape[axis + 1:], dtype=np.int64))
    row_max, row_quantize, col_max, col_quantize = kernels(MODE[fmt.rounding], fmt.block)
    xb = as_numpy(x.view(torch.int32)).reshape(-1)
    rows = C == 1 and not two_d  # the row kernels: 1-D blocks along the last axis
    bmax = np.empty(A * -(-R0 // b0) * -(-R // b1) * C, np.int32)
    if rows:
        row_max(xb, bmax, A, R)
    else:
        col_max(xb, bmax, A, R0, R, C)
    top = int(bmax.max()) if bmax.size else 0
    if top == 0:
        return None
    out = torch.empty_like(x)
    advise(out)  # huge pages for the untouched output (pages.py)
    args = (xb, as_numpy(x).reshape(-1), as_numpy(out.view(torch.int32)).reshape(-1), bmax)
    tail = (tensor_scale(top, fmt), keys[0], keys[1])
    if rows:
        row_quantize(*args, A, R, *tail)
    else:
        col_quantize(*args, A, R0, R, C, *tail)
    return out
