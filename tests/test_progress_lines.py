"""What a run prints while it trains where no progress bar draws (a pipe, a log file, nohup), the
estimate of its length, and the one line a kernel's first compilation prints."""
import subprocess
import sys

from bfp.engine.progress import ProgressLines, duration
from bfp.kernels.numba_cpu.compile_notice import describe


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _epoch(terminal, enabled=True, steps=100, per_step=2.0, estimated=None):
    lines, clock = [], Clock()
    est = [False] if estimated is None else estimated
    p = ProgressLines(lines.append, 0, 200, steps, "img", 200, est, enabled=enabled, interval_s=60,
                      terminal=terminal, clock=clock)
    for done in range(1, steps + 1):
        clock.t = 25.0 + per_step * (done - 1)  # the first step compiles: 25 s, left out of the rate
        p.step(done, 64 * done)
    return lines


def test_without_a_terminal_a_line_a_minute_and_one_estimate():
    lines = _epoch(terminal=False)
    assert lines[0] == "estimate: about 3m20s an epoch, 11h06m for the 200 epochs left (from 5 steps at 32 img/s)"
    ticks = lines[1:]
    assert len(ticks) == 3  # at 60, 120 and 180 s after the first step, never after the last
    assert ticks[0] == "epoch 1/200: step 31/100 (31%), 32 img/s, 2m18s left in the epoch, 11h05m in the run"


def test_on_a_terminal_only_the_estimate_and_with_progress_off_nothing():
    assert _epoch(terminal=True) == [_epoch(terminal=False)[0]]
    assert _epoch(terminal=False, enabled=False) == []
    est = [False]
    _epoch(terminal=True, estimated=est)
    assert _epoch(terminal=True, estimated=est) == []  # once a run, not once an epoch


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (0, 42, 72, 3600 * 5 + 61)] == ["0s", "42s", "1m12s", "5h01m"]


def test_a_kernel_compiling_says_so_once_and_what_it_rounds():
    assert describe("tiled_kind1_mode1") == "for block formats (BFP, MX) with nearest rounding"
    assert describe("elementwise_kind0_mode2") == "for element-wise floats with stochastic rounding"
    code = ("import bfp.kernels.numba_cpu, numba\n"
            "def fresh(x):\n    return x + 1\n"
            "fresh.__module__ = 'bfp.kernels.numba_cpu.example'\n"
            "f = numba.njit(fresh)\nf(1); f(2)\n"
            "g = numba.njit(lambda x: x * 2)\ng(3)\n")  # not bfpsim's: no line
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr
    assert err.count("bfpsim: compiling the CPU kernel") == 1, err
    assert "bfpsim: compiling the CPU kernel fresh (first use, 10-30 s; cached on disk" in err


def test_a_short_first_epoch_of_a_long_run_ends_with_the_estimate():
    lines = _epoch(terminal=False, steps=4, per_step=1.0)
    assert lines == ["estimate: about 4s an epoch, 13m20s for the 200 epochs left (from 3 steps at 64 img/s)"]
