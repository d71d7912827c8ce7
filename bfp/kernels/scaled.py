"""The scaling steps of ``bfp.scaled.Scaled`` around the element rounding (which is the plain
``Float`` path of ``dispatch``): amax, the scale, ``x * scale`` clamped, and ``q / scale``.
PyTorch float32 operations, so the same on every device."""
from __future__ import annotations

from typing import Optional

import torch

from ..scaled import Scaled

_F32_MAX = float(torch.finfo(torch.float32).max)


def amax(x32: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of ``x32`` (0-dim; 0 for an empty tensor)."""
    a = torch.where(torch.isfinite(x32), x32.abs(), 0.0)
    return a.amax() if a.numel() else torch.zeros((), device=x32.device)


def prepare(x32: torch.Tensor, fmt: Scaled, given_amax: Optional[torch.Tensor] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clamp(x * scale, -max, max), scale)`` of float32 ``x32`` (steps 1-3 of ``bfp.scaled``);
    ``given_amax``: delayed scaling's amax (the history's largest) instead of ``x32``'s."""
    a = torch.where(torch.isfinite(x32), x32.abs(), 0.0)
    if given_amax is not None:
        amax = given_amax.to(device=x32.device, dtype=torch.float32)
    elif fmt.granularity == "tensor" or x32.dim() == 0:
        amax = a.amax() if a.numel() else torch.zeros((), device=x32.device)
    else:
        axis = fmt.axis + x32.dim() if fmt.axis < 0 else fmt.axis
        if not 0 <= axis < x32.dim():
            raise ValueError(f"Scaled axis {fmt.axis} is out of range for a tensor of shape {tuple(x32.shape)}")
        amax = a.amax(dim=axis, keepdim=True)
    top = torch.tensor(fmt.fmt.max, dtype=torch.float32, device=x32.device)
    scale = torch.where(amax > 0, top / amax.clamp(min=torch.finfo(torch.float32).tiny), 1.0).clamp(max=_F32_MAX)
    if fmt.pow2:  # 2**floor(log2 scale): keep the exponent bits of a positive normal float32
        scale = (scale.view(torch.int32) & 0x7F800000).view(torch.float32)
    return (x32 * scale).clamp(-fmt.fmt.max, fmt.fmt.max), scale


def finish(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Step 4: the dequantised value ``q / scale``."""
    return q / scale
