"""The rounded ``ring`` reduction as the collective it simulates: a reduce-scatter round the
ring of processes, then an all-gather, over ``torch.distributed`` point-to-point messages.

``ring_allreduce(reduce, buf, shapes)`` gives every rank what ``RoundedReduce`` (``order=
"param-ring"``) computes from all ranks' gradients: the same bits (tested for 2, 3 and 4 gloo
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

import functools
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import overflow
from .reduce import RoundedReduce, _shift_up, aps_shift, ring_owner


def ring_capable(reduce: RoundedReduce) -> bool:
    """True when ``ring_allreduce`` can run ``reduce`` (ring order, a chunkable format)."""
    return reduce.order == "param-ring" and reduce.divide in ("before", "after") and \
        (reduce.fmt is None or reduce.fmt.chunkable)


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
    """Send ``send`` to the right neighbour and receive ``recv`` from the left one, at once (an
    empty side is skipped: both ends of a link know its size)."""
    right, left = (rank + 1) % world, (rank - 1) % world
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, dist.get_global_rank(group, right) if group else right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, left) if group else left, group))
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()


def ring_allreduce(reduce: RoundedReduce, buf: torch.Tensor, shapes: list[torch.Size],
                   group: Optional[Any] = None) -> int:
    """Reduce the flat bucket ``buf`` (this rank's gradients of parameters of ``shapes``, one
    after another) over the ring of processes, in place; returns the bytes this rank sent."""
    out, sent = ring_reduce_workers(reduce, buf.reshape(1, -1), shapes, group)  # rounds buf in place
    buf.copy_(out)
    return sent


@functools.lru_cache(maxsize=4096)
def _visits(k: int, procs: int, local: int) -> list[tuple[int, int, int]]:
    """Where chunk ``k`` (starting at worker k of W = procs x local) is added, in order, as
    (process, first local worker, end): the rest of its own process, every other process
    whole, then the first workers of its own process."""
    p0, s0 = divmod(k, local)
    out = [(p0, s0, local)] + [((p0 + i) % procs, 0, local) for i in range(1, procs)]
    return out + ([(p0, 0, s0)] if s0 else [])


def ring_reduce_workers(reduce: RoundedReduce, rows: torch.Tensor, shapes: list[torch.Size],
                        group: Optional[Any] = None) -> tuple[torch.Tensor, int]:
    """The ring reduction of W = processes x E workers, this process holding its E workers'
    flat gradients ``rows`` ([E, numel]; workers ``rank * E ..``; float32 rows are overwritten
    with the rounded addends): (the reduced flat gradient, the bytes this rank sent). Memory:
    ``rows``, the partial sums passing through (at most one gradient's worth) and the result. Each chunk's partial sum passes the workers in ring order, E at
    a time inside a process, one message per step between neighbouring processes."""
    procs = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    rank = dist.get_rank(group) if procs > 1 else 0
    local = rows.shape[0]
    world = procs * local
    offs, off = [], 0
    for s in shapes:
        offs.append(off)
        off += s.numel()
    if off != rows.shape[1]:
        raise RuntimeError(f"gradient rows hold {rows.shape[1]} elements, their parameters {off}")
    with torch.autocast(rows.device.type, enabled=False):
        # in place: rows become every local worker's shifted, rounded gradient (no second copy)
        own = rows if rows.dtype == torch.float32 else rows.float()
        if reduce.average and reduce.divide == "before":
            own.div_(world)
        shifts = _aps_shifts(reduce, own, offs, shapes, world, procs, group)
        for i, (o, s) in enumerate(zip(offs, shapes)):
            for w in range(local):
                t = _shift_up(own[w, o:o + s.numel()], shifts[i])
                overflow.check("reduce", t, reduce.fmt)  # a worker's gradient beyond the format
                own[w, o:o + s.numel()] = t if reduce.fmt is None else \
                    reduce._q(t.reshape(tuple(s) or (1,))).reshape(-1)
        pieces = _pieces(reduce.fmt, tuple(tuple(x) for x in shapes), world)  # chunk k -> [(param, a, b)]
        out = own.new_empty(own.shape[1])  # the partial sums live here, then the result
        comp = torch.zeros_like(out) if reduce.kahan else None
        finished, sent = _reduce_scatter(reduce, own, out, comp, shapes, pieces, procs, local, rank, group)
        for k in finished:  # finish the chunks whose sums end here
            for i, a, b in pieces[k]:
                t = _shift_up(out[a:b], -shifts[i])
                out[a:b] = t / world if reduce.average and reduce.divide == "after" else t
        sent += _all_gather(out, pieces, procs, local, rank, group)
    return out, sent


def _aps_shifts(reduce, v, offs, shapes, world, procs, group) -> list[int]:
    """Per parameter, the APS shift from the largest magnitude over all workers (0 without APS)."""
    if not reduce.aps:
        return [0] * len(shapes)
    # worker by worker: a max over all rows at once would take a temporary of E parameters
    amax = torch.stack([torch.stack([row[o:o + s.numel()].abs().max() for row in v]).max() if s.numel()
                        else v.new_zeros(()) for o, s in zip(offs, shapes)])
    amax = torch.where(torch.isfinite(amax), amax, torch.inf)  # NaN/Inf anywhere: no shift
    if procs > 1:
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return [aps_shift(torch.full((world, 1), a), reduce.fmt) for a in amax.tolist()]


@functools.lru_cache(maxsize=64)
def _pieces(fmt, shapes: tuple, world: int) -> list[list[tuple[int, int, int]]]:
    """Chunk k's flat ranges (param, start, end) in a bucket of ``shapes``: the same every step,
    so computed once per bucket layout (read only)."""
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    o = 0
    for i, s in enumerate(shapes):
        for k, (a, b) in enumerate(_chunks(torch.Size(s), world, fmt)):
            if b > a:
                pieces[k].append((i, o + a, o + b))
        o += torch.Size(s).numel()
    return pieces


def _add_workers(reduce, own, out, comp, pieces_k, shapes, workers, first: bool) -> None:
    """Add the local workers ``workers`` (in order) to chunk k's partial sum in ``out`` (and
    Kahan's compensation in ``comp``), rounding every operation per parameter piece as
    ``RoundedReduce._sum`` does; the first term of a chunk starts its sum."""
    for w in workers:
        for i, a, b in pieces_k:
            t, s = own[w, a:b], shapes[i]
            if first:
                out[a:b] = t
                if comp is not None:
                    comp[a:b] = 0
            elif comp is not None:
                sp = out[a:b].clone()
                y = _q_chunk(reduce, t - comp[a:b], s)
                tot = _q_chunk(reduce, sp + y, s)
                comp[a:b] = _q_chunk(reduce, _q_chunk(reduce, tot - sp, s) - y, s)
                out[a:b] = tot
            else:
                x = out[a:b] + t
                overflow.check("reduce", x, reduce.fmt)  # a watching loss scaler sees the sum overflow
                out[a:b] = _q_chunk(reduce, x, s)
        first = False


def _gather_pieces(bufs, ks, pieces) -> torch.Tensor:
    parts = [buf[a:b] for buf in bufs for k in ks for _, a, b in pieces[k]]
    return torch.cat(parts) if parts else bufs[0].new_empty(0)


def _scatter_pieces(recv: torch.Tensor, bufs, ks, pieces) -> None:
    pos = 0
    for buf in bufs:
        for k in ks:
            for _, a, b in pieces[k]:
                buf[a:b] = recv[pos:pos + b - a]
                pos += b - a


def _reduce_scatter(reduce, own, out, comp, shapes, pieces, procs, local, rank, group):
    """Run every chunk along its visits, one step per visit; the partial sums (and Kahan's
    compensations) of the chunks going on are sent to the right neighbour after each step.
    Returns (the chunks whose last visit is this rank, bytes sent)."""
    world = procs * local
    visits = [_visits(k, procs, local) for k in range(world)]
    bufs = [out] + ([comp] if comp is not None else [])
    finished, sent = [], 0
    for t in range(max(len(v) for v in visits)):
        here = [k for k in range(world) if t < len(visits[k]) and visits[k][t][0] == rank]
        for k in here:
            _, a, b = visits[k][t]
            _add_workers(reduce, own, out, comp, pieces[k], shapes, range(a, b), t == 0)
            if t + 1 == len(visits[k]):
                finished.append(k)
        if procs == 1:  # the next visit is here too: nothing to send
            continue
        outgoing = [k for k in here if t + 1 < len(visits[k])]
        incoming = [k for k in range(world) if t + 1 < len(visits[k]) and visits[k][t + 1][0] == rank]
        send = _gather_pieces(bufs, outgoing, pieces)
        recv = out.new_empty(len(bufs) * sum(b - a for k in incoming for _, a, b in pieces[k]))
        _exchange(send, recv, rank, procs, group)
        sent += send.numel() * send.element_size()
        _scatter_pieces(recv, bufs, incoming, pieces)
    return finished, sent


def _final_rank(k: int, procs: int, local: int) -> int:
    return _visits(k, procs, local)[-1][0]


def _all_gather(out: torch.Tensor, pieces, procs, local, rank, group) -> int:
    """Pass every finished chunk round the ring (procs - 1 steps) so every rank has them all."""
    world, sent = procs * local, 0
    for j in range(procs - 1):
        out_k = [k for k in range(world) if _final_rank(k, procs, local) == (rank - j) % procs]
        in_k = [k for k in range(world) if _final_rank(k, procs, local) == (rank - j - 1) % procs]
        send = _gather_pieces([out], out_k, pieces)
        recv = out.new_empty(sum(b - a for k in in_k for _, a, b in pieces[k]))
        _exchange(send, recv, rank, procs, group)
        sent += send.numel() * send.element_size()
        _scatter_pieces(recv, [out], in_k, pieces)
    return sent
