"""Triton kernels for the element-rule families (Float, BlockFloat, MX, P3109): one pass, no atomics.

* ``_elementwise``: element-wise formats, ``BLOCK`` elements a program; the rule's constants are
  the host's (one tile of scale 0), so the kernel is the rule alone.
* ``_tiles``: tiled formats over the canonical 4-D view (``plan.canonical_4d``). A program owns
  ``TPP`` whole tiles; a tile's ``G0*G1*G2*G3`` elements are enumerated as ``PT`` slots (the next
  power of two), so each tile's largest finite magnitude is one ``tl.max(axis=1)`` in registers
  and its constants are computed once per tile row, then broadcast.
* ``bands.py``'s ``_bands``: tiles ``(1, G1, G2, G3)`` that cut the last axis (BlockFloat over NCHW
  maps), a program a band of ``G1`` channels x ``G2`` rows, where a band is 256 to ``ELEMS`` slots.
* ``_big_tiles``: a tile of more than ``MAX_SLOTS`` elements (a row of thousands, a whole tensor):
  one program a tile, which sweeps it twice in chunks (its maximum, then the rule): still one launch.

Counts, when asked for, are each program's two sums in a small buffer that torch adds (no atomics;
the buffer is allocated only then). Stochastic keys are read from a device tensor (no host
round trip). Flat element indices are int32, and int64 (``IDX64``) for a tensor of 2**31 elements
or more; the lanes hold float32 bit patterns as int32 (``rule.py``).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..scalar import _tile_consts, ilog2 as py_ilog2
from . import launcher
from .bands import _bands
from .lanes import _counts, _keys, _load_bits, _store_bits, round_tiles
from .rule import MAG, EXP_INF, quant_const, quant_tile, rand32, tile_consts

_INT64 = torch.int64
MAX_SLOTS = 2048      # a tile of at most this many slots fits one program with others
ELEMS = 2048          # elements a program handles (element-wise, and tiles x slots)
CHUNK = 1024          # _big_tiles' sweep
BANDS = True          # strided tiles by bands (bands.py) where a band fits a program


@triton.jit
def _elementwise(x_ptr, o_ptr, keys_ptr, part_ptr, n, QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr,
                 LO: tl.constexpr, KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr,
                 OVF_INF: tl.constexpr, INF_NAN: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr,
                 IDX64: tl.constexpr, IO: tl.constexpr = 0):
    pid = tl.program_id(0)
    if IDX64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n
    b = _load_bits(x_ptr + offs, msk, IO)
    r = tl.zeros(b.shape, tl.uint32)
    if MODE == 2:
        k0, k1 = _keys(keys_ptr)
        r = rand32(k0, k1, offs, IDX64)
    o = quant_const(b, r, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN)
    _store_bits(o_ptr + offs, o, msk, IO)
    if STATS:
        _counts(part_ptr, pid, b, o)


@triton.jit
def _tile_offsets(t_first, j, s, D0, D1, D2, D3, n1, n2, n3, n_tiles,
                  G0: tl.constexpr, G1: tl.constexpr, G2: tl.constexpr, G3: tl.constexpr, RUNS: tl.constexpr):
    """Flat offsets of slots ``s`` (a row, [1, S]) of the tiles ``t_first + j`` (``j`` a column,
    [T, 1]) and which exist. ``RUNS`` 1: every tile is ``G3`` consecutive elements (``G0 = G1 =
    G2 = 1``, ``G3`` divides ``D3``), at ``t * G3``; 2: every tile is ``G2`` whole rows of ``D3``
    (``G0 = G1 = 1``, ``G3 = D3``), consecutive, the last of each ``D2`` shorter; 0: a tile's 4-D
    index by division (once a tile row; the counts are compile-time constants in ``_tiles``)."""
    t = t_first + j
    if RUNS == 1:
        return t * G3 + s, (t < n_tiles) & (s < G3)
    if RUNS == 2:
        t2 = t % n2
        return (t // n2) * (D2 * D3) + t2 * (G2 * D3) + s, (t < n_tiles) & (s < G2 * D3) & (s < (D2 - t2 * G2) * D3)
    t3 = t % n3
    t2 = (t // n3) % n2
    t1 = (t // (n3 * n2)) % n1
    t0 = t // (n3 * n2 * n1)
    g3 = s % G3
    g2 = (s // G3) % G2
    g1 = (s // (G3 * G2)) % G1
    g0 = s // (G3 * G2 * G1)
    base = ((t0 * G0 * D1 + t1 * G1) * D2 + t2 * G2) * D3 + t3 * G3
    inner = ((g0 * D1 + g1) * D2 + g2) * D3 + g3
    msk = (t < n_tiles) & (s < G0 * G1 * G2 * G3)
    if G0 > 1:
        msk = msk & (g0 < D0 - t0 * G0)
    if G1 > 1:
        msk = msk & (g1 < D1 - t1 * G1)
    if G2 > 1:
        msk = msk & (g2 < D2 - t2 * G2)
    if G3 > 1:
        msk = msk & (g3 < D3 - t3 * G3)
    return base + inner, msk


@triton.jit
def _tiles(x_ptr, o_ptr, keys_ptr, part_ptr, D0, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
           n1: tl.constexpr, n2: tl.constexpr, n3: tl.constexpr, n_tiles,
           G0: tl.constexpr, G1: tl.constexpr, G2: tl.constexpr, G3: tl.constexpr, PT: tl.constexpr,
           TPP: tl.constexpr, KIND: tl.constexpr, MODE: tl.constexpr, SCALE: tl.constexpr, SOFF: tl.constexpr,
           QOFF: tl.constexpr, LIM: tl.constexpr, PLIM: tl.constexpr, EMIN: tl.constexpr, MAN: tl.constexpr,
           MAXKEPT: tl.constexpr, PMAXKEPT: tl.constexpr, EMAXQ: tl.constexpr, TOP: tl.constexpr,
           MB: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr,
           STATS: tl.constexpr, IDX64: tl.constexpr, RUNS: tl.constexpr, IO: tl.constexpr = 0):
    pid = tl.program_id(0)
    first = pid * TPP
    if IDX64:
        first = first.to(tl.int64)
    j = tl.arange(0, TPP)[:, None]
    s = tl.arange(0, PT)[None, :]
    off, msk = _tile_offsets(first, j, s, D0, D1, D2, D3, n1, n2, n3, n_tiles, G0, G1, G2, G3, RUNS)
    b = _load_bits(x_ptr + off, msk, IO)
    m = b & MAG
    tmax = tl.max(tl.where(m < EXP_INF, m, 0), axis=1, keep_dims=True)  # masked-off lanes loaded 0
    round_tiles(o_ptr, keys_ptr, part_ptr, pid, b, tmax, off, msk, KIND, MODE, SCALE, SOFF, QOFF, LIM, PLIM, EMIN, MAN, MAXKEPT, PMAXKEPT,
                EMAXQ, TOP, MB, FTZ, OVF_INF, INF_NAN, STATS, IDX64, IO)


@triton.jit
def _big_tiles(x_ptr, o_ptr, keys_ptr, part_ptr, D0, D1, D2, D3, n1, n2, n3, n_tiles,
               G0: tl.constexpr, G1: tl.constexpr, G2: tl.constexpr, G3: tl.constexpr, SIZE: tl.constexpr,
               CH: tl.constexpr, KIND: tl.constexpr, MODE: tl.constexpr, SCALE: tl.constexpr, SOFF: tl.constexpr,
               QOFF: tl.constexpr, LIM: tl.constexpr, PLIM: tl.constexpr, EMIN: tl.constexpr, MAN: tl.constexpr,
               MAXKEPT: tl.constexpr, PMAXKEPT: tl.constexpr, EMAXQ: tl.constexpr, TOP: tl.constexpr,
               MB: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr,
               STATS: tl.constexpr, IDX64: tl.constexpr, RUNS: tl.constexpr, IO: tl.constexpr = 0):
    pid = tl.program_id(0)
    first = pid
    if IDX64:
        first = first.to(tl.int64)
    j = tl.zeros((1, 1), tl.int32)
    tmax = tl.zeros((1, 1), tl.int32)
    for c in range(0, SIZE, CH):
        s = c + tl.arange(0, CH)[None, :]
        off, msk = _tile_offsets(first, j, s, D0, D1, D2, D3, n1, n2, n3, n_tiles, G0, G1, G2, G3, RUNS)
        m = _load_bits(x_ptr + off, msk, IO) & MAG
        tmax = tl.maximum(tmax, tl.max(tl.where(m < EXP_INF, m, 0), axis=1, keep_dims=True))  # masked: 0
    qt, p2q, hi, lo = tile_consts(tmax, KIND, SCALE, SOFF, QOFF, LIM, PLIM, EMIN, MAN, MAXKEPT, PMAXKEPT,
                                  EMAXQ, TOP, MB)
    nz = tl.zeros((1, CH), tl.int32)
    zc = tl.zeros((1, CH), tl.int32)
    if MODE == 2:
        k0, k1 = _keys(keys_ptr)
    for c in range(0, SIZE, CH):
        s = c + tl.arange(0, CH)[None, :]
        off, msk = _tile_offsets(first, j, s, D0, D1, D2, D3, n1, n2, n3, n_tiles, G0, G1, G2, G3, RUNS)
        b = _load_bits(x_ptr + off, msk, IO)
        r = tl.zeros(b.shape, tl.uint32)
        if MODE == 2:
            r = rand32(k0, k1, off, IDX64)
        o = quant_tile(b, tmax, qt, p2q, hi, lo, r, KIND, MODE, MAN, EMIN, EMAXQ, LIM, FTZ, OVF_INF, INF_NAN)
        _store_bits(o_ptr + off, o, msk, IO)
        if STATS:
            a = (b & MAG) != 0  # masked-off lanes read 0: neither count
            nz += a.to(tl.int32)
            zc += (a & ((o & MAG) == 0)).to(tl.int32)
    if STATS:
        tl.store(part_ptr + 2 * pid, tl.sum(nz).to(tl.int64))
        tl.store(part_ptr + 2 * pid + 1, tl.sum(zc).to(tl.int64))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def _rule_consts(rule) -> dict:
    kind, mode, scale, soff, qoff, lim, emin, man, maxkept, emaxq, ftz, ovf_inf, inf_nan = rule
    top = lim if kind == 1 else maxkept
    return dict(KIND=kind, MODE=mode, SCALE=scale, SOFF=soff, QOFF=qoff, LIM=lim, PLIM=py_ilog2(lim) if lim else 0,
                EMIN=emin, MAN=man, MAXKEPT=maxkept, PMAXKEPT=py_ilog2(maxkept) if maxkept else 0, EMAXQ=emaxq,
                TOP=top, MB=py_ilog2(top) if top else 0, FTZ=ftz, OVF_INF=ovf_inf, INF_NAN=inf_nan)


@functools.lru_cache(maxsize=256)
def rule_kwargs(rule) -> dict:
    """An element-wise rule's constants as the kernels' keyword arguments (``QT`` ... ``INF_NAN``):
    the one tile's constants (scale 0, the host's) and the rule's own; every element-wise launch
    (this module's, scaled FP8's, the in-place roundings', NVFP4's two rules) takes them."""
    qt, p2q, hi, lo = _tile_consts(0, rule.kind, 0, 0, rule.qoff, rule.lim, rule.emin, rule.man, rule.maxkept,
                                   rule.emaxq)
    return dict(QT=qt, P2Q=p2q, HI=hi, LO=lo, KIND=rule.kind, MODE=rule.mode, MAN=rule.man, FTZ=rule.ftz,
                OVF_INF=rule.ovf_inf, INF_NAN=rule.inf_nan)


def tile_config(shape4, tile4) -> dict:
    """How a tiled launch covers ``shape4`` with ``tile4``: the tile counts, whether the big-tile
    kernel runs or the band kernel (``bands.py``: tiles ``(1, G1, G2, G3)`` that cut the last axis,
    when a band of ``G1`` channels x ``G2`` rows fits a program), tiles a program (``TPP``) and the
    kernel's tile constants."""
    (D0, D1, D2, D3), (G0, G1, G2, G3) = shape4, tile4
    n1, n2, n3 = -(-D1 // G1), -(-D2 // G2), -(-D3 // G3)
    size = G0 * G1 * G2 * G3
    runs = 1 if G0 == G1 == G2 == 1 and D3 % G3 == 0 else 2 if G0 == G1 == 1 and G3 == D3 else 0
    pt = _pow2_at_least(size)
    consts = dict(G0=G0, G1=G1, G2=G2, G3=G3, RUNS=runs)
    out = dict(n_tiles=-(-D0 // G0) * n1 * n2 * n3, counts=(n1, n2, n3), big=pt > MAX_SLOTS, bands=False)
    pg, pb = _pow2_at_least(G1), _pow2_at_least(G2 * D3)
    if BANDS and runs == 0 and G0 == 1 and 1 < n3 and 256 <= pg * pb <= ELEMS:  # smaller bands: _tiles is cheaper
        return dict(out, bands=True, programs=D0 * n1 * n2, warps=1,
                    consts=dict(G1=G1, G2=G2, G3=G3, PG=pg, PB=pb, NT=_pow2_at_least(n3)))
    if out["big"]:  # one program a tile, swept in chunks
        return dict(out, TPP=1, warps=4, consts=dict(consts, SIZE=size, CH=CHUNK))
    # Strided tiles: every thread holds a share of every tile row of its program and computes that
    # row's index and constants, so the fewer threads a program, the fewer rows each thread pays for:
    # one warp over 1024 slots (sm_90, as launched: fb16 on 64x128x32x32 82 thread-instructions an
    # element with 2 warps over 2048, 64 with this; 127-154 registers, no spill: about 13 programs an
    # SM, 50 KB of loads in flight; BENCHMARKS.md). Runs: 4 warps over 2048.
    tpp = max(1, (ELEMS if runs else ELEMS // 2) // pt)
    return dict(out, TPP=tpp, warps=4 if runs else 1, consts=dict(consts, PT=pt, TPP=tpp))


IO = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the dtypes the kernels load and store


@functools.lru_cache(maxsize=1024)
def _plan(rule, n: int, shape4, tile4, stats: bool, io: int = 0) -> tuple:
    """(kernel, grid, extra positional arguments, keyword arguments) of one launch, by its key:
    everything but the tensors, computed once for a rule and shape (a training step repeats them)."""
    idx64 = n + 2 * ELEMS >= 2 ** 31  # flat offsets past int32 (with a block's overhang): int64 indices
    if shape4 is None:
        return _elementwise, (_cdiv(n, ELEMS),), (n,), dict(**rule_kwargs(rule), STATS=stats, BLOCK=ELEMS,
                                                             IDX64=idx64, IO=io, enable_fp_fusion=False)
    cfg = tile_config(shape4, tile4)
    kw = dict(**cfg["consts"], **_rule_consts(rule), STATS=stats, IDX64=idx64, IO=io, num_warps=cfg["warps"],
              enable_fp_fusion=False)
    if cfg["bands"]:
        return _bands, (cfg["programs"],), (shape4[0],), dict(kw, D1=shape4[1], D2=shape4[2], D3=shape4[3],
                                                             n1=cfg["counts"][0], n2=cfg["counts"][1],
                                                             n3=cfg["counts"][2])
    return (_big_tiles if cfg["big"] else _tiles), (_cdiv(cfg["n_tiles"], cfg["TPP"]),), \
        (*shape4, *cfg["counts"], cfg["n_tiles"]), kw


def launch(x32, out, rule, shape4, tile4, keys, stats: bool):
    """Quantize contiguous ``x32`` into ``out`` of its dtype (float32, bfloat16 or float16: loaded
    and stored as such, the rule on float32 bits in registers; both on one device, a CPU tensor
    only under ``TRITON_INTERPRET=1``); ``keys``: an int64 tensor of the two stochastic keys on that
    device (or None unless stochastic). Returns the int64 counts ``[nonzero_in, zeroed]`` or None."""
    return prepare(rule, x32.numel(), shape4, tile4, stats, x32.dtype)(x32, out, keys)


@functools.lru_cache(maxsize=1024)
def prepare(rule, n: int, shape4, tile4, stats: bool, dtype: torch.dtype):
    """``launch`` fixed for tensors of ``n`` elements of ``dtype`` over ``shape4``/``tile4``: the
    plan looked up once, so a training step's repeated calls pay only the launch.
    Returns ``go(x32, out, keys) -> counts or None`` (``launch``'s arguments and result)."""
    key = (rule, n, shape4, tile4, stats, IO[dtype])
    kernel, grid, extra, kw = _plan(*key)
    rows = (grid[0], 2)

    def go(x32, out, keys):
        part = x32.new_empty(rows, dtype=_INT64) if stats else x32
        launcher.run(kernel, grid, (x32, out, x32 if keys is None else keys, part), extra, kw, key)  # keys: read if stochastic
        return part.sum(0) if stats else None
    return go
