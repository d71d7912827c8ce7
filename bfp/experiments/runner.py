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

import contextlib
import ctypes
import fcntl
import json
import os
import signal
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
GENERATED = ("results", "docs")  # the runner's and report's own outputs: they never make the source dirty


def dirty_paths(repo: Path = REPO) -> list[str]:
    """Tracked files with uncommitted changes outside ``GENERATED`` ([] outside git)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                              *(f":(exclude){g}" for g in GENERATED)], cwd=repo, capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def source_commit(repo: Path = REPO) -> Optional[str]:
    """HEAD, with ``+dirty`` when ``dirty_paths`` has any (None outside git)."""
    commit = logs.git_commit(repo)
    if commit is None:
        return None
    return commit.split("+")[0] + ("+dirty" if dirty_paths(repo) else "")


def check_clean(allow_dirty: bool, repo: Path = REPO) -> None:
    """Results come from a clean commit: refuse uncommitted source changes unless ``allow_dirty``
    (the rows are then recorded as not citable and the report marks them)."""
    dirty = dirty_paths(repo)
    if dirty and not allow_dirty:
        raise ValueError(f"the source tree has uncommitted changes ({', '.join(dirty[:5])}"
                         f"{', ...' if len(dirty) > 5 else ''}): results must come from a clean commit; commit "
                         f"or stash them, or pass --allow-dirty to record rows marked not citable")


@contextlib.contextmanager
def table_lock(runs_dir: Path):
    """One runner per table: an exclusive lock on ``RUNS/.lock``; ValueError when another holds it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    f = open(runs_dir / ".lock", "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            raise ValueError(f"another runner is working on {runs_dir} (pid {f.read().strip() or '?'}); wait for "
                             f"it, or stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when the runner dies, even by SIGKILL (no orphan keeps training
    into a run directory that a rerun resumes beside it)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


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
               "git_commit": source_commit(REPO)})
    t = time.monotonic()
    rc = subprocess.call(script_argv(argv), env={**os.environ, "PYTHONUNBUFFERED": "1"},  # lines as they come
                         preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
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
        runs_dir: Path, epochs: Optional[int] = None, say: Callable[[str], None] = _say,
        allow_dirty: bool = False) -> int:
    """Every row of ``rows`` (module docstring); 0 when all have results, 1 otherwise. Refuses a
    source tree with uncommitted changes (``check_clean``) and a table another runner holds."""
    check_clean(allow_dirty or (prof is not None and prof.name != "full"))  # a quick profile is never published
    with table_lock(runs_dir):
        return _run(table, rows, prof, data, results_dir, runs_dir, epochs, say)


def _run(table, rows, prof, data, results_dir, runs_dir, epochs, say) -> int:
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
