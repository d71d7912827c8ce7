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
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import Float, Format

__all__ = ["GLOO_MAX_SEGMENT", "gloo_segments", "gloo_chunks", "gloo_order", "element_bytes"]

GLOO_MAX_SEGMENT = 1 << 20  # gloo::AllreduceOptions::kMaxSegmentSize (gloo/allreduce.h)


def element_bytes(fmt: Optional[Format]) -> int:
    """Bytes of one element on the wire: the storage of a ``Float`` of 1 + exp + man bits
    (1, 2 or 4 bytes), 4 for float32 (``None``)."""
    if fmt is None:
        return 4
    if not isinstance(fmt, Float):
        raise ValueError(f"a library's reduction order cuts a flat buffer of scalars; {fmt!r} is a block "
                         f"format, whose tiles the cuts would split (use a Float transport, or the "
                         f"per-parameter order 'ring')")
    bits = 1 + fmt.exp + fmt.man
    return 1 if bits <= 8 else 2 if bits <= 16 else 4


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
