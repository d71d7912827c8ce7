"""Checkpoint files: written atomically, verified and loaded with ``torch.load(weights_only=True)``.

A checkpoint is a dict of tensors and plain Python values (see
``Trainer.state_dict``). ``save`` writes a temporary file beside the target,
flushes it to disk and ``os.replace``s it over the target, so an interrupted
write never leaves a half-written file under the real name and the previous
good checkpoint survives until the new one is complete. A write that fails
(a full disk) raises ``CheckpointError`` naming the file and leaves the old
file as it was.

``load`` first checks the CRC-32 that the zip archive of ``torch.save`` keeps
for every member (``torch.load`` itself does not check them), so a file with
flipped bits is refused by name instead of loading wrong weights. A file
holding Python objects other than tensors and plain values (a pickle that
would run code) is refused without unpickling it. The set of files a run
keeps (last, best, epoch_NNN) is ``bfp.engine.checkpoint_set``.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import random
import zipfile
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


TEMP_MARK = ".tmp-"  # temporary files are ".<name>.tmp-<pid>" beside their target


def temp_path(path: Path, pid: Optional[int] = None) -> Path:
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid() if pid is None else pid}")


@contextlib.contextmanager
def atomic_file(path: os.PathLike | str, mode: str = "wb", **open_kw) -> Iterator[IO]:
    """A temporary file beside ``path``: synced and ``os.replace``d over ``path`` when the
    block ends normally, removed (leaving ``path`` as it was) when it raises."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, mode, **open_kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def _sync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable, so files replaced one after another stay in
    that order after a power loss (where the platform can open directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the rename itself is atomic
    finally:
        os.close(fd)


def serialize(obj: dict[str, Any]) -> bytes:
    """The bytes ``save`` writes: ``obj`` tagged with our format and version, as ``torch.save``
    writes it (a zip archive with a CRC-32 per member, which ``verify`` checks; computed even
    where ``torch.serialization.set_crc32_options(False)`` turned them off)."""
    get_crc = getattr(torch.serialization, "get_crc32_options", None)
    off = get_crc is not None and not get_crc()
    if off:
        torch.serialization.set_crc32_options(True)
    try:
        buf = io.BytesIO()
        torch.save({"format": FORMAT, "version": VERSION, **obj}, buf)
    finally:
        if off:
            torch.serialization.set_crc32_options(False)
    return buf.getvalue()


def write_bytes(data: bytes, path: os.PathLike | str) -> Path:
    """``data`` written atomically to ``path``; an OS error (a full disk, a read-only
    directory) is a ``CheckpointError`` naming the file, with ``path`` left as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as f:
            f.write(data)
    except OSError as e:
        why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
        kept = "its previous version is kept" if path.exists() else "nothing was written under that name"
        raise CheckpointError(f"cannot write checkpoint {str(path)!r}: {why} ({len(data)} bytes); "
                              f"{kept}") from None
    return path


def save(obj: dict[str, Any], path: os.PathLike | str) -> Path:
    return write_bytes(serialize(obj), path)


def verify(path: os.PathLike | str) -> None:
    """Raise ``CheckpointError`` unless every member of the archive at ``path`` matches its CRC-32."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated and cannot be read "
                              f"(not a readable archive: {e})") from None
    if bad is not None:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: member {bad!r} does not match its "
                              f"CRC-32 (bits changed on disk or in transfer)")


def _unpickling_refused(e: Exception) -> Optional[str]:
    """The line of a weights_only refusal that says what was refused (torch's own message
    goes on to advise ``weights_only=False``, which would run the file's code)."""
    if not isinstance(e, pickle.UnpicklingError) or "Weights only load failed" not in str(e):
        return None
    lines = [ln for ln in str(e).splitlines() if "GLOBAL" in ln or "unsupported" in ln.lower()]
    return lines[0].strip() if lines else "an object that is not a tensor or plain value"


def read_weights(path: os.PathLike | str) -> tuple[Any, str]:
    """A weights file not written by bfpsim (``--pretrained``): ``(object, note)``, loaded with
    ``weights_only=True`` after the CRC-32 check where the file carries CRCs; ``note`` says
    when it cannot be checked (torch's legacy non-zip format, or CRCs turned off)."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            crcs = [i.CRC for i in z.infolist() if i.file_size]
        if crcs and not any(crcs):
            note = "; not integrity-checked: the file was written with its CRC-32s turned off"
        else:
            verify(path)
            note = "; CRC-32 of every member checked"
    else:
        note = "; not integrity-checked: torch's legacy (non-zip) format carries no checksums"
    return _load_tensors(path, "cpu", repr(str(path)), "is not a loadable state_dict"), note


def _load_tensors(path: Path, map_location: Any, what: str, unreadable: str) -> Any:
    """``torch.load(weights_only=True)``; a refused pickle or an unreadable file is a
    ``CheckpointError`` saying ``what`` ``unreadable`` (never torch's weights_only=False advice)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated/corrupt zips and pickles
        refused = _unpickling_refused(e)
        if refused is not None:
            raise CheckpointError(f"{what} holds Python objects that loading would have to execute ({refused}); "
                                  f"bfpsim loads only tensors and plain values. Never load a file you did not "
                                  f"write yourself with weights_only=False: unpickling runs arbitrary code.") from None
        raise CheckpointError(f"{what} {unreadable} ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None


def load(path: os.PathLike | str, map_location: Any = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    verify(path)
    obj = _load_tensors(path, map_location, f"checkpoint {str(path)!r}", "is corrupt or truncated and cannot be read")
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
                              f"(was it run with `save` on?)")
    if not p.exists():
        raise CheckpointError(f"`resume` {str(p)!r}: no such file or run directory")
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
