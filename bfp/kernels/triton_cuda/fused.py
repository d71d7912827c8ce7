"""The tensor-core multi-term fused adder (``bfp.tensorcore``'s docstring is the rule; its float64
torch code the reference) as one Triton kernel for a batch of GEMMs, bit for bit the reference.

A program owns a ``BM x BN`` tile of one GEMM of the batch and runs every accumulation chain of
K for it (the chains' bounds from ``promote_every`` and ``split_k``), adding each chain's float32
result to the output in order with float32 round-to-nearest, as the reference does. A step takes
``T`` (the accumulator's ``terms``) columns of ``a`` and rows of ``b``, zero past the chain's end:

* products ``a_i b_i`` in float64 (exact: the operands are float32 values, 24-bit significands);
* the alignment exponent ``E``: the largest product exponent (from the operands' precomputed
  exponents, their sum, or from the product's own float64 bits) and the accumulator's, at least
  ``align_emin``; a zero operand's exponent is a large negative sentinel (never the largest);
* each term cut to ``align_bits`` fraction bits below ``2**E``: scaled by an exact power of two
  built from its exponent bits, truncated (``floor``/``ceil`` by sign) or rounded to nearest even
  (``floor`` plus a tie test), scaled back; the cut terms add exactly in float64 in any order;
* the step's sum cut to ``sum_bits`` relative to its own exponent (float64 bits), at least
  ``sum_emin``; a zero sum is +0.

Every float64 operation here is exact (powers of two, sums of integer multiples of one power of
two below ``2**53``), so the order of the sums inside a step does not matter and the interpreter
(NumPy) and the GPU agree. Inf and NaN are carried by the float64 arithmetic as in the reference.
The operands' exponents come from the same torch steps as the Numba kernel's
(``reference.operand_exponents``), computed on the device.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..reference import ZERO_EXP, operand_exponents
from . import launcher

ZERO = tl.constexpr(ZERO_EXP)  # a kernel reads only constexpr globals


@triton.jit
def _exp64(x):
    """floor(log2|x|) of float64 ``x`` from its bits (int32; x normal in float64, as every value here is)."""
    return (((x.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023).to(tl.int32)


@triton.jit
def _pow2(k):
    """2**k as float64 (int32 ``k`` within float64's normal range)."""
    return ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _cut(x, e, BITS: tl.constexpr, NEAREST: tl.constexpr):
    """``x`` to ``BITS`` fraction bits below ``2**e`` (the reference's ``_cut``, its scale capped
    at ``2**1000`` as there)."""
    k = tl.minimum(BITS - e, 1000)
    y = x * _pow2(k)
    r = tl.floor(y)
    if NEAREST:  # ties to even
        d = y - r
        odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
        r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
        r = tl.where(y != y, y, r)
    else:  # toward zero
        r = tl.where(y < 0, tl.ceil(y), r)
    return r * _pow2(-k)


@triton.jit
def _fused(a_ptr, b_ptr, ea_ptr, eb_ptr, o_ptr, bounds_ptr, n_chains, M, N, K,
           T: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, ALIGN_EMIN: tl.constexpr, ALIGN_BITS: tl.constexpr,
           ALIGN_NEAREST: tl.constexpr, SUM_BITS: tl.constexpr, SUM_EMIN: tl.constexpr, SUM_NEAREST: tl.constexpr,
           ACC_IN_ALIGN: tl.constexpr, OPERAND_EXP: tl.constexpr):
    g, pm, pn = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pm * BM + tl.arange(0, BM)[:, None, None]           # (BM, 1, 1)
    rn = pn * BN + tl.arange(0, BN)[None, None, :]           # (1, 1, BN)
    t = tl.arange(0, T)[None, :, None]                        # (1, T, 1)
    a_base = a_ptr + g.to(tl.int64) * M * K
    b_base = b_ptr + g.to(tl.int64) * K * N
    ea_base = ea_ptr + g.to(tl.int64) * M * K
    eb_base = eb_ptr + g.to(tl.int64) * K * N
    out = tl.zeros((BM, BN), tl.float32)
    for ch in range(n_chains):
        s = tl.load(bounds_ptr + ch)
        e = tl.load(bounds_ptr + ch + 1)
        c = tl.zeros((BM, BN), tl.float64)
        steps = tl.maximum((e - s + T - 1) // T, 1)
        for st in range(steps):
            k = s + st * T + t                                     # (1, T, 1)
            ka = (rm < M) & (k < e)
            kb = (k < e) & (rn < N)
            a = tl.load(a_base + rm * K + k, mask=ka, other=0.0).to(tl.float64)      # (BM, T, 1)
            b = tl.load(b_base + k * N + rn, mask=kb, other=0.0).to(tl.float64)      # (1, T, BN)
            p = a * b                                                                 # (BM, T, BN), exact
            if OPERAND_EXP:
                ea = tl.load(ea_base + rm * K + k, mask=ka, other=ZERO)
                eb = tl.load(eb_base + k * N + rn, mask=kb, other=ZERO)
                ex = ea + eb
            else:
                ex = tl.where(p == 0, 2 * ZERO, _exp64(p))
            ex = tl.where(p == 0, 2 * ZERO, ex)
            top = tl.max(ex, axis=1)                                                  # (BM, BN)
            if ACC_IN_ALIGN:
                top = tl.maximum(top, tl.where(c == 0, 2 * ZERO, _exp64(c)))
            top = tl.maximum(top, ALIGN_EMIN)
            terms = tl.sum(_cut(p, top[:, None, :], ALIGN_BITS, ALIGN_NEAREST), axis=1)
            if ACC_IN_ALIGN:
                cc = _cut(c, top, ALIGN_BITS, ALIGN_NEAREST)
            else:
                cc = c
            sm = terms + cc
            es = tl.maximum(tl.where(sm == 0, 0, _exp64(sm)), SUM_EMIN)
            sm = _cut(sm, tl.where(sm == 0, 0, es), SUM_BITS, SUM_NEAREST)
            c = tl.where(sm == 0, 0.0, sm)                                            # +0, never -0
        out = out + c.to(tl.float32)                                                  # in order, nearest
    om = pm * BM + tl.arange(0, BM)[:, None]
    on = pn * BN + tl.arange(0, BN)[None, :]
    tl.store(o_ptr + g.to(tl.int64) * M * N + om * N + on, out, mask=(om < M) & (on < N))


@functools.lru_cache(maxsize=256)
def _bounds(chains: tuple, device: str) -> torch.Tensor:
    """The chains' bounds on the device, made once per K and accumulator (a training step then
    copies nothing from the host, and a CUDA graph can hold the tensor)."""
    return torch.tensor([chains[0][0]] + [e for _, e in chains], dtype=torch.int32, device=device)


def fused_bmm(a: torch.Tensor, b: torch.Tensor, acc, chains: list[tuple[int, int]]) -> torch.Tensor:
    """``bfp.tensorcore.fused_bmm`` of ``a`` (B, M, K) and ``b`` (B, K, N) over ``chains`` (the
    reference's ``_chains``), float32 (B, M, N), on ``a``'s device."""
    a, b = a.float().contiguous(), b.float().contiguous()
    (nb, m, k), n = a.shape, b.shape[2]
    emin_a, emin_b = acc.emins()
    ea, eb = operand_exponents(a, emin_a).contiguous(), operand_exponents(b, emin_b).contiguous()
    out = torch.empty(nb, m, n, dtype=torch.float32, device=a.device)
    if not out.numel():
        return out
    bounds = _bounds(tuple(chains), str(a.device))
    t = acc.terms
    bm = bn = 16 if t <= 16 else 8
    grid = (nb, -(-m // bm), -(-n // bn))
    launcher.launch(_fused, grid, a, b, ea, eb, out, bounds, len(chains), m, n, k, T=t, BM=bm, BN=bn,
                    ALIGN_EMIN=acc.align_emin, ALIGN_BITS=acc.align_bits,
                    ALIGN_NEAREST=acc.align_rounding == "nearest", SUM_BITS=acc.sum_bits, SUM_EMIN=acc.sum_emin,
                    SUM_NEAREST=acc.sum_rounding == "nearest", ACC_IN_ALIGN=bool(acc.accumulator_in_alignment),
                    OPERAND_EXP=acc.product_exponent == "operands", enable_fp_fusion=False)
    return out
