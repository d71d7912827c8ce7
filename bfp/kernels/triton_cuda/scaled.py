"""Scaled FP8 (``bfp.formats.scaled``): per tensor (current or delayed) and rowwise, in Triton.

Per tensor: two launches and no host round trip: the amax pass of ``nvfp4.py`` (the largest finite
magnitude by an integer atomic max), or the delayed recipe's amax given as a device tensor; then
``_scaled`` (which, for delayed scaling's training step, also emits the tensor's own amax for the
history by the same atomic max: no amax pass), element-wise: the scale from the amax (``fmt.max / amax`` as an
IEEE division, 1 where the amax is 0, at most float32's max, its exponent alone with ``pow2``),
``y = clamp(x * scale, -max, max)`` (NaN kept, as torch's clamp), ``q = fmt(y)`` by the integer
element rule, and ``q / scale`` as an IEEE division (``tl.math.div_rn``): the steps of
``kernels/scaled.py`` in its order, so the bits equal the PyTorch reference's, and no step divides
by a reciprocal (PyTorch's CUDA kernels do, pytorch/pytorch issues 191495 and 186618). Launched
with ``enable_fp_fusion=False``.

Rowwise (one scale per line along ``axis``): one launch. ``_rows`` gives a program whole lines of
up to ``MAX_ROW`` elements, each line's amax one ``tl.max`` in registers; a line along an axis
that is not the last is read with its stride (lines enumerated innermost first, so neighbouring
lines' loads are coalesced), with no transposing copy, so the draws of stochastic rounding hash the
same flat offsets as the reference. Longer lines take ``_long_rows``: one program a line, read
twice in chunks (amax, then rounding).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import launcher
from .element import rule_kwargs
from .nvfp4 import ELEMS, _clamp, _f32, tensor_amax
from .rule import EXP_INF, MAG, quant_const, rand32

MAX_ROW = 4096  # rowwise rows up to this length run in one program with TPP rows (longer ones: one each, looped)

F32_MAX = tl.constexpr(3.4028234663852886e38)
TINY_BITS = tl.constexpr(0x00800000)  # the smallest normal float32, 2**-126


@triton.jit
def _scale_of(amax, FMAX: tl.constexpr, POW2: tl.constexpr):
    """``fmax / amax`` (an IEEE division), 1 where amax is 0, at most float32's max; with ``POW2``
    its exponent alone (``kernels/scaled.py``'s ``scale_of``)."""
    tiny = tl.full([], TINY_BITS, tl.int32).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, tl.math.div_rn(_f32(FMAX), tl.maximum(amax, tiny)), _f32(1.0))
    scale = tl.minimum(scale, _f32(F32_MAX))
    if POW2:
        scale = (scale.to(tl.int32, bitcast=True) & EXP_INF).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def _apply(x, scale, offs, keys_ptr, FMAX: tl.constexpr, QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr,
           LO: tl.constexpr, KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr,
           OVF_INF: tl.constexpr, INF_NAN: tl.constexpr, IDX64: tl.constexpr):
    """``fmt(clamp(x * scale, -max, max)) / scale``: steps 3 and 4, IEEE throughout."""
    y = _clamp(x * scale, _f32(-FMAX), _f32(FMAX))
    r = tl.zeros(offs.shape, tl.uint32)
    if MODE == 2:
        r = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), offs, IDX64)
    q = quant_const(y.to(tl.int32, bitcast=True), r, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN)
    return tl.math.div_rn(q.to(tl.float32, bitcast=True), scale)


@triton.jit
def _scaled(x_ptr, o_ptr, keys_ptr, amax_ptr, seen_ptr, n, FMAX: tl.constexpr, POW2: tl.constexpr,
            QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr, KIND: tl.constexpr,
            MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr, INF_NAN: tl.constexpr,
            BLOCK: tl.constexpr, IDX64: tl.constexpr, SEEN: tl.constexpr):
    """One scale from the amax at ``amax_ptr``; with ``SEEN`` (delayed scaling) the tensor's own
    largest finite magnitude bits also go to ``seen_ptr`` (zeroed by the caller) by an integer
    atomic max, as ``nvfp4._amax`` does: the history's next entry with no pass of its own."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK) if IDX64 else pid * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n
    x = tl.load(x_ptr + offs, mask=msk, other=0.0)
    if SEEN:
        m = x.to(tl.int32, bitcast=True) & MAG
        tl.atomic_max(seen_ptr, tl.max(tl.where(m < EXP_INF, m, 0), axis=0))
    scale = _scale_of(tl.load(amax_ptr).to(tl.float32), FMAX, POW2)
    out = _apply(x, scale, offs, keys_ptr, FMAX, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN, IDX64)
    tl.store(o_ptr + offs, out, mask=msk)


@triton.jit
def _rows(x_ptr, o_ptr, keys_ptr, R, C, Z, PT: tl.constexpr, TPP: tl.constexpr, FMAX: tl.constexpr,
          POW2: tl.constexpr, QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr,
          KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
          INF_NAN: tl.constexpr, STRIDED: tl.constexpr, IDX64: tl.constexpr):
    """Rowwise scaling of ``x`` viewed as ``(B, C, Z)`` along ``C`` (``R = B * Z`` rows, ``C <= PT``):
    a program owns ``TPP`` whole rows; each row's amax is one ``tl.max`` in registers. Rows are
    enumerated with ``z`` fastest, so a strided row's loads are still coalesced across rows."""
    pid = tl.program_id(0)
    t = pid * TPP + tl.arange(0, TPP)[:, None]
    if IDX64:
        t = t.to(tl.int64)
    s = tl.arange(0, PT)[None, :]
    msk = (t < R) & (s < C)
    offs = ((t // Z) * C + s) * Z + t % Z if STRIDED else t * C + s
    x = tl.load(x_ptr + offs, mask=msk, other=0.0)
    m = x.to(tl.int32, bitcast=True) & MAG
    amax = tl.max(tl.where(m < EXP_INF, m, 0), axis=1, keep_dims=True).to(tl.float32, bitcast=True)
    out = _apply(x, _scale_of(amax, FMAX, POW2), offs, keys_ptr, FMAX, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF,
                 INF_NAN, IDX64)
    tl.store(o_ptr + offs, out, mask=msk)


@triton.jit
def _long_rows(x_ptr, o_ptr, keys_ptr, C, Z, CHUNK: tl.constexpr, FMAX: tl.constexpr, POW2: tl.constexpr,
               QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr, KIND: tl.constexpr,
               MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
               INF_NAN: tl.constexpr, IDX64: tl.constexpr):
    """Rowwise scaling of rows longer than ``MAX_ROW``: a program owns one row, reads it twice in
    chunks (its amax, then the rounding): two reads and one write, no second launch."""
    pid = tl.program_id(0)
    t = pid.to(tl.int64) if IDX64 else pid
    base = (t // Z) * C * Z + t % Z
    s = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], tl.int32)
    for c0 in range(0, C, CHUNK):
        offs = base + (c0 + s) * Z
        m = tl.load(x_ptr + offs, mask=c0 + s < C, other=0.0).to(tl.int32, bitcast=True) & MAG
        acc = tl.maximum(acc, tl.where(m < EXP_INF, m, 0))
    scale = _scale_of(tl.max(acc, axis=0).to(tl.float32, bitcast=True), FMAX, POW2)
    for c0 in range(0, C, CHUNK):
        offs = base + (c0 + s) * Z
        msk = c0 + s < C
        x = tl.load(x_ptr + offs, mask=msk, other=0.0)
        out = _apply(x, scale, offs, keys_ptr, FMAX, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN, IDX64)
        tl.store(o_ptr + offs, out, mask=msk)


def amax(x32: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of contiguous float32 ``x32`` as a 0-dim float32 device tensor."""
    return tensor_amax(x32).view(torch.float32)


def tensorwise(x32: torch.Tensor, fmax: float, pow2: bool, rule, keys, given_amax=None, seen: bool = False):
    """Scaled rounding of contiguous float32 ``x32`` with one scale (``kernels/scaled.py``'s steps):
    ``rule`` the element format's, ``keys`` an int64 device tensor (stochastic) or None,
    ``given_amax`` the delayed recipe's amax (a device tensor) or None (this tensor's). With
    ``seen`` (delayed scaling's training step) returns ``(out, amax)``: ``x32``'s own largest finite
    magnitude as a 0-dim float32 device tensor, taken by the same pass."""
    top = amax(x32) if given_amax is None else given_amax.to(device=x32.device, dtype=torch.float32).reshape(())
    out = torch.empty_like(x32)
    mine = torch.zeros((), dtype=torch.int32, device=x32.device) if seen else top
    n = x32.numel()
    kw = dict(FMAX=fmax, POW2=pow2, **rule_kwargs(rule), BLOCK=ELEMS, IDX64=n + 2 * ELEMS >= 2 ** 31, SEEN=seen,
              enable_fp_fusion=False)
    launcher.run(_scaled, (-(-n // ELEMS),), (x32, out, x32 if keys is None else keys, top, mine), (n,), kw,
                 ("tensorwise", n, fmax, pow2, rule, keys is None, seen))
    return (out, mine.view(torch.float32)) if seen else out


def rowwise(x32: torch.Tensor, axis: int, fmax: float, pow2: bool, rule, keys) -> torch.Tensor:
    """Rowwise scaled rounding of contiguous float32 ``x32`` along ``axis`` (one scale per line of
    that axis, in one pass where a line has at most ``MAX_ROW`` elements); ``keys`` an int64 device
    tensor (stochastic) or None."""
    C = x32.shape[axis]
    Z = math.prod(x32.shape[axis + 1:])
    R = x32.numel() // C
    out = torch.empty_like(x32)
    consts = dict(FMAX=fmax, POW2=pow2, **rule_kwargs(rule), IDX64=2 * x32.numel() + 2 * ELEMS >= 2 ** 31)
    key = ("rowwise", R, C, Z, fmax, pow2, rule, keys is None)
    keys = x32 if keys is None else keys
    if C <= MAX_ROW:
        pt = 1 << max(C - 1, 0).bit_length()
        tpp = max(1, ELEMS // pt)
        launcher.run(_rows, (-(-R // tpp),), (x32, out, keys), (R, C, Z),
                     dict(PT=pt, TPP=tpp, STRIDED=Z > 1, **consts, enable_fp_fusion=False), key)
    else:
        launcher.run(_long_rows, (R,), (x32, out, keys), (C, Z), dict(CHUNK=ELEMS, **consts, enable_fp_fusion=False),
                     key)
    return out

