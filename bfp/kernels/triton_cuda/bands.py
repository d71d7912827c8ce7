"""Strided tiles by bands: the element rule for tiles ``(1, G1, G2, G3)`` over a canonical
``(D0, D1, D2, D3)`` view whose last axis is cut into several tiles (a BlockFloat's 12x3x3 over an
NCHW activation), one program a band.

A band is one batch item ``t0``, one group of ``G1`` channels ``t1`` and one row of tiles ``t2``:
for each of its channels, ``G2`` rows of the whole last axis, which lie one after another in
memory, so a band is ``G1`` contiguous runs of ``G2 * D3`` elements (rows ``[PG, PB]``: channel,
position ``p = row * D3 + column``; loads and stores along ``p`` vectorise). A tile of the band is
the positions whose column falls in its ``G3``: its largest finite magnitude is the maximum over
the channels (axis 0), then over its positions, taken with a ``[NT, PB]`` membership mask (tile
``t`` owns position ``p``) and handed back to each position the same way; the tile constants are
then computed once a position (``PB`` of them a program, not once a tile row a thread as in
``element._tiles``). Bits, counts and stochastic draws (the flat offset) are ``element._tiles``'s.
One warp a program (sm_90 as launched, fb16 on 64x128x32x32: 38 thread-instructions an element
with one warp, 47 with two, 56 with four, against 64 for ``_tiles``; 187 registers, no spill).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .lanes import _load_bits, round_tiles
from .rule import EXP_INF, MAG


@triton.jit
def _bands(x_ptr, o_ptr, keys_ptr, part_ptr, D0, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
           n1: tl.constexpr, n2: tl.constexpr, n3: tl.constexpr, G1: tl.constexpr, G2: tl.constexpr,
           G3: tl.constexpr, PG: tl.constexpr, PB: tl.constexpr, NT: tl.constexpr, KIND: tl.constexpr,
           MODE: tl.constexpr, SCALE: tl.constexpr, SOFF: tl.constexpr, QOFF: tl.constexpr, LIM: tl.constexpr,
           PLIM: tl.constexpr, EMIN: tl.constexpr, MAN: tl.constexpr, MAXKEPT: tl.constexpr,
           PMAXKEPT: tl.constexpr, EMAXQ: tl.constexpr, TOP: tl.constexpr, MB: tl.constexpr, FTZ: tl.constexpr,
           OVF_INF: tl.constexpr, INF_NAN: tl.constexpr, STATS: tl.constexpr, IDX64: tl.constexpr,
           IO: tl.constexpr = 0):
    pid = tl.program_id(0)
    t2 = pid % n2
    t1 = (pid // n2) % n1
    t0 = pid // (n2 * n1)
    if IDX64:
        t0 = t0.to(tl.int64)
    g = tl.arange(0, PG)[:, None]
    p = tl.arange(0, PB)[None, :]
    c = t1 * G1 + g
    rows = tl.minimum(G2, D2 - t2 * G2)
    off = ((t0 * D1 + c) * D2 + t2 * G2) * D3 + p
    msk = (g < G1) & (c < D1) & (p < rows * D3)
    b = _load_bits(x_ptr + off, msk, IO)
    m = b & MAG
    cmax = tl.max(tl.where(m < EXP_INF, m, 0), axis=0, keep_dims=True)  # [1, PB]: over the channels
    # (masked-off lanes loaded 0: they never win a maximum, so no test of the mask here or below)
    own = (tl.arange(0, NT)[:, None] == (p % D3) // G3)  # [NT, PB]: tile t owns position p
    tmax_t = tl.max(tl.where(own, cmax, 0), axis=1, keep_dims=True)  # [NT, 1]
    tmax = tl.max(tl.where(own, tmax_t, 0), axis=0, keep_dims=True)  # [1, PB]: each position's tile's
    round_tiles(o_ptr, keys_ptr, part_ptr, pid, b, tmax, off, msk, KIND, MODE, SCALE, SOFF, QOFF, LIM, PLIM, EMIN, MAN, MAXKEPT, PMAXKEPT,
                EMAXQ, TOP, MB, FTZ, OVF_INF, INF_NAN, STATS, IDX64, IO)
