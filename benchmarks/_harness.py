"""What every benchmark shares: alternated timing, machine metadata, one table, JSON out.

The machines are shared and noisy (absolute times move 2-3x with the load), so
a benchmark never compares timings taken at different moments: it times the
callables it compares in rounds that visit each once, reversing the order every
other round so that neither always runs first, and reports ratios of medians
or of the fastest calls taken in the same run. The JSON record carries the
load average and versions the figures depend on.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch


@dataclass
class Timings:
    """Seconds per call of each named callable, in round order: wall and process CPU time."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.wall[name])

    def fastest(self, name: str) -> float:
        """The call least disturbed by other processes."""
        return min(self.wall[name])

    def pair_ratios(self, name: str, base: str, *, cpu: bool = False) -> list[float]:
        """``name`` over ``base`` in each round, where the two ran next to each other."""
        times = self.cpu if cpu else self.wall
        return [t / b for t, b in zip(times[name], times[base])]


def alternate(fns: Mapping[str, Callable[[], Any]], rounds: int, *, warmup: int = 1,
              sync: Callable[[], Any] = lambda: None,
              setup: Callable[[str], Any] = lambda name: None) -> Timings:
    """Time each of ``fns`` once per round, in reverse order every other round.

    ``warmup`` untimed rounds come first (JIT compilation, the allocator).
    ``sync`` waits for the device around each timed call
    (``torch.cuda.synchronize`` on a GPU); ``setup(name)`` runs untimed
    before each call, to put state the benchmark itself changes back.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            setup(name)
            fns[name]()
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            setup(name)
            sync()
            c0 = time.process_time()
            t0 = time.perf_counter()
            fns[name]()
            sync()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return Timings(wall, cpu)


def sgd_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.01) -> Callable[[], None]:
    """One SGD (momentum 0.9) training step of ``model`` on ``(x, y)`` as a function to time."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def machine(**fields: Any) -> dict[str, Any]:
    """``fields`` plus what the figures depend on: machine, load, versions, threads.

    Call it after the timings, so that the load average covers the run. Numba
    is imported here and not at the top because a benchmark may set
    ``NUMBA_THREADING_LAYER``, which only counts before Numba first loads.
    """
    import numba

    return {**fields, "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
            "torch": torch.__version__, "numba": numba.__version__,
            "torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def print_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> None:
    """Print ``rows`` under ``columns``, (title, format spec) pairs such as ``("ms", ".2f")``.

    Text is left-aligned and numbers right-aligned, each column as wide as its
    widest cell.
    """
    cells = [[format(v, spec) for v, (_, spec) in zip(row, columns)] for row in rows]
    right = [not isinstance(v, str) for v in rows[0]] if rows else [False] * len(columns)
    widths = [max([len(title)] + [len(r[i]) for r in cells]) for i, (title, _) in enumerate(columns)]

    def line(texts: Sequence[str]) -> str:
        return "  ".join(t.rjust(w) if r else t.ljust(w) for t, w, r in zip(texts, widths, right)).rstrip()

    print(line([title for title, _ in columns]))
    for r in cells:
        print(line(r))


def count_args(doc: str, argv, flag: str, default: int):
    """The ``--json`` and one positive count flag (``--reps``, ``--rounds``) of a host-time benchmark,
    parsed and checked (``check_args``); one intra-op thread for the timings."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument(flag, type=int, default=default)
    args = ap.parse_args(argv)
    check_args(ap, at_least={flag: (getattr(args, flag[2:]), 1)}, json_path=args.json)
    torch.set_num_threads(1)
    return args


def check_args(ap, *, at_least: Mapping[str, tuple[Any, int]] = {}, json_path: Optional[str] = None) -> None:
    """Refuse bad command-line values before any work, as argparse does (``ap.error``: exit 2, the flag
    and the allowed range named, no traceback): each ``at_least`` entry is ``flag: (value, minimum)``
    (None: not given); ``json_path`` must be a file this process can write (not a folder)."""
    for flag, (value, low) in at_least.items():
        if value is not None and value < low:
            ap.error(f"{flag} must be an integer >= {low}, got {value}")
    if json_path:
        out = Path(json_path)
        parent = out.parent if str(out.parent) else Path(".")
        if out.is_dir():
            ap.error(f"--json {json_path} is a folder; give the JSON file's path")
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            ap.error(f"--json {json_path}: cannot write there ({parent} is not a writable folder)")


def emit_json(record: Mapping[str, Any], path: Optional[str | Path] = None) -> None:
    """Print ``record`` as one JSON line; with ``path``, also write it there, indented."""
    print(json.dumps(record))
    if path:
        Path(path).write_text(json.dumps(record, indent=2) + "\n")


def host_us(fn: Callable[[], Any], reps: int, sync: Callable[[], Any] = lambda: None) -> float:
    """Median microseconds of host time per ``fn()`` over ``reps`` calls in 7 rounds, after 50
    untimed calls; ``sync`` (``torch.cuda.synchronize`` on a GPU) runs between rounds, never
    inside one, so queued device work does not count."""
    for _ in range(50):
        fn()
    sync()
    rounds = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        rounds.append((time.perf_counter() - t) / reps * 1e6)
        sync()
    return statistics.median(rounds)
