"""Every GEMM a forward computes, counted where PyTorch dispatches it, with its multiply-adds.

``GemmCensus`` is a ``TorchDispatchMode``: it sees each aten op after Python-level functions
(``F.linear``, ``einsum``, ``matmul``, ``tensordot``, ``F.grouped_mm``, an HF MoE block's expert
loop) have decomposed into the ops that compute. An op is a GEMM when it is one of ``GEMM_OPS``;
its multiply-adds come from the shapes (``macs``). An op of another namespace than PyTorch's own
and bfpsim's (a ``torch.library`` custom op: ``transformers::grouped_mm_fallback``, a user's
kernel) is *opaque*: the census cannot see inside it, so it is recorded as such, never as
nothing. ``where(op)`` (the caller's) says to which site each record belongs.

Products: an attention kernel is two (``q k^T`` and ``p v``), every other GEMM op one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["GEMM_OPS", "CensusRecord", "GemmCensus", "macs"]

_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
              "_efficient_attention_forward")
GEMM_OPS = frozenset(("mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                      "_grouped_mm", "_scaled_mm", "_scaled_grouped_mm", "_int_mm", "convolution",
                      "_convolution", *_ATTENTION))
# Namespaces whose ops are PyTorch's own plumbing or bfpsim's (its rounding ops; its fused GEMM
# runs inside a quantized layer): never opaque.
_KNOWN = frozenset(("aten", "prims", "bfp", "_c10d_functional", "c10d", "profiler", "debugprims", "_dtensor",
                    "higher_order", "quantized_decomposed"))


@dataclass(frozen=True)
class CensusRecord:
    """One op of the forward: its name (``aten.mm``; ``transformers.grouped_mm_fallback`` for an
    opaque one), products, multiply-adds (None: opaque), and ``where(op)``'s key for it."""

    op: str
    products: int
    macs: Optional[int]
    key: Any

    @property
    def opaque(self) -> bool:
        return self.macs is None


def _shape(t) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def macs(name: str, args: tuple, out: Any) -> int:
    """The multiply-adds of GEMM op ``name`` (of ``GEMM_OPS``) on ``args`` giving ``out``."""
    o = out[0] if isinstance(out, (tuple, list)) else out
    if name in _ATTENTION:  # q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev)
        q, k, v = (_shape(a) for a in args[:3])
        return math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1])
    if name in ("convolution", "_convolution"):
        x, w, transposed = args[0], args[1], bool(args[6]) if len(args) > 6 else False
        return (x.numel() if transposed else o.numel()) * math.prod(_shape(w)[1:])
    if name in ("addmm", "_addmm_activation", "baddbmm", "addbmm", "addmv"):
        args = args[1:]
    a, b = args[0], args[1]
    if name in ("dot", "vdot"):
        return a.numel()
    if name in ("_grouped_mm", "_scaled_grouped_mm") and a.dim() == 2 and b.dim() == 2:
        return o.numel() // max(1, o.shape[0]) * a.shape[-1]  # groups along K: (G, M, N) over all of K
    if name == "addbmm":
        return math.prod(_shape(a)) * b.shape[-1]
    return o.numel() * a.shape[-1]  # every other: each output element sums K products


class GemmCensus(TorchDispatchMode):
    """While active, ``records`` gets a ``CensusRecord`` for every GEMM op and every opaque op
    (module docstring), keyed by ``where(op)``."""

    def __init__(self, where: Callable[[str], Any]):
        super().__init__()
        self.where, self.records = where, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ns = getattr(func, "namespace", "aten")
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if ns == "aten" and name in GEMM_OPS:
            self.records.append(CensusRecord(f"aten.{name}", 2 if name in _ATTENTION else 1,
                                             macs(name, args, out), self.where(f"aten.{name}")))
        elif ns not in _KNOWN:
            self.records.append(CensusRecord(f"{ns}.{name}", 1, None, self.where(f"{ns}.{name}")))
        return out
