"""Optimizer factories: ``factory(params, config) -> torch.optim.Optimizer``.

A ``Trainer`` is given a factory rather than an optimizer so it can build the
optimizer over the parameters of the model it was handed (after conversion,
which keeps the Parameter objects). ``config`` is the run's ``TrainConfig``
(``lr``, ``momentum``, ``weight_decay``, ``nesterov``).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from .lars import LARS, lars  # noqa: F401  (layer-wise adaptive rate scaling)

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter], Any], torch.optim.Optimizer]


def sgd(params: Iterable[torch.nn.Parameter], config: Any) -> torch.optim.SGD:
    """SGD with momentum and L2 weight decay (the original simulator's optimizer)."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay, nesterov=config.nesterov)


FACTORIES: dict[str, OptimizerFactory] = {"sgd": sgd, "lars": lars}
