"""CPU tensors as NumPy arrays for the Numba kernels, without locking their storage.

``Tensor.numpy()`` marks the tensor's storage non-resizable for as long as the storage lives. FSDP2
frees its all-gathered parameters by resizing their storage to 0 after each forward
(``torch.distributed.fsdp``'s ``free_storage``), so a kernel that took ``weight.numpy()`` made the next
reshard fail ("Trying to resize storage that is not resizable"). ``np.from_dlpack`` gives the same
zero-copy, writable view through the DLPack protocol and leaves the storage as it was (NumPy 2.1 and
later: versioned DLPack, writable arrays)."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["as_numpy"]


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of CPU tensor ``t`` (no copy, writable, the storage left resizable)."""
    return np.from_dlpack(t.detach())
