"""The rounded ``ring`` reduction as the collective it simulates: a reduce-scatter round the
ring of processes, then an all-gather, over ``torch.distributed`` point-to-point messages.

``ring_allreduce(reduce, buf, shapes)`` gives every rank what ``RoundedReduce`` (``order=
"ring"``) computes from all ranks' gradients: the same bits (tested for 2, 3 and 4 gloo
processes, Float, BlockFloat and MX, APS, Kahan, both divides, shapes that do not split
evenly). Each rank holds only its own gradient and, per step, one chunk in flight:

1. ``average`` with ``divide="before"``: its values divided by W; ``aps``: the shift of
   every parameter from the largest magnitude over all ranks (one small MAX all-reduce),
   then its values rounded to ``reduce.fmt`` in each parameter's shape.
2. Reduce-scatter, W-1 steps: at step j rank r sends chunk ``(r - j) mod W`` of every
   parameter in the bucket (with its Kahan compensation, if any) to rank r+1 and receives
   chunk ``(r - j - 1) mod W`` from rank r-1, to which it adds its own rounded chunk,
   rounding every operation as the reference does. Chunk k thus starts at worker k and
   travels once round the ring (the chunks are ``reduce.ring_owner``'s: whole tiles of the
   first axis, so rounding a chunk equals rounding it inside the whole tensor).
3. Rank r now holds the sum of chunk ``(r + 1) mod W``: shifted back (APS) and divided by W
   (``divide="after"``), then passed round the ring W-1 more steps (all-gather).

Each rank sends ``2 (W - 1) / W`` of the bucket per step (Kahan: ``3 (W - 1) / W``, the
compensation travels with the partial sums), as NCCL's and gloo's rings do; the step
returns the bytes it sent. Formats whose rounding depends on the whole tensor (NVFP4's
tensor scale, ``Scaled``) cannot be split into chunks and keep the gather
(``bfp.distributed.hook``), as does the ``sequential`` order (CPD's, inherently serial).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ..nvfp4 import NVFP4
from ..scaled import Scaled
from .reduce import RoundedReduce, _shift_up, aps_shift, ring_owner


def ring_capable(reduce: RoundedReduce) -> bool:
    """True when ``ring_allreduce`` can run ``reduce`` (ring order, a chunkable format)."""
    return reduce.order == "ring" and not isinstance(reduce.fmt, (NVFP4, Scaled))


def _chunks(shape: torch.Size, world: int, fmt) -> list[tuple[int, int]]:
    """Flat element ranges of the W chunks of a parameter of ``shape``."""
    shape = tuple(shape) or (1,)
    owner = ring_owner(shape, world, fmt)
    row = 1
    for d in shape[1:]:
        row *= d
    out = []
    for k in range(world):
        rows = (owner == k).nonzero().flatten()
        out.append((int(rows[0]) * row, (int(rows[-1]) + 1) * row) if len(rows) else (0, 0))
    return out


def _q_chunk(reduce: RoundedReduce, t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Round a flat chunk (whole rows of a parameter of ``shape``) in its own rows' shape."""
    if reduce.fmt is None or t.numel() == 0:
        return t
    shape = tuple(shape) or (1,)
    return reduce._q(t.reshape(-1, *shape[1:])).reshape(-1)


def _exchange(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int, group) -> None:
    right, left = (rank + 1) % world, (rank - 1) % world
    ops = [dist.P2POp(dist.isend, send, dist.get_global_rank(group, right) if group else right, group),
           dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, left) if group else left, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_allreduce(reduce: RoundedReduce, buf: torch.Tensor, shapes: list[torch.Size],
                   group: Optional[Any] = None) -> int:
    """Reduce the flat bucket ``buf`` (this rank's gradients of parameters of ``shapes``, one
    after another) over the ring, in place; returns the bytes this rank sent."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    offs, off = [], 0
    for s in shapes:
        offs.append(off)
        off += s.numel()
    if off != buf.numel():
        raise RuntimeError(f"bucket holds {buf.numel()} gradient elements, its parameters {off}")
    with torch.autocast(buf.device.type, enabled=False):
        v = buf.float().clone()
        if reduce.average and reduce.divide == "before":
            v = v / world
        shifts = [0] * len(shapes)
        if reduce.aps:  # the largest magnitude over all ranks, per parameter (non-finite: +inf)
            amax = torch.stack([v[o:o + s.numel()].abs().max() if s.numel() else v.new_zeros(())
                                for o, s in zip(offs, shapes)])
            amax = torch.where(torch.isfinite(amax), amax, torch.inf)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
            for i, a in enumerate(amax.tolist()):
                shifts[i] = aps_shift(torch.tensor([[a]] * world), reduce.fmt)
        own = []
        for i, (o, s) in enumerate(zip(offs, shapes)):
            t = _shift_up(v[o:o + s.numel()], shifts[i])
            own.append(reduce._q(t.reshape(tuple(s) or (1,))).reshape(-1) if reduce.fmt is not None else t)
        chunks = [_chunks(s, world, reduce.fmt) for s in shapes]
        part, sent = _reduce_scatter(reduce, own, shapes, chunks, world, rank, group)
        mine = (rank + 1) % world  # the chunk whose whole sum this rank now holds
        for i, (p, c) in enumerate(zip(part, chunks)):
            a, b = c[mine]
            x = _shift_up(p[a:b], -shifts[i])
            if reduce.average and reduce.divide == "after":
                x = x / world
            p[a:b] = x
        sent += _all_gather(part, chunks, world, rank, group)
        for p, o, s in zip(part, offs, shapes):
            buf[o:o + s.numel()].copy_(p)
    return sent


def _reduce_scatter(reduce: RoundedReduce, own: list[torch.Tensor], shapes, chunks, world: int, rank: int,
                    group) -> tuple[list[torch.Tensor], int]:
    """W-1 steps; afterwards rank r's ``part`` holds the rounded sum of chunk (r + 1) mod W."""
    part = [t.clone() for t in own]
    comp = [torch.zeros_like(t) for t in own] if reduce.kahan else None
    sent = 0
    for j in range(world - 1):
        k_out, k_in = (rank - j) % world, (rank - j - 1) % world
        pieces = [p[c[k_out][0]:c[k_out][1]] for p, c in zip(part, chunks)]
        if comp is not None:
            pieces += [p[c[k_out][0]:c[k_out][1]] for p, c in zip(comp, chunks)]
        send = torch.cat(pieces)
        n_in = sum(c[k_in][1] - c[k_in][0] for c in chunks)
        recv = send.new_empty(n_in * (2 if comp is not None else 1))
        _exchange(send, recv, rank, world, group)
        sent += send.numel() * send.element_size()
        off = 0
        for i, (s, c) in enumerate(zip(shapes, chunks)):
            a, b = c[k_in]
            s_in, t = recv[off:off + b - a], own[i][a:b]
            if comp is None:
                part[i][a:b] = _q_chunk(reduce, s_in + t, s)
            else:  # as RoundedReduce._sum: y = q(t - c); s' = q(s + y); c = q(q(s' - s) - y)
                c_in = recv[n_in + off:n_in + off + b - a]
                y = _q_chunk(reduce, t - c_in, s)
                tot = _q_chunk(reduce, s_in + y, s)
                comp[i][a:b] = _q_chunk(reduce, _q_chunk(reduce, tot - s_in, s) - y, s)
                part[i][a:b] = tot
            off += b - a
    return part, sent


def _all_gather(part: list[torch.Tensor], chunks, world: int, rank: int, group) -> int:
    """W-1 steps passing the finished chunks on; returns the bytes sent."""
    sent = 0
    for j in range(world - 1):
        k_out, k_in = (rank + 1 - j) % world, (rank - j) % world
        send = torch.cat([p[c[k_out][0]:c[k_out][1]] for p, c in zip(part, chunks)])
        recv = send.new_empty(sum(c[k_in][1] - c[k_in][0] for c in chunks))
        _exchange(send, recv, rank, world, group)
        sent += send.numel() * send.element_size()
        off = 0
        for p, c in zip(part, chunks):
            a, b = c[k_in]
            p[a:b] = recv[off:off + b - a]
            off += b - a
    return sent
