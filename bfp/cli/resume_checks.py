"""What ``--resume`` refuses before it trains, each as a usage error naming the file and value.

Why: a resume that loads but computes something else is worse than one that
fails. Refused are: a dataset whose fingerprint (``bfp.data.fingerprint``)
differs from the checkpoint's, unless ``--resume-allow-data-change``; another
class count, always (the classifier's weights cannot fit); weights, keys or
saved flags that do not fit the model the flags build.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from ..engine import checkpoint_set
from ..data.fingerprint import differences
from .flags import UsageError


def remove_stale_temps(run_dir: Optional[Path], log) -> None:
    """Temporary files of a killed writer in the run directory and its checkpoints/."""
    if run_dir is None:
        return
    for d in (run_dir, run_dir / "checkpoints"):
        for p in checkpoint_set.remove_stale_temps(d):
            log(f"removed {p}, a temporary file of a writer that no longer runs")


def check_data(args: argparse.Namespace, path: Path, state: dict[str, Any], data) -> Optional[str]:
    """Refuse a dataset that is not the one the checkpoint at ``path`` trained on; returns a
    line for the log when the change is allowed or the checkpoint predates fingerprints."""
    saved = state.get("extra", {}).get("data")
    now = data.fingerprint
    saved_classes = saved.get("classes") if isinstance(saved, dict) else None
    if isinstance(saved_classes, list) and len(saved_classes) != data.num_classes:
        raise UsageError(f"--resume {path}: the checkpoint was trained on {len(saved_classes)} classes, "
                         f"the dataset now ({args.dataset}, -dp {args.dataset_path}) has {data.num_classes}; "
                         f"its classifier cannot continue on other classes")
    if not isinstance(saved, dict) or now is None:
        return (f"--resume {path}: this checkpoint records no dataset fingerprint (written before "
                f"bfpsim kept one); the dataset is not checked")
    diff = differences(saved, now)
    if not diff:
        return None
    where = f"{saved.get('path')} -> {now.get('path')}" if saved.get("path") != now.get("path") else now.get("path")
    msg = f"the dataset differs from the one the checkpoint trained on ({where}): {'; '.join(diff)}"
    if not args.resume_allow_data_change:
        raise UsageError(f"--resume {path}: {msg}. Continuing would train on other data (and, with "
                         f"another image count, on another learning-rate schedule); point -dp at the "
                         f"original data, or pass --resume-allow-data-change to continue anyway")
    return f"warning: {msg}; continuing as --resume-allow-data-change asks"


def check_world(path: Path, state: dict[str, Any], processes: int, emulate_node: int) -> Optional[str]:
    """Refuse to resume with another process count or worker count than the run was started with
    (each worker's micro-batch, hence every gradient, would change); returns a log line for a
    checkpoint that predates the record."""
    saved = state.get("extra", {}).get("world")
    if not isinstance(saved, dict):
        return (f"--resume {path}: this checkpoint records no process count (written before bfpsim kept "
                f"one); resume it with the processes it was started with")
    was = (saved.get("processes"), saved.get("emulate_node"))
    if was != (processes, emulate_node):
        raise UsageError(
            f"--resume {path}: the run was started with {was[0]} process(es) x --emulate-node {was[1]} = "
            f"{saved.get('workers')} workers; this resume has {processes} process(es) x --emulate-node "
            f"{emulate_node} = {processes * emulate_node}. Another split changes every micro-batch and "
            f"gradient, so it would not continue the same run: resume with {was[0]} process(es) "
            f"(torchrun --nproc-per-node {was[0]}, or no launcher for 1)")
    return None


def check_counters(path: Path, state: dict[str, Any], epochs: int) -> None:
    """Refuse impossible saved counters (an edited or foreign file) before they can
    overwrite ``epoch_NNN.pt`` or ``best.pt`` of real epochs."""
    try:
        epoch, step = int(state["epoch"]), int(state["global_step"])
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"--resume {path}: the checkpoint's epoch/step counters cannot be read "
                         f"({type(e).__name__}: {e})") from None
    if not 0 <= epoch <= epochs or step < 0 or (epoch == 0) != (step == 0):
        raise UsageError(f"--resume {path}: the checkpoint says {epoch} epoch(s) and {step} step(s) are done, "
                         f"impossible for a run of {epochs} epochs (0..{epochs} epochs, steps >= 0, none "
                         f"before the first epoch ends); the file was edited or damaged. Nothing was "
                         f"written; resume from another checkpoint of the run (epoch_NNN.pt, best.pt)")


def load_state(trainer, state: dict[str, Any], path: Path) -> None:
    """``trainer.load_state_dict(state)``; a state that does not fit the model, or impossible
    counters, are usage errors."""
    check_counters(path, state, trainer.epochs)
    try:
        trainer.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()][:3]  # torch: a title, then each key
        detail = f"missing entry {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {' '.join(lines)}"
        raise UsageError(f"--resume {path}: the checkpoint does not fit the model built from its flags "
                         f"({detail}); was it written by another bfpsim version or edited?") from None


def saved_flags(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's flags as a dict; anything else is a usage error naming the file."""
    args = state["extra"].get("args") if isinstance(state.get("extra"), dict) else None
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise UsageError(f"--resume {path}: the saved flags are not a mapping of flag names to values "
                         f"(got {type(args).__name__}); the file was not written by bfpsim's CLI")
    return args
