"""One training step on one batch: the strategy a ``Trainer`` is given.

``PlainStep`` runs forward under the mixed-precision policy's autocast, the
loss in float32, a scaled backward and the optimizer step. Other strategies
(distributed data parallel with a communication hook, N emulated workers in
one process) keep the same call and differ in how gradients are made and
combined before ``amp.step``.
"""
from __future__ import annotations

import torch
import torch.nn as nn




def quantized_layers(model: nn.Module) -> list[nn.Module]:
    """The model's quantized layers (those that take a ``quantize_hook``)."""
    return [m for m in model.modules() if hasattr(m, "quantize_hook")]


def measuring(layers: list[nn.Module]) -> bool:
    """Whether this step is measured (``--do``, ``--diagnose``: a quantize hook on a layer calls
    Python at every point), so it runs eagerly, neither compiled nor replayed from a CUDA graph."""
    return any(m.quantize_hook is not None for m in layers)


class PlainStep:
    """Single process: gradients of the whole batch, then one optimizer step."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """The module the step runs (a wrapper for distributed strategies; here the model)."""
        return model

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion, optimizer,
                 amp) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on ``(x, y)``; returns the loss and the logits, both detached."""
        return amp.train_step(model, x, y, criterion=criterion, optimizer=optimizer)
