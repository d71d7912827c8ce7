"""The blocked Hadamard transform of ``bfp.hadamard.transform_rows`` in Triton, alone and fused into
NVFP4 (the NVFP4 recipe's weight-gradient operands), bit for bit the PyTorch reference.

The input is seen as ``(A, R, C)``: ``R`` rows transformed in blocks of ``B`` (a power of two;
zero past the last row), ``C`` columns. A program loads one block of ``B`` rows by ``W`` columns
(coalesced along the columns), runs the ``log2 B`` butterfly stages of ``bfp.hadamard.butterflies``
in registers (stage ``h`` pairs rows ``j`` and ``j + h`` in groups of ``2h`` into ``u + v`` and
``u - v``: a reshape to ``(B / 2h, 2, h, W)``, the pair axis split off, joined back), each a float32
addition as the reference's, then multiplies row ``i`` by ``factor[i]`` (``s_i / sqrt(B)``, a
power of two times a sign for the recipe's sizes).

``transform_rows`` writes the transformed tensor (``A, ceil(R / B) * B, C``). ``transform_quantize``
never writes it: ``_amax`` transforms each block and keeps its largest finite magnitude (the
NVFP4 tensor scale needs the transformed tensor's amax), and ``_quantize`` transforms each block
again and rounds it as NVFP4 in bfpsim's convention with 1-D blocks of ``B`` along the rows (one
block per column of the tile: ``triton_cuda.nvfp4._bfpsim``), the stochastic draw of an element
hashing its index with the rows moved last, as the unfused path's. Launched with
``enable_fp_fusion=False``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import Rounding
from ..dispatch import device_keys
from ..nvfp4_codes import E2M1, E4M3
from ..plan import rule_for
from .nvfp4 import _bfpsim, _consts
from .rule import EXP_INF, MAG, rand32
from . import launcher

W = 64  # columns per program


@triton.jit
def _butterflies(t, B: tl.constexpr, LOG2B: tl.constexpr, WC: tl.constexpr):
    """``W_B`` applied along axis 0 of ``t`` (``B x WC``), the reference's stages in its order."""
    for s in tl.static_range(LOG2B):
        x = tl.permute(tl.reshape(t, (B >> (s + 1), 2, 1 << s, WC)), (0, 2, 3, 1))
        u, v = tl.split(x)
        t = tl.reshape(tl.permute(tl.join(u + v, u - v), (0, 3, 1, 2)), (B, WC))
    return t


@triton.jit
def _ids(nb, ncol):
    """(item, row block, column block) of this program (one grid axis: no 65,535 limit)."""
    pid = tl.program_id(0)
    return pid // (nb * ncol), (pid // ncol) % nb, pid % ncol


@triton.jit
def _load(x_ptr, f_ptr, pid_a, rb, c0, Rin, C, B: tl.constexpr, LOG2B: tl.constexpr, WC: tl.constexpr,
          IDX64: tl.constexpr):
    """Block ``rb`` of item ``pid_a`` (rows zero past ``Rin``), columns ``c0 ..``, transformed;
    also the column mask, the item index (int64 with ``IDX64``), the block's rows and columns."""
    i = tl.arange(0, B)[:, None]
    c = c0 + tl.arange(0, WC)[None, :]
    row = rb * B + i
    a = pid_a.to(tl.int64) if IDX64 else pid_a
    t = tl.load(x_ptr + (a * Rin + row) * C + c, mask=(row < Rin) & (c < C), other=0.0)
    t = _butterflies(t, B, LOG2B, WC)
    return t * tl.load(f_ptr + i), c < C, a, i, c


@triton.jit
def _rows(x_ptr, f_ptr, o_ptr, Rin, C, nb, ncol, B: tl.constexpr, LOG2B: tl.constexpr, WC: tl.constexpr,
          IDX64: tl.constexpr):
    pid_a, rb, pc = _ids(nb, ncol)
    t, cm, a, i, c = _load(x_ptr, f_ptr, pid_a, rb, pc * WC, Rin, C, B, LOG2B, WC, IDX64)
    tl.store(o_ptr + (a * nb * B + rb * B + i) * C + c, t, mask=cm)


@triton.jit
def _amax(x_ptr, f_ptr, part_ptr, Rin, C, nb, ncol, B: tl.constexpr, LOG2B: tl.constexpr, WC: tl.constexpr,
          IDX64: tl.constexpr):
    pid_a, rb, pc = _ids(nb, ncol)
    t, cm, _, _, _ = _load(x_ptr, f_ptr, pid_a, rb, pc * WC, Rin, C, B, LOG2B, WC, IDX64)
    m = t.to(tl.int32, bitcast=True) & MAG
    top = tl.max(tl.max(tl.where(cm & (m < EXP_INF), m, 0), axis=1), axis=0)
    tl.store(part_ptr + tl.program_id(0), top)


@triton.jit
def _quantize(x_ptr, f_ptr, o_ptr, keys_ptr, amax_ptr, Rin, C, nb, ncol, B: tl.constexpr, LOG2B: tl.constexpr,
              WC: tl.constexpr, TENSOR_SCALE: tl.constexpr, E4: tl.constexpr, E2: tl.constexpr, MODE: tl.constexpr,
              IDX64: tl.constexpr):
    pid_a, rb, pc = _ids(nb, ncol)
    t, cm, a, i, c = _load(x_ptr, f_ptr, pid_a, rb, pc * WC, Rin, C, B, LOG2B, WC, IDX64)
    R = nb * B
    r = rb * B + i
    b = t.to(tl.int32, bitcast=True)
    m = b & MAG
    draws = tl.zeros(b.shape, tl.uint32)
    if MODE == 2:  # indexed with the rows moved last, as the unfused path (and the CPU kernel)
        draws = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), (a * C + c) * R + r,
                       IDX64)
    amax_b = tl.max(tl.where(cm & (m < EXP_INF), m, 0), axis=0, keep_dims=True).to(tl.float32, bitcast=True)
    out = _bfpsim(b, m, m < EXP_INF, amax_b, tl.load(amax_ptr), draws, E4, E2, MODE, TENSOR_SCALE)
    tl.store(o_ptr + (a * R + r) * C + c, out, mask=cm)


def _shape(t: torch.Tensor, block: int) -> tuple:
    Rin, C = t.shape[-2], t.shape[-1]
    A = t.numel() // max(Rin * C, 1)
    nb = -(-Rin // block)
    ncol = -(-C // W)
    return A, Rin, C, nb, ncol, 2 * (A * nb * block * C) + 2 * block * W >= 2 ** 31


def transform_rows(t: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``bfp.hadamard.transform_rows`` of contiguous float32 ``t`` (at least 2-D), ``factor`` the
    rows' factors (float32, on ``t``'s device; its length the block)."""
    block = factor.numel()
    A, Rin, C, nb, ncol, idx64 = _shape(t, block)
    out = torch.empty(*t.shape[:-2], nb * block, C, dtype=torch.float32, device=t.device)
    if out.numel():
        launcher.launch(_rows, (A * nb * ncol,), t, factor, out, Rin, C, nb, ncol, B=block,
                        LOG2B=block.bit_length() - 1, WC=W, IDX64=idx64, enable_fp_fusion=False)
    return out


def transform_quantize(t: torch.Tensor, factor: torch.Tensor, fmt, generator, transformed=None) -> torch.Tensor:
    """NVFP4 (bfpsim's convention, 1-D blocks of ``len(factor)`` along the rows) of the transformed
    float32 ``t`` without writing the transformed tensor, the keys drawn from ``generator`` as
    ``bfp.quantize`` draws them on ``t``'s device (the Numba kernel's signature; ``transformed``
    is not needed here: an all-zero result is handled in the kernel)."""
    keys = device_keys(generator, t.device) if fmt.rounding is Rounding.STOCHASTIC else None
    return quantize_rows(t.contiguous(), factor, fmt, keys)


def quantize_rows(t: torch.Tensor, factor: torch.Tensor, fmt, keys) -> torch.Tensor:
    """``transform_quantize`` of contiguous ``t`` with ``keys`` an int64 device tensor or None."""
    block = factor.numel()
    A, Rin, C, nb, ncol, idx64 = _shape(t, block)
    out = torch.empty(*t.shape[:-2], nb * block, C, dtype=torch.float32, device=t.device)
    if not out.numel():
        return out
    grid = (A * nb * ncol,)
    part = torch.empty(grid[0], dtype=torch.int32, device=t.device)
    log2b = block.bit_length() - 1
    launcher.launch(_amax, grid, t, factor, part, Rin, C, nb, ncol, B=block, LOG2B=log2b, WC=W, IDX64=idx64,
                    enable_fp_fusion=False)
    e2 = rule_for(E2M1[fmt.rounding])
    launcher.launch(_quantize, grid, t, factor, out, t if keys is None else keys, part.amax(), Rin, C, nb, ncol,
                    B=block, LOG2B=log2b, WC=W, TENSOR_SCALE=fmt.tensor_scale, E4=_consts(rule_for(E4M3)),
                    E2=_consts(e2), MODE=e2.mode, IDX64=idx64, enable_fp_fusion=False)
    return out
