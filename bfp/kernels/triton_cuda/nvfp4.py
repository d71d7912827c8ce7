"""NVFP4 (``bfp.formats.nvfp4``) in Triton: both conventions (bfpsim's and TransformerEngine's), 1-D
blocks along a contiguous last axis and 2-D tiles (TE's 16 x 16 weight tiles) on the tensor as it is.

Two launches after a zeroed 0-dim int32 tensor, none of which waits on the host: ``_amax`` (the
tensor's largest magnitude as int32 bits by an integer atomic max, deterministic: finite ones for
bfpsim's convention, Inf included for TE's, whose amax kernel sees it; NaN never) and
``_quantize``, whose programs run in reverse order (the blocks the amax pass read last are the
likeliest still in L2): one program owns ``TPP`` whole blocks, viewed as ``(B, R, C, Z)`` with tiles of
``BR x BC`` over ``R`` and ``C`` (1-D blocks: ``R = BR = Z = 1``). It reads the tensor's amax,
derives the tensor's scales itself, then per block the E4M3 block scale and per element the E2M1
code, exactly as the PyTorch references (``kernels/nvfp4.py``, ``kernels/nvfp4_te.py``):

    bfpsim  pts = max(amax / 2688, 2**-149)            (1 without the tensor scale)
            sb8 = e4m3(clamp((amax_b / 6) / pts, 2**-6, 448))    nearest-even, the element rule
            ts  = pts * sb8;  v = clamp(x / ts, -6, 6);  out = e2m1(v) * ts
    te      s_enc = min(2688 / amax, FLT_MAX) (1 where 0);  s_dec = 1 / s_enc;  mult = s_enc * (1 / 6)
            sb8 = e4m3(clamp(min(amax_b * mult, FLT_MAX), -448, 448))
            enc = min(1 / (sb8 * s_dec), FLT_MAX);  v = clamp(x * enc, -6, 6);  out = e2m1(v) * sb8 * s_dec

The roundings of E4M3 and E2M1 are the element rule (``rule.py``'s ``quant_const``); the float32 operations
between them are IEEE divisions (``tl.math.div_rn``: Triton's ``/`` is an approximate division on a
GPU) and products, launched with ``enable_fp_fusion=False`` so no multiply-add is fused, which is
what NumPy does in the interpreter: the two agree bit for bit. Clamps and minima keep a NaN operand
NaN (as torch's do) by an explicit test. In bfpsim's convention a tensor with no finite nonzero
value rounds every element by the E2M1 rule directly (zeros stay, Inf becomes NaN), as the
reference does. A stochastic element's draw hashes its flat offset, as the reference's does on the
same layout (the block axis moved last for 1-D blocks, the tensor as it is for 2-D tiles).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..nvfp4_codes import E2M1, E4M3
from ..plan import rule_for
from . import launcher
from .element import rule_kwargs
from .rule import EXP_INF, MAG, quant_const, rand32

ELEMS = 2048
F32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _amax(x_ptr, amax_ptr, n, BLOCK: tl.constexpr, IDX64: tl.constexpr, WITH_INF: tl.constexpr):
    """The tensor's largest magnitude bits into ``amax_ptr`` (zeroed by the caller) by an integer
    atomic max: order-independent, so deterministic; no partial maxima, no second reduction."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK) if IDX64 else pid * BLOCK + tl.arange(0, BLOCK)
    m = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.int32, bitcast=True) & MAG
    keep = (m <= EXP_INF) if WITH_INF else (m < EXP_INF)
    tl.atomic_max(amax_ptr, tl.max(tl.where(keep, m, 0), axis=0))


@triton.jit
def _f32(v: tl.constexpr):
    """A float32 constant (a bare float literal is float64 in the interpreter)."""
    return tl.full([], v, tl.float32)


@triton.jit
def _clamp(v, lo, hi):
    """min(max(v, lo), hi), NaN kept (torch's clamp)."""
    return tl.where(v != v, v, tl.minimum(tl.maximum(v, lo), hi))


@triton.jit
def _min(v, hi):
    """min(v, hi), NaN kept (torch.minimum)."""
    return tl.where(v != v, v, tl.minimum(v, hi))


@triton.jit
def _round(v_bits, qt: tl.constexpr, p2q: tl.constexpr, hi: tl.constexpr, lo: tl.constexpr, r,
           KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
           INF_NAN: tl.constexpr):
    return quant_const(v_bits, r, qt, p2q, hi, lo, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN)


@triton.jit
def _bfpsim(b, m, finite, amax_b, amax_bits, r, E4: tl.constexpr, E2: tl.constexpr, MODE: tl.constexpr,
            TENSOR_SCALE: tl.constexpr):
    """bfpsim's convention for one block (``amax_b``: its largest finite magnitude, float32)."""
    if amax_bits == 0:  # nothing finite and nonzero: each element by the E2M1 rule (zeros stay, Inf -> NaN)
        out = _round(b, E2[0], E2[1], E2[2], E2[3], r, E2[4], MODE, E2[5], E2[6], E2[7], E2[8]).to(tl.float32,
                                                                                                     bitcast=True)
    else:
        if TENSOR_SCALE:
            pts = tl.maximum(tl.math.div_rn(amax_bits.to(tl.float32, bitcast=True), _f32(2688.0)),
                             tl.full([], 1, tl.int32).to(tl.float32, bitcast=True))  # 2**-149
        else:
            pts = _f32(1.0)
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
    return out


@triton.jit
def _te(b, amax_b, amax_bits, r, E4: tl.constexpr, E2: tl.constexpr, MODE: tl.constexpr):
    """TransformerEngine's convention for one block (``amax_b``: its largest magnitude, Inf counted)."""
    s_enc = _min(tl.math.div_rn(_f32(2688.0), amax_bits.to(tl.float32, bitcast=True)), _f32(F32_MAX))
    s_enc = tl.where(s_enc == 0, _f32(1.0), s_enc)
    s_dec = tl.math.div_rn(_f32(1.0), s_enc)
    mult = s_enc * tl.math.div_rn(_f32(1.0), _f32(6.0))
    sb = _clamp(_min(amax_b * mult, _f32(F32_MAX)), _f32(-448.0), _f32(448.0))
    sb8 = _round(sb.to(tl.int32, bitcast=True), E4[0], E4[1], E4[2], E4[3], 0, E4[4], 1, E4[5], E4[6], E4[7],
                 E4[8]).to(tl.float32, bitcast=True)
    enc = _min(tl.math.div_rn(_f32(1.0), sb8 * s_dec), _f32(F32_MAX))
    x = b.to(tl.float32, bitcast=True)
    real = x == x
    v = tl.where(real, _clamp(x * enc, _f32(-6.0), _f32(6.0)), x)
    q = _round(v.to(tl.int32, bitcast=True), E2[0], E2[1], E2[2], E2[3], r, E2[4], MODE, E2[5], E2[6], E2[7], E2[8])
    qf = q.to(tl.float32, bitcast=True)
    return tl.where(real, qf * sb8 * s_dec, qf)


@triton.jit
def _quantize(x_ptr, o_ptr, keys_ptr, amax_ptr, B, R, C, Z, n_tile_rows, n_tile_cols,
              BR: tl.constexpr, BC: tl.constexpr, PR: tl.constexpr, PC: tl.constexpr, TPP: tl.constexpr,
              TILE2D: tl.constexpr, TENSOR_SCALE: tl.constexpr, TE: tl.constexpr,
              E4: tl.constexpr, E2: tl.constexpr, MODE: tl.constexpr, IDX64: tl.constexpr):
    # E4 / E2: (qt, p2q, hi, lo, kind, man, ftz, ovf_inf, inf_nan) of the E4M3 and E2M1 rules.
    # Programs in reverse: the amax pass read the last blocks last, so they are the likeliest in L2.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    t = pid * TPP + tl.arange(0, TPP)[:, None, None]
    if IDX64:
        t = t.to(tl.int64)
    i = tl.arange(0, PR)[None, :, None]
    j = tl.arange(0, PC)[None, None, :]
    if TILE2D:  # tiles enumerated with z fastest (coalesced when the tile's axes are not the last)
        z = t % Z
        tq = t // Z
        tc = tq % n_tile_cols
        tq = tq // n_tile_cols
        tr = tq % n_tile_rows
        bb = tq // n_tile_rows
        row = tr * BR + i
        col = tc * BC + j
        msk = (bb < B) & (i < BR) & (j < BC) & (row < R) & (col < C)
        off = ((bb * R + row) * C + col) * Z + z
    else:  # 1-D blocks along the contiguous last axis
        bb = t // n_tile_cols
        col = (t % n_tile_cols) * BC + j
        msk = (bb < B) & (j < BC) & (col < C)
        off = bb * C + col
    b = tl.load(x_ptr + off, mask=msk, other=0.0).to(tl.int32, bitcast=True)
    m = b & MAG
    r = tl.zeros(b.shape, tl.uint32)
    if MODE == 2:
        r = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), off, IDX64)
    amax_bits = tl.load(amax_ptr)
    keep = (m <= EXP_INF) if TE else (m < EXP_INF)
    amax_b = tl.max(tl.max(tl.where(keep, m, 0), axis=2, keep_dims=True), axis=1, keep_dims=True)
    amax_b = amax_b.to(tl.float32, bitcast=True)
    if TE:
        out = _te(b, amax_b, amax_bits, r, E4, E2, MODE)
    else:
        out = _bfpsim(b, m, m < EXP_INF, amax_b, amax_bits, r, E4, E2, MODE, TENSOR_SCALE)
    tl.store(o_ptr + off, out, mask=msk)


@functools.lru_cache(maxsize=16)
def _consts(fmt_rule) -> tuple:
    """(qt, p2q, hi, lo, kind, man, ftz, ovf_inf, inf_nan) of an element-wise rule: ``rule_kwargs``
    as the tuple ``_round`` takes (a constexpr tuple, one argument for each of NVFP4's two rules)."""
    k = rule_kwargs(fmt_rule)
    return tuple(k[c] for c in ("QT", "P2Q", "HI", "LO", "KIND", "MAN", "FTZ", "OVF_INF", "INF_NAN"))


def _pow2(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def tensor_amax(x: torch.Tensor, with_inf: bool = False) -> torch.Tensor:
    """The largest finite magnitude of contiguous float32 ``x`` (``with_inf``: Inf counted; NaN
    never) as a 0-dim int32 device tensor of its bits."""
    return _amax_launch(x.numel(), with_inf)(x)


@functools.lru_cache(maxsize=256)
def _amax_launch(n: int, with_inf: bool):
    """``tensor_amax`` fixed for tensors of ``n`` elements: ``go(x) -> amax``."""
    grid, scalars, key = (-(-n // ELEMS),), (n,), ("amax", n, with_inf)
    kw = dict(BLOCK=ELEMS, IDX64=n + 2 * ELEMS >= 2 ** 31, WITH_INF=with_inf)

    def go(x):
        amax = torch.zeros((), dtype=torch.int32, device=x.device)
        launcher.run(_amax, grid, (x, amax), scalars, kw, key)
        return amax
    return go


@functools.lru_cache(maxsize=256)
def _plan(view: tuple, block: tuple, rounding, tensor_scale: bool, te: bool, stochastic: bool) -> tuple:
    """(grid, integer arguments, keyword arguments) of ``_quantize``, once a layout and format."""
    B, R, C, Z = view
    BR, BC = min(block[0], R), min(block[1], C)  # a block longer than its axis is the axis: the same tiles, fewer slots
    pr, pc = _pow2(BR), _pow2(BC)
    ntr, ntc = -(-R // BR), -(-C // BC)
    tpp = max(1, ELEMS // (pr * pc))
    e2 = rule_for(E2M1[rounding])
    n = B * R * C * Z
    kw = dict(BR=BR, BC=BC, PR=pr, PC=pc, TPP=tpp, TILE2D=(BR, R, Z) != (1, 1, 1), TENSOR_SCALE=tensor_scale, TE=te,
              E4=_consts(rule_for(E4M3)), E2=_consts(e2), MODE=e2.mode, IDX64=2 * n + 2 * ELEMS >= 2 ** 31,
              enable_fp_fusion=False)
    return (-(-(B * ntr * ntc * Z) // tpp),), (B, R, C, Z, ntr, ntc), kw


def quantize(x: torch.Tensor, view: tuple, block: tuple, rounding, tensor_scale: bool, te: bool, keys
             ) -> torch.Tensor:
    """NVFP4 of contiguous float32 ``x`` viewed as ``view = (B, R, C, Z)`` in blocks of ``block =
    (BR, BC)`` over its ``R`` and ``C`` axes (1-D blocks along the last axis: ``(B, 1, C, 1)`` and
    ``(1, BC)``); tail blocks shorter. ``te``: TransformerEngine's convention; ``keys``: the
    stochastic keys as an int64 tensor on ``x``'s device, or None."""
    return prepare(view, block, rounding, tensor_scale, te, keys is not None)(x, keys)


@functools.lru_cache(maxsize=256)
def prepare(view: tuple, block: tuple, rounding, tensor_scale: bool, te: bool, stochastic: bool):
    """``quantize`` fixed for one layout and format, its plans looked up once (a training step
    repeats the same calls): ``go(x, keys) -> out``, ``quantize``'s tensors."""
    key = (view, block, rounding, tensor_scale, te, stochastic)
    grid, scalars, kw = _plan(*key)
    amax = _amax_launch(view[0] * view[1] * view[2] * view[3], te)

    def go(x, keys):
        out = torch.empty_like(x)
        launcher.run(_quantize, grid, (x, out, x if keys is None else keys, amax(x)), scalars, kw, key)
        return out
    return go
