"""A run's checkpoint set: ``epoch_NNN.pt``, ``best.pt`` and ``last.pt``, complete or absent.

Why the order matters: ``--resume`` continues from ``last.pt``. ``write_set``
serializes the state once and writes every other file of the epoch first and
``last.pt`` last, each atomically (``checkpoint.write_bytes``). A crash (kill
-9, power loss, full disk) before ``last.pt`` is replaced leaves ``last.pt`` at
the previous epoch, so the resume trains that epoch again and rewrites every
file of its set, bit for bit as the uninterrupted run would have; a crash after
it leaves a complete set. Files of the set written before the crash are either
the old or the new complete version, never a mix.

Temporary files of a writer that died (``.last.pt.tmp-<pid>``) are removed by
``remove_stale_temps``; a temp file of a live process is left alone.

When a checkpoint cannot be loaded, ``load_with_hint`` names the newest intact
checkpoint of the same run, so a corrupt ``last.pt`` does not hide a good
``epoch_NNN.pt``.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from . import checkpoint as ckpt

LAST, BEST = "last.pt", "best.pt"
_TEMP = re.compile(r"^\..+" + re.escape(ckpt.TEMP_MARK) + r"(\d+)$")


def epoch_name(epochs_done: int) -> str:
    return f"epoch_{epochs_done:03d}.pt"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours from before: nothing of this process is writing yet when we look
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def remove_stale_temps(directory: os.PathLike | str) -> list[Path]:
    """Remove the temporary files in ``directory`` whose writing process is gone; returns them.

    Process ids are those of this machine: a run directory shared with another
    host that is writing at the same moment must not be cleaned from here."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for p in sorted(directory.iterdir()):
        m = _TEMP.match(p.name)
        if m and p.is_file() and not _alive(int(m.group(1))):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _check_space(directory: Path, size: int, names: list[str], epochs_done: int) -> None:
    """Refuse before writing anything when the files cannot fit: one temporary copy plus
    every file of the set that does not exist yet (a replaced file frees its old space)."""
    need = size * (1 + sum(not (directory / n).exists() for n in names))
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # cannot tell: the writes themselves report a full disk
    if free < need:
        raise ckpt.CheckpointError(
            f"not enough space in {str(directory)!r} for the checkpoints of epoch {epochs_done} "
            f"({', '.join(names)}): {need} bytes needed, {free} free. Nothing of epoch {epochs_done} "
            f"was written and the files already there are intact; free some space and resume the run "
            f"with `resume` {directory.parent}")


def write_set(state: dict[str, Any], directory: os.PathLike | str, *, best: bool,
              periodic: bool) -> list[Path]:
    """Write the checkpoints of one finished epoch (``state['epoch']`` epochs done):
    ``epoch_NNN.pt`` when ``periodic``, ``best.pt`` when ``best``, then ``last.pt``.
    Returns the paths written, in order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(directory)
    done = int(state["epoch"])
    names = ([epoch_name(done)] if periodic else []) + ([BEST] if best else []) + [LAST]
    data = ckpt.serialize(state)
    _check_space(directory, len(data), names, done)
    return [ckpt.write_bytes(data, directory / n) for n in names]


def _epoch_of(path: Path) -> Optional[int]:
    try:
        return int(ckpt.load(path)["epoch"])
    except (ckpt.CheckpointError, KeyError, TypeError, ValueError):
        return None


def newest_intact(directory: os.PathLike | str, exclude: Optional[Path] = None) -> Optional[tuple[Path, int]]:
    """``(path, epochs done)`` of the loadable checkpoint of ``directory`` with the most
    epochs done (``last.pt`` before ``epoch_NNN.pt`` before ``best.pt`` on a tie), or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    rank = lambda p: 2 if p.name == LAST else 0 if p.name == BEST else 1  # noqa: E731
    found = []
    for p in directory.glob("*.pt"):
        if exclude is not None and p.resolve() == Path(exclude).resolve():
            continue
        epoch = _epoch_of(p)
        if epoch is not None:
            found.append((epoch, rank(p), p))
    if not found:
        return None
    epoch, _, path = max(found)
    return path, epoch


def load_with_hint(path: os.PathLike | str, map_location: Any = "cpu") -> dict[str, Any]:
    """``checkpoint.load``; a file that cannot be loaded raises ``CheckpointError`` that
    also names the newest intact checkpoint beside it, if there is one."""
    path = Path(path)
    try:
        return ckpt.load(path, map_location=map_location)
    except ckpt.CheckpointError as e:
        raise ckpt.CheckpointError(f"{e}{_hint(path.parent, exclude=path)}") from None


def _hint(directory: Path, exclude: Optional[Path] = None) -> str:
    good = newest_intact(directory, exclude=exclude)
    if good is None:
        return ""
    path, epoch = good
    return (f". The newest intact checkpoint of this run is {str(path)!r} ({epoch} epochs done): "
            f"resume from it with `resume` {path}")


def resolve(path_or_run_dir: os.PathLike | str) -> Path:
    """``checkpoint.resolve``; a run directory without ``last.pt`` also names its newest
    intact checkpoint."""
    try:
        return ckpt.resolve(path_or_run_dir)
    except ckpt.CheckpointError as e:
        p = Path(path_or_run_dir)
        raise ckpt.CheckpointError(f"{e}{_hint(p / 'checkpoints') if p.is_dir() else ''}") from None
