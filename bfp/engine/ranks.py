"""Which process this is: rank 0 alone prints, logs, notifies and writes files.

Without ``torch.distributed`` initialised (a plain ``python cifar.py``) this
process is rank 0 of 1. Logging, metrics, Slack and checkpoints ask
``is_main()`` themselves, so the training loop carries no rank branches;
evaluation sums its counts with ``sum_over_ranks`` (the identity in one
process), so every rank reports the same accuracy.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..distributed.env import broadcast_state, group_size


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return group_size()


def is_main() -> bool:
    return rank() == 0


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over all processes (``t`` itself in a single process); every rank must call it."""
    if world_size() > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics) before an evaluation,
    so all ranks evaluate, and rank 0 saves, the same model; nothing in a single process."""
    broadcast_state(list(model.buffers()))
