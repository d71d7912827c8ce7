"""The quantize entry point as an operator PyTorch understands: ``torch.ops.bfp.quantize_rule``.

A ``torch.library.custom_op`` with a fake (meta) implementation, so ``torch.compile``, FakeTensor
tracing and ``torch.library.opcheck`` see a quantization as one opaque op with known output
shapes, and the backends sit behind it: the Numba kernels for CPU tensors, the Triton kernels for
CUDA tensors (and for CPU tensors under ``TRITON_INTERPRET=1``), the PyTorch reference when asked
for (or for a tile that folds into more than four axes).

    quantize_rule(x, rule, tile, keys, stats, backend) -> (out, counts)

``x``: contiguous float32; ``rule``: ``plan.Rule``'s 13 integers; ``tile``: the tile over ``x``'s
shape (empty: element-wise); ``keys``: the two stochastic-rounding keys as an int64 tensor on
``x``'s device (None unless the rule rounds stochastically); ``stats``: also count (nonzero inputs,
those made zero); ``backend``: "cpu", "triton" or "reference". ``counts`` is int64 ``[2]``, or
``[0]`` without ``stats`` (nothing is counted or allocated for it then).
"""
from __future__ import annotations

from typing import Optional

import torch

from .pages import advise
from .plan import Rule, canonical_4d
from .reference import quantize_reference
from .scalar import MAG

__all__ = ["quantize_rule"]


def _counts_torch(xb: torch.Tensor, ob: torch.Tensor) -> torch.Tensor:
    nz = (xb & MAG) != 0
    return torch.stack([nz.sum(), (nz & ((ob & MAG) == 0)).sum()])


def _key_ints(keys: Optional[torch.Tensor]) -> tuple[int, int]:
    return (0, 0) if keys is None else tuple(int(v) for v in keys.tolist())


@torch.library.custom_op("bfp::quantize_rule", mutates_args=())
def quantize_rule(x: torch.Tensor, rule: list[int], tile: list[int], keys: Optional[torch.Tensor], stats: bool,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    r, t = Rule(*rule), (tuple(tile) or None)
    canon = None if t is None else canonical_4d(tuple(x.shape), t)
    none = x.new_empty(0, dtype=torch.int64)
    if backend == "reference" or (t is not None and canon is None):
        out = quantize_reference(x, r, t, _key_ints(keys))
        return out, (_counts_torch(x.view(torch.int32), out.view(torch.int32)) if stats else none)
    shape4, tile4 = canon if canon is not None else (None, None)
    out = torch.empty_like(x)
    if backend == "cpu":
        if x.is_cuda:
            raise ValueError("backend='cpu' needs a CPU tensor; got one on " + str(x.device))
        advise(out)  # huge pages for the untouched output: see pages.py
        from . import cpu  # Numba loads on first use
        nz, zc = cpu.run(x.view(torch.int32).numpy().reshape(-1), out.view(torch.int32).numpy().reshape(-1), r,
                         shape4, tile4, _key_ints(keys), stats)
        return out, (torch.tensor([nz, zc], dtype=torch.int64) if stats else none)
    from .triton_cuda import run  # Triton loads on first use
    counts = run(x, out, r, shape4, tile4, keys, stats)
    return out, (counts if stats else none)


@quantize_rule.register_fake
def _(x, rule, tile, keys, stats, backend):
    return torch.empty_like(x), x.new_empty(2 if stats else 0, dtype=torch.int64)
