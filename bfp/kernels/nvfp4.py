"""NVFP4 quantization (the rule is ``bfp.formats.nvfp4``'s docstring): a PyTorch reference, and the
dispatch to the Numba CPU kernels (``numba_cpu/nvfp4_cpu``, ``nvfp4_te_cpu``) and to the Triton
kernel (``triton_cuda/nvfp4``: both conventions, 1-D blocks moved to the last axis, 2-D tiles on the
tensor as it is), which do the same float32 operations in the same order.

The E4M3 block scales and the E2M1 elements are rounded by the integer element rule of
``scalar.py`` (the one every format uses), so only the divisions and products between them
are float32 arithmetic, and those are correctly rounded on every backend.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..formats import Rounding
from ..formats.nvfp4 import E2M1_MAX, E4M3_MAX, E4M3_TINY, NVFP4
from .nvfp4_te import quantize_te
from .nvfp4_codes import E2M1, E4M3, bits as _bits, floats as _float, tensor_scale_of
from .ops import key_ints
from .plan import rule_for
from .runtime import kernel
from .reference import quantize_bits, tile_max
from .scalar import EXP_INF, MAG



def reference(xm: torch.Tensor, fmt: NVFP4, keys, tile=None) -> torch.Tensor:
    """NVFP4 of float32 ``xm`` whose block axis is the last, contiguous (any device); ``tile``:
    the block's shape over ``xm`` (default ``fmt.block`` along the last axis)."""
    xb = _bits(xm)
    m = xb & MAG
    finite = m < EXP_INF
    mf = torch.where(finite, m, 0)
    e2m1 = rule_for(E2M1[fmt.rounding])
    if not mf.numel():
        return xm.clone()
    # The tensor's amax stays on the device (no host read). "Nothing finite and nonzero" (amax 0) is
    # chosen by a select at the end: E2M1's rule keeps each finite element, a signed zero, as it is,
    # and the non-finite ones take the same rule below (Inf becomes NaN), so no second pass is needed.
    amax_bits = mf.amax()
    pts = tensor_scale_of(amax_bits, fmt)
    tile = tile or (1,) * (xm.dim() - 1) + (fmt.block,)
    sb = _float(tile_max(mf, tile)) / torch.tensor(np.float32(E2M1_MAX), device=xm.device)
    sbs = (sb / pts).clamp(E4M3_TINY, E4M3_MAX)
    sb8 = _float(quantize_bits(_bits(sbs), rule_for(E4M3), None, keys))
    ts = pts * sb8
    v = torch.where(finite.view(xm.shape), (xm / ts).clamp(-E2M1_MAX, E2M1_MAX), xm)
    q = _float(quantize_bits(_bits(v), e2m1, None, keys)).view(xm.shape)
    finite = finite.view(xm.shape)
    return torch.where(finite, torch.where(amax_bits == 0, xm, q * ts), q)


def _tile(x32: torch.Tensor, axis: int, block: tuple) -> list[int]:
    """A 2-D block's extent over every axis of ``x32``, its last axis on ``axis``."""
    tile = [1] * x32.dim()
    for k, b in enumerate(reversed(block)):
        tile[axis - k] = b
    return tile


def _view(shape: tuple, axis: int, block) -> tuple[tuple, tuple]:
    """``(B, R, C, Z)`` and ``(BR, BC)`` of a 2-D block ending on ``axis`` (the Triton kernel's view)."""
    br, bc = block
    return (math.prod(shape[:axis - 1]), shape[axis - 1], shape[axis], math.prod(shape[axis + 1:])), (br, bc)


def _triton_view(shape: tuple, axis: int, block) -> tuple[tuple, tuple]:
    """The Triton kernel's view and block of a contiguous tensor of ``shape``: a 2-D block over
    ``shape`` as it is (``_view``), a 1-D block along ``axis``, the last."""
    if isinstance(block, tuple):
        return _view(shape, axis, block)
    return (math.prod(shape[:-1]), 1, shape[-1], 1), (1, block)


def prepare(shape: tuple, fmt: NVFP4, backend: str):
    """The Triton launch of ``fmt`` fixed for contiguous float32 tensors of ``shape`` whose blocks
    need no transposing copy (2-D tiles, or 1-D blocks along the last axis): ``go(x32, keys) ->
    out``, ``keys`` a device tensor or None. None where that does not apply (then ``quantize``)."""
    prepared = kernel("nvfp4_prepare", backend)
    axis = fmt.axis + len(shape) if fmt.axis < 0 else fmt.axis
    if prepared is None or not shape or not math.prod(shape) or not 0 <= axis < len(shape) \
            or (isinstance(fmt.block, tuple) and axis < len(fmt.block) - 1) \
            or (not isinstance(fmt.block, tuple) and axis != len(shape) - 1):
        return None
    view, block = _triton_view(shape, axis, fmt.block)
    return prepared(view, block, fmt.rounding, fmt.tensor_scale, fmt.convention == "te",
                    fmt.rounding is Rounding.STOCHASTIC)


def quantize(x32: torch.Tensor, fmt: NVFP4, keys, backend: str) -> torch.Tensor:
    """NVFP4 of float32 ``x32`` (a new tensor); ``backend`` "cpu" runs the Numba kernels on CPU
    tensors, "triton" the Triton kernel (both conventions, 1-D blocks moved to the last axis, 2-D
    tiles on the tensor as it is), any other the PyTorch reference on ``x32``'s device."""
    axis = fmt.axis + x32.dim() if fmt.axis < 0 else fmt.axis
    if not 0 <= axis < max(x32.dim(), 1):
        raise ValueError(f"NVFP4 axis {fmt.axis} is out of range for a tensor of shape {tuple(x32.shape)}")
    if isinstance(fmt.block, tuple) and axis - len(fmt.block) + 1 < 0:
        raise ValueError(f"NVFP4 block {'x'.join(map(str, fmt.block))} ending on axis {fmt.axis} needs "
                         f"{len(fmt.block)} axes up to it; a tensor of shape {tuple(x32.shape)} has {axis + 1}")
    te = fmt.convention == "te"
    fast = kernel("nvfp4", backend) if backend == "triton" and x32.numel() else None
    if fast is not None:  # the Triton kernel: the keys stay on the device
        if fmt.rounding is not Rounding.STOCHASTIC:
            keys = None
        elif not isinstance(keys, torch.Tensor):
            keys = torch.tensor(keys, dtype=torch.int64, device=x32.device)
        xm = x32.reshape(1) if x32.dim() == 0 else x32
        last = isinstance(fmt.block, tuple) or axis == xm.dim() - 1  # 2-D tiles: on the tensor as it is
        xm = (xm if last else xm.movedim(axis, -1)).contiguous()
        view, block = _triton_view(tuple(xm.shape), xm.dim() - 1 if not last else axis, fmt.block)
        out = fast(xm, view, block, fmt.rounding, fmt.tensor_scale, te, keys)
        return (out if last else out.movedim(-1, axis)).reshape(x32.shape)
    keys = key_ints(keys)  # every other path takes the keys as numbers
    if te:  # TransformerEngine's order of operations (bfp.kernels.nvfp4_te)
        if backend == "cpu" and not x32.is_cuda and x32.dim() and x32.numel():  # any axis, in place
            return kernel("nvfp4_te", "cpu")(x32.contiguous(), axis, fmt, keys)
        if isinstance(fmt.block, tuple):  # TE's 16 x 16 weight tiles, on the tensor as it is
            return quantize_te(x32.contiguous(), fmt, keys, _tile(x32, axis, fmt.block))
        xm = x32.reshape(1) if x32.dim() == 0 else x32
        return quantize_te(xm.movedim(axis, -1).contiguous(), fmt, keys).movedim(-1, axis) \
            .reshape(x32.shape)
    if isinstance(fmt.block, tuple):  # 2-D blocks: on the tensor as it is
        if backend == "cpu" and not x32.is_cuda:
            out = kernel("nvfp4", "cpu")(x32.contiguous(), axis, fmt, keys)  # Numba loads on first use
            if out is not None:
                return out
        tile = _tile(x32, axis, fmt.block)
        return reference(x32.contiguous(), fmt, keys, tuple(tile))
    xm = x32.reshape(1) if x32.dim() == 0 else x32
    if backend == "cpu" and not xm.is_cuda:  # any axis in place: no transposing copy
        out = kernel("nvfp4", "cpu")(xm.contiguous(), axis, fmt, keys)  # Numba loads on first use
        if out is not None:
            return out.reshape(x32.shape)
    xm = xm.movedim(axis, -1).contiguous()
    return reference(xm, fmt, keys).movedim(-1, axis).reshape(x32.shape)
