"""One line on stderr when Numba compiles one of bfpsim's CPU kernels, which takes 10-30 s on a
2-core machine and would otherwise pass in silence:

    bfpsim: compiling the CPU kernel for block formats (BFP, MX) with nearest rounding (first use,
    10-30 s; cached on disk, later runs load it)

Numba announces a compilation (its ``numba:compile`` event) only when a kernel is neither in
memory nor in its on-disk cache, so a cached kernel prints nothing. Only the outermost
compilation of a kernel of this package is named (the helpers it inlines compile inside it).
``install()`` registers the listener once per process; importing the backend does it.
"""
from __future__ import annotations

import re
import sys
import threading

from numba.core import event

__all__ = ["install"]

_installed = threading.Lock()
_done = [False]


_KINDS = {"0": "element-wise floats", "1": "block formats (BFP, MX)"}  # bfp.kernels.plan's KIND_*
_MODES = {"0": "truncation", "1": "nearest rounding", "2": "stochastic rounding"}  # plan.MODE


def describe(qualname: str) -> str:
    """What a kernel rounds, from the name ``cpu.specialise`` gives it (``tiled_kind1_mode1``);
    another kernel by its own name."""
    m = re.fullmatch(r"\w+?_kind(\d)_mode(\d)", qualname)
    if m is None or m[1] not in _KINDS or m[2] not in _MODES:
        return qualname
    return f"for {_KINDS[m[1]]} with {_MODES[m[2]]}"


class _Notice(event.Listener):
    def __init__(self):
        self.depth = 0

    def on_start(self, e) -> None:
        self.depth += 1
        if self.depth != 1:
            return
        fn = getattr(e.data.get("dispatcher"), "py_func", None)
        if fn is None or not str(getattr(fn, "__module__", "")).startswith("bfp."):
            return
        print(f"bfpsim: compiling the CPU kernel {describe(fn.__qualname__)} (first use, 10-30 s; cached on disk, "
              f"later runs load it)", file=sys.stderr, flush=True)

    def on_end(self, e) -> None:
        self.depth -= 1


def install() -> None:
    """Register the listener (once)."""
    with _installed:
        if not _done[0]:
            event.register("numba:compile", _Notice())
            _done[0] = True
