"""Whether a saved model and optimizer state fits the model and optimizer built for a run, checked
entry by entry before anything is loaded or any step taken.

The model's state must have exactly the model's entries (none missing, none unexpected), each of the
model's shape and dtype; for a sharded model (FSDP2's DTensors) the whole tensor's shape. The
optimizer's state must have the optimizer's parameter groups, as many parameters in each, and every
per-parameter tensor that is not a scalar (momentum buffers, Adam's moments) the shape of its
parameter, in a floating dtype (PyTorch's optimizers cast it to the parameter's dtype on load). The
optimizer's state is keyed by parameter index (``Optimizer.state_dict``) or by parameter name
(``torch.distributed.checkpoint``'s full state dicts, ``--fsdp``); both are understood.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["check_state_fits"]


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def check_model_state(model: nn.Module, saved: Any) -> None:
    """ValueError naming every missing, unexpected or differently shaped or typed entry."""
    if not isinstance(saved, dict):
        raise ValueError(f"the model's state is a {type(saved).__name__}, not a dict of tensors")
    want = model.state_dict()
    missing = [k for k in want if k not in saved]
    unexpected = [k for k in saved if k not in want]
    wrong = [f"{k} (saved {_describe(saved[k]) if isinstance(saved[k], torch.Tensor) else type(saved[k]).__name__}, "
             f"the model's {_describe(v)})" for k, v in want.items()
             if k in saved and isinstance(v, torch.Tensor)
             and not (isinstance(saved[k], torch.Tensor) and tuple(saved[k].shape) == tuple(v.shape)
                      and saved[k].dtype == v.dtype)]
    problems = ([f"missing entries {', '.join(missing)}"] if missing else []) + \
               ([f"unexpected entries {', '.join(unexpected)}"] if unexpected else []) + \
               ([f"entries of another shape or dtype: {'; '.join(wrong)}"] if wrong else [])
    if problems:
        raise ValueError("the model's state does not fit the model: " + "; ".join(problems))


def check_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """ValueError naming the first group, parameter or state entry that does not fit."""
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
            and isinstance(saved.get("param_groups"), list)):
        raise ValueError("the optimizer's state is not a dict with 'state' and 'param_groups'")
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise ValueError(f"the optimizer's state has {len(saved['param_groups'])} parameter groups, the "
                         f"optimizer {len(groups)}")
    by_index = [p for g in groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {names[id(p)]: p for p in by_index if id(p) in names}
    for i, (g, s) in enumerate(zip(groups, saved["param_groups"])):
        n = len(s.get("params", [])) if isinstance(s, dict) else -1
        if n != len(g["params"]):
            raise ValueError(f"the optimizer's parameter group {i} has {n} parameters saved, {len(g['params'])} "
                             f"in the optimizer")
    for key, entries in saved["state"].items():
        p = by_index[key] if isinstance(key, int) and 0 <= key < len(by_index) else \
            by_name.get(key) if isinstance(key, str) else None
        if p is None:
            raise ValueError(f"the optimizer's state has an entry for parameter {key!r}, which the optimizer "
                             f"does not have")
        label = names.get(id(p), f"parameter {key}")
        for field, v in (entries.items() if isinstance(entries, dict) else ()):
            if not isinstance(v, torch.Tensor) or v.dim() == 0:  # step counters and other scalars
                continue
            if tuple(v.shape) != tuple(p.shape) or not v.is_floating_point():
                raise ValueError(f"the optimizer's {field!r} of {label} is {_describe(v)}; the parameter is "
                                 f"{_describe(p)}")


def check_state_fits(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: Any,
                     optimizer_state: Any) -> None:
    """Both checks (module docstring); nothing is loaded."""
    check_model_state(model, model_state)
    check_optimizer_state(model, optimizer, optimizer_state)
