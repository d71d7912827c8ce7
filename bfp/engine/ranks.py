"""Which process this is: rank 0 alone prints, logs, notifies and writes files.

Without ``torch.distributed`` initialised (a plain ``python cifar.py``) this
process is rank 0 of 1. Logging, metrics, Slack and checkpoints ask
``is_main()`` themselves, so the training loop carries no rank branches.
"""
from __future__ import annotations

import torch.distributed as dist


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0
