"""The original ImageNet learning-rate schedule: 10x lower at each third of the run.

``lr(step) = base_lr * 0.1 ** floor(3 * epoch / epochs)`` with
``epoch = step // steps_per_epoch``: on 90 epochs the drops come at epochs 30
and 60, as in the PyTorch ImageNet example the original simulator ran; on
``epochs`` not divisible by 3 each drop comes at the first epoch at or past
the third. An optional linear warm-up over ``warmup_steps`` multiplies the
first steps by ``(step + 1) / warmup_steps``. Same interface and checkpoint
state as ``CosineSchedule``; a ``conf_train`` ``lr`` change replaces
``base_lr`` and keeps the position.
"""
from __future__ import annotations

from typing import Any

import torch

from .schedule import CosineSchedule


class ThirdsSchedule(CosineSchedule):
    """Step decay by 10x at each third of ``epochs`` (see the module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, *,
                 epochs: int = 1):
        if epochs < 1 or total_steps % epochs:
            raise ValueError(f"total_steps {total_steps} must be a positive multiple of epochs {epochs}")
        self.epochs, self.steps_per_epoch = epochs, total_steps // epochs
        super().__init__(optimizer, total_steps, warmup_steps)  # no cosine floor: factor() replaces it

    def factor(self, step: int) -> float:
        epoch = min(step, self.total_steps - 1) // self.steps_per_epoch
        f = 0.1 ** ((3 * epoch) // self.epochs)
        return f * (step + 1) / self.warmup_steps if step < self.warmup_steps else f

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved run's schedule, as ``CosineSchedule`` restores its ``total_steps``: its
        ``epochs`` and steps per epoch too (a resume on data of another size, allowed by
        ``--resume-allow-data-change``, keeps the drops where the run had them)."""
        self.epochs = int(state.get("epochs", self.epochs))
        self.steps_per_epoch = int(state["total_steps"]) // self.epochs
        super().load_state_dict(state)


SCHEDULES = ("cosine", "thirds")


def make_schedule(kind: str, optimizer: torch.optim.Optimizer, *, epochs: int, steps_per_epoch: int,
                  warmup_steps: int = 0) -> CosineSchedule:
    """``cosine`` (``CosineSchedule``) or ``thirds`` (``ThirdsSchedule``) over ``epochs``."""
    if kind == "cosine":
        return CosineSchedule(optimizer, total_steps=epochs * steps_per_epoch, warmup_steps=warmup_steps)
    if kind == "thirds":
        return ThirdsSchedule(optimizer, total_steps=epochs * steps_per_epoch, warmup_steps=warmup_steps,
                              epochs=epochs)
    raise ValueError(f"`lr_schedule` {kind!r} unknown; allowed: {', '.join(SCHEDULES)}")
