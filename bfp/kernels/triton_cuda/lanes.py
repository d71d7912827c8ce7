"""What every element-rule kernel shares: loading a tensor's elements as float32 bits, storing the
rounded bits in the tensor's dtype, the stochastic keys, the per-program counts, and a block of
tiles rounded from their maxima (``round_tiles``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .rule import EXP_INF, MAG, quant_tile, rand32, tile_consts


@triton.jit
def _load_bits(ptr, msk, IO: tl.constexpr):
    """float32 bits (int32) of the elements at ``ptr``: float32 (``IO`` 0), bfloat16 (1: its 16
    bits are float32's top half) or float16 (2: widened, exact) in memory."""
    if IO == 1:
        b = tl.load(ptr, mask=msk, other=0.0).to(tl.int16, bitcast=True).to(tl.int32) << 16
    elif IO == 2:
        b = tl.load(ptr, mask=msk, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)
    else:
        b = tl.load(ptr, mask=msk, other=0.0).to(tl.int32, bitcast=True)
    return b


@triton.jit
def _store_bits(ptr, o, msk, IO: tl.constexpr):
    """Store float32 bits ``o`` as ``IO``'s dtype, rounded to nearest even as ``Tensor.to`` rounds
    (bfloat16 by integer arithmetic on the bits, a NaN as torch's 0x7FC0; float16 by the
    conversion, IEEE round-to-nearest-even in the interpreter's NumPy and on a GPU)."""
    if IO == 1:
        rne = (o + 0x7FFF + ((o >> 16) & 1)) >> 16
        top = tl.where((o & MAG) > EXP_INF, 0x7FC0, rne)
        tl.store(ptr, top.to(tl.int16).to(tl.bfloat16, bitcast=True), mask=msk)
    elif IO == 2:
        tl.store(ptr, o.to(tl.float32, bitcast=True).to(tl.float16), mask=msk)
    else:
        tl.store(ptr, o.to(tl.float32, bitcast=True), mask=msk)


@triton.jit
def _keys(keys_ptr):
    return tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32)


@triton.jit
def _counts(part_ptr, pid, b, o):
    """The program's two counts (nonzero inputs, those rounded to zero) in one integer sum: 1 for
    each nonzero input plus 65536 for each one zeroed, so the low 16 bits count the first and the
    rest the second (a program holds fewer than 65536 elements). ``b`` comes from ``_load_bits``,
    whose masked-off lanes read 0: those count as neither, with no test of the mask."""
    tl.static_assert(b.numel < 65536)
    nz = (b & MAG) != 0
    both = tl.sum(tl.where(nz, tl.where((o & MAG) == 0, 65537, 1), 0))
    tl.store(part_ptr + 2 * pid, (both & 0xFFFF).to(tl.int64))
    tl.store(part_ptr + 2 * pid + 1, (both >> 16).to(tl.int64))


@triton.jit
def round_tiles(o_ptr, keys_ptr, part_ptr, pid, b, tmax, off, msk, KIND: tl.constexpr, MODE: tl.constexpr,
                SCALE: tl.constexpr, SOFF: tl.constexpr, QOFF: tl.constexpr, LIM: tl.constexpr, PLIM: tl.constexpr,
                EMIN: tl.constexpr, MAN: tl.constexpr, MAXKEPT: tl.constexpr, PMAXKEPT: tl.constexpr,
                EMAXQ: tl.constexpr, TOP: tl.constexpr, MB: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
                INF_NAN: tl.constexpr, STATS: tl.constexpr, IDX64: tl.constexpr, IO: tl.constexpr):
    """Round the float32 bits ``b`` at flat offsets ``off`` whose tile maxima are ``tmax`` (broadcast
    to ``b``), store them and, with ``STATS``, the program's counts."""
    qt, p2q, hi, lo = tile_consts(tmax, KIND, SCALE, SOFF, QOFF, LIM, PLIM, EMIN, MAN, MAXKEPT, PMAXKEPT,
                                  EMAXQ, TOP, MB)
    r = tl.zeros(b.shape, tl.uint32)
    if MODE == 2:
        k0, k1 = _keys(keys_ptr)
        r = rand32(k0, k1, off, IDX64)
    o = quant_tile(b, tmax, qt, p2q, hi, lo, r, KIND, MODE, MAN, EMIN, EMAXQ, LIM, FTZ, OVF_INF, INF_NAN)
    _store_bits(o_ptr + off, o, msk, IO)
    if STATS:
        _counts(part_ptr, pid, b, o)
