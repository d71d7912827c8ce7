"""Quantization kernels: round tensors to a ``bfp.formats`` format.

``quantize`` picks the backend by the tensor's device: Numba CUDA for CUDA
tensors, Numba CPU (parallel) for CPU tensors; ``backend="reference"`` runs the
readable PyTorch reference that the fast kernels must equal bit for bit.
Numba compiles lazily, on the first call of each kernel.

Gradients: the kernels compute on detached bits. ``quantize`` of a tensor that
requires grad (with grad mode on) passes the gradient straight through: the
backward of ``y = quantize(x)`` is ``dx = dy``, unchanged (the straight-through
estimator). The nine-point quantized layers (``bfp.layers``) quantize gradients
too; use them to train. ``meta`` tensors give a ``meta`` result of the same
shape and dtype on every backend (the format is still checked against the shape).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import Format
from .dispatch import (DrawnKeys, check_history, check_history_values, delayed, draw_keys, format_json,
                       needs_keys, op_keys, parse_format, quantize_stats)
from . import p3109  # noqa: F401  (registers the P3109 family's rule)
if torch.distributed.is_available():
    from . import sharding  # noqa: F401  (the format op's DTensor sharding rules)

__all__ = ["quantize", "quantize_held", "quantize_stats", "zero_setting_error", "DrawnKeys", "draw_keys", "op_keys",
           "check_history", "check_history_values", "format_json", "needs_keys", "parse_format"]


def quantize(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None,
             backend: Optional[str] = None, state: Optional[torch.Tensor] = None,
             update_state: bool = False) -> torch.Tensor:
    """A new tensor of ``x``'s shape, dtype and device with ``x`` rounded to ``fmt``.

    ``x`` is never modified. float32 is exact. float16/bfloat16 inputs are
    widened to float32 (exactly), quantized and rounded back to their dtype
    (nearest-even; exact whenever ``fmt`` fits in that dtype). float64 inputs
    are first rounded to float32 (nearest-even), so the result equals
    ``quantize(x.float(), fmt).double()``.

    ``generator`` seeds stochastic rounding: one 64-bit draw from it per call
    keys a counter-based hash of each element's flat index, so the same seed
    gives the same result on the same device whatever the parallelisation.
    Without one, torch's default generator is used (``torch.manual_seed``).

    ``backend``: ``None`` (by device), ``"reference"``, ``"cpu"`` or ``"cuda"``.

    ``state``: the format's state at this point, for formats that keep one (``fmt.history_length``
    > 0: delayed scaling's amax history, a float32 tensor of that length, newest first; a
    quantized layer keeps one per point); ``update_state`` (training) moves it. The result is not
    differentiable through ``state``.

    When ``x`` requires grad and grad mode is on, the result does too and its
    gradient passes straight through to ``x`` unchanged (see the module docstring);
    the values are the same bits either way. A ``meta`` tensor gives an empty
    ``meta`` tensor of its shape.
    """
    if isinstance(fmt, Format) and fmt.history_length and isinstance(state, torch.Tensor):
        check_history_values(fmt, state, x)  # where a history enters; a layer's own were checked on load
    return quantize_held(x, fmt, generator=generator, backend=backend, state=state, update_state=update_state)


def quantize_held(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None,
                  backend: Optional[str] = None, state: Optional[torch.Tensor] = None,
                  update_state: bool = False) -> torch.Tensor:
    """``quantize`` with a ``state`` its holder keeps and checked where it entered (a quantized
    layer's amax history: ``load_state_dict`` refuses non-finite ones, the kernels never record one):
    its values are not read on the host at every call."""
    if isinstance(fmt, Format) and fmt.history_length:
        if state is None or not isinstance(state, torch.Tensor) or state.numel() != fmt.history_length:
            raise ValueError(f"{fmt!r} is delayed scaling: its amax history is state of a quantized layer's "
                             f"point; use it in a layer's precision, or pass state= a float32 tensor of length "
                             f"{fmt.history_length} (got {None if state is None else tuple(getattr(state, 'shape', ()))})")
        check_history(fmt, state)
        out = delayed(x, fmt, state, generator, update_state)
    else:
        out = quantize_stats(x, fmt, generator=generator, backend=backend, stats=False)[0]
    if x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, out)
    return out


class _StraightThrough(torch.autograd.Function):
    """``forward(x, q) = q``; ``backward(dy) = (dy, None)``: q's values with x's gradient."""

    @staticmethod
    def forward(ctx, x, q):
        return q

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def zero_setting_error(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None) -> float:
    """Share of the nonzero elements of ``x`` that quantizing to ``fmt`` makes zero.

    Elements that are already zero are not counted (the original simulator
    divided by all elements, so sparse tensors such as ReLU outputs looked
    better than they were). Returns 0.0 for a tensor with no nonzero element.
    Counted by the same kernels as ``quantize``, on ``x``'s device; only the
    two counts travel to the host (a DTensor's: summed over its shards). A ``meta`` tensor has no
    values to count: ValueError.
    """
    if isinstance(x, torch.Tensor) and x.device.type == "meta":
        raise ValueError(f"zero_setting_error needs values; a meta tensor (shape {tuple(x.shape)}) has "
                         f"only a shape")
    _, counts = quantize_stats(x, fmt, generator=generator, stats=True)
    if type(counts) is not torch.Tensor and hasattr(counts, "full_tensor"):  # a DTensor's: summed over its shards
        counts = counts.full_tensor()
    nonzero, zeroed = counts.tolist()
    return zeroed / nonzero if nonzero else 0.0
