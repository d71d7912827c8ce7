"""Run a matrix's rows, each as its own ``cifar.py`` process, resumably.

For every row, in the table's order:

* ``results/<table>/<row>.json`` exists: the row is done and skipped;
* its run directory has ``checkpoints/last.pt``: the killed run is resumed
  (``cifar.py --resume RUN_DIR -dp DATA``), bit for bit the run that was
  started (the engine's resume guarantee);
* its run directory exists without a checkpoint (killed before the first
  epoch ended): it is moved aside to ``<row>.failed-<n>`` (nothing is deleted)
  and the row starts afresh;
* else the row's command runs.

A run that finished all its epochs is collected into the result file
(``bfp.experiments.results``). A row that fails is reported and the next one
runs; the exit status is then 1. Every start and end of a ``cifar.py``
process is logged in ``RUNS/.<row>.invocations.jsonl`` (argv, wall time,
exit status, load average), so a row's result says how often it was resumed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from ..engine import logs
from . import matrix, results

REPO = Path(__file__).resolve().parents[2]
_say = partial(print, flush=True)


def script_argv(argv: list[str]) -> list[str]:
    """How to execute a ``cifar.py ...`` argv here: the checkout's cifar.py, else the ``bfp`` command."""
    script = REPO / "cifar.py"
    if script.is_file():
        return [sys.executable, str(script), *argv[1:]]
    return [sys.executable, "-c", "import sys; from bfp.cli import main; sys.exit(main(sys.argv[1:]))",
            "cifar", *argv[1:]]


def _loadavg() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _invoke(argv: list[str], log: Path, say: Callable[[str], None]) -> int:
    say("  $ " + matrix.shell(argv))
    _log(log, {"argv": argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": _loadavg(),
               "git_commit": logs.git_commit(REPO)})
    t = time.monotonic()
    rc = subprocess.call(script_argv(argv), env={**os.environ, "PYTHONUNBUFFERED": "1"})  # lines as they come
    _log(log, {"wall_s": round(time.monotonic() - t, 2), "returncode": rc, "loadavg_end": _loadavg()})
    return rc


def _log(log: Path, entry: dict) -> None:
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def invocations(log: Path) -> list[dict]:
    """One dict per ``cifar.py`` process started for the row; a killed one has no ``returncode``."""
    out: list[dict] = []
    if log.is_file():
        for line in log.read_text(errors="replace").splitlines():
            if line.strip():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # torn by a kill while it was written: that entry is lost
                    continue
                if not isinstance(entry, dict):
                    continue
                if "argv" in entry or not out:
                    out.append(entry)
                else:
                    out[-1].update(entry)
    return out


def _set_aside(run_dir: Path) -> Path:
    n = 1
    while run_dir.with_name(f"{run_dir.name}.failed-{n}").exists():
        n += 1
    target = run_dir.with_name(f"{run_dir.name}.failed-{n}")
    run_dir.rename(target)
    return target


def run_row(table: str, row: matrix.Row, prof: matrix.Profile, data: str, results_dir: Path,
            runs_dir: Path, epochs: Optional[int] = None, say: Callable[[str], None] = _say) -> bool:
    """Bring ``row`` to a result file (see the module docstring); False if its run failed."""
    epochs = epochs or prof.epochs
    argv = matrix.command(row, prof, data, str(runs_dir), epochs)
    run_dir, log = runs_dir / row.name, runs_dir / f".{row.name}.invocations.jsonl"
    runs_dir.mkdir(parents=True, exist_ok=True)
    if len(results.read_metrics(run_dir)) < epochs:
        if (run_dir / "checkpoints" / "last.pt").is_file():
            say(f"  resuming {run_dir} ({len(results.read_metrics(run_dir))} of {epochs} epochs done)")
            rc = _invoke(["cifar.py", "--resume", str(run_dir), "-dp", data, "--progress", "False"], log, say)
        else:
            if run_dir.exists():
                say(f"  {run_dir} has no checkpoint (killed in its first epoch): moved to "
                    f"{_set_aside(run_dir)}")
            rc = _invoke(argv, log, say)
        if rc != 0:
            say(f"  {row.name}: cifar.py exited with status {rc}; the row stays open (rerun to resume)")
            return False
    done = results.read_metrics(run_dir)
    if len(done) < epochs:
        say(f"  {row.name}: the run ended after {len(done)} of {epochs} epochs; the row stays open")
        return False
    doc = results.collect(run_dir, table=table, row=row, profile=prof, command=argv,
                          invocations=invocations(log))
    results.write_json(doc, results_dir / f"{row.name}.json")
    say(f"  {row.name}: test top-1 {doc['final_top1']:.2f}% (best {doc['best_top1']:.2f}%), "
        f"{doc['train_time_s']:.0f} s training -> {results_dir / (row.name + '.json')}")
    return True


def run(table: str, rows: list[matrix.Row], prof: matrix.Profile, data: str, results_dir: Path,
        runs_dir: Path, epochs: Optional[int] = None, say: Callable[[str], None] = _say) -> int:
    """Every row of ``rows`` (module docstring); 0 when all have results, 1 otherwise."""
    failed, t0 = [], time.monotonic()
    for i, row in enumerate(rows, 1):
        if (results_dir / f"{row.name}.json").is_file():
            results.read_result(results_dir / f"{row.name}.json")  # done only when it is a good one
            say(f"[{i}/{len(rows)}] {row.name}: done ({results_dir / (row.name + '.json')})")
            continue
        say(f"[{i}/{len(rows)}] {row.name}: {row.words}  (elapsed {time.monotonic() - t0:.0f} s)")
        if not run_row(table, row, prof, data, results_dir, runs_dir, epochs, say):
            failed.append(row.name)
    if failed:
        say(f"{len(failed)} row(s) without a result: {', '.join(failed)}")
        return 1
    say(f"all {len(rows)} row(s) have results in {results_dir}")
    return 0
