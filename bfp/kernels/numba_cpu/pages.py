"""Fresh CPU outputs on transparent huge pages, where Linux offers them.

Why: ``bfp.quantize`` returns a new tensor, and a large new tensor arrives as
untouched pages (glibc maps blocks above 32 MiB afresh on every allocation).
On the project's 2-core VM, faulting in 32 MiB of 4 KiB pages took ~11 ms of
the ~14 ms of ``torch.clone`` and as long again as the rounding itself. With
``madvise(MADV_HUGEPAGE)`` on the output before the kernel writes it, the
kernel faults 2 MiB pages instead (512 times fewer faults; the zeroing stays).
Nothing else changes: same tensor, same storage, same values; memory use only
differs in that whole 2 MiB pages are taken, and the output is written whole.

Only the 2 MiB-aligned middle of the buffer is advised; outputs smaller than
``MIN_BYTES`` are left alone (they rarely span a huge page, and are often reused
heap memory that is already faulted in). Where THP is off ("never"), madvise
is not Linux, or libc cannot be loaded, ``advise`` does nothing.
``BFP_HUGEPAGES=0`` in the environment turns it off, ``off()`` within a block
(benchmarks/quantize.py times both ways in one run).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys

import torch

HUGE = 2 << 20            # x86-64 and arm64 (4 KiB base pages) PMD size
MIN_BYTES = 4 * HUGE      # below this, the advice saves little
_MADV_HUGEPAGE = 14       # <sys/mman.h> on Linux


@functools.lru_cache(maxsize=None)
def _madvise():
    """libc's madvise, or None where huge-page advice is unavailable or turned off."""
    if os.environ.get("BFP_HUGEPAGES", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return None
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_off = 0  # depth of off() blocks


@contextlib.contextmanager
def off():
    """No advice inside this block (for measurements and tests)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def advise(t: torch.Tensor) -> None:
    """Ask for huge pages under ``t``'s untouched storage (a hint; errors are ignored)."""
    nbytes = t.numel() * t.element_size()
    madvise = _madvise() if nbytes >= MIN_BYTES and not _off else None
    if madvise is None:
        return
    start = t.data_ptr()
    lo = -(-start // HUGE) * HUGE
    hi = (start + nbytes) // HUGE * HUGE
    if hi > lo:
        madvise(lo, hi - lo, _MADV_HUGEPAGE)
