"""The scaling steps of ``bfp.formats.scaled.Scaled`` around the element rounding (which is the plain
``Float`` path of ``dispatch``): amax, the scale, ``x * scale`` clamped, and ``q / scale`` (the
reference of the fused kernels: ``numba_cpu/scaled_cpu.py`` on the CPU, ``triton_cuda/scaled.py`` for
per-tensor and rowwise scaling on CUDA tensors).
PyTorch operations, so the same on every device: the two divisions run in float64 and round once to
float32, which equals IEEE float32 division (a quotient of two float32 values rounded to float64 and
then to float32 is the correctly rounded float32 quotient: 53 >= 2 * 24 + 2 bits), whatever the
device's kernel does. PyTorch's CUDA kernels divide a tensor by a scalar as a multiplication by its
reciprocal (pytorch/pytorch issues 191495, 186618), which in float32 lands one ulp off; in float64
that error is far below what the final rounding to float32 can see."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..formats.scaled import Scaled
from .runtime import device_backend, kernel

_F32_MAX = float(torch.finfo(torch.float32).max)


def amax(x32: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of float32 ``x32`` (0-dim; 0 for an empty tensor): one Numba
    pass on a contiguous CPU tensor (``scaled_cpu``), PyTorch steps elsewhere; the same value."""
    fast = kernel("amax", device_backend(x32)) if x32.device.type in ("cpu", "cuda") else None
    if fast is not None and x32.is_contiguous() and x32.numel():
        return fast(x32)  # Numba or Triton, loaded on first use
    return _amax_torch(x32)


def _amax_torch(x32: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    a = torch.where(torch.isfinite(x32), x32.abs(), 0.0)
    if dim is not None:
        return a.amax(dim=dim, keepdim=True)
    return a.amax() if a.numel() else torch.zeros((), device=x32.device)


def scale_of(amax: torch.Tensor, fmt: Scaled) -> torch.Tensor:
    """Step 2: ``fmt.max / amax`` (1 where amax is 0), power of two with ``pow2``."""
    top = torch.tensor(fmt.fmt.max, dtype=torch.float32, device=amax.device)
    quotient = _div(top, amax.clamp(min=torch.finfo(torch.float32).tiny))
    scale = torch.where(amax > 0, quotient, 1.0).clamp(max=_F32_MAX)
    if fmt.pow2:  # 2**floor(log2 scale): keep the exponent bits of a positive normal float32
        scale = (scale.view(torch.int32) & 0x7F800000).view(torch.float32)
    return scale


def tensorwise(x32: torch.Tensor, fmt: Scaled, rounding: Callable, given_amax: Optional[torch.Tensor] = None,
               keys=None) -> torch.Tensor:
    """Steps 1-4 with one scale for the tensor (``given_amax``: delayed scaling's). A contiguous
    CPU tensor runs the fused Numba kernels (``scaled_cpu``: the same bits) when ``keys`` (the
    stochastic-rounding keys) are given; otherwise ``rounding(y, fmt.fmt)`` rounds step 3."""
    if keys is not None and x32.device.type == "cpu" and x32.is_contiguous():
        a = given_amax.to(torch.float32) if given_amax is not None else amax(x32)
        return kernel("scaled", "cpu")(x32, scale_of(a, fmt), fmt.fmt, keys)
    y, scale = prepare(x32, fmt, given_amax)
    return finish(rounding(y, fmt.fmt), scale)


def prepare(x32: torch.Tensor, fmt: Scaled, given_amax: Optional[torch.Tensor] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clamp(x * scale, -max, max), scale)`` of float32 ``x32`` (steps 1-3 of ``bfp.formats.scaled``);
    ``given_amax``: delayed scaling's amax (the history's largest) instead of ``x32``'s."""
    if given_amax is not None:
        top = given_amax.to(device=x32.device, dtype=torch.float32)
    elif fmt.granularity == "tensor" or x32.dim() == 0:
        top = _amax_torch(x32)  # the PyTorch steps throughout: the fused kernels' reference
    else:
        axis = fmt.axis + x32.dim() if fmt.axis < 0 else fmt.axis
        if not 0 <= axis < x32.dim():
            raise ValueError(f"Scaled axis {fmt.axis} is out of range for a tensor of shape {tuple(x32.shape)}")
        top = _amax_torch(x32, axis)
    scale = scale_of(top, fmt)
    return (x32 * scale).clamp(-fmt.fmt.max, fmt.fmt.max), scale


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 ``a / b`` correctly rounded on every device (module docstring); float32 overflow
    gives Inf as the float32 division does."""
    return (a.double() / b.double()).float()


def finish(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Step 4: the dequantised value ``q / scale``, an IEEE float32 division on every device."""
    return _div(q, scale)
