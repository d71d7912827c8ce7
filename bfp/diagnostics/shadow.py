"""``--shadow``: how far the quantized model has drifted from an FP32 copy of itself.

At a measured step (``--diagnose N``), ``Shadow`` records, for every quantized layer of the
model, its output (the activation), the gradient arriving at that output, and its weight
gradient, and it snapshots the weights before the step. After the step, an unquantized copy
(every point off, accumulators off) with those weights runs the same batch in float32. The
comparison, per layer, of quantized against shadow (float64):

* ``cos``: cosine similarity ``a.b / (|a| |b|)`` (1 = the same direction);
* ``rel``: relative error ``|a - b| / |b|``.

A point's own rounding shows in ``bfp.diagnostics.points`` (SQNR). The shadow shows what
reached each layer after every rounding before it, forward and backward. Where a layer's
SQNR is fine but its shadow error is large, the error came from earlier layers. Caveats:
the shadow sees the step's last forward pass (with ``--emulate-node``, the last
worker's micro-batch); dropout draws differ between the two models; under
``--loss-scale`` the quantized gradients carry the loss scale (cosines are unaffected, the
relative errors of gradients are not). BatchNorm statistics move in the copy only.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Optional

import torch

from ..layers import measuring_hook
from ..precision import LayerPrecision
from .points import _Q_TYPES

SHADOW_MEASURES = ("act_cos", "act_rel", "grad_cos", "grad_rel", "wgrad_cos", "wgrad_rel")


def compare(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> tuple[float, float]:
    """(cosine, relative error) of ``a`` against the reference ``b`` in float64 (nan, nan if
    either is missing or has another shape)."""
    if a is None or b is None or a.shape != b.shape:
        return math.nan, math.nan
    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    na, nb = float(a.norm()), float(b.norm())
    cos = float(a @ b) / (na * nb) if na and nb else (1.0 if na == nb else 0.0)
    rel = float((a - b).norm()) / nb if nb else (0.0 if na == 0 else math.inf)
    return cos, rel


def _layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, _Q_TYPES)}


class _Recorder:
    """Forward hooks keeping each layer's last output and, through a hook on that output
    tensor, the gradient that reaches it."""

    def __init__(self, layers: dict[str, torch.nn.Module]):
        self.out: dict[str, torch.Tensor] = {}
        self.grad: dict[str, torch.Tensor] = {}
        self.handles = [m.register_forward_hook(self._fwd(name)) for name, m in layers.items()]

    def _fwd(self, name):
        def keep_grad(g):
            self.grad[name] = g.detach().float().clone()

        def hook(module, args, output):
            if module.training and isinstance(output, torch.Tensor):
                self.out[name] = output.detach().float().clone()
                if output.requires_grad:
                    output.register_hook(keep_grad)
        return measuring_hook(hook)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class Shadow:
    """Arm before a step (``arm(model, criterion)`` returns the criterion to train with, which
    records the targets), ``compare`` after it."""

    def __init__(self):
        self.rec: Optional[_Recorder] = None

    def arm(self, model: torch.nn.Module, criterion):
        self.model = model
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.rec = _Recorder(_layers(model))
        self.batch: dict[str, Any] = {}
        self._pre = model.register_forward_pre_hook(measuring_hook(self._input))

        def recording(out, y):
            self.batch["y"] = y.detach()
            return criterion(out, y)
        return recording

    def _input(self, module, args):
        if module.training and args:
            self.batch["x"] = args[0].detach()

    def compare(self, criterion) -> list[dict[str, Any]]:
        """Rows per quantized layer: the six ``SHADOW_MEASURES``; the hooks are removed."""
        rec, self.rec = self.rec, None
        if rec is None:
            return []
        rec.remove()
        self._pre.remove()
        layers = _layers(self.model)
        wgrad = {n: (m.weight.grad.detach().float().clone() if getattr(m, "weight", None) is not None
                     and m.weight.grad is not None else None) for n, m in layers.items()}
        if "x" not in self.batch or "y" not in self.batch:
            return []
        shadow = copy.deepcopy(self.model)
        shadow.load_state_dict(self.state)
        shadow_layers = _layers(shadow)
        for m in shadow_layers.values():
            m.set_precision(LayerPrecision())
            m.quantize_hook = None
        shadow.train()
        ref = _Recorder(shadow_layers)
        try:
            with torch.autocast(self.batch["x"].device.type, enabled=False):
                criterion(shadow(self.batch["x"]), self.batch["y"]).backward()
        finally:
            ref.remove()
        rows = []
        for name, m in shadow_layers.items():
            w = m.weight.grad if getattr(m, "weight", None) is not None else None
            row = {"layer": name}
            for key, (a, b) in (("act", (rec.out.get(name), ref.out.get(name))),
                                ("grad", (rec.grad.get(name), ref.grad.get(name))),
                                ("wgrad", (wgrad.get(name), w))):
                row[f"{key}_cos"], row[f"{key}_rel"] = compare(a, b)
            rows.append(row)
        return rows
