"""One process, one worker: the step strategy for DistributedDataParallel.

``DDPStep(reduce)`` has the interface of ``bfp.engine.step.PlainStep``:
``prepare(model)`` wraps the model in ``DistributedDataParallel`` (once per
model; a precision switch swaps layers inside the same model and keeps its
Parameters, so the wrapper stays valid) with the rounded all-reduce hook of
``bfp.distributed.hook`` when ``reduce`` is given, DDP's own float32
all-reduce (mean) when it is None. The step itself is the plain one: DDP
reduces the gradients during ``backward``. BatchNorm buffers are broadcast
from rank 0 at every forward (DDP's default, ``broadcast_buffers=True``), so rank 0's
running statistics are its own micro-batch's, as ``--emulate-node`` keeps
them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from .hook import RoundedHookState, rounded_allreduce_hook
from .reduce import RoundedReduce


class DDPStep:
    """Forward, backward (DDP reduces the gradients) and the optimizer step."""

    def __init__(self, reduce: Optional[RoundedReduce] = None, device: Optional[torch.device] = None,
                 bucket_cap_mb: Optional[float] = None):
        self.reduce, self.device, self.bucket_cap_mb = reduce, device, bucket_cap_mb
        self._wrapped: Optional[tuple[int, DistributedDataParallel]] = None

    def prepare(self, model: nn.Module) -> nn.Module:
        if self._wrapped is None or self._wrapped[0] != id(model):
            dev = self.device if self.device is not None else next(model.parameters()).device
            # buffers are broadcast from rank 0 at every forward: DDP's default
            ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None,
                                          bucket_cap_mb=self.bucket_cap_mb)
            if self.reduce is not None:
                ddp.register_comm_hook(RoundedHookState(self.reduce), rounded_allreduce_hook)
            self._wrapped = (id(model), ddp)
        return self._wrapped[1]

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion, optimizer,
                 amp) -> tuple[torch.Tensor, torch.Tensor]:
        """Train on ``(x, y)``; returns the loss and the logits, both detached."""
        return amp.train_step(model, x, y, criterion=criterion, optimizer=optimizer)
