"""Checkpoints: written atomically, loaded with ``torch.load(weights_only=True)``.

A checkpoint is a dict of tensors and plain Python values (see
``Trainer.state_dict``). ``save`` writes a temporary file beside the target,
flushes it to disk and ``os.replace``s it over the target, so an interrupted
write never leaves a half-written file under the real name and the previous
good checkpoint survives until the new one is complete.
"""
from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import IO, Any, Iterator, Optional

import numpy as np
import torch

FORMAT = "bfpsim-checkpoint"
VERSION = 2
# Version 1 named the network config in force "active_precision"; it loads as version 2.
_V1_RENAMES = {"active_precision": "network_config"}


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, truncated or not ours."""


@contextlib.contextmanager
def atomic_file(path: os.PathLike | str, mode: str = "wb", **open_kw) -> Iterator[IO]:
    """A temporary file beside ``path``: synced and ``os.replace``d over ``path`` when the
    block ends normally, removed (leaving ``path`` as it was) when it raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode, **open_kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save(obj: dict[str, Any], path: os.PathLike | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, "version": VERSION, **obj}, f)
    return path


def load(path: os.PathLike | str, map_location: Any = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated/corrupt zips and pickles
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated and cannot be read "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a bfpsim checkpoint")
    if obj.get("version") == 1:
        obj = {_V1_RENAMES.get(k, k): v for k, v in obj.items()}
        obj["version"] = VERSION
    if obj.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has version {obj.get('version')!r}; "
                              f"this bfpsim reads versions 1 and {VERSION}")
    return obj


def resolve(path_or_run_dir: os.PathLike | str) -> Path:
    """A checkpoint file from ``--resume``: a file, or a run directory (its latest checkpoint)."""
    p = Path(path_or_run_dir)
    if p.is_dir():
        for cand in (p / "checkpoints" / "last.pt", p / "last.pt"):
            if cand.is_file():
                return cand
        raise CheckpointError(f"run directory {str(p)!r} has no checkpoints/last.pt "
                              f"(was it run with --save True?)")
    if not p.exists():
        raise CheckpointError(f"--resume {str(p)!r}: no such file or run directory")
    return p


# RNG states as tensors and plain lists, so weights_only loading accepts them.

def rng_state(generators: Optional[dict[str, torch.Generator]] = None) -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {k: g.get_state() for k, g in (generators or {}).items()},
    }
    return state


def set_rng_state(state: dict[str, Any], generators: Optional[dict[str, torch.Generator]] = None) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for k, g in (generators or {}).items():
        if k in state["generators"]:
            g.set_state(state["generators"][k])
