"""The random Hadamard transform (RHT) of the weight-gradient GEMM's inputs (NVFP4 recipe).

``H = diag(s) @ W_b / sqrt(b)``: ``W_b`` the ``b x b`` Walsh-Hadamard (Sylvester) matrix,
``s`` a vector of random signs drawn once from ``seed``. ``H`` is orthogonal (``H^T H = I``),
so transforming both inputs of ``dW = dY^T X`` along the reduction axis (tokens / rows) in
blocks of ``b`` leaves the product unchanged: ``(H dY)^T (H X) = dY^T X``. Quantizing the
transformed operands (``bwo``, ``bwi``) spreads outliers over a block before they are rounded,
which is why the recipe does it. Rows past the last whole block are zero-padded (zeros add
nothing to the product). The transform itself is float32 arithmetic: with every point off
the weight gradient equals PyTorch's within float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools

import torch

from .precision import Hadamard


@functools.lru_cache(maxsize=32)
def _matrix(block: int, seed: int) -> torch.Tensor:
    """``H`` (float64, CPU) of ``block`` and ``seed``."""
    w = torch.ones(1, 1, dtype=torch.float64)
    while w.shape[0] < block:
        w = torch.cat([torch.cat([w, w], 1), torch.cat([w, -w], 1)], 0)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (block,), generator=g, dtype=torch.int64).to(torch.float64) * 2 - 1
    return signs[:, None] * w / block ** 0.5


def matrix(rht: Hadamard, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return _matrix(rht.block, rht.seed).to(dtype=dtype, device=device)


def transform_rows(t: torch.Tensor, rht: Hadamard) -> torch.Tensor:
    """``H`` applied to the rows (dim -2) of ``t`` in blocks of ``rht.block``, zero-padding the
    last block; the result has ``ceil(rows / block) * block`` rows."""
    rows, b = t.shape[-2], rht.block
    pad = (-rows) % b
    if pad:
        t = torch.nn.functional.pad(t, (0, 0, 0, pad))
    blocks = t.reshape(*t.shape[:-2], -1, b, t.shape[-1])
    h = matrix(rht, t.dtype, t.device)
    return torch.matmul(h, blocks).reshape(*t.shape[:-2], -1, t.shape[-1])
