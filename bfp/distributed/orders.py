"""The order in which real collective libraries add W workers' values, element by element.

``gloo`` (``gloo/allreduce.cc``, ``ring()``; what ``ProcessGroupGloo`` runs for a dense CPU
``all_reduce``): the *flat buffer* of ``n`` elements of ``es`` bytes is cut into ``S`` segments,

    maxSegmentBytes = es * max(1, maxSegmentSize // es)         (maxSegmentSize: 1 MiB, allreduce.h)
    S = roundUp(max(ceil(n * es / maxSegmentBytes), 2 W), W)
    segmentBytes = roundUp(ceil(n * es / S), es)                 (so ceil(n / S) elements each)

``P = S / W`` consecutive segments form chunk ``c`` (the last chunks may be short or empty:
10 elements over 3 ranks are chunks of 4, 4 and 2). In the reduce-scatter, rank ``r`` sends
segment ``(r + 1) P + i`` to rank ``r - 1`` and reduces what rank ``r + 1`` sends it
(``computeReduceScatterOffsets``), so chunk ``c`` is started by rank ``c - 1`` (its own value),
and ranks ``c - 2, c - 3, ...`` each add their own value to what they received, the last being
rank ``c``: the sum is ``(((x[c-1] + x[c-2]) + x[c-3]) + ... ) + x[c]`` (ranks mod W). Each add
is gloo's ``sum<T>``: for ``float16``/``bfloat16`` the two values widened to float32, added in
float32 (round to nearest even) and rounded back to nearest even, overflow giving +-inf. The
all-gather only copies. With W = 2 every order agrees (float addition commutes).

``gloo_chunks(n, world, es)`` gives every element's chunk, ``gloo_order(c, world)`` the ranks in
the order they add chunk ``c``; ``element_bytes(fmt)`` the transport's element size (a ``Float``
of at most 8 bits: 1, at most 16: 2, else 4; None (float32): 4).

``nccl-ring`` (NCCL's ``src/device/all_reduce.h``, ``runRing``): the buffer is cut into one
contiguous part per channel (``ncclCollCbdPart``; here: equal parts in units of 16 bytes, the
first parts one unit longer, a simplification of ``enqueue.cc``'s cell split, whose exact sizes
depend on NCCL's tuner), each part into blocks of ``nranks * chunkCount`` elements (``chunkCount``
= the protocol's chunk, ``NCCL_CHUNK_BYTES`` / es: Simple 2 MiB, LL 32 KiB, LL128 576,000 B;
``calcCollChunking`` may shrink it for small messages: set ``chunk_bytes``), the last block's
``chunkCount = alignUp(ceil(rem / nranks), 16 / es)``. Chunk ``j`` of a block is sent first by
ring index ``j + 1`` (step 0: ``chunk = ringIx + nranks - 1``), reduced at ``j + 2``, ..., and
finished at ring index ``j`` (step k-1: ``chunk = ringIx``). A channel's ring is a permutation of
the ranks (``rings``; default 0..W-1 for every channel, what one node without a topology file
gets; ``NCCL_DEBUG=INFO`` prints the real ones as "Channel 00 : 0 1 2 3").

``nccl-tree`` (``runTreeUpDown``; ``src/graph/trees.cc``, ``connect.cc``): ``nodes`` nodes of
``W / nodes`` ranks (rank = node * R + local). Inside a node a chain: local rank 0 is the node's
head, local ``i``'s child is ``i + 1``. Between nodes a double binary tree over node indices
(``ncclGetDtree``): tree 0 is ``ncclGetBtree``, tree 1 its mirror (even node count) or shifted by
one (odd). Every rank folds its own value, then its chain child's partial sum, then its tree
children ``d0``, ``d1`` (the heads of those nodes), in that order (``tree->down`` is filled so:
chain child in ``ncclTopoPreset``, then ``setTreeDown`` d0, d1), each add rounded. NCCL doubles the
tree channels, the second half using tree 1: here channel ``c`` of ``channels`` uses tree 0 when
``c < ceil(channels / 2)``, else tree 1.

Neither NCCL order has been compared with a real NCCL here (no GPU): ``benchmarks/nccl_check.py``
does that on a GPU machine; the tests check hand-derived tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..formats import Format

__all__ = ["GLOO_MAX_SEGMENT", "gloo_segments", "gloo_chunks", "gloo_order", "element_bytes", "NcclOptions",
           "NCCL_CHUNK_BYTES", "channel_parts", "nccl_ring_groups", "nccl_reduce_scatter_groups", "btree", "dtree", "nccl_tree"]

NCCL_CHUNK_BYTES = {"simple": 2 << 20, "ll": 32 << 10, "ll128": 576_000}


@dataclass(frozen=True)
class NcclOptions:
    """How an NCCL collective is laid out (module docstring): channels, protocol (its chunk, or
    ``chunk_bytes``), nodes (for the tree), and each channel's ring order (``rings``)."""

    channels: int = 1
    protocol: str = "simple"
    nodes: int = 1
    chunk_bytes: Optional[int] = None
    rings: tuple = ()

    def __post_init__(self):
        if isinstance(self.channels, bool) or not isinstance(self.channels, int) or not 1 <= self.channels <= 64:
            raise ValueError(f"`nccl_channels` must be an integer in 1..64, got {self.channels!r}")
        if self.protocol not in NCCL_CHUNK_BYTES:
            raise ValueError(f"`nccl_proto` {self.protocol!r} unknown; allowed: {', '.join(NCCL_CHUNK_BYTES)}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"`nodes` must be a positive integer, got {self.nodes!r}")
        if self.chunk_bytes is not None and (not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 16):
            raise ValueError(f"chunk_bytes must be an integer >= 16, got {self.chunk_bytes!r}")
        object.__setattr__(self, "rings", tuple(tuple(r) for r in self.rings))

    def ring(self, channel: int, world: int) -> tuple[int, ...]:
        ring = self.rings[channel % len(self.rings)] if self.rings else tuple(range(world))
        if sorted(ring) != list(range(world)):
            raise ValueError(f"ring {list(ring)} of channel {channel} is not a permutation of the {world} ranks")
        return ring

GLOO_MAX_SEGMENT = 1 << 20  # gloo::AllreduceOptions::kMaxSegmentSize (gloo/allreduce.h)


def element_bytes(fmt: Optional[Format]) -> int:
    """Bytes of one element on the wire: the storage of a ``Float`` of 1 + exp + man bits
    (1, 2 or 4 bytes), 4 for float32 (``None``)."""
    if fmt is None:
        return 4
    if fmt.transport_bytes() is None:
        raise ValueError(f"a library's reduction order cuts a flat buffer of scalars; {fmt!r} is a block "
                         f"format, whose tiles the cuts would split (use a Float transport, or the "
                         f"per-parameter order 'param-ring')")
    return fmt.transport_bytes()


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def gloo_segments(n: int, world: int, es: int, max_segment: int = GLOO_MAX_SEGMENT) -> tuple[int, int, int]:
    """(segments S, segments per chunk P, elements per segment) of gloo's ring for ``n`` elements."""
    if n < 1 or world < 1 or es < 1:
        raise ValueError(f"gloo_segments needs n, world, es >= 1, got {n}, {world}, {es}")
    max_bytes = es * max(1, max_segment // es)
    s = _round_up(max(-(-(n * es) // max_bytes), 2 * world), world)
    return s, s // world, -(-n // s)


def gloo_chunks(n: int, world: int, es: int, max_segment: int = GLOO_MAX_SEGMENT) -> torch.Tensor:
    """The chunk (0..W-1) of each of ``n`` flat elements in gloo's ring (module docstring)."""
    s, p, per = gloo_segments(n, world, es, max_segment)
    return torch.arange(n) // per // p


def gloo_order(chunk: int, world: int) -> list[int]:
    """The ranks that add chunk ``chunk``, in order: ``chunk - 1``, ``chunk - 2``, ..., ``chunk``."""
    return [(chunk - 1 - k) % world for k in range(world)]


def channel_parts(n: int, channels: int, es: int) -> list[tuple[int, int]]:
    """(offset, count) of each channel's contiguous part of ``n`` elements: equal parts in units of
    16 bytes (``16 // es`` elements), the first parts one unit longer, empty channels dropped."""
    unit = max(1, 16 // es)
    units = -(-n // unit)
    base, extra = divmod(units, channels)
    out, off = [], 0
    for c in range(channels):
        count = min((base + (c < extra)) * unit, n - off)
        if count > 0:
            out.append((off, count))
        off += max(count, 0)
    return out


def nccl_ring_groups(n: int, world: int, es: int, opts: NcclOptions = NcclOptions()) -> tuple[torch.Tensor, list]:
    """(the group of every element, each group's ranks in the order they add it) for NCCL's ring."""
    group = torch.empty(n, dtype=torch.long)
    orders: list[tuple[int, ...]] = []
    index: dict[tuple[int, ...], int] = {}
    chunk = (opts.chunk_bytes or NCCL_CHUNK_BYTES[opts.protocol]) // es
    align = max(1, 16 // es)
    for ch, (off, count) in enumerate(channel_parts(n, opts.channels, es)):
        ring = opts.ring(ch, world)
        elem = 0
        while elem < count:
            rem, cc = count - elem, chunk
            if rem < world * chunk:
                cc = -(-(-(-rem // world)) // align) * align
            for j in range(world):
                a, b = elem + j * cc, min(elem + (j + 1) * cc, count)
                if b <= a:
                    continue
                seq = tuple(ring[(j + 1 + k) % world] for k in range(world))
                group[off + a:off + b] = index.setdefault(seq, len(index))
                if len(orders) < len(index):
                    orders.append(seq)
            elem += world * cc
    return group, orders


def nccl_reduce_scatter_groups(n: int, world: int, es: int, opts: NcclOptions = NcclOptions()
                               ) -> tuple[torch.Tensor, list]:
    """(the group of every element of a reduce-scatter's flat input of ``world * n`` elements, each
    group's ranks in the order they add it) for NCCL's ring reduce-scatter (``src/device/
    reduce_scatter.h``, ``runRing``): rank ``d``'s segment (elements ``d * n`` to ``(d + 1) * n``) is
    sent first by the rank after ``d`` on the channel's ring (step 0: ``rankDest = ringRanks[nranks -
    1]``), each next rank adds its own value (``recvReduceSend``) and ``d`` adds last
    (``recvReduceCopy``). Each segment is cut into the channels' parts as ``channel_parts`` cuts an
    all-reduce's buffer (``ncclCollCbdPart`` over the per-rank count), each channel adding around its
    own ring; the protocol's chunks do not change the order."""
    group = torch.empty(world * n, dtype=torch.long)
    orders: list[tuple[int, ...]] = []
    index: dict[tuple[int, ...], int] = {}
    for ch, (off, count) in enumerate(channel_parts(n, opts.channels, es)):
        ring = opts.ring(ch, world)
        pos = {r: i for i, r in enumerate(ring)}
        for d in range(world):
            seq = tuple(ring[(pos[d] + 1 + k) % world] for k in range(world))
            group[d * n + off:d * n + off + count] = index.setdefault(seq, len(index))
            if len(orders) < len(index):
                orders.append(seq)
    return group, orders


def btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """(parent, child 0, child 1) of ``rank`` in ``ncclGetBtree`` (-1: none)."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    d0 = -1 if low == 0 else rank - low
    d1 = -1 if low == 0 else rank + low
    while d1 >= nranks:
        d1 = -1 if low == 0 else rank + low
        low >>= 1
    return up, d0, d1


def dtree(nranks: int, rank: int, tree: int) -> tuple[int, int, int]:
    """(parent, child 0, child 1) of ``rank`` in tree 0 or 1 of ``ncclGetDtree``."""
    if tree == 0:
        return btree(nranks, rank)
    if nranks % 2 == 1:  # shifted by one
        u, d0, d1 = btree(nranks, (rank - 1 + nranks) % nranks)
        return tuple(-1 if x == -1 else (x + 1) % nranks for x in (u, d0, d1))
    u, d0, d1 = btree(nranks, nranks - 1 - rank)  # mirrored
    return tuple(-1 if x == -1 else nranks - 1 - x for x in (u, d0, d1))


def nccl_tree(world: int, nodes: int, tree: int) -> tuple:
    """The fold of tree ``tree``: a nested ``(rank, (child, child, ...))``, each rank adding its own
    value, then its children's partial sums in order (chain child, then d0, d1)."""
    if world % nodes:
        raise ValueError(f"{world} ranks do not split into {nodes} nodes of equal size")
    per = world // nodes

    def head(node: int) -> int:
        return node * per

    def fold(rank: int) -> tuple:
        node, local = divmod(rank, per)
        kids = [rank + 1] if local + 1 < per else []
        if local == 0:
            _, d0, d1 = dtree(nodes, node, tree)
            kids += [head(d) for d in (d0, d1) if d != -1]
        return rank, tuple(fold(k) for k in kids)

    root = next(k for k in range(nodes) if dtree(nodes, k, tree)[0] == -1)
    return fold(head(root))
