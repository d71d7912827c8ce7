"""A dataset download that fails leaves the disk as it found it.

Why: torchvision creates ``root`` and writes a partial archive before the
network fails (or Ctrl-C arrives); the empty or half-written
``data/cifar100/`` then looked like a dataset to the next run.
``removed_on_failure(root)`` notes what exists before the download and, on
any exception (``KeyboardInterrupt`` too), removes what the block added, then
re-raises the exception unchanged.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator, Optional


@contextlib.contextmanager
def removed_on_failure(root: Path) -> Iterator[None]:
    """Inside the block, write under ``root``; if the block raises, remove the directories
    it created (up to the outermost one missing before), or, where ``root`` existed,
    only the entries of ``root`` that were not there before."""
    made, before = _first_missing(root), (set(root.iterdir()) if root.is_dir() else set())
    try:
        yield
    except BaseException:
        _remove_leftovers(root, made, before)
        raise


def _first_missing(root: Path) -> Optional[Path]:
    """The outermost directory of ``root`` (itself or a parent) that does not exist yet."""
    missing = None
    for p in (root, *root.parents):
        if p.exists():
            break
        missing = p
    return missing


def _remove_leftovers(root: Path, made: Optional[Path], before: set) -> None:
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    if root.is_dir():
        for p in set(root.iterdir()) - before:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
