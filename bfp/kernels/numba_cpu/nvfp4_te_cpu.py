"""NVFP4 in TransformerEngine's convention (``bfp.kernels.nvfp4_te``) as Numba CPU kernels for 1-D
blocks along any axis and for TE's 2-D tiles (16 x 16 weights), in the tensor's own layout (no
transposing copy): the tensor is seen as ``(A, R, C)``, ``R`` the block axis (``(A, R0, R, C)`` for
a tile over ``R0`` and ``R``). Per block its largest magnitude (NaN takes no part, Inf does),
its E4M3 scale and its elements, each step the float32 operation of the PyTorch code, in the same
order, so the bits are the same (tests/test_nvfp4_te.py). ``C == 1`` (blocks along the last axis)
runs the row kernel, one block at a time; ``C > 1`` and 2-D tiles the column kernels, a block's
rows at a time along the columns, or along a block's rows as one run where there are few columns
(as ``nvfp4_cpu``'s). The tensor's amax is the largest block maximum; ``S_enc`` and
``S_dec`` come from it by ``nvfp4_codes.te_scales``. Stochastic draws use an element's index with the
block axis moved last (2-D tiles: as it is), as the reference does. E4M3 scales round by ``rule_cpu._elem_nearest`` (on its
path, checked per call), E2M1 elements by ``nvfp4_cpu._e2m1_nearest`` and ``_e2m1_stochastic`` (float32 only). Imported, and compiled,
on first use.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit, prange

from ...formats.nvfp4 import E2M1_MAX, E4M3_MAX, NVFP4
from .cpu import specialise
from .rule_cpu import _elem_nearest, _nearest_ok, _rand32, _tile_consts
from .nvfp4_cpu import FLAT, _col_item, _col_max, _col_tasks, _e2m1_nearest, _e2m1_stochastic
from ..nvfp4_codes import E4M3, te_scales
from .pages import advise
from ..plan import MODE, rule_for
from ..scalar import EXP_INF, MAG
from ..arrays import as_numpy

_MAG, _INF = np.int32(MAG), np.int32(EXP_INF)
_FMAX, _SIX, _E4 = np.float32(3.4028234663852886e38), np.float32(E2M1_MAX), np.float32(E4M3_MAX)
STEP = 1 << 16  # elements per step of the amax pass
# Compile-time constants of each specialised kernel (cpu.specialise): the rounding mode, the block
# (b1 elements along the block axis; b0 rows of a 2-D tile along the axis before it, 1 for 1-D).
mode, block, b0, b1, two_d = 1, 16, 1, 16, False


@njit(inline="always")
def _mag(xb):
    """Magnitude bits for a maximum: NaN takes no part (0), Inf does."""
    m = xb & _MAG
    return m if m <= _INF else np.int32(0)


@njit(inline="always")
def _scale(top_bits, mult, s_dec, e4, c4):
    """``(sb8, enc)`` of a block whose largest magnitude has bits ``top_bits``: TE's E4M3 block scale
    (no lower clamp) and the encode multiplier ``min(1 / (sb8 * S_dec), FLT_MAX)`` (``c4``: E4M3's
    tile constants, ``_consts4``, computed once per kernel call)."""
    sb = min(max(min(np.int32(top_bits).view(np.float32) * mult, _FMAX), -_E4), _E4)
    sbb = _elem_nearest(np.int64(np.float32(sb).view(np.int32)), 0, c4[0], c4[1], c4[2], c4[3], e4[1], e4[4],
                        e4[5], e4[6])
    sb8 = np.int32(sbb).view(np.float32)
    return sb8, min(np.float32(1.0) / (sb8 * s_dec), _FMAX)


@njit(inline="always")
def _consts4(e4):
    """E4M3's tile constants for ``_scale`` (the block scale's exponent never shifts them)."""
    return _tile_consts(0, 0, 0, 0, 0, 0, e4[0], e4[1], e4[2], e4[3])


@njit(inline="always")
def _out(xb, x, sb8, enc, s_dec, rmode, r):
    """Output bits of one element: ``e2m1(clamp(x * enc, +-6)) * sb8 * S_dec`` (``rmode``: the
    kernel's compile-time rounding mode, passed in: an inlined helper sees this module's globals),
    in float32 only (nvfp4_cpu's E2M1 roundings: the rule's bits for ``|v| <= 6``); NaN stays NaN."""
    nan = (xb & _MAG) > _INF
    v = min(max(x * enc, -_SIX), _SIX)
    q = _e2m1_nearest(v) if rmode == 1 else _e2m1_stochastic(v, r)
    return xb if nan else np.float32(q * sb8 * s_dec).view(np.int32)


@njit(parallel=True, cache=True)
def amax_bits(xi):
    """float32 bits of the largest magnitude (NaN takes no part, Inf does; 0: none)."""
    parts = np.zeros((xi.size + STEP - 1) // STEP, np.int32)
    for s in prange(parts.size):
        xs = xi[s * STEP:min(xi.size, s * STEP + STEP)]  # a slice: indices provably >= 0
        top = np.int32(0)
        for j in range(xs.size):
            top = max(top, _mag(xs[j]))
        parts[s] = top
    return parts.max() if parts.size else np.int32(0)


def _te_rows(xi, xf, oi, rows, n, mult, s_dec, e4, k0, k1):
    c4 = _consts4(e4)
    nb = (n + block - 1) // block
    for t in prange(rows * nb):
        a = (t // nb) * n + (t % nb) * block
        end = min(a + block, (t // nb) * n + n)
        xs, fs, os = xi[a:end], xf[a:end], oi[a:end]  # slices: indices provably >= 0
        top = np.int32(0)
        for k in range(xs.size):
            top = max(top, _mag(xs[k]))
        sb8, enc = _scale(top, mult, s_dec, e4, c4)
        for k in range(xs.size):
            r = _rand32(k0, k1, np.int64(a + k)) if mode == 2 else 0
            os[k] = _out(xs[k], fs[k], sb8, enc, s_dec, mode, r)


def _te_cols(xi, xf, oi, bmax, A, R0, R, C, mult, s_dec, e4, k0, k1):
    c4 = _consts4(e4)
    nb, ncc, per, nrr = _col_tasks(R, C, b1)
    nb0 = (R0 + b0 - 1) // b0
    for s in prange(A * nb0 * nrr * ncc):
        a, i0, a0, rr, c0, c1 = _col_item(s, nb0, nrr, ncc, C)
        w = c1 - c0
        sc = np.empty(w, np.float32)
        en = np.empty(w, np.float32)
        m = b1 * C if C < FLAT else 0
        sce, ene, kofs = np.empty(m, np.float32), np.empty(m, np.float32), np.empty(m, np.int64)
        for j in range(m):  # the run's element j: column j % C, row j // C of the block
            kofs[j] = (j % C) * R + j // C
        for rb in range(rr * per, min(nb, rr * per + per)):
            bm = bmax[(a0 * nb + rb) * C + c0:(a0 * nb + rb) * C + c1]
            for c in range(w):
                sc[c], en[c] = _scale(bm[c], mult, s_dec, e4, c4)
            if C < FLAT:  # few columns: a block's rows are one contiguous run (as nvfp4_cpu's)
                n = (min(R, rb * b1 + b1) - rb * b1) * C
                for j in range(n):
                    sce[j], ene[j] = sc[j % C], en[j % C]
                for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                    start = ((a * R0 + r0) * R + rb * b1) * C
                    xs, fs, os = xi[start:start + n], xf[start:start + n], oi[start:start + n]
                    for j in range(n):
                        k = start + j if two_d else a * C * R + rb * b1 + kofs[j]
                        r32 = _rand32(k0, k1, np.int64(k)) if mode == 2 else 0
                        os[j] = _out(xs[j], fs[j], sce[j], ene[j], s_dec, mode, r32)
                continue
            for r0 in range(i0 * b0, min(R0, i0 * b0 + b0)):
                for r in range(rb * b1, min(R, rb * b1 + b1)):
                    row = ((a * R0 + r0) * R + r) * C + c0
                    xs, fs, os = xi[row:row + w], xf[row:row + w], oi[row:row + w]  # indices >= 0
                    for c in range(w):
                        # 1-D: the index with the block axis moved last; 2-D: as it is
                        k = row + c if two_d else (a * C + c0 + c) * R + r
                        r32 = _rand32(k0, k1, np.int64(k)) if mode == 2 else 0
                        os[c] = _out(xs[c], fs[c], sc[c], en[c], s_dec, mode, r32)


@functools.lru_cache(maxsize=None)
def _kernels(rounding_mode: int, blk):
    """The row and column kernels for rounding ``rounding_mode`` and block ``blk`` (an int, or
    (b0, b1) for 2-D tiles), compiled with both as constants."""
    tile = isinstance(blk, tuple)
    r0, r1 = blk if tile else (1, blk)
    tag = f"mode{rounding_mode}_b{r0}x{r1}{'_2d' if tile else ''}"
    bound = dict(mode=rounding_mode, block=r1, b0=r0, b1=r1, two_d=tile)
    col_max = specialise(_col_max, f"nvfp4_te_col_max_{tag}", True, **bound, with_inf=True)  # Inf counts
    rows, cols = (specialise(t, f"nvfp4_{t.__name__.lstrip('_')}_{tag}", True, **bound) for t in (_te_rows, _te_cols))
    return rows, col_max, cols


@functools.lru_cache(maxsize=None)
def _on_path(fmt) -> np.ndarray:
    """The rule constants of ``fmt``, which must be on ``rule_cpu._elem_nearest``'s path (checked once
    per format; the array is shared, read only)."""
    r = rule_for(fmt)
    c = np.array([r.emin, r.man, r.maxkept, r.emaxq, r.ftz, r.ovf_inf, r.inf_nan], np.int64)
    t = _tile_consts(0, 0, 0, 0, 0, 0, *c[:4])
    if not _nearest_ok(0, t[0], t[1], t[2], int(c[1])):
        raise AssertionError(f"{fmt!r} is not on rule_cpu._elem_nearest's path")  # fixed formats: never
    return c


def quantize(x32: torch.Tensor, axis: int, fmt: NVFP4, keys) -> torch.Tensor:
    """NVFP4 (TE convention) of a contiguous, non-empty CPU float32 tensor, in its layout: 1-D
    blocks along ``axis`` (normalised), or 2-D tiles over ``axis - 1`` and ``axis`` (TE's
    ``quant_tile_shape``)."""
    shape = x32.shape
    two_d = isinstance(fmt.block, tuple)
    bb0, bb1 = fmt.block if two_d else (1, fmt.block)
    lead = axis - 1 if two_d else axis
    A = int(np.prod(shape[:lead], dtype=np.int64))
    R0 = shape[axis - 1] if two_d else 1
    R = shape[axis]
    C = int(np.prod(shape[axis + 1:], dtype=np.int64))
    rows, col_max, cols = _kernels(MODE[fmt.rounding], fmt.block)
    xb = as_numpy(x32.view(torch.int32)).reshape(-1)
    by_rows = C == 1 and not two_d  # the row kernel: 1-D blocks along the last axis
    if by_rows:
        top = int(amax_bits(xb))
    else:
        bmax = np.empty(A * -(-R0 // bb0) * -(-R // bb1) * C, np.int32)
        col_max(xb, bmax, A, R0, R, C)
        top = int(bmax.max())
    s_dec, mult = te_scales(torch.tensor(top, dtype=torch.int32).view(torch.float32))
    out = torch.empty_like(x32)
    advise(out)  # huge pages for the untouched output (pages.py)
    args = (xb, as_numpy(x32).reshape(-1), as_numpy(out.view(torch.int32)).reshape(-1))
    tail = (np.float32(mult.item()), np.float32(s_dec.item()), _on_path(E4M3),
            np.int64(keys[0]), np.int64(keys[1]))
    if by_rows:
        rows(*args, A, R, *tail)
    else:
        cols(*args, bmax, A, R0, R, C, *tail)
    return out
