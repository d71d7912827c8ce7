"""Numba CPU kernels (parallel). Imported, and compiled, on first use.

Both kernels read the input's float32 bits and write the output's bits; the
element rule is ``scalar.py``'s, compiled here with ``numba.njit`` and inlined
so the inner loops vectorise. Each (element kind, rounding mode) pair gets its
own compiled kernels, so the loops carry no code of other modes. Random numbers for stochastic rounding are a hash
of the flat element index, so the result does not depend on the number of
threads or the work split.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import types
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from .rule_cpu import (_elem, _elem_f, _elem_nearest, _elem_scaled, _fixed_f, _nearest_ok, _rand32, _tile_consts,
                       fixed_c, scale_pair, scaled_consts)
from ..scalar import EXP_INF, MAG



def _cache_dir() -> str:
    """Numba's on-disk cache folder for these kernels, named by a hash of every module of this
    package. Numba keys its cache on the kernel's own file only, so an edit of an inlined helper
    in another module (the element rule in ``rule_cpu.py`` and ``scalar.py``, ``nvfp4_cpu``'s E2M1
    rounding inlined by ``nvfp4_te_cpu``) would otherwise be served stale; here any edit of a
    kernel module starts a fresh folder. ``NUMBA_CACHE_DIR`` is the base when set."""
    here = Path(__file__).parent  # this backend's folder and the shared modules above it (scalar.py, plan.py)
    src = b"".join(p.read_bytes() for p in sorted([*here.glob("*.py"), *here.parent.glob("*.py")]))
    key = hashlib.sha1(src + numba.__version__.encode()).hexdigest()[:16]
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(Path.home(), ".cache", "bfpsim")
    return os.path.join(base, f"kernels-{key}")


@njit(inline="always")
def _count(xs, os, n):
    """(nonzero inputs, of those the zeroed outputs) over xs[:n], os[:n]."""
    nz = 0
    zc = 0
    for j in range(n):
        nzi = (np.int64(xs[j]) & MAG) != 0
        nz += nzi
        zc += nzi & ((np.int64(os[j]) & MAG) == 0)
    return nz, zc


@contextlib.contextmanager
def _kernel_cache():
    """Numba fixes a dispatcher's cache folder when it is decorated: point it at
    ``_cache_dir()`` while the kernels are made, then restore the user's."""
    user = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = _cache_dir()
    try:
        yield
    finally:
        numba.config.CACHE_DIR = user


# The three kernels below are templates: ``_specialise`` binds the globals
# KIND, MODE (and ``strip`` for ``_tiled``) and compiles them; they are never
# called as Python.

def _elementwise(xb, ob, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1,
                 stats):
    """Element-wise formats (tiles of one element): one flat parallel loop."""
    qt, p2q, hi, lo = _tile_consts(0, KIND, 0, 0, qoff, lim, emin, man, maxkept, emaxq)
    f_lo, f_top, f_hi, f_c23, f_qnan, f_ok = scaled_consts(qt, p2q, hi, lo, man, inf_nan)
    ok = _nearest_ok(KIND, qt, p2q, hi, man)
    near = MODE == 1 and ok
    if ok and MODE <= 1 and KIND == 1 and inf_nan < 4:  # float32 lanes (rule_cpu): fixed point, then float
        c, u = np.int32(fixed_c(p2q)).view(np.float32), np.int32(p2q).view(np.float32)
        for i in prange(xb.size):
            ob[i] = _fixed_f(xb[i], c, u, f_hi, f_qnan, inf_nan, MODE == 0)
    elif near and KIND == 0 and f_ok:
        for i in prange(xb.size):
            ob[i] = _elem_f(xb[i], f_lo, f_top, f_hi, f_c23, f_qnan, ftz, ovf_inf, inf_nan)
    elif near:
        for i in prange(xb.size):
            ob[i] = _elem_nearest(np.int64(xb[i]), KIND, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan)
    else:
        for i in prange(xb.size):
            r = _rand32(k0, k1, np.int64(i)) if MODE == 2 else 0
            ob[i] = _elem(np.int64(xb[i]), KIND, MODE, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, r)
    # Counting is a second pass, so the quantizing loop carries no reduction.
    nz = 0
    zc = 0
    if stats:
        step = 1 << 16
        for c in prange((xb.size + step - 1) // step):
            a, b = _count(xb[c * step:], ob[c * step:], min(step, xb.size - c * step))
            nz += a
            zc += b
    return nz, zc


def _strip(xb, ob, rows, seg0, seg1, G3, colmax, cq, scale, soff, qoff, lim, emin, man,
           maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1, stats, f_lo, f_top, f_hi, f_c23, f_qnan, mx_ok):
    """One work item: the rows ``rows`` (flat offsets) of one tile along axes
    0-2, columns seg0:seg1 (whole tiles of G3) of axis 3. Long tiles: every
    tile's maximum, then every tile's constants (into ``colmax``, ``cq``), then
    the elements tile by tile; the maxima do not wait on each other's constants,
    so the CPU overlaps them (one tile at a time took ~17 ns a tile of latency:
    MX quantize 2M elements 3.5 -> 2.9 ms). Short tiles: pass 1 takes
    column maxima over the rows (vectorised) and spreads each tile's
    constants over its columns; pass 2 quantizes the rows. Nearest
    rounding takes ``_elem_nearest`` where ``_nearest_ok`` says it applies to
    every tile of the strip; MX tiles of one column each (G3 == 1) then round
    ``x * 2**-s`` with the element's own constants and multiply by ``2**s``
    (exact: see docs/formats.md; the per-column constants' arithmetic cost more,
    BENCHMARKS.md). Returns the (nonzero, zeroed) counts."""
    w = seg1 - seg0
    if G3 >= 16:  # long tiles (MX blocks): all maxima, then all constants, then the elements
        nt = (w + G3 - 1) // G3
        for t in range(nt):  # independent short reductions (int32 lanes): the CPU overlaps them
            a3 = seg0 + t * G3
            n3 = min(G3, seg1 - a3)
            tmax = np.int32(0)
            for row in rows:
                xs = xb[row + a3:row + a3 + n3]
                for j in range(n3):
                    m = xs[j] & np.int32(MAG)
                    tmax = max(tmax, m if m < np.int32(EXP_INF) else np.int32(0))
            colmax[t] = tmax
        nf = 0
        nout = 0
        for t in range(nt):
            c0, c1, c2, c3 = _tile_consts(np.int64(colmax[t]), KIND, scale, soff, qoff, lim, emin, man,
                                          maxkept, emaxq)
            nf += not _nearest_ok(KIND, c0, c1, c2, man)
            cq[0, t], cq[1, t], cq[2, t], cq[3, t] = c0, c1, c2, c3
            if mx_ok:  # 2**-s, 2**s of the tile (see the column path below)
                cq[4, t], cq[5, t], out = scale_pair(c3, emin)
                nout += out
            elif KIND == 1:
                cq[4, t] = fixed_c(c1)
        lanes = nf == 0 and ((MODE <= 1 and KIND == 1 and inf_nan < 4) or (mx_ok and nout == 0))
        for t in range(nt):
            a3 = seg0 + t * G3
            n3 = min(G3, seg1 - a3)
            c0, c1, c2, c3 = cq[0, t], cq[1, t], cq[2, t], cq[3, t]
            f4, f5 = np.int32(cq[4, t]).view(np.float32), np.int32(cq[5, t]).view(np.float32)
            fu, fh = np.int32(c1).view(np.float32), np.int32(c2).view(np.float32)
            for row in rows:
                xs = xb[row + a3:row + a3 + n3]
                os = ob[row + a3:row + a3 + n3]
                if lanes and KIND == 1:  # float32 lanes (rule_cpu)
                    for j in range(n3):
                        os[j] = _fixed_f(xs[j], f4, fu, fh, f_qnan, inf_nan, MODE == 0)
                    continue
                if lanes:
                    for j in range(n3):
                        os[j] = _elem_scaled(xs[j], f4, f5, f_lo, f_top, f_hi, f_c23, f_qnan, ftz, ovf_inf,
                                             inf_nan)
                    continue
                if MODE == 1 and nf == 0:
                    for j in range(n3):
                        os[j] = _elem_nearest(np.int64(xs[j]), KIND, c0, c1, c2, c3, man, ftz, ovf_inf,
                                              inf_nan)
                    continue
                for j in range(n3):
                    r = _rand32(k0, k1, np.int64(row + a3 + j)) if MODE == 2 else 0
                    os[j] = _elem(np.int64(xs[j]), KIND, MODE, c0, c1, c2, c3, man, ftz,
                                  ovf_inf, inf_nan, r)
    else:  # short tiles: column maxima over the rows, constants spread over columns
        colmax[:w] = 0
        c_q, c_p, c_hi, c_lo = cq[0], cq[1], cq[2], cq[3]
        allok = True  # every tile of the strip on the float32 shortcuts (rule_cpu._nearest_ok)
        for row in rows:
            xs = xb[row + seg0:row + seg1]  # slices: indices provably >= 0, so loops vectorise
            for j in range(w):
                m = xs[j] & np.int32(MAG)
                colmax[j] = max(colmax[j], m if m < np.int32(EXP_INF) else np.int32(0))
        scaled = False
        if G3 == 1:  # a tile per column (MX blocks across rows): one loop, no inner runs
            c_inv, c_fac = cq[4], cq[5]
            nf = 0
            nout = 0
            for j in range(w):
                c0, c1, c2, c3 = _tile_consts(np.int64(colmax[j]), KIND, scale, soff, qoff, lim, emin, man,
                                              maxkept, emaxq)
                nf += not _nearest_ok(KIND, c0, c1, c2, man)
                c_q[j], c_p[j], c_hi[j], c_lo[j] = c0, c1, c2, c3
                if mx_ok:  # float32 bits of the column's 2**-s and 2**s
                    c_inv[j], c_fac[j], out = scale_pair(c3, emin)
                    nout += out
                elif KIND == 1:
                    c_inv[j] = fixed_c(c1)  # float32 lanes (rule_cpu._fixed_f)
            allok = nf == 0
            scaled = allok and mx_ok and nout == 0
        for a3 in range(0, w if G3 > 1 else 0, G3):
            b3 = min(a3 + G3, w)
            tmax = 0
            for j in range(a3, b3):
                tmax = max(tmax, colmax[j])
            c0, c1, c2, c3 = _tile_consts(tmax, KIND, scale, soff, qoff, lim, emin, man,
                                          maxkept, emaxq)
            allok = allok and _nearest_ok(KIND, c0, c1, c2, man)
            c_q[a3:b3] = c0
            c_p[a3:b3] = c1
            c_hi[a3:b3] = c2
            c_lo[a3:b3] = c3
            if KIND == 1:
                cq[4, a3:b3] = fixed_c(c1)
        fast = MODE == 1 and allok
        fixed = MODE <= 1 and KIND == 1 and inf_nan < 4 and allok
        nr = rows.size
        todo = rows
        if scaled and w < 16 and rows[nr - 1] - rows[0] == (nr - 1) * w:
            # short rows back to back (a 3x3 convolution's weight, blocks over its input channels):
            # the factors repeated row after row (doubling: few copies), then one loop over the block
            have = w
            while have < nr * w:
                m = min(have, nr * w - have)
                c_inv[have:have + m] = c_inv[:m]
                c_fac[have:have + m] = c_fac[:m]
                have += m
            xs = xb[rows[0] + seg0:rows[0] + seg0 + nr * w]
            os = ob[rows[0] + seg0:rows[0] + seg0 + nr * w]
            for k in range(nr * w):
                os[k] = _elem_scaled(xs[k], np.int32(c_inv[k]).view(np.float32), np.int32(c_fac[k]).view(np.float32),
                                     f_lo, f_top, f_hi, f_c23, f_qnan, ftz, ovf_inf, inf_nan)
            todo = rows[:0]  # done (the counts below read every row)
        for row in todo:
            base = row + seg0
            xs = xb[base:base + w]
            os = ob[base:base + w]
            if scaled:  # the element format's own rule on x * 2**-s, times 2**s (exact here)
                for j in range(w):
                    os[j] = _elem_scaled(xs[j], np.int32(c_inv[j]).view(np.float32),
                                         np.int32(c_fac[j]).view(np.float32), f_lo, f_top, f_hi, f_c23, f_qnan,
                                         ftz, ovf_inf, inf_nan)
                continue
            if fixed:  # float32 lanes (rule_cpu)
                for j in range(w):
                    os[j] = _fixed_f(xs[j], np.int32(cq[4, j]).view(np.float32), np.int32(c_p[j]).view(np.float32),
                                     np.int32(c_hi[j]).view(np.float32), f_qnan, inf_nan, MODE == 0)
                continue
            if fast:
                for j in range(w):
                    os[j] = _elem_nearest(np.int64(xs[j]), KIND, c_q[j], c_p[j], c_hi[j], c_lo[j], man, ftz,
                                          ovf_inf, inf_nan)
                continue
            for j in range(w):
                r = _rand32(k0, k1, np.int64(base + j)) if MODE == 2 else 0
                os[j] = _elem(np.int64(xs[j]), KIND, MODE, c_q[j], c_p[j], c_hi[j], c_lo[j],
                              man, ftz, ovf_inf, inf_nan, r)
    nz = 0
    zc = 0
    if stats:  # second pass over the strip, still in cache
        for row in rows:
            a, b = _count(xb[row + seg0:], ob[row + seg0:], w)
            nz += a
            zc += b
    return nz, zc


def _tiled(xb, ob, D0, D1, D2, D3, G0, G1, G2, G3, S3, scale, soff, qoff, lim, emin, man,
           maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1, stats, nchunks):
    """4-D tensor, tiles G; axis 3 is cut into segments of S3 (a multiple of
    G3). Work items (tile of axes 0-2, segment) are spread over ``nchunks``."""
    n1 = (D1 + G1 - 1) // G1
    n2 = (D2 + G2 - 1) // G2
    ns = (D3 + S3 - 1) // S3
    nwork = ((D0 + G0 - 1) // G0) * n1 * n2 * ns
    # the element format's own constants, for MX tiles rounded as x * 2**-s (``_strip``)
    e0, e1, e2, e3 = _tile_consts(np.int64(0), KIND, 0, soff, qoff, lim, emin, man, maxkept, emaxq)
    f_lo, f_top, f_hi, f_c23, f_qnan, f_ok = scaled_consts(e0, e1, e2, e3, man, inf_nan)
    mx_ok = MODE == 1 and KIND == 0 and scale != 0 and f_ok
    nz = 0
    zc = 0
    for c in prange(nchunks):
        colmax = np.empty(S3, np.int32)  # 32-bit lanes: twice as many per vector as int64
        # tile constants, and (column path) 2**-s, 2**s: short rows repeat them over a whole tile
        cq = np.empty((6, S3 * G0 * G1 * G2 if S3 < 16 else S3), np.int32)
        rows = np.empty(G0 * G1 * G2, np.int64)
        lnz = 0
        lzc = 0
        for t in range(c * nwork // nchunks, (c + 1) * nwork // nchunks):
            ts = t % ns
            t2 = (t // ns) % n2
            t1 = (t // (ns * n2)) % n1
            t0 = t // (ns * n2 * n1)
            nr = 0
            for i0 in range(t0 * G0, min(t0 * G0 + G0, D0)):
                for i1 in range(t1 * G1, min(t1 * G1 + G1, D1)):
                    for i2 in range(t2 * G2, min(t2 * G2 + G2, D2)):
                        rows[nr] = ((i0 * D1 + i1) * D2 + i2) * D3
                        nr += 1
            a, b = strip(xb, ob, rows[:nr], ts * S3, min(ts * S3 + S3, D3), G3, colmax, cq,
                         scale, soff, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf,
                         inf_nan, k0, k1, stats, f_lo, f_top, f_hi, f_c23, f_qnan, mx_ok)
            lnz += a
            lzc += b
        nz += lnz
        zc += lzc
    return nz, zc


def _specialise(template, KIND: int, MODE: int, parallel: bool = False, **bound):
    """``template`` compiled with ``KIND``, ``MODE`` and ``bound`` as its globals.

    Numba freezes globals as compile-time constants, so each (kind, mode) pair
    gets loops free of the other modes' code. The kernels are not closures on
    purpose: Numba's cache index key hashes a closure's cell contents with
    pickle, and a pickled dispatcher (``strip`` inside ``tiled``) carries a
    random per-process uuid, so a closure over it never matched its cache
    entry (each process recompiled ``tiled``, ~5 s, and appended another
    ``.nbc`` file). Here the closure is empty and the (kind, mode) pair is in
    the qualified name, which names the cache's index file.
    """
    return specialise(template, f"{template.__name__.lstrip('_')}_kind{KIND}_mode{MODE}", parallel,
                      KIND=KIND, MODE=MODE, **bound)


def specialise(template, qualname: str, parallel: bool = False, **bound):
    """``template`` (a plain module-level function) compiled with ``bound`` as compile-time global
    constants and cached on disk under ``qualname``, which must name every bound value (it names
    the cache's index file; see ``_specialise`` for why this is not a closure)."""
    g = dict(template.__globals__, **bound)
    fn = types.FunctionType(template.__code__, g, template.__name__, template.__defaults__)
    fn.__qualname__ = qualname
    fn.__doc__ = template.__doc__
    with _kernel_cache():
        return njit(cache=True, parallel=parallel)(fn)


@functools.lru_cache(maxsize=None)
def kernels(KIND: int, MODE: int):
    """``(elementwise, tiled)`` compiled for one element kind and rounding mode
    (compile-time constants; Numba caches each pair on disk, one index file per
    kernel and pair)."""
    with _kernel_cache():
        strip = _specialise(_strip, KIND, MODE)
        return (_specialise(_elementwise, KIND, MODE, parallel=True),
                _specialise(_tiled, KIND, MODE, parallel=True, strip=strip))


# Below this many elements (1 MiB of float32) a kernel runs on the calling
# thread only: the work (~1-3 ns an element, under 1 ms) gains little from a
# second thread, and on a loaded 2-core machine a woken thread waited for a
# time slice (24K- and 64K-element quantizes took 4-16 ms on two threads,
# 0.1-0.3 ms on one). Results do not depend on the number of threads.
SERIAL_BELOW = 1 << 18


@contextlib.contextmanager
def threads_for(n: int, below: int = SERIAL_BELOW):
    """Run a kernel's parallel loops on the calling thread only when its work ``n`` is under
    ``below`` (elements here; the tensor-core chains pass products, ``fused.SERIAL_PRODUCTS``)."""
    before = 1 if n >= below else numba.get_num_threads()
    if before == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def run(xb: np.ndarray, ob: np.ndarray, rule, shape4, tile4, keys, stats: bool):
    """Quantize flat int32 bits ``xb`` into ``ob``; returns (nonzero, zeroed) counts."""
    kind, mode, scale, soff, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    k0, k1 = keys
    elementwise, tiled = kernels(kind, mode)
    with threads_for(xb.size):
        if shape4 is None:
            return elementwise(xb, ob, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan,
                               k0, k1, stats)
        D0, D1, D2, D3 = shape4
        G0, G1, G2, G3 = tile4
        S3 = G3 * max(1, 4096 // G3) if D3 > 4096 else D3  # segments of whole tiles
        nwork = -(-D0 // G0) * -(-D1 // G1) * -(-D2 // G2) * -(-D3 // S3)
        nchunks = max(1, min(nwork, 8 * numba.get_num_threads()))
        return tiled(xb, ob, D0, D1, D2, D3, G0, G1, G2, G3, S3, scale, soff, qoff, lim, emin, man,
                     maxkept, emaxq, ftz, ovf_inf, inf_nan, k0, k1, stats, nchunks)
