"""CPU tensors as NumPy arrays for the Numba kernels, without locking their storage.

``Tensor.numpy()`` marks the tensor's storage non-resizable for as long as the storage lives. FSDP2
frees its all-gathered parameters by resizing their storage to 0 after each forward
(``torch.distributed.fsdp``'s ``free_storage``), so a kernel that took ``weight.numpy()`` made the next
reshard fail ("Trying to resize storage that is not resizable"). A DLPack view is the same zero-copy,
writable array and leaves the storage as it was (NumPy 2.1 and later: versioned DLPack, writable).

Speed (``benchmarks/host_checks.py``, BENCHMARKS.md): the public path, ``np.from_dlpack(t)``, costs
about 3.3 us a call (torch's Python ``__dlpack__`` checks) against 1.3 us for ``.numpy()``, twice a
quantize call; torch's own versioned capsule (``torch._C._to_dlpack_versioned``, what ``__dlpack__``
calls) handed to NumPy directly costs 0.9 us. It is used where torch has it (a private function: the
public path otherwise, the same arrays)."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["as_numpy"]

_VERSIONED = getattr(torch._C, "_to_dlpack_versioned", None)


class _Capsule:
    """A DLPack producer around a capsule made already (NumPy asks its producer for one)."""

    __slots__ = ("capsule",)

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of CPU tensor ``t`` (no copy, writable, the storage left resizable)."""
    if t.requires_grad:
        t = t.detach()
    if _VERSIONED is not None:
        return np.from_dlpack(_Capsule(_VERSIONED(t)))
    return np.from_dlpack(t)
