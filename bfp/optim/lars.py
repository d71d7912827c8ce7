"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017), CPD's ``--use_lars``.

Large global batches (many workers) train badly with one learning rate for
every layer, because the ratio of a layer's weight norm to its gradient norm
varies by orders of magnitude. LARS gives each parameter tensor ``w`` with
gradient ``g`` its own rate, per step::

    trust = eta * ||w|| / (||g|| + wd * ||w||)      (1 if ||w|| or ||g|| is 0)
    d     = trust * (g + wd * w)
    v     = momentum * v + d                       (v = d on the first step)
    w     = w - lr * v

``eta`` is the trust coefficient (``--lars-trust``, default 0.001), ``wd``
the weight decay, norms are float32 L2 norms of the whole tensor. As is
usual (and as the LARS paper's released code does), tensors with one
dimension (biases, BatchNorm weights) are not adapted: ``trust = 1``. No
Nesterov variant. A NaN/Inf gradient gives a NaN/Inf update, as SGD would.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

DEFAULT_TRUST = 0.001


class LARS(torch.optim.Optimizer):
    """SGD with momentum and per-tensor trust ratio (see the module docstring)."""

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = DEFAULT_TRUST):
        for what, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                        ("`trust_coefficient`", trust_coefficient)):
            if not (isinstance(v, (int, float)) and v >= 0 and v == v and v != float("inf")):
                raise ValueError(f"LARS {what} must be a finite number >= 0, got {v!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient))

    @staticmethod
    def trust_ratio(w: torch.Tensor, g: torch.Tensor, weight_decay: float, eta: float) -> torch.Tensor:
        """``eta * ||w|| / (||g|| + wd * ||w||)``, 1 for one-dimensional tensors or a zero norm."""
        if w.dim() <= 1:
            return torch.ones((), dtype=w.dtype, device=w.device)
        wn, gn = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        ratio = eta * wn / (gn + weight_decay * wn)
        return torch.where((wn > 0) & (gn > 0), ratio, torch.ones_like(ratio))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mom, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["trust_coefficient"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                d = (g + wd * p) * self.trust_ratio(p, g, wd, eta)
                if mom:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d.clone()
                    else:
                        state["momentum_buffer"].mul_(mom).add_(d)
                    d = state["momentum_buffer"]
                p.add_(d, alpha=-lr)
        return loss


def lars(params: Iterable[torch.nn.Parameter], config: Any, trust_coefficient: float = DEFAULT_TRUST) -> LARS:
    """Optimizer factory: LARS with the run's lr, momentum and weight decay."""
    return LARS(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                trust_coefficient=trust_coefficient)
