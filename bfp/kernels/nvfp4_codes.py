"""What the NVFP4 kernels share (``nvfp4``, bfpsim's convention, its CPU/CUDA/RHT kernels, and
``nvfp4_te``, TransformerEngine's): the element and scale formats as ``Float`` rules, float32 <->
bit-pattern views, the tensor scale (and TE's encode and decode scales), the CPU kernels' block chunk. They import this module and
not each other."""
from __future__ import annotations

import numpy as np
import torch

from ..formats import Encoding, Float, Rounding
from ..formats.nvfp4 import E2M1_MAX, E4M3_MAX, NVFP4

E4M3 = Float(4, 3, encoding=Encoding.FN)  # the block scale
E2M1 = {r: Float(2, 1, r, encoding=Encoding.FINITE) for r in (Rounding.NEAREST, Rounding.STOCHASTIC)}


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` as its bit patterns (int64)."""
    return t.contiguous().view(torch.int32).long()


def floats(b: torch.Tensor) -> torch.Tensor:
    """Bit patterns back to float32."""
    return b.to(torch.int32).view(torch.float32)


PTS_DIV = np.float32(E4M3_MAX * E2M1_MAX)  # 2688: the tensor scale puts the largest block scale at 448
PTS_MIN = np.float32(2.0 ** -149)
CHUNK = 1024  # blocks per step of the CPU kernels' parallel loops


def tensor_scale_of(amax_bits: torch.Tensor, fmt: NVFP4) -> torch.Tensor:
    """``tensor_scale`` on the device: ``amax_bits`` a 0-dim integer tensor of the float32 bits; the
    division in float64 rounded once to float32, which is IEEE float32 division (53 >= 2 * 24 + 2)."""
    if not fmt.tensor_scale:
        return torch.ones((), dtype=torch.float32, device=amax_bits.device)
    amax = amax_bits.to(torch.int32).view(torch.float32)
    pts = (amax.double() / float(PTS_DIV)).float()
    return torch.maximum(pts, torch.tensor(float(PTS_MIN), dtype=torch.float32, device=amax.device))


def tensor_scale(amax_bits: int, fmt: NVFP4) -> np.float32:
    """``pts`` from the tensor's largest finite magnitude (its float32 bits)."""
    if not fmt.tensor_scale:
        return np.float32(1.0)
    amax = np.array([amax_bits], np.int32).view(np.float32)[0]
    return max(np.float32(amax / PTS_DIV), PTS_MIN)


FLT_MAX = torch.finfo(torch.float32).max


def fp32(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=like.device)


def encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """TransformerEngine's ``S_enc = min(fp32(448 * 6) / amax, FLT_MAX)`` (``nvfp4_te``, step 1), an
    ``S_enc`` of 0 (an infinite amax) replaced by 1 (a 0-dim float32 tensor)."""
    s = torch.minimum(fp32(E4M3_MAX * E2M1_MAX, amax) / amax, fp32(FLT_MAX, amax))
    return torch.where(s == 0, fp32(1.0, amax), s)


def te_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S_dec, S_enc * fp32(1/6))`` of ``nvfp4_te``'s step 1 from the tensor's amax (0-dim float32)."""
    s_enc = encode_scale(amax)
    return fp32(1.0, amax) / s_enc, s_enc * fp32(1.0, amax).div(fp32(E2M1_MAX, amax))
