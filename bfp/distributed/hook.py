"""The low-precision gradient all-reduce as a DDP communication hook.

``ddp.register_comm_hook(RoundedHookState(reduce), rounded_allreduce_hook)`` (or
``install_rounded_hook(ddp, reduce)``, which checks the model and returns the state) replaces
DDP's float32 all-reduce of each gradient bucket by
``bfp.distributed.reduce.RoundedReduce``. The ``ring`` order runs as a ring
(``bfp.distributed.ring``: reduce-scatter and all-gather over point-to-point
messages, ``2 (W-1)/W`` of the bucket sent per rank). The ``sequential`` order
(and formats a chunk cannot be rounded alone in: NVFP4, Scaled) all-gathers
the bucket, so every rank holds all N workers' gradients and computes the same
reduction with the reference function itself (N times a ring's traffic). Both
equal the single-process reference bit for bit (tested with 2, 3 and 4 gloo
processes). With DDP a process is one worker; for N
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

from .reduce import LIBRARY_ORDERS, RoundedReduce
from .ring import ring_allreduce, ring_capable


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
    ``out`` ([numel]); the parameters lie in ``stack`` one after another with ``shapes``. A
    library's order (``gloo``, ``nccl-*``) reduces the bucket's flat buffer at once, as the library
    does, with APS still shifting each parameter by its own exponent (``RoundedReduce(stack, sizes)``)."""
    if reduce.order in LIBRARY_ORDERS:
        if sum(s.numel() for s in shapes) != out.numel():
            raise RuntimeError(f"bucket holds {out.numel()} gradient elements, its parameters "
                               f"{sum(s.numel() for s in shapes)}")
        return out.copy_(reduce(stack, [s.numel() for s in shapes]))
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
    bytes_sent: int = 0  # by the ring, over the run (the gather's traffic is not counted)
    calls: int = 0  # buckets reduced, over the run: 0 after a step means the hook never ran


def install_rounded_hook(ddp: Any, reduce: RoundedReduce, group: Optional[Any] = None) -> RoundedHookState:
    """Register ``rounded_allreduce_hook`` on ``ddp`` (a ``DistributedDataParallel``) on any device,
    and return its state (``state.calls`` counts the buckets it reduced). A model that is not a DDP
    module, or one with a communication hook already (DDP takes one), is a ValueError saying so."""
    from torch.nn.parallel import DistributedDataParallel
    if not isinstance(ddp, DistributedDataParallel):
        raise ValueError(f"the rounded all-reduce replaces DistributedDataParallel's, but the model is a "
                         f"{type(ddp).__name__}: run with 2 or more processes under DDP (torchrun), or emulate "
                         f"workers in one process (bfp.distributed.emulated)")
    state = RoundedHookState(reduce, group)
    try:
        ddp.register_comm_hook(state, rounded_allreduce_hook)
    except RuntimeError as e:
        raise ValueError(f"DDP already has a communication hook ({str(e).splitlines()[0]}): it takes one; "
                         f"leave the other out (a strategy's ddp_comm_hook, a hook of your own)") from None
    return state


def check_hook_ran(state: RoundedHookState, where: str) -> None:
    """RuntimeError unless ``state``'s hook reduced a bucket (called after a step's backward):
    without it the gradients were averaged in float32 and nothing was simulated."""
    if state.calls == 0:
        raise RuntimeError(f"{where}: the rounded all-reduce hook reduced no gradient bucket in the first "
                           f"step: the gradients were averaged in float32 and the simulation did not happen "
                           f"(was the model's DDP wrapper replaced, or are all parameters frozen?)")


def rounded_allreduce_hook(state: RoundedHookState, bucket):  # no return annotation: DDP checks it
    """DDP communication hook: a Future of the bucket with its gradients reduced by ``state.reduce``:
    round the ring (``bfp.distributed.ring``) for the ring order, else all-gathered."""
    state.calls += 1
    buf = bucket.buffer()
    shapes = [p.shape for p in bucket.parameters()]
    if ring_capable(state.reduce):
        state.bytes_sent += ring_allreduce(state.reduce, buf, shapes, state.group)
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut
    world = dist.get_world_size(state.group)
    parts = [torch.empty_like(buf) for _ in range(world)]
    work = dist.all_gather(parts, buf, group=state.group, async_op=True)

    def finish(_fut) -> torch.Tensor:
        return reduce_flat(state.reduce, torch.stack(parts, 0), shapes, buf)

    return work.get_future().then(finish)
