"""Which results no longer describe the code: rows run at another commit whose sources changed since.

A result file records the commit it was started at (``git_commit``). It is *stale* when that
commit is unknown, carried uncommitted changes (``+dirty``), is not in this repository, or differs
from HEAD in a file the row depends on (``DEPENDS``: the library, the script, the package's
metadata); with ``every=True``, whenever it is not HEAD at all (to rerun the whole table from one
commit). ``set_aside`` moves a stale result and its run directory out of the runner's way (into
``RUNS/stale/``; nothing is deleted), so ``run`` trains the row afresh at HEAD; a run directory
that every invocation ran at HEAD stays, as that commit's own rerun, which ``run`` resumes or
collects (a rerun killed at its second epoch is not thrown away when the stale file is found
again).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

from ..engine import logs
from . import results, runner, validate

DEPENDS = ("bfp", "cifar.py", "pyproject.toml")


def changed_since(commit: str, repo: Path, paths: tuple[str, ...] = DEPENDS) -> Optional[list[str]]:
    """Files of ``paths`` that differ between ``commit`` and HEAD; None when git does not know it.
    ``commit`` comes from a result file, so it reaches git only as 40 hex digits, after
    ``--end-of-options`` (a value such as ``--output=FILE`` is never parsed as an option)."""
    if not (isinstance(commit, str) and validate.COMMIT.fullmatch(commit) and "+" not in commit):
        raise ValueError(f"{commit!r} is not a commit (40 hex digits); refused before it reaches git")
    try:
        out = subprocess.run(["git", "diff", "--name-only", "--end-of-options", commit, "HEAD", "--", *paths],
                             cwd=repo,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.split() if out.returncode == 0 else None


def why_stale(doc: dict, head: str, repo: Path, every: bool = False) -> Optional[str]:
    """Why the result ``doc`` must be rerun at ``head``; None when it still stands."""
    commit = doc.get("git_commit")
    if not commit:
        return "it records no commit"
    if not validate.commit_ok(commit):
        return f"its commit {str(commit)[:50]!r} is not 40 hex digits"
    if "+dirty" in commit:
        return f"it ran from a tree with uncommitted changes ({commit[:12]}+dirty)"
    if commit == head:
        return None
    if every:
        return f"it ran at {commit[:12]}, not HEAD {head[:12]}"
    changed = changed_since(commit, repo)
    if changed is None:
        return f"its commit {commit[:12]} is not in this repository"
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"{', '.join(changed[:3])}{more} changed since its commit {commit[:12]}"
    return None


def find(results_dir: Path, repo: Path, every: bool = False, table: Optional[str] = None) -> dict[str, str]:
    """{result name: why it is stale} over every result file of ``results_dir`` (checked as
    ``table``'s when given)."""
    head = (logs.git_commit(repo) or "").split("+")[0]
    if not head:
        raise ValueError(f"{repo} is not a git checkout: staleness is judged against its HEAD")
    out = {}
    for name, doc in results.load_results(results_dir, table).items():
        why = why_stale(doc, head, repo, every)
        if why is not None:
            out[name] = why
    return out


def set_aside(names: list[str], results_dir: Path, runs_dir: Path, head: Optional[str] = None) -> Path:
    """Move each stale result file and its run directory (and invocation log) into a new
    ``runs_dir/stale/<n>/``; returns that folder. A run directory whose invocations all ran at the
    clean commit ``head`` stays where it is (module docstring)."""
    n = 1
    while (runs_dir / "stale" / str(n)).exists():
        n += 1
    dest = runs_dir / "stale" / str(n)
    dest.mkdir(parents=True)
    for name in names:
        log = runs_dir / f".{name}.invocations.jsonl"
        keep = head is not None and runner.ran_at(log) == {head}
        for src in (results_dir / f"{name}.json", *(() if keep else (runs_dir / name, log))):
            if src.exists():
                src.rename(dest / src.name)
    return dest
