"""Checks of what the ``torch.ops.bfp`` ops are given, for callers that reach them directly: each
bad argument is a clear ``TypeError``/``ValueError`` naming the value and what is allowed (the
Python entry points, ``bfp.quantize`` and friends, pass only what these accept). Used in the ops'
implementations and in their fake implementations, so torch.compile refuses at trace time too."""
from __future__ import annotations

import json
from typing import Callable, Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensor(x, what: str, dtypes=FLOAT_DTYPES, min_dim: int = 0) -> None:
    """``x`` a dense (strided) tensor of one of ``dtypes`` with at least ``min_dim`` dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.compiler.is_compiling() and x.layout != torch.strided:  # dynamo's strict mode bans .layout
        raise TypeError(f"{what}: a {str(x.layout).replace('torch.', '')} tensor; only dense (strided) tensors are "
                        f"rounded (x.to_dense() first)")
    if x.dtype not in dtypes:
        raise TypeError(f"{what}: a {dtype_name(x.dtype)} tensor; allowed: "
                        f"{', '.join(dtype_name(d) for d in dtypes)}")
    if x.dim() < min_dim:
        raise ValueError(f"{what} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")


def values(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its values in memory: a negative view (``torch._neg_view(x)``, PyTorch's lazy
    negation, whose memory holds ``x`` and whose sign is a flag) materialized, since the kernels read
    the memory; any other tensor as it is (no copy)."""
    if torch.compiler.is_compiling():  # a traced graph is functional: no views' flags reach the kernels
        return x
    return x.resolve_neg() if x.is_neg() else x


def keys(k: Optional[torch.Tensor]) -> None:
    """The stochastic-rounding draw: None or an int64 tensor of two keys."""
    if k is None:
        return
    if not isinstance(k, torch.Tensor) or k.dtype != torch.int64 or tuple(k.shape) != (2,):
        got = f"{dtype_name(k.dtype)} tensor of shape {tuple(k.shape)}" if isinstance(k, torch.Tensor) \
            else type(k).__name__
        raise ValueError(f"keys must be None or an int64 tensor of shape (2,) (one draw of two 32-bit keys), "
                         f"got a {got}")


def choice(value: str, what: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} unknown; allowed: {', '.join(repr(a) for a in allowed)}")


def parsed(text, what: str, parse: Callable, how: str = "bfp.kernels.format_json(fmt)"):
    """``parse(text)`` of a JSON argument (a format, an accumulator); anything unreadable named."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be the JSON of its to_dict() ({how}), got {text!r}")
    try:
        return parse(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {text[:80]!r} is not JSON ({e.msg}); pass {how}") from None


def generator(g) -> None:
    """None or a ``torch.Generator`` (or keys drawn already, which the ops pass on)."""
    if g is not None and not isinstance(g, torch.Generator) and type(g).__name__ != "DrawnKeys":
        raise TypeError(f"generator must be None or a torch.Generator, got {type(g).__name__} {g!r}")
