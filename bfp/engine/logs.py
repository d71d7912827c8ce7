"""A run's directory: resolved configuration, text log, TensorBoard events.

Layout of ``runs/<name>/``::

    config.json      every flag, the network config, bfpsim version, git commit
    log.txt          what was printed, with times
    metrics.jsonl    one JSON object per epoch (read by draw_curve.py)
    events.out.tfevents.*   TensorBoard
    checkpoints/     last.pt, best.pt, epoch_<n>.pt
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, TextIO

from tqdm import tqdm

from .. import __version__
from .checkpoint import atomic_file
from .redact import pattern, redact_json, redact_text
from .ranks import is_main


def git_commit(cwd: Optional[os.PathLike] = None) -> Optional[str]:
    """The commit of the source tree (``+dirty`` with local changes), or None outside git."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_version() -> str:
    return __version__


def timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


class RunLog:
    """Prints and, with a run directory, appends to ``log.txt`` and ``metrics.jsonl``.

    ``writer`` is a TensorBoard ``SummaryWriter`` when ``tensorboard`` is on.
    ``redact`` strings (secrets) are replaced by ``***`` in everything written, as whole
    tokens only; JSON files are redacted value by value (``bfp.engine.redact``).
    In a distributed run only rank 0 prints and writes; on other ranks it is silent
    and has no run directory.
    """

    def __init__(self, run_dir: Optional[os.PathLike] = None, *, tensorboard: bool = False,
                 stream: Optional[TextIO] = None, redact: tuple[str, ...] = ()):
        self.quiet = not is_main()
        self.run_dir = Path(run_dir) if run_dir is not None and not self.quiet else None
        self.stream = stream if stream is not None else sys.stdout
        self._pattern = pattern(redact)  # the secrets are kept only as this pattern
        self._file = None
        self.writer = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.run_dir / "log.txt", "a", encoding="utf-8")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter
                self.writer = SummaryWriter(log_dir=str(self.run_dir))

    def _clean(self, msg: str) -> str:
        return redact_text(msg, self._pattern)

    def __call__(self, msg: str) -> None:
        if self.quiet:
            return
        msg = self._clean(str(msg))
        tqdm.write(msg, file=self.stream)  # keeps an open progress bar intact
        if self._file is not None:
            stamp = _dt.datetime.now().isoformat(timespec="seconds")
            with self._writing("log.txt"):
                for line in msg.splitlines() or [""]:
                    self._file.write(f"{stamp} {line}\n")
                self._file.flush()

    @contextlib.contextmanager
    def _writing(self, name: str):
        """An ``OSError`` of a write (disk full, read-only, quota) names the file; ``log.txt`` is
        then closed so the messages that follow are printed only, never half-written."""
        try:
            yield
        except OSError as e:
            if name == "log.txt" and self._file is not None:
                f, self._file = self._file, None
                with contextlib.suppress(OSError):
                    f.close()
            raise OSError(e.errno, e.strerror, str(self.run_dir / name)) from None

    def metrics(self, record: dict[str, Any]) -> None:
        if self.run_dir is not None:
            with self._writing("metrics.jsonl"), open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def write_json(self, name: str, obj: Any) -> Path:
        """Write ``obj`` to ``run_dir/name`` atomically."""
        if self.run_dir is None:
            raise RuntimeError(f"cannot write {name}: this run has no run directory")
        path = self.run_dir / name
        with self._writing(name), atomic_file(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(redact_json(obj, self._pattern), indent=2) + "\n")
        return path

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self._file is not None:
            with self._writing("log.txt"):
                f, self._file = self._file, None
                f.close()


def read_metrics(run_dir: os.PathLike) -> list[dict[str, Any]]:
    """The per-epoch records of a run; a resumed run's repeated epochs keep their last record."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} not found: is {str(run_dir)!r} a run directory "
                                f"written with `log` on?")
    by_epoch: dict[int, dict] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            by_epoch[int(rec["epoch"])] = rec
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{path}:{n}: not a JSON record with an 'epoch' number") from None
    return [by_epoch[e] for e in sorted(by_epoch)]
