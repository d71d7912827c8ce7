"""Functional products inside a module's forward, computed by named, quantizable children.

A model that calls ``F.scaled_dot_product_attention`` or ``torch.matmul``/``@``/``bmm``/``mm`` in
its own forward (a Hugging Face or timm attention block, a hand-written one) has no module to
swap. ``route(model, trace)`` gives each module that the trace (``bfp.trace``) saw make such a
call children named after the call (``qk``/``pv`` for the n-th SDPA call, ``qk1``/``pv1`` for the
next; ``matmul0``, ``matmul1``, ... for products), all ``bfp.layers.Matmul``, and while that
module runs its forward, a ``TorchFunctionMode`` computes the n-th call of its kind with them:

* SDPA as ``bfp.attention.products`` (``p = softmax(qk(q, k^T) * scale + masks)``, ``pv(p, v)``;
  its arguments: ``attn_mask`` bool or float, ``dropout_p``, ``is_causal`` top-left aligned,
  ``scale``, ``enable_gqa``), equal to SDPA within float rounding when nothing is rounded. While
  neither product quantizes anything (plain ``Matmul``s, or quantization off and no hook), the
  call is PyTorch's own SDPA, so an unquantized model computes bit for bit as before.
* a product ``a @ b`` as ``matmul<i>(a, b)`` (``a`` takes the input points, ``b`` the weight
  points); with quantization off it is the same ``torch.matmul``, bit for bit.

Only the module's own calls are routed, not those made inside its children (their own layers
compute those), so a routed module never catches a Q-layer's internal products. A call beyond
the number the trace saw (another input took another branch) runs unchanged and is counted in
``module.bfp_unrouted`` so the report can say so. Routing twice changes nothing.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .attention import products
from .layers import Matmul
from .trace import MATMUL_FUNCS, SDPA, GemmTrace

__all__ = ["route", "watch_children", "ROUTED"]

ROUTED = "_bfp_routes"  # the attribute that marks a routed module: its stack of active routes


class _Route(TorchFunctionMode):
    """While active, the owner's own SDPA and matmul calls go to its named products."""

    def __init__(self, owner: nn.Module):
        super().__init__()
        self.owner, self.depth, self.counts = owner, 0, {"sdpa": 0, "matmul": 0}

    def enter_child(self) -> None:
        self.depth += 1

    def leave_child(self) -> None:
        self.depth -= 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = "sdpa" if func is SDPA else "matmul" if func in MATMUL_FUNCS else None
        if kind is None or self.depth:
            return func(*args, **kwargs)
        i = self.counts[kind]
        self.counts[kind] += 1
        if i >= self.owner._bfp_products[kind]:
            self.owner.bfp_unrouted += 1
            return func(*args, **kwargs)
        if kind == "sdpa":
            sfx = str(i) if i else ""
            qk, pv = getattr(self.owner, f"qk{sfx}"), getattr(self.owner, f"pv{sfx}")
            if _off(qk) and _off(pv):  # nothing to round: PyTorch's own function, bit for bit
                return func(*args, **kwargs)
            return _sdpa(qk, pv, *args, **kwargs)
        a, b = args[:2]
        if func is torch.Tensor.__rmatmul__:
            a, b = b, a
        return getattr(self.owner, f"matmul{i}")(a, b)


def _off(m: nn.Module) -> bool:
    """A product that rounds nothing: a plain ``Matmul``, or a ``QMatmul`` with quantization off and no hook."""
    return isinstance(m, Matmul) or (not m.precision.enabled and m.quantize_hook is None)


def _sdpa(qk: nn.Module, pv: nn.Module, query: Tensor, key: Tensor, value: Tensor,
          attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: Optional[float] = None, enable_gqa: bool = False) -> Tensor:
    if enable_gqa and key.shape[-3] != query.shape[-3]:  # grouped query attention: each key head serves a group
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    return products(qk, pv, query, key, value, attn_mask, None, is_causal, scale, dropout_p)[0]


def _enter(module: nn.Module, args) -> None:
    route = _Route(module)
    route.__enter__()
    getattr(module, ROUTED).append(route)


def _leave(module: nn.Module, args, output) -> None:
    getattr(module, ROUTED).pop().__exit__(None, None, None)


_DEPTH_OWNERS = "_bfp_depth_owners"  # a child's routed parents, in its __dict__ (not a submodule)


def _down(child: nn.Module, args) -> None:
    for owner in child.__dict__.get(_DEPTH_OWNERS, ()):
        routes = getattr(owner, ROUTED)
        if routes:
            routes[-1].enter_child()


def _up(child: nn.Module, args, output) -> None:
    for owner in child.__dict__.get(_DEPTH_OWNERS, ()):
        routes = getattr(owner, ROUTED)
        if routes:
            routes[-1].leave_child()


def _count_depth(owner: nn.Module, child: nn.Module) -> None:
    """Hooks on a direct child of ``owner``: while the child runs, ``owner``'s active route lets every
    call through (the child's own products are its own; under torch.compile a child's autograd.Function
    traces its backward, products included, inside the child's forward). Module hooks, not global
    ones: dynamo traces these. The hooks are module-level functions and the owner is found in the
    child's ``__dict__``: ``copy.deepcopy`` maps it to the copy's owner and pickling keeps it (a
    closure would keep pointing at the original model's owner)."""
    owners = child.__dict__.setdefault(_DEPTH_OWNERS, [])
    if not owners:
        child.register_forward_pre_hook(_down)
        child.register_forward_hook(_up, always_call=True)
    owners.append(owner)


def watch_children(model: nn.Module) -> nn.Module:
    """Depth hooks (``_count_depth``) on every direct child of every routed module of ``model`` that lacks
    them: called after each conversion, which may have swapped a child for its quantized twin."""
    for owner in model.modules():
        if hasattr(owner, ROUTED):
            for child in owner.children():
                if not any(o is owner for o in child.__dict__.get(_DEPTH_OWNERS, ())):
                    _count_depth(owner, child)
    return model


def route(model: nn.Module, trace: GemmTrace) -> nn.Module:
    """Give every module of ``model`` whose own forward the trace saw call SDPA or a matmul its
    named products, and route the calls through them (module docstring). Returns ``model``."""
    sdpa, matmul = trace.routed("sdpa"), trace.routed("matmul")
    for name in dict.fromkeys([*sdpa, *matmul]):
        module = model.get_submodule(name) if name else model
        if hasattr(module, ROUTED):
            continue
        want = [f"{n}{str(i) if i else ''}" for i in range(sdpa.get(name, 0)) for n in ("qk", "pv")]
        want += [f"matmul{i}" for i in range(matmul.get(name, 0))]
        taken = [n for n in want if hasattr(module, n)]
        if taken:
            raise ValueError(f"{name or type(module).__name__} computes products in its forward but already "
                             f"has {taken}: the names they would take")
        for n in want:
            setattr(module, n, Matmul())
        module._bfp_products = {"sdpa": sdpa.get(name, 0), "matmul": matmul.get(name, 0)}
        module.bfp_unrouted = 0
        setattr(module, ROUTED, [])
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_leave, always_call=True)
    return watch_children(model)
