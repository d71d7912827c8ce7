"""Run a matrix's rows, each as its own ``cifar.py`` process, resumably.

For every row, in the table's order (seed 0; then seeds 1 and 2 of the
references and of the rows near a verdict's threshold, ``spread.needs_seeds``,
as ``<row>-s1``, ``<row>-s2``):

* ``results/<table>/<row>.json`` exists: the row is done and skipped;
* its run directory has ``checkpoints/last.pt``: the killed run is resumed
  (``cifar.py --resume RUN_DIR -dp DATA``), bit for bit the run that was
  started (the engine's resume guarantee), if it was started at the commit
  the runner now stands at; an unfinished run of another commit is moved
  aside to ``<row>.other-commit-<n>`` and the row starts afresh (a run of two
  commits would not be citable);
* its run directory exists without a checkpoint (killed before the first
  epoch ended): it is moved aside to ``<row>.failed-<n>``, with its invocation
  log (nothing is deleted), and the row starts afresh;
* else the row's command runs.

A run directory is resumed or collected only when its ``config.json`` records
exactly the row's command (flags, epochs, data folder, seed); otherwise it is
moved aside to ``<row>.other-command-<n>`` and the row starts afresh. A run that
finished all its epochs is collected into the result file
(``bfp.experiments.results``). A row that fails is reported and the next one
runs; the exit status is then 1. Every start and end of a ``cifar.py``
process is logged in ``RUNS/.<row>.invocations.jsonl`` (argv, wall time,
exit status, load average), so a row's result says how often it was resumed
(``results.resumed``: an invocation that is a ``--resume``).
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
from . import matrix, results, spread

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
def _lock(folder: Path, flag: str):
    """An exclusive lock on ``folder/.lock``; ValueError naming ``flag`` when another runner holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / ".lock", "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            raise ValueError(f"another runner is working on {folder} ({flag}; pid {f.read().strip() or '?'}); wait "
                             f"for it, or stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()


@contextlib.contextmanager
def table_lock(runs_dir: Path, results_dir: Optional[Path] = None):
    """One runner per run folder and per result folder: an exclusive lock on ``RUNS/.lock`` and on
    ``RESULTS/.lock`` (two runners with other ``--runs`` but one ``--results`` would replace each
    other's result files); ValueError when another holds either."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_lock(runs_dir, "--runs"))
        if results_dir is not None and Path(results_dir).resolve() != Path(runs_dir).resolve():
            stack.enter_context(_lock(results_dir, "--results"))
        yield


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when the runner dies, even by SIGKILL (no orphan keeps training
    into a run directory that a rerun resumes beside it)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def script_argv(argv: list[str]) -> list[str]:
    """How to execute a ``cifar.py ...`` (or ``lm.py ...``) argv here: the checkout's script, else the
    ``bfp`` command's task of that name."""
    script = REPO / argv[0]
    if script.is_file():
        return [sys.executable, str(script), *argv[1:]]
    return [sys.executable, "-c", "import sys; from bfp.cli import main; sys.exit(main(sys.argv[1:]))",
            Path(argv[0]).stem, *argv[1:]]


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


def ran_at(log: Path) -> set[str]:
    """The commits (``+dirty`` kept) that a row's invocations ran at."""
    return {str(i.get("git_commit")) for i in invocations(log)}


def _set_aside(run_dir: Path, log: Path, why: str = "failed") -> Path:
    """Move ``run_dir`` and its invocation log (where they exist) to ``<name>.<why>-<n>``, ``n`` the
    first number neither name has; nothing is deleted. The log goes with its directory, so the
    row's next run records only its own invocations (a restart from scratch is not "resumed")."""
    n = 1
    while any(p.with_name(f"{p.name}.{why}-{n}").exists() for p in (run_dir, log)):
        n += 1
    for p in (run_dir, log):
        if p.exists():
            p.rename(p.with_name(f"{p.name}.{why}-{n}"))
    return run_dir.with_name(f"{run_dir.name}.{why}-{n}")


def started_as(run_dir: Path) -> Optional[list[str]]:
    """The ``cifar.py`` argv (script first) a run directory was started with, from its
    ``config.json`` (None when it has none or it cannot be read)."""
    try:
        cmd = json.loads((run_dir / "config.json").read_text())["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cmd if isinstance(cmd, list) and all(isinstance(a, str) for a in cmd) else None


def command_mismatch(run_dir: Path, argv: list[str]) -> Optional[str]:
    """None when ``run_dir`` was started by ``argv`` (the script's path aside); else why not."""
    saved = started_as(run_dir)
    if saved is None:
        return "it has no readable config.json"
    if saved[1:] == argv[1:]:
        return None
    diff = next(i for i in range(max(len(saved) - 1, len(argv) - 1))
                if i >= len(saved) - 1 or i >= len(argv) - 1 or saved[1 + i] != argv[1 + i])
    return (f"it was started with {' '.join(saved[1 + diff:3 + diff]) or '(fewer flags)'!s} where this row has "
            f"{' '.join(argv[1 + diff:3 + diff]) or '(fewer flags)'!s}")


def run_row(table: str, row: matrix.Row, prof: matrix.Profile, data: str, results_dir: Path,
            runs_dir: Path, epochs: Optional[int] = None, say: Callable[[str], None] = _say,
            seed: int = 0) -> bool:
    """Bring ``row`` (with ``seed``) to a result file (see the module docstring); False if its run failed."""
    epochs = epochs or prof.epochs
    name = matrix.key(row, seed)
    argv = matrix.command(row, prof, data, str(runs_dir), epochs, seed)
    run_dir, log = runs_dir / name, runs_dir / f".{name}.invocations.jsonl"
    runs_dir.mkdir(parents=True, exist_ok=True)
    if run_dir.exists() and (run_dir / "checkpoints").exists() or results.read_metrics(run_dir):
        why = command_mismatch(run_dir, argv)
        if why is not None:  # another row's flags, epochs or data: never collected nor resumed as this row
            say(f"  {run_dir} was not started by this row's command ({why}): moved to "
                f"{_set_aside(run_dir, log, 'other-command')}")
    if (run_dir / "checkpoints" / "last.pt").is_file() and len(results.read_metrics(run_dir)) < epochs:
        other = sorted(ran_at(log) - {str(source_commit())})
        if other:  # a run goes on only at the commit it started at, so its result stays citable
            shown = ", ".join(c[:12] + c[40:] for c in other)  # 12 digits, and "+dirty" where there
            say(f"  {run_dir} was started at another commit ({shown}): moved to "
                f"{_set_aside(run_dir, log, 'other-commit')}")
    if len(results.read_metrics(run_dir)) < epochs:
        if (run_dir / "checkpoints" / "last.pt").is_file():
            say(f"  resuming {run_dir} ({len(results.read_metrics(run_dir))} of {epochs} epochs done)")
            data_args = [prof.data_flag, data] if prof.data_flag else []
            rc = _invoke([prof.script, "--resume", str(run_dir), *data_args, "--progress", "False"], log, say)
        else:
            if run_dir.exists() or log.exists():
                say(f"  {run_dir} has no checkpoint (killed in its first epoch): moved to "
                    f"{_set_aside(run_dir, log)}")
            rc = _invoke(argv, log, say)
        if rc != 0:
            say(f"  {name}: {prof.script} exited with status {rc}; the row stays open (rerun to resume)")
            return False
    done = results.read_metrics(run_dir)
    if len(done) != epochs:
        say(f"  {name}: the run ended after {len(done)} of {epochs} epochs; the row stays open")
        return False
    doc = results.collect(run_dir, table=table, row=row, profile=prof, command=argv,
                          invocations=invocations(log), name=name)
    results.write_json(doc, results_dir / f"{name}.json")
    say(f"  {name}: test top-1 {doc['final_top1']:.2f}% (best {doc['best_top1']:.2f}%), "
        f"{doc['train_time_s']:.0f} s training -> {results_dir / (name + '.json')}")
    return True


def run(table: str, rows: list[matrix.Row], prof: matrix.Profile, data: str, results_dir: Path,
        runs_dir: Path, epochs: Optional[int] = None, say: Callable[[str], None] = _say,
        allow_dirty: bool = False) -> int:
    """Every row of ``rows`` (module docstring), then the further seeds of the rows that need
    them (``spread.needs_seeds``); 0 when all have results, 1 otherwise. Refuses a source tree
    with uncommitted changes (``check_clean``) and a table another runner holds."""
    check_clean(allow_dirty or (prof is not None and prof.name != "full"))  # a quick profile is never published
    with table_lock(runs_dir, results_dir):
        return _run(table, rows, prof, data, results_dir, runs_dir, epochs, say)


def _have(results_dir: Path, name: str, table: str, prof) -> bool:
    path = results_dir / f"{name}.json"
    if path.is_file():
        results.read_result(path, table, getattr(prof, "name", None))  # done only when it is a good one
        return True
    return False


def _run(table, rows, prof, data, results_dir, runs_dir, epochs, say) -> int:
    failed, t0 = [], time.monotonic()
    todo = [(row, 0) for row in rows]
    i = 0
    while i < len(todo):
        row, seed = todo[i]
        i += 1
        name = matrix.key(row, seed)
        if _have(results_dir, name, table, prof):
            say(f"[{i}/{len(todo)}] {name}: done ({results_dir / (name + '.json')})")
        else:
            say(f"[{i}/{len(todo)}] {name}: {row.words}, seed {seed}  (elapsed {time.monotonic() - t0:.0f} s)")
            if not run_row(table, row, prof, data, results_dir, runs_dir, epochs, say, seed):
                failed.append(name)
        if i == len(todo) and len(prof.seeds) > 1:  # seed 0 of the chosen rows done: which need more
            todo += _more_seeds(table, rows, todo, prof, results_dir, say)
    if failed:
        say(f"{len(failed)} run(s) without a result: {', '.join(failed)}")
        return 1
    say(f"all {len(todo)} run(s) have results in {results_dir}")
    return 0


def _more_seeds(table, rows, todo, prof, results_dir: Path, say) -> list[tuple[matrix.Row, int]]:
    res = results.load_results(results_dir, table, prof.name)
    refs = {r.reference for r in rows}
    planned = {(r.name, s) for r, s in todo}
    out = []
    for row in rows:
        need = spread.needs_seeds(res, row.name, row.reference, refs)
        if need is None:
            say(f"  {row.name}: seeds {', '.join(map(str, prof.seeds[1:]))} decided once it and "
                f"{row.reference} have seed 0")
        elif need:
            out += [(row, s) for s in prof.seeds[1:] if (row.name, s) not in planned]
    return out
