"""Optimizer factories: ``factory(params, config) -> torch.optim.Optimizer``.

A ``Trainer`` is given a factory rather than an optimizer so it can build the
optimizer over the parameters of the model it was handed (after conversion,
which keeps the Parameter objects). ``config`` is the run's ``TrainConfig``
(``lr``, ``momentum``, ``weight_decay``, ``nesterov``).

    sgd     SGD with momentum and L2 weight decay (the original simulator's)
    adamw   AdamW: ``momentum`` is beta1 (beta2 0.999, eps 1e-8), weight decay decoupled
            and applied to every parameter; what transformers are usually trained with
    lars    SGD with a layer-wise trust ratio (``bfp.optim.lars``)
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from .lars import LARS, lars  # noqa: F401  (layer-wise adaptive rate scaling)

_F32_MAX = float(torch.finfo(torch.float32).max)  # torch turns lr and weight decay into float32 scalars


def _f32(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= _F32_MAX


#: What each optimizer setting may be: name -> (test, what is allowed). One table for the
#: TrainConfig, conf_train optimizer-dict entries and the command line.
HYPERPARAMS = {
    "lr": (_f32, "a number in [0, 3.4e38] (float32's range)"),
    "momentum": (lambda v: _f32(v) and v <= 1, "a number in [0, 1]"),
    "weight_decay": (_f32, "a number in [0, 3.4e38] (float32's range)"),
}


def check_hyperparam(name: str, value: Any, label: str = "") -> None:
    """ValueError naming ``label`` (default the parameter, `` `name` ``), the value and what is
    allowed, if ``value`` is not an allowed ``name`` (``HYPERPARAMS``)."""
    ok, allowed = HYPERPARAMS[name]
    if not ok(value):
        raise ValueError(f"{label or f'`{name}`'} must be {allowed}, got {value!r}")


OptimizerFactory = Callable[[Iterable[torch.nn.Parameter], Any], torch.optim.Optimizer]


def sgd(params: Iterable[torch.nn.Parameter], config: Any) -> torch.optim.SGD:
    """SGD with momentum and L2 weight decay (the original simulator's optimizer)."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay, nesterov=config.nesterov)


def adamw(params: Iterable[torch.nn.Parameter], config: Any) -> torch.optim.AdamW:
    """AdamW with beta1 = ``config.momentum`` (a plan's ``momentum`` entry sets beta1 too: ``set_momentum``)."""
    return torch.optim.AdamW(params, lr=config.lr, betas=(config.momentum, 0.999), weight_decay=config.weight_decay)


def set_momentum(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set every parameter group's momentum: SGD's ``momentum``, Adam's beta1."""
    for g in optimizer.param_groups:
        if "betas" in g:
            g["betas"] = (value, g["betas"][1])
        else:
            g["momentum"] = value


FACTORIES: dict[str, OptimizerFactory] = {"sgd": sgd, "adamw": adamw, "lars": lars}
OPTIMIZERS = ("sgd", "adamw")  # what --optimizer chooses (LARS is --use-lars, on SGD)
