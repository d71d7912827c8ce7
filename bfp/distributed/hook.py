"""The low-precision gradient all-reduce as a DDP communication hook.

``ddp.register_comm_hook(RoundedHookState(reduce), rounded_allreduce_hook)``
replaces DDP's float32 all-reduce of each gradient bucket by
``bfp.distributed.reduce.RoundedReduce``: the bucket (float32, unrounded)
is all-gathered, so every rank holds all N workers' gradients, and every rank
then computes the same rounded reduction of every parameter in the bucket,
in its own shape, with the reference function itself. The wire carries N
times the data of a ring reduce-scatter; the arithmetic is exactly that of
N workers with narrow adders in the chosen order (``ring`` or
``sequential``), and the result is bit for bit the single-process reference
(tested with 2 gloo processes). With DDP a process is one worker; for N
workers per process, see ``bfp.distributed.emulated``, which uses
``gather_workers`` below.

The hook divides by the world size itself where the reduction averages
(DDP leaves that to a registered hook).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from .reduce import RoundedReduce


def gather_workers(rows: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-gather ``rows`` ([E, n], this process's E workers) into [world * E, n], in
    rank order: worker ``w`` of rank ``r`` becomes row ``r * E + w``."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(rows) for _ in range(world)]
    dist.all_gather(parts, rows.contiguous(), group=group)
    return torch.cat(parts, 0)


def reduce_flat(reduce: RoundedReduce, stack: torch.Tensor, shapes: list[torch.Size],
                out: torch.Tensor) -> torch.Tensor:
    """Reduce gathered flat buckets ``stack`` ([N, numel]) parameter by parameter into
    ``out`` ([numel]); the parameters lie in ``stack`` one after another with ``shapes``."""
    off = 0
    for shape in shapes:
        n = shape.numel()
        part = stack[:, off:off + n].reshape(stack.shape[0], *shape)
        out[off:off + n].copy_(reduce(part).reshape(-1))
        off += n
    if off != out.numel():
        raise RuntimeError(f"bucket holds {out.numel()} gradient elements, its parameters {off}")
    return out


@dataclass
class RoundedHookState:
    """What the hook needs: the reduction and the process group (None: the default)."""

    reduce: RoundedReduce
    group: Optional[Any] = None


def rounded_allreduce_hook(state: RoundedHookState, bucket):  # no return annotation: DDP checks it
    """DDP communication hook: a Future of the bucket with its gradients reduced by ``state.reduce``."""
    buf = bucket.buffer()
    shapes = [p.shape for p in bucket.parameters()]
    world = dist.get_world_size(state.group)
    parts = [torch.empty_like(buf) for _ in range(world)]
    work = dist.all_gather(parts, buf, group=state.group, async_op=True)

    def finish(_fut) -> torch.Tensor:
        return reduce_flat(state.reduce, torch.stack(parts, 0), shapes, buf)

    return work.get_future().then(finish)
