"""NVFP4 in TransformerEngine's convention (``NVFP4(convention="te")``, presets ``nvfp4_te``,
``nvfp4_te_sr``): the order of operations of TE's ``NVFP4QuantizerRef``
(``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``, ``_quantize_blockwise_reference``,
which mirrors ``core_nvfp4.cuh``), each step a float32 operation rounded to nearest even:

1. ``amax``: the largest magnitude of the tensor (NaN ignored; an Inf counts: TE's amax kernel
   sees it). ``S_enc = min(fp32(448 * 6) / amax, FLT_MAX)``: amax 0 gives FLT_MAX; an ``S_enc``
   of 0 (an infinite amax) is replaced by 1. ``S_dec = 1 / S_enc``.
2. per block of 16 along ``axis`` (or per 16 x 16 tile, TE's 2-D weight quantization,
   ``quant_tile_shape=(16, 16)``, ``NVFP4(block=(16, 16), convention="te")``): ``sb = min(amax_b * (S_enc * fp32(1/6)), FLT_MAX)``, clamped
   to +-448, rounded to E4M3 (nearest even; *no lower clamp*: subnormal and zero block scales
   occur, unlike bfpsim's ``nvfp4``, whose block scales are clamped up to 2^-6).
3. each element: ``e2m1(clamp(x * min(1 / (fp32(sb) * S_dec), FLT_MAX), -6, 6))``: a multiply by a
   reciprocal, not a division (a zero block scale gives the reciprocal FLT_MAX); E2M1 to nearest
   even (TE's ``cast_to_fp4x2`` thresholds: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
   3.5 -> 4, 5 -> 4) or stochastically (``nvfp4_te_sr``: bfpsim's counter-based draws, one per
   element, as ``nvfp4_sr``; TE's kernel draws its own bits, so only the distribution matches).
4. the value the GEMM sees: ``q * fp32(sb) * S_dec`` (float32, in that order). TE's reference GEMM
   applies the decode factors of both operands at once, ``alpha = amax_x * amax_w / (6^2 448^2)``;
   one operand at a time, ``S_dec`` is that factor's share (they can differ in float32's last bit).

NaN stays NaN (TE's byte packing has no NaN code and stores it as +0; a simulator keeps it
visible), +-Inf is clamped to +-6 times the block scale, as TE's clamp does. The steps below are
PyTorch float32 operations on any device (the reference); on the CPU, 1-D blocks along any axis
and 2-D tiles run as Numba kernels in the tensor's own layout (``nvfp4_te_cpu``), on CUDA tensors
as the Triton kernel (``triton_cuda/nvfp4``), with the same bits and draws as the reference.
"""
from __future__ import annotations

import torch

from ..formats.nvfp4 import E2M1_MAX, E4M3_MAX, NVFP4
from .nvfp4_codes import E2M1, E4M3, FLT_MAX, bits as _bits, fp32 as _fp32, floats as _float, te_scales
from .plan import rule_for
from .reference import quantize_bits, tile_max
from .scalar import MAG

def _round(v: torch.Tensor, fmt, keys) -> torch.Tensor:
    """``v`` rounded to the element format ``fmt`` by the shared element rule (the PyTorch
    reference: an element's draw hashes its flat index with ``keys``)."""
    return _float(quantize_bits(_bits(v), rule_for(fmt), None, keys)).view(v.shape)


def _rows(xm, fmt: NVFP4, keys, mag, real, s_dec, mult) -> torch.Tensor:
    """``quantize_te`` (``mag``: |x| with NaN as 0) for 1-D blocks along the last axis, with the
    block scales computed once per block (not per element) and broadcast: the same float32
    operations, so the same bits."""
    n, b = xm.shape[-1], fmt.block
    pad = (-n) % b

    def blocks(t: torch.Tensor) -> torch.Tensor:  # (..., blocks, b), the tail block zero-padded
        return (torch.nn.functional.pad(t, (0, pad)) if pad else t).view(*t.shape[:-1], -1, b)

    vec_max = blocks(mag).amax(-1, keepdim=True)
    sb = torch.minimum(vec_max * mult, _fp32(FLT_MAX, xm)).clamp(-E4M3_MAX, E4M3_MAX)
    sb8 = _round(sb, E4M3, keys)  # nearest: the keys draw nothing
    enc = torch.minimum(_fp32(1.0, xm) / (sb8 * s_dec), _fp32(FLT_MAX, xm))
    scaled = (blocks(xm) * enc).view(*xm.shape[:-1], n + pad)[..., :n]
    v = torch.where(real, scaled.clamp(-E2M1_MAX, E2M1_MAX), xm).contiguous()
    q = _round(v, E2M1[fmt.rounding], keys).view(xm.shape)
    out = (blocks(q) * sb8 * s_dec).view(*xm.shape[:-1], n + pad)[..., :n]
    return torch.where(real, out, q)


def quantize_te(xm: torch.Tensor, fmt: NVFP4, keys, tile=None) -> torch.Tensor:
    """NVFP4 (TE convention) of float32 ``xm`` whose block axis is the last, contiguous, as PyTorch
    float32 operations on its device; ``tile``: the block's shape over ``xm`` (TE's
    ``quant_tile_shape`` (16, 16) for weights; default ``fmt.block`` along the last axis, TE's
    (1, 16), with the block scales computed once per block). CPU tensors reach the Numba kernels
    (``nvfp4_te_cpu``) through ``nvfp4.quantize``, the one dispatch."""
    mag = torch.nan_to_num(xm.abs(), nan=0.0, posinf=float("inf"))  # NaN takes no part; Inf does
    amax = mag.amax() if xm.numel() else _fp32(0.0, xm)
    s_dec, mult = te_scales(amax)
    if tile is None and xm.dim() and xm.numel():
        return _rows(xm, fmt, keys, mag, ~torch.isnan(xm), s_dec, mult)
    real = ~torch.isnan(xm)
    m = _bits(mag) & MAG
    vec_max = _float(tile_max(m, tuple(tile) if tile is not None else (1,) * (xm.dim() - 1) + (fmt.block,)))
    sb = torch.minimum(vec_max * mult, _fp32(FLT_MAX, xm)).clamp(-E4M3_MAX, E4M3_MAX)
    sb8 = _round(sb, E4M3, keys)
    enc = torch.minimum(_fp32(1.0, xm) / (sb8 * s_dec), _fp32(FLT_MAX, xm))
    v = torch.where(real, (xm * enc).clamp(-E2M1_MAX, E2M1_MAX), xm)
    q = _round(v, E2M1[fmt.rounding], keys).view(xm.shape)
    return torch.where(real, q * sb8 * s_dec, q)
