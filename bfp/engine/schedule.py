"""Learning-rate schedule and epoch-keyed changes of precision and optimizer.

The learning rate is a pure function of the optimizer step:
``lr(step) = base_lr * factor(step)``, linear warm-up over ``warmup_steps``
then a half cosine down to ``min_factor`` at ``total_steps``. A
``conf_train`` change of ``lr`` replaces ``base_lr`` and keeps the position in
the schedule, so switching precision or optimizer settings never restarts the
schedule (the original simulator's scheduler-step bookkeeping is not needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..optim import check_hyperparam


class CosineSchedule:
    """Sets ``lr`` of every param group before each step; its state is the step count and base LRs."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0,
                 min_factor: float = 0.0):
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"warmup_steps must be in [0, {total_steps}], got {warmup_steps}")
        self.optimizer = optimizer
        self.total_steps, self.warmup_steps, self.min_factor = total_steps, warmup_steps, min_factor
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.step_count = 0
        self._apply()

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t))

    def _apply(self) -> None:
        f = self.factor(self.step_count)
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            if isinstance(g["lr"], torch.Tensor):  # a device lr (--cuda-graph): written in place, no sync
                g["lr"].fill_(base * f)
            else:
                g["lr"] = base * f

    def step(self) -> None:
        """Advance one optimizer step (call after ``optimizer.step()``)."""
        self.step_count += 1
        self._apply()

    def set_base_lr(self, lr: float) -> None:
        self.base_lrs = [float(lr)] * len(self.base_lrs)
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, "base_lrs": list(self.base_lrs),
                "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "min_factor": self.min_factor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self.base_lrs = [float(x) for x in state["base_lrs"]]
        self.total_steps, self.warmup_steps = int(state["total_steps"]), int(state["warmup_steps"])
        self.min_factor = float(state["min_factor"])
        self._apply()


# Optimizer settings a conf_train "optimizer-dict" entry may change.
OPTIMIZER_KEYS = {"lr": "lr", "momentum": "momentum", "weight-decay": "weight_decay",
                  "weight_decay": "weight_decay", "scheduler-step": None, "scheduler_step": None}


@dataclass
class EpochPlan:
    """What changes at the start of given epochs: a network config (preset name,
    path or dict for ``bfp.convert``) and optimizer settings."""

    precision: dict[int, Any] = field(default_factory=dict)
    optimizer: dict[int, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, precision: Optional[dict], optimizer: Optional[dict], source: str) -> "EpochPlan":
        return cls(precision={_epoch(k, source, "bfp-layer-conf-dict"): v
                              for k, v in (precision or {}).items()},
                   optimizer={_epoch(k, source, "optimizer-dict"): _opt_entry(v, k, source)
                              for k, v in (optimizer or {}).items()})

    def check_epochs(self, epochs: int, source: str) -> None:
        for what, d in (("bfp-layer-conf-dict", self.precision), ("optimizer-dict", self.optimizer)):
            late = sorted(e for e in d if e >= epochs)
            if late:
                raise ValueError(f"{source}: {what} has epochs {late} but the run trains epochs "
                                 f"0..{epochs - 1} (`epochs` {epochs})")

    def precision_at(self, epoch: int, initial: Any = None) -> Any:
        """The network config in force during ``epoch``: the latest switch at or before it."""
        keys = [e for e in self.precision if e <= epoch]
        return self.precision[max(keys)] if keys else initial

    def to_json(self) -> dict[str, Any]:
        return {"bfp-layer-conf-dict": {str(k): v for k, v in sorted(self.precision.items())},
                "optimizer-dict": {str(k): dict(v) for k, v in sorted(self.optimizer.items())}}


def _epoch(key: Any, source: str, what: str) -> int:
    try:
        e = int(key)
    except (TypeError, ValueError):
        e = -1
    if e < 0 or str(key).strip() != str(e):
        raise ValueError(f"{source}: {what} key {key!r} is not an epoch number (0, 1, 2 ...)")
    return e


def _opt_entry(entry: Any, key: Any, source: str) -> dict[str, float]:
    if not isinstance(entry, dict):
        raise ValueError(f"{source}: optimizer-dict[{key!r}] must be an object like "
                         f'{{"lr": 0.01}}, got {entry!r}')
    out: dict[str, float] = {}
    for k, v in entry.items():
        if k not in OPTIMIZER_KEYS:
            raise ValueError(f"{source}: optimizer-dict[{key!r}] has unknown key {k!r}; allowed: "
                             f"{', '.join(sorted(OPTIMIZER_KEYS))}")
        name = OPTIMIZER_KEYS[k]
        if name is None:  # scheduler-step: the original's, ignored (cosine decay)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{source}: optimizer-dict[{key!r}][{k!r}] must be a finite number >= 0, "
                                 f"got {v!r}")
        else:
            check_hyperparam(name, v, f"{source}: optimizer-dict[{key!r}][{k!r}]")
            out[name] = float(v)
    return out
