"""Progress of a training epoch where no progress bar can show it, and the run's length.

A tqdm bar draws only on a terminal; piped into a file, under ``nohup`` or a batch scheduler, an
epoch of an hour would print nothing between the setup lines and its end. ``ProgressLines``
prints instead, when the output is not a terminal, one line every ``interval_s`` seconds:

    epoch 1/200: step 120/391 (31%), 95 img/s, 7m12s left in the epoch, 24h10m in the run

and, on a terminal or not, once a run, an estimate of its length after its first steps (10 s or
50 steps, or the end of a shorter first epoch of a run of more; the first step is left out of the
rate: it compiles kernels and warms caches):

    estimate: about 1h05m an epoch, 216h40m for the 200 epochs left (from 12 steps at 95 img/s)

Rates count samples (images, or tokens for a language model) per second of wall time since
the end of the epoch's first step. Nothing is printed with ``enabled`` False (``--progress
False``), nor by a rank other than 0.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

__all__ = ["ProgressLines", "duration"]


def duration(seconds: float) -> str:
    """``seconds`` as ``3h05m``, ``7m12s`` or ``42s``."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _terminal() -> bool:
    return any(getattr(f, "isatty", lambda: False)() for f in (sys.stdout, sys.stderr))


class ProgressLines:
    """Lines for one epoch (module docstring). ``step(done, samples)`` after each step: ``done``
    steps of ``steps`` taken this epoch, ``samples`` seen. ``epochs_left`` counts this epoch.
    ``estimated`` is shared by a run's epochs (a one-item list): the estimate prints once."""

    def __init__(self, log: Callable[[str], None], epoch: int, epochs: int, steps: int, unit: str,
                 epochs_left: int, estimated: list, enabled: bool = True, interval_s: float = 60.0,
                 terminal: Optional[bool] = None, clock: Callable[[], float] = time.perf_counter):
        self.log, self.epoch, self.epochs, self.steps, self.unit = log, epoch, epochs, steps, unit
        self.epochs_left, self.estimated, self.enabled, self.interval_s = epochs_left, estimated, enabled, interval_s
        self.lines = enabled and not (_terminal() if terminal is None else terminal)
        self.clock = clock
        self.t1: Optional[float] = None  # the end of the first step
        self.s1 = 0
        self.last = 0.0

    def step(self, done: int, samples: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.t1 is None:
            self.t1, self.s1, self.last = now, samples, now
            return
        dt = now - self.t1
        if dt <= 0 or samples <= self.s1:
            return
        rate = (samples - self.s1) / dt  # samples a second
        per_step = dt / (done - 1)
        first_epoch_done = done == self.steps and self.epochs_left > 1  # a short epoch of a long run
        if not self.estimated[0] and ((dt >= 10.0 or done - 1 >= 50) and done - 1 >= 3 or first_epoch_done):
            self.estimated[0] = True
            epoch_s = per_step * self.steps
            run_s = epoch_s * self.epochs_left
            self.log(f"estimate: about {duration(epoch_s)} an epoch, {duration(run_s)} for the "
                     f"{self.epochs_left} epoch{'s' if self.epochs_left != 1 else ''} left (from {done - 1} steps "
                     f"at {rate:.0f} {self.unit}/s)")
        if self.lines and now - self.last >= self.interval_s and done < self.steps:
            self.last = now
            left = per_step * (self.steps - done)
            run_left = left + per_step * self.steps * (self.epochs_left - 1)
            self.log(f"epoch {self.epoch + 1}/{self.epochs}: step {done}/{self.steps} "
                     f"({100 * done // self.steps}%), {rate:.0f} {self.unit}/s, {duration(left)} left in the "
                     f"epoch, {duration(run_left)} in the run")
