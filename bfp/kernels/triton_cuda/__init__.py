"""The Triton backend: the element rule's kernels for CUDA tensors (``element.py``, ``rule.py``).

Loaded on first use. On a CPU tensor it runs only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before the first import), which is how CI checks it bit for bit
without a GPU: every operation is integer arithmetic on bit patterns, so the interpreter and a
GPU compute the same bits. Triton ships with PyTorch's CUDA wheels on Linux; elsewhere
``pip install triton``.
"""
from __future__ import annotations

import functools
import os

__all__ = ["run", "interpreted"]


def interpreted() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``): kernels then take CPU tensors."""
    return _INTERPRETED


_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")  # read once, as triton does


def run(x32, out, rule, shape4, tile4, keys, stats: bool):
    """Quantize contiguous float32 ``x32`` into ``out`` with the element rule ``rule`` (tiles
    ``tile4`` over the canonical ``shape4``, or element-wise); ``keys``: the stochastic keys as an
    int64 tensor on ``x32``'s device (None otherwise). Returns the counts tensor or None."""
    if not x32.is_cuda and not interpreted():
        raise ValueError(f"the Triton backend runs CUDA tensors (or CPU tensors under TRITON_INTERPRET=1); got "
                         f"one on {x32.device}: use backend='cpu' or 'reference' for it")
    return _launch()(x32, out, rule, shape4, tile4, keys, stats)


@functools.lru_cache(maxsize=1)
def _launch():
    """``element.launch``, imported (and its kernels decorated) on first use."""
    try:
        from .element import launch
    except ImportError as e:  # pragma: no cover - torch's Linux CUDA wheels bring triton
        raise RuntimeError(f"the Triton backend needs the triton package ({e}); it ships with PyTorch's CUDA "
                           f"wheels on Linux, elsewhere: pip install triton") from None
    return launch
