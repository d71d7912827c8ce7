"""N workers emulated in one process (``--emulate-node N``), CPD's way to study 8 or 256 workers on one GPU.

``EmulatedStep(n, reduce)`` is a step strategy (the interface of
``bfp.engine.step.PlainStep``): it cuts the batch into ``n`` contiguous
micro-batches, runs forward and backward on each as worker ``w`` would, keeps
every worker's gradient apart and combines them with the same rounded
reduction as the DDP hook (``bfp.distributed.reduce``). Under ``torchrun``
each process emulates ``n`` workers (worker ``rank * n + w``), so 8 processes
with ``n = 32`` reduce like 256 workers. The ``ring`` order runs as a ring
(``bfp.distributed.ring.ring_reduce_workers``): a process holds its own ``n``
workers' gradients and the partial sums passing through it, never the other
processes' gradients. The ``sequential`` order (and NVFP4/Scaled gradient
formats) gathers every worker's gradients on every process.

Buckets: a library's order (``gloo``, ``nccl-*``) adds along the flat bucket it is handed, so
the workers' gradients are reduced in DDP's buckets (``bfp.distributed.buckets``): one bucket in
``model.parameters()`` order at the first step, then buckets rebuilt from the order in which
worker 0's first backward made the gradients ready (first bucket 1 MiB, then ``bucket_cap_mb``,
25 MiB by default), as DDP rebuilds them at its second iteration.

What matches a real run of ``world * n`` workers bit for bit (tested: a
2-process gloo run against one process with ``--emulate-node 2``): the
gradients, their reduction, the parameters and optimizer state. BatchNorm
running statistics follow DDP's ``broadcast_buffers=True``: they are
worker 0's, updated by worker 0's micro-batch only; the other workers'
micro-batch statistics normalise their own forward (each worker's
BatchNorm sees only its own micro-batch, as on its own GPU) and are then
discarded. Under ``torchrun`` the buffers are broadcast from rank 0 before
every step, as DDP does. Randomness drawn inside the model (dropout,
stochastic rounding of a network config) comes from this process's one
generator in worker order and so differs from separate processes.

Unused parameters: a worker whose backward leaves a gradient ``None``
contributes zeros; a parameter no worker touched keeps ``grad = None`` (the
optimizer skips it). The reported loss is the mean of the micro-batch
losses; the logits are concatenated.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn

from .env import broadcast_state, group_size
from .buckets import ReadyOrder, bucket_limits, ddp_buckets
from .hook import gather_workers, reduce_flat
from .reduce import RoundedReduce
from .ring import ring_capable, ring_reduce_workers


class EmulatedStep:
    """Train on a batch as ``n`` workers per process whose gradients go through ``reduce``."""

    def __init__(self, n: int, reduce: RoundedReduce, group: Optional[Any] = None,
                 bucket_cap_mb: Optional[float] = None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`n` (workers emulated per process) must be a positive integer, got {n!r}")
        bucket_limits(bucket_cap_mb)  # refuses a bad cap now
        self.n, self.reduce, self.group, self.bucket_cap_mb = n, reduce, group, bucket_cap_mb
        self._ready: Optional[tuple[int, list[int]]] = None  # (model id, first backward's ready order)
        self.last_buckets: list[list[int]] = []
        self._synced: Optional[int] = None
        self.bytes_sent = 0  # by the ring, over the run
        self.keep_rows, self.last_rows = False, None

    def _layout(self, model, params, sizes, first: bool, device) -> list[tuple[list[int], torch.Tensor]]:
        """DDP's buckets (one in parameters() order at the first step, rebuilt from the second) with
        each bucket's columns in the flat gradient rows; built once per model and phase, not per step."""
        key = (id(model), first, str(device))
        if getattr(self, "_layout_key", None) != key:
            self.last_buckets = ddp_buckets(params, None if first else self._ready[1], self.bucket_cap_mb)
            offs = [0]
            for k in sizes:
                offs.append(offs[-1] + k)
            self._cols = [(b, torch.cat([torch.arange(offs[i], offs[i + 1], device=device) for i in b]))
                          for b in self.last_buckets]
            self._layout_key = key
        return self._cols

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model itself; under torchrun, rank 0's parameters are copied to all ranks once."""
        if self._synced != id(model):
            broadcast_state(list(model.parameters()) + list(model.buffers()), self.group)
            self._synced = id(model)
        return model

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion, optimizer,
                 amp) -> tuple[torch.Tensor, torch.Tensor]:
        if len(x) % self.n:
            raise ValueError(f"a batch of {len(x)} images cannot be split into `n` {self.n} "
                             f"equal micro-batches")
        broadcast_state(list(model.buffers()), self.group)  # as DDP's broadcast_buffers
        params = [p for p in model.parameters() if p.requires_grad]
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        # one row per worker: its flat gradient, then one 0/1 "has a gradient" column per parameter
        rows = torch.zeros(self.n, total + len(params), dtype=torch.float32, device=x.device)
        losses, outs, kept = [], [], None
        first = self._ready is None or self._ready[0] != id(model)
        recorder = ReadyOrder(params)
        for w, (xw, yw) in enumerate(zip(x.chunk(self.n), y.chunk(self.n))):
            optimizer.zero_grad(set_to_none=True)
            if w == 0 and first:  # DDP rebuilds its buckets from the first backward's ready order
                with recorder:
                    loss, out = amp.forward_backward(model, xw, yw, criterion=criterion)
            else:
                loss, out = amp.forward_backward(model, xw, yw, criterion=criterion)
            if w == 0:
                kept = [b.detach().clone() for b in model.buffers()]
            else:
                for b, k in zip(model.buffers(), kept):
                    b.data.copy_(k)
            off = 0
            for i, p in enumerate(params):
                if p.grad is not None:
                    rows[w, off:off + sizes[i]] = p.grad.detach().reshape(-1).float()
                    rows[w, total + i] = 1.0
                off += sizes[i]
            losses.append(loss)
            outs.append(out)
        shapes = [p.shape for p in params]
        if self.keep_rows:  # a copy of this process's workers' gradients (tests); the ring consumes rows
            self.last_rows = rows.clone()
        watch = amp.watch()  # the reduction's overflows reach the loss scaler, as the layers' points do
        if ring_capable(self.reduce):  # this process's workers only; partial sums go round the ring
            with watch:
                flat, sent = ring_reduce_workers(self.reduce, rows[:, :total], shapes, self.group)
            self.bytes_sent += sent
            used = rows[:, total:].amax(0)
            if group_size(self.group) > 1:
                torch.distributed.all_reduce(used, op=torch.distributed.ReduceOp.MAX, group=self.group)
            used = used > 0
        else:  # sequential (CPD's gather), or a format rounded on whole tensors only
            if group_size(self.group) > 1:
                rows = gather_workers(rows, self.group)
            flat = torch.empty(total, dtype=torch.float32, device=x.device)
            with watch:
                for bucket, cols in self._layout(model, params, sizes, first, x.device):
                    flat[cols] = reduce_flat(self.reduce, rows[:, cols], [shapes[i] for i in bucket],
                                             torch.empty(len(cols), dtype=torch.float32, device=x.device))
            used = rows[:, total:].amax(0) > 0
        off = 0
        for i, p in enumerate(params):
            p.grad = flat[off:off + sizes[i]].view_as(p).to(p.dtype) if used[i] else None
            off += sizes[i]
        if first:
            self._ready = (id(model), recorder.order)
        amp.step(optimizer)
        return torch.stack(losses).mean(), torch.cat(outs)
