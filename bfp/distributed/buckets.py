"""DDP's gradient buckets: which parameters share one flat buffer, and in what order.

A library's reduction order (``gloo``, ``nccl-*``) cuts the *flat bucket* it is handed, so
which parameters lie in one bucket, and where, decides which worker starts which element's
sum. ``torch.nn.parallel.DistributedDataParallel`` (torch 2.x, ``distributed.py``
``_BucketCapacityConfig`` and ``_ddp_init_helper``; the C++ ``Reducer``'s
``compute_bucket_assignment_by_size`` and ``rebuild_buckets``) builds them so:

* **First iteration**: one bucket holding every parameter that requires a gradient, in
  ``model.parameters()`` order (the initial size limit is ``sys.maxsize`` unless
  ``find_unused_parameters`` or ``static_graph`` is set).
* **From the second iteration**: the buckets are rebuilt from the order in which the first
  backward made the gradients ready (rank 0's order, broadcast). Walking that order, each
  parameter joins the open bucket of its dtype and device; a bucket closes as soon as its bytes
  reach its limit (so it may exceed the limit by its last parameter); the first bucket of a
  dtype/device has the limit ``first_bucket_bytes_cap`` (1 MiB, ``dist._DEFAULT_FIRST_BUCKET_BYTES``,
  when ``bucket_cap_mb`` is left unset; else ``bucket_cap_mb``), every later one
  ``bucket_cap_mb`` (25 MiB by default). The open buckets left at the end follow, one per
  dtype/device in first-seen order. Within a bucket the parameters lie in ready order.

``ddp_buckets(params)`` gives the first iteration's buckets, ``ddp_buckets(params, ready)``
the rebuilt ones, as lists of indices into ``params``; a test checks both against the buckets a
real DDP hands its communication hook.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_CAP_MB = 25            # DDP's default bucket_cap_mb
_MB = 1024 * 1024


def bucket_limits(cap_mb: Optional[float] = None) -> tuple[int, int]:
    """(first bucket's byte limit, every later bucket's) of a DDP built with ``bucket_cap_mb``."""
    if cap_mb is None:
        return FIRST_BUCKET_BYTES, BUCKET_CAP_MB * _MB
    if isinstance(cap_mb, bool) or not isinstance(cap_mb, (int, float)) or not cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be a number of MiB > 0, got {cap_mb!r}")
    cap = int(cap_mb * _MB)
    return cap, cap


def ddp_buckets(params: Sequence[torch.Tensor], ready: Optional[Sequence[int]] = None,
                cap_mb: Optional[float] = None) -> list[list[int]]:
    """DDP's buckets (lists of indices into ``params``): the first iteration's when ``ready`` is
    None, else those rebuilt from ``ready``, the indices in gradient-ready order (module docstring).
    Parameters missing from ``ready`` (no gradient in the first backward) follow in ``params`` order."""
    if ready is None:
        return [list(range(len(params)))] if len(params) else []
    bad = [i for i in ready if not 0 <= i < len(params)]
    if bad or len(set(ready)) != len(ready):
        raise ValueError(f"ready order {list(ready)} is not a list of distinct indices of {len(params)} parameters")
    order = list(ready) + [i for i in range(len(params)) if i not in set(ready)]
    first, cap = bucket_limits(cap_mb)
    open_: dict[tuple, list[int]] = {}
    size: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}  # closed buckets per key: the first has the smaller limit
    out: list[list[int]] = []
    for i in order:
        p = params[i]
        key = (p.dtype, p.device)
        open_.setdefault(key, []).append(i)
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        if size[key] >= (first if seen.get(key, 0) == 0 else cap):
            out.append(open_.pop(key))
            size[key] = 0
            seen[key] = seen.get(key, 0) + 1
    out.extend(b for b in open_.values() if b)
    return out


class ReadyOrder:
    """Records the order in which a backward pass makes parameters' gradients ready (the
    ``AccumulateGrad`` post-hooks, where DDP's reducer hooks in): ``with ReadyOrder(params) as r:
    loss.backward()``, then ``r.order`` (indices into ``params``, each once)."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params, self.order, self._handles = list(params), [], []

    def __enter__(self) -> "ReadyOrder":
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: self._seen(i)))
        return self

    def _seen(self, i: int) -> None:
        if i not in self.order:
            self.order.append(i)

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
