"""The blocked Hadamard transform of ``bfp.hadamard.transform_rows`` as a Numba CPU kernel,
bit for bit the reference's float32 steps (tests/test_hadamard.py). Imported, and compiled, on
first use.

The input is seen as ``(A, R, C)``: ``R`` the rows transformed in blocks of ``b``, ``A`` the
axes before, ``C`` the columns. A work item takes a run of row blocks (about ``COLS`` columns'
worth, so narrow tensors still give long items) and up to ``COLS`` columns; each block of ``b``
rows (zero past ``R``) goes into a scratch array, runs the ``log2 b`` butterfly stages along
the rows (each ``u + v`` and ``u - v`` in float32, in the reference's order, the inner loop
over the columns so it vectorises), multiplies row ``i`` by ``factor[i]`` and writes the
block: one read and one write of the tensor, against the reference's batched GEMM.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from .pages import advise
from ..arrays import as_numpy

COLS = 1024  # columns per work item


@njit(inline="always")
def load_transformed(x, t, factor, a, rb, Rin, C, c0, w, b):
    """Rows ``rb*b ..`` of item ``a`` (zero past ``Rin``), columns ``c0:c0+w``, into ``t``,
    transformed: the butterflies, then row ``i`` times ``factor[i]``."""
    have = min(b, Rin - rb * b)
    for i in range(b):
        src = (a * Rin + rb * b + i) * C + c0
        for c in range(w):
            t[i, c] = x[src + c] if i < have else np.float32(0.0)
    h = 1
    while h < b:
        for g in range(0, b, 2 * h):
            for j in range(g, g + h):
                for c in range(w):
                    u, v = t[j, c], t[j + h, c]
                    t[j, c] = u + v
                    t[j + h, c] = u - v
        h *= 2
    for i in range(b):
        f = factor[i]
        for c in range(w):
            t[i, c] = t[i, c] * f


@njit(inline="always")
def work_items(nb, C, cols):
    """How ``nb`` row blocks x ``C`` columns split into work items of about ``cols`` columns:
    (column runs, row blocks per item, row-block runs); narrow tensors still give long items."""
    ncc = (C + cols - 1) // cols
    per = max(1, cols // min(C, cols))
    return ncc, per, (nb + per - 1) // per


@njit(parallel=True, cache=True)
def _transform(x, out, factor, A, R, C, b):
    nb = (R + b - 1) // b
    ncc, per, nrr = work_items(nb, C, COLS)
    for s in prange(A * nrr * ncc):
        a, rr, cc = s // (nrr * ncc), (s // ncc) % nrr, s % ncc
        c0, c1 = cc * COLS, min(C, cc * COLS + COLS)
        w = c1 - c0
        t = np.empty((b, w), np.float32)  # one scratch block per item
        for rb in range(rr * per, min(nb, rr * per + per)):
            load_transformed(x, t, factor, a, rb, R, C, c0, w, b)
            for i in range(b):
                dst = (a * nb * b + rb * b + i) * C + c0
                for c in range(w):
                    out[dst + c] = t[i, c]


def transform_rows(t: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous CPU float32, rows on dim -2) transformed in blocks of ``len(factor)``
    rows; the result has the rows padded up to whole blocks."""
    b = factor.numel()
    R, C = t.shape[-2], t.shape[-1]
    A = t.numel() // max(R * C, 1)
    rows = -(-R // b) * b
    out = torch.empty(*t.shape[:-2], rows, C, dtype=torch.float32)
    if out.numel() == 0:
        return out
    advise(out)
    _transform(as_numpy(t.reshape(-1)), as_numpy(out.view(-1)), as_numpy(factor), A, R, C, b)
    return out
