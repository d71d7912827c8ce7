"""The element rule's quantize, one backend chosen: ``run_rule``.

The Numba kernels for CPU tensors, the Triton kernels for CUDA tensors (and for CPU tensors under
``TRITON_INTERPRET=1``), the PyTorch reference when asked for (or for a tile that folds into more
than four axes). PyTorch sees it through ``dispatch.quantize_format``, the custom op every family
shares (torch.compile and FakeTensor tracing, ``opcheck``).

    run_rule(x, rule, tile, keys, stats, backend) -> (out, counts or None)

``x``: contiguous float32; ``rule``: ``plan.Rule``'s 13 integers; ``tile``: the tile over ``x``'s
shape (None: element-wise; empty: the one tile of a 0-dim tensor); ``keys``: the two stochastic-rounding keys as an int64 tensor on
``x``'s device (None unless the rule rounds stochastically); ``stats``: also count (nonzero inputs,
those made zero); ``backend``: "cpu", "triton" or "reference". ``counts`` is int64 ``[2]``, or None
without ``stats`` (nothing is counted or allocated for it then).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .runtime import kernel
from .plan import Rule, canonical_4d
from .reference import quantize_reference
from .scalar import MAG
from .arrays import as_numpy

__all__ = ["run_rule"]


def _counts_torch(xb: torch.Tensor, ob: torch.Tensor) -> torch.Tensor:
    nz = (xb & MAG) != 0
    return torch.stack([nz.sum(), (nz & ((ob & MAG) == 0)).sum()])


def key_ints(keys) -> tuple[int, int]:
    """The two stochastic keys as numbers (the reference's and the Numba kernels' form): a tensor of
    them read back (once; on a CUDA tensor that is a host read, the fallback's cost), None as (0, 0)."""
    if keys is None:
        return (0, 0)
    return tuple(int(v) for v in keys.tolist()) if isinstance(keys, torch.Tensor) else keys


@functools.lru_cache(maxsize=1024)
def canonical(shape: tuple, tile: Optional[tuple]):
    return None if tile is None else canonical_4d(shape, tile)


def run_rule(x: torch.Tensor, rule, tile, keys: Optional[torch.Tensor], stats: bool,
             backend: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The op's implementation (``quantize_rule``'s arguments, ``rule`` a ``plan.Rule`` and ``tile``
    a tuple); the counts are None without ``stats``."""
    r, t = rule if isinstance(rule, Rule) else Rule(*rule), (None if tile is None else tuple(tile))
    canon = canonical(tuple(x.shape), t)
    if backend == "reference" or (t is not None and canon is None):
        x32 = x.float()  # the Triton backend hands over bfloat16/float16 as they are
        out = quantize_reference(x32, r, t, key_ints(keys))
        counts = _counts_torch(x32.view(torch.int32), out.view(torch.int32)) if stats else None
        return out.to(x.dtype), counts
    shape4, tile4 = canon if canon is not None else (None, None)
    out = torch.empty_like(x)
    if backend == "cpu":
        if x.is_cuda:
            raise ValueError("backend='cpu' needs a CPU tensor; got one on " + str(x.device))
        kernel("pages", "cpu")(out)  # huge pages for the untouched output: numba_cpu/pages.py
        nz, zc = kernel("rule", "cpu")(as_numpy(x.view(torch.int32)).reshape(-1), as_numpy(out.view(torch.int32)).reshape(-1), r,
                         shape4, tile4, key_ints(keys), stats)
        return out, (torch.tensor([nz, zc], dtype=torch.int64) if stats else None)
    return out, kernel("rule", "triton")(x, out, r, shape4, tile4, keys, stats)
