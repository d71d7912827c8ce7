"""Which GEMMs a model computes, found by running it: one forward of an example input, op by op.

``trace_gemms(model, example_input)`` runs ``model`` once (eval mode, no autograd, the global
random state saved and restored, training flags put back) under a ``TorchFunctionMode`` and
forward hooks on every module, and records each GEMM as a ``Site``, in the order the forward
first reaches it:

============  ====================================================================================
``layer``     a call of a convertible module (``nn.Linear``, ``nn.Conv1d``/``Conv2d``,
              ``bfp.layers.Matmul``, a transformers ``Conv1D``, or their Q-layers); what runs
              inside it belongs to it
``sdpa``      ``F.scaled_dot_product_attention`` called in another module's own forward (not in a
              child's): two products, q k^T and p v, which routing gives that module as ``qk``/``pv``
``matmul``    ``torch.matmul``/``@``/``bmm``/``mm`` in a module's own forward: one product, routed
              as ``matmul<i>``
``unsupported``  another GEMM-like op in a module's own forward (``einsum``, ``addmm`` and
              ``addmm_``, ``baddbmm``, ``torch.linalg.matmul``, ``dot``/``vdot``/``inner``/
              ``linalg.vecdot``, ``outer``/``ger``/``addr``, ``F.linear``/``F.conv*``/``conv_tbc`` called
              directly, ...): it stays FP32, the conversion report says so and ``strict`` refuses it
``recurrent``  a call of ``nn.LSTM``/``GRU``/``RNN`` or a cell, whose GEMMs run inside one fused
              op: FP32, reported and refused under ``strict`` like ``unsupported``
============  ====================================================================================

A site's ``index`` counts the calls of its kind in one forward of its owner, so a module called
several times (a shared block) gives each site once. No source text is read: what the model
computes decides.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .census import GemmCensus
from .layers import CONVERTIBLE, QTransposedLinear, quantized_twin

__all__ = ["Site", "GemmTrace", "trace_gemms", "MATMUL_FUNCS", "SDPA", "type_name_of"]

SDPA = F.scaled_dot_product_attention
# a @ b, torch.matmul, a.matmul(b), bmm, mm: one product each (Tensor.__matmul__ arrives as Tensor.matmul).
MATMUL_FUNCS = {torch.matmul: "matmul", Tensor.matmul: "matmul", Tensor.__rmatmul__: "rmatmul",
                torch.bmm: "bmm", Tensor.bmm: "bmm", torch.mm: "mm", Tensor.mm: "mm"}
_UNSUPPORTED = {torch.einsum: "einsum", torch.addmm: "addmm", Tensor.addmm: "addmm", torch.baddbmm: "baddbmm",
                Tensor.baddbmm: "baddbmm", torch.addbmm: "addbmm", torch.tensordot: "tensordot",
                torch.linalg.multi_dot: "multi_dot", torch.chain_matmul: "chain_matmul", F.bilinear: "bilinear",
                F.linear: "F.linear", F.conv1d: "F.conv1d", F.conv2d: "F.conv2d", F.conv3d: "F.conv3d",
                F.conv_transpose1d: "F.conv_transpose1d", F.conv_transpose2d: "F.conv_transpose2d",
                F.conv_transpose3d: "F.conv_transpose3d", torch.addmv: "addmv", torch.mv: "mv", Tensor.mv: "mv",
                torch.linalg.matmul: "linalg.matmul", torch.conv_tbc: "conv_tbc", torch.dot: "dot", Tensor.dot: "dot",
                torch.vdot: "vdot", Tensor.vdot: "vdot", torch.inner: "inner", Tensor.inner: "inner",
                torch.linalg.vecdot: "linalg.vecdot", Tensor.addmv: "addmv", Tensor.addbmm: "addbmm"}
# Matrix powers and sparse products: GEMMs too (a matrix power of n is about log2(n) products, a sparse
# product one), out of any layer's reach; what this torch lacks is skipped.
_UNSUPPORTED.update({f: name for name, f in (
    ("matrix_power", getattr(torch.linalg, "matrix_power", None)), ("matrix_power", getattr(torch, "matrix_power", None)),
    ("matrix_power", getattr(Tensor, "matrix_power", None)), ("matrix_exp", getattr(torch.linalg, "matrix_exp", None)),
    ("matrix_exp", getattr(torch, "matrix_exp", None)), ("matrix_exp", getattr(Tensor, "matrix_exp", None)),
    ("sparse.mm", getattr(torch.sparse, "mm", None)), ("sparse.addmm", getattr(torch.sparse, "addmm", None)),
    ("sparse.sampled_addmm", getattr(torch.sparse, "sampled_addmm", None)), ("smm", getattr(torch, "smm", None)),
    ("smm", getattr(Tensor, "smm", None)), ("hspmm", getattr(torch, "hspmm", None)),
    ("sspaddmm", getattr(torch, "sspaddmm", None)), ("sspaddmm", getattr(Tensor, "sspaddmm", None)),
    ("chain_matmul", getattr(torch.linalg, "chain_matmul", None))) if f is not None})
# Outer products: a GEMM with K = 1 (torch.ger is outer's old name; addr adds one to a matrix).
_UNSUPPORTED.update({torch.outer: "outer", Tensor.outer: "outer", torch.ger: "ger", Tensor.ger: "ger",
                     torch.addr: "addr", Tensor.addr: "addr"})
# In-place forms (a.addmm_(b, c)) are the same products.
_UNSUPPORTED.update({getattr(Tensor, f"{n}_"): n for n in ("addmm", "baddbmm", "addbmm", "addmv", "addr")})
# Modules whose forward runs its GEMMs inside one fused op, out of any hook's reach: recorded as
# unsupported GEMMs of that module (an LSTM's input and hidden products, per layer and direction).
RECURRENT = (nn.RNNBase, nn.RNNCellBase)
_Q_TYPES = {q: f.__name__ for f, q in CONVERTIBLE.items()}


def type_name_of(module: nn.Module) -> Optional[str]:
    """The config type name of a convertible or converted module (``Linear`` for ``nn.Linear``,
    ``QLinear`` and a transformers ``Conv1D``), or None."""
    if isinstance(module, QTransposedLinear):
        return "Linear"
    for q, name in _Q_TYPES.items():
        if isinstance(module, q):
            return name
    twin = quantized_twin(module)
    if twin is None:
        return None
    return "Linear" if twin is QTransposedLinear else type(module).__name__


@dataclass(frozen=True)
class Site:
    """One GEMM of the traced forward (module docstring): ``kind``, the ``owner`` module's name
    (``""``: the model itself), ``op`` (the config type name of a layer, or the function's name)
    and ``index`` (its kind's n-th call in one forward of the owner)."""

    kind: str
    owner: str
    op: str
    index: int = 0

    def layer_names(self) -> tuple[str, ...]:
        """The convertible modules that compute this site once routed (none for ``unsupported``)."""
        pre = f"{self.owner}." if self.owner else ""
        if self.kind == "layer":
            return (self.owner,)
        if self.kind == "sdpa":
            sfx = str(self.index) if self.index else ""
            return (f"{pre}qk{sfx}", f"{pre}pv{sfx}")
        if self.kind == "matmul":
            return (f"{pre}matmul{self.index}",)
        return ()

    def describe(self) -> str:
        where = self.owner or "(model)"
        return f"{self.op} in {where}" + (f" (call {self.index + 1})" if self.index else "")


@dataclass(frozen=True)
class GemmTrace:
    """The sites of one traced forward, in execution order, and what the forward was given;
    ``census``: every GEMM the dispatcher ran (``bfp.census``), each record keyed by its site."""

    sites: tuple[Site, ...]
    input_desc: str = ""
    census: tuple = ()

    def macs(self, site: Site) -> Optional[int]:
        """The multiply-adds the dispatcher counted for ``site`` (None: opaque or not seen there)."""
        rec = [r for r in self.census if r.key == site]
        return None if not rec or any(r.opaque for r in rec) else sum(r.macs for r in rec)

    @property
    def total_macs(self) -> int:
        return sum(r.macs for r in self.census if not r.opaque)

    def execution_order(self) -> tuple[str, ...]:
        """Convertible-layer names in the order the forward computes them (routed names included)."""
        out: list[str] = []
        for s in self.sites:
            out.extend(n for n in s.layer_names() if n not in out)
        return tuple(out)

    def routed(self, kind: str) -> dict[str, int]:
        """Owner -> number of ``kind`` (``sdpa`` / ``matmul``) sites per forward, for routing."""
        out: dict[str, int] = {}
        for s in self.sites:
            if s.kind == kind:
                out[s.owner] = max(out.get(s.owner, 0), s.index + 1)
        return out


class _Recorder(TorchFunctionMode):
    """The function-level sites; ``current`` is the site whose function runs now (the census
    gives it the GEMMs the function dispatches)."""

    def __init__(self, stack: list, sites: dict):
        super().__init__()
        self.stack, self.sites, self.current = stack, sites, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.stack and not any(frame[2] for frame in self.stack):  # inside a convertible layer: its own
            name, _, _, counts = self.stack[-1]
            kind = "sdpa" if func is SDPA else "matmul" if func in MATMUL_FUNCS else \
                "unsupported" if func in _UNSUPPORTED else None
            if kind is not None:
                op = "scaled_dot_product_attention" if kind == "sdpa" else MATMUL_FUNCS.get(func) or _UNSUPPORTED[func]
                key = kind if kind != "unsupported" else op
                site = Site(kind, name, op, counts[key])
                self.sites.setdefault(site, None)
                counts[key] += 1
                prev, self.current = self.current, site
                try:
                    return func(*args, **kwargs)
                finally:
                    self.current = prev
        return func(*args, **kwargs)


def _site_of_dispatch(stack: list, recorder: _Recorder, sites: dict, op: str) -> Site:
    """The site a dispatched GEMM belongs to: the function site running it, else the innermost
    convertible layer or recurrent module computing it, else a new ``unsupported`` site of the innermost module named
    after the op (a GEMM no function-level rule knows: the census never lets one pass unseen)."""
    if recorder.current is not None:
        return recorder.current
    for name, module, is_layer, _ in reversed(stack):
        if is_layer:
            return Site("layer", name, type_name_of(module))
        if isinstance(module, RECURRENT):  # the fused recurrent op's own GEMMs
            return Site("recurrent", name, type(module).__name__)
    name, _, _, counts = stack[-1] if stack else ("", None, False, Counter())
    site = Site("unsupported", name, op, counts[op])
    counts[op] += 1
    sites.setdefault(site, None)
    return site


def _call(model: nn.Module, example_input: Any):
    if isinstance(example_input, dict):
        return model(**example_input)
    if isinstance(example_input, (tuple, list)):
        return model(*example_input)
    return model(example_input)


def trace_gemms(model: nn.Module, example_input: Any, input_desc: str = "") -> GemmTrace:
    """Run ``model`` once on ``example_input`` (a tensor, a tuple of positional arguments or a
    dict of keyword arguments) and return its ``GemmTrace`` (module docstring). The model's
    parameters, buffers (eval mode: batch norm statistics untouched), training flags and the
    global random state are as before."""
    names = {id(m): n for n, m in model.named_modules()}
    stack: list = []
    sites: dict[Site, None] = {}

    def pre(module, args):
        name = names.get(id(module), "?")
        layer = type_name_of(module)
        if layer is not None and not any(frame[2] for frame in stack):
            sites.setdefault(Site("layer", name, layer), None)
        elif isinstance(module, RECURRENT) and not any(frame[2] for frame in stack):
            sites.setdefault(Site("recurrent", name, type(module).__name__), None)
        stack.append((name, module, layer is not None, Counter()))

    def post(module, args, output):
        stack.pop()

    handles = []
    modes = {m: m.training for m in model.modules()}
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post, always_call=True))
        recorder = _Recorder(stack, sites)
        census = GemmCensus(lambda op: _site_of_dispatch(stack, recorder, sites, op))
        with torch.random.fork_rng(devices=devices), torch.no_grad(), recorder, census:
            model.eval()
            _call(model, example_input)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return GemmTrace(tuple(sites), input_desc, tuple(census.records))


def describe_input(example_input: Any) -> str:
    """``"1x3x32x32 float32"``-style words for a report."""
    def one(t):
        return "x".join(map(str, t.shape)) + f" {str(t.dtype).replace('torch.', '')}" if isinstance(t, Tensor) \
            else type(t).__name__
    if isinstance(example_input, dict):
        return ", ".join(f"{k}={one(v)}" for k, v in example_input.items())
    if isinstance(example_input, (tuple, list)):
        return ", ".join(one(t) for t in example_input)
    return one(example_input)


def filter_of(module_filter: Optional[Callable[[nn.Module, str], bool]]):
    """``module_filter`` checked: a callable ``(module, fqn) -> bool`` or None."""
    if module_filter is not None and not callable(module_filter):
        raise ValueError(f"module_filter must be a callable (module, fqn) -> bool or None, got {module_filter!r}")
    return module_filter
