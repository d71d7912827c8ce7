"""Everything ``--resume`` does, in one place: merging the saved flags, and what it refuses.

``apply_resume`` takes the interrupted run's flags and epoch plan from its
checkpoint; only the flags in ``RESUME_OVERRIDES`` may be given again (where a
run runs and what it reports, not what it computes). The checkpoint is read and
CRC-checked once, there, and travels in the run specification
(``bfp.cli.spec.RunSpec.resumed``).

Why the checks: a resume that loads but computes something else is worse than
one that fails. Refused, each as a usage error naming the file and value, are:
changed flags; saved flags of the wrong type; a dataset whose fingerprint
(``bfp.data.fingerprint``) differs from the checkpoint's, unless
``--resume-allow-data-change``; another class count, always (the classifier's
weights cannot fit); another process or worker count; impossible counters;
weights, keys or saved flags that do not fit the model the flags build; a run
directory holding a later checkpoint that continuing would overwrite.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..data.fingerprint import differences
from ..engine import checkpoint as ckpt
from ..engine import checkpoint_set
from ..engine.schedule import EpochPlan
from .peers import peer_failure
from .flags import UsageError, build_parser, flag_name, str2bool
from .tasks import Task

# Flags a resumed run may change (where it runs and what it reports, not what it computes).
RESUME_OVERRIDES = {"num_workers", "device", "log", "save", "save_interval",
                    "slackbot", "slack_channel", "slack_base_url", "progress", "batch_size_test",
                    "histograms", "resume", "do_color", "dataset_path", "mode", "resume_allow_data_change",
                    "evaluate", "print_freq", "grad_histogram", "diagnose", "diagnose_out", "sweep_family",
                    "sample_chars", "shadow", "overwrite"}
# Names under which checkpoints written before the rename saved two flags.
_OLD_DESTS = {"bfp": "network_config", "precision": "compute_dtype"}
# What runs did before a flag existed, where that is not the flag's default in every script.
_BEFORE_FLAG = {"optimizer": "sgd"}  # lm.py's default is adamw; every run before --optimizer used SGD


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint a run resumes from: its path and its loaded state."""

    path: Path
    state: dict[str, Any]


def apply_resume(task: Task, args: argparse.Namespace) -> tuple[argparse.Namespace, EpochPlan, Checkpoint]:
    """The interrupted run's flags and plan, with the few flags that may change taken from ``args``,
    and its checkpoint (read and CRC-checked once, here)."""
    path = checkpoint_set.resolve(args.resume)
    state = checkpoint_set.load_with_hint(path, map_location="cpu")
    extra = state.get("extra")
    if not isinstance(extra, dict) or "args" not in extra or "plan" not in extra:
        raise UsageError(f"--resume {path}: this checkpoint holds no {task.prog} flags (it was written by a "
                         f"Trainer used from Python); resume it with Trainer.load_state_dict")
    saved = {_OLD_DESTS.get(k, k): v for k, v in saved_flags(path, state).items()}
    saved = {**_BEFORE_FLAG, **saved}
    parser = build_parser(task)
    _check_saved_types(parser, saved, path)
    same = lambda x, y: json.dumps(x, default=str) == json.dumps(y, default=str)  # noqa: E731 (tuples == lists)
    changed = sorted(k for k in args.explicit if k not in RESUME_OVERRIDES
                     and not same(saved.get(k), getattr(args, k))
                     and not (k in ("model", "dataset") and str(saved.get(k)).lower() == str(getattr(args, k)).lower()))
    if changed:
        raise UsageError(f"--resume continues the saved run as it was; these flags differ from it: "
                         f"{', '.join(flag_name(parser, k) for k in changed)} (only "
                         f"{', '.join(sorted(flag_name(parser, k) for k in RESUME_OVERRIDES))} may change)")
    for k in args.explicit:
        if k in RESUME_OVERRIDES:
            saved[k] = getattr(args, k)
    saved["resume"] = args.resume
    # a permission of this invocation only: a later resume of the run must ask again
    saved["resume_allow_data_change"] = args.resume_allow_data_change
    # flags added after the checkpoint was written take their defaults
    new = argparse.Namespace(**{**vars(parser.parse_args([])), **saved})
    new.explicit = args.explicit
    try:
        new.model_opt = [tuple(x) for x in new.model_opt]
        p = state["extra"]["plan"]
        return new, EpochPlan.parse(p["bfp-layer-conf-dict"], p["optimizer-dict"], "<checkpoint>"), \
            Checkpoint(path, state)
    except (TypeError, KeyError, ValueError) as e:
        raise UsageError(f"--resume {path}: the saved flags or epoch plan cannot be read "
                         f"({type(e).__name__}: {e})") from None


def _check_saved_types(parser: argparse.ArgumentParser, saved: dict[str, Any], path: Path) -> None:
    """A saved flag whose value has not the type its flag parses to is refused by name."""
    for a in parser._actions:
        if a.dest not in saved or saved[a.dest] is None or not a.option_strings:
            continue
        v, want = saved[a.dest], {int: (int,), float: (int, float), str2bool: (bool,)}.get(a.type)
        if a.type is None and a.default is not None and isinstance(a.default, str):
            want = (str,)
        bad = want is not None and (not isinstance(v, want) or (bool not in want and isinstance(v, bool)))
        if bad:
            raise UsageError(f"--resume {path}: saved flag {flag_name(parser, a.dest)} = {v!r} is not "
                             f"a {' or '.join(t.__name__ for t in want)}; the checkpoint was edited or "
                             f"written by another program")


def resumed_run_dir(args: argparse.Namespace, path: Path, state: dict[str, Any]) -> Optional[Path]:
    """The run directory a resume writes to: the one holding ``path`` (a copied run
    continues in its copy), else the one recorded in the checkpoint. Refuses when it
    holds a later ``last.pt``, which continuing from an earlier epoch would overwrite."""
    saved = state["extra"].get("run_dir")
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else Path(saved) if saved else None
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if (args.log or args.save) and last is not None and last.is_file() and last.resolve() != path.resolve():
        try:
            later = ckpt.load(last)["epoch"]
        except ckpt.CheckpointError:
            later = -1  # a corrupt last.pt holds nothing to keep: resuming replaces it
        if later > state["epoch"]:
            raise UsageError(
                f"--resume {path}: {run_dir} holds a later checkpoint ({last}, {later} epochs done) that "
                f"continuing after epoch {state['epoch']} would overwrite; to branch from there, copy "
                f"{run_dir} to a new directory, delete the copy's checkpoints/last.pt and resume the "
                f"copy's {path.name}")
    return run_dir


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
    was, is_ = _source(saved), _source(now)  # a folder, or lm.py's corpus (its name or file)
    where = f"{was} -> {is_}" if was != is_ else is_
    msg = f"the dataset differs from the one the checkpoint trained on ({where}): {'; '.join(diff)}"
    if not args.resume_allow_data_change:
        raise UsageError(f"--resume {path}: {msg}. Continuing would train on other data (and, with "
                         f"another image count, on another learning-rate schedule); point -dp at the "
                         f"original data, or pass --resume-allow-data-change to continue anyway")
    return f"warning: {msg}; continuing as --resume-allow-data-change asks"


def _source(fingerprint: dict[str, Any]) -> str:
    """Where a dataset came from, in words: its folder, or a text corpus's name."""
    return str(fingerprint.get("path") or fingerprint.get("corpus") or "the dataset (no path recorded)")


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


_SCHEDULE_SHAPE = ("total_steps", "warmup_steps", "epochs")  # what the run's flags and data fix


def fit_schedule(path: Path, state: dict[str, Any], schedule, steps_per_epoch: int, allow_data_change: bool,
                 log=None) -> dict[str, Any]:
    """``state`` with a schedule the run can train on. The saved schedule's length must be the one the
    flags and data give now (``training_epochs`` x steps per epoch, the warm-up): a checkpoint whose
    ``training_epochs`` disagrees with its own schedule (edited or foreign) would train on at lr 0, and
    is refused. Under ``--resume-allow-data-change`` (another image count: other steps per epoch) the
    schedule is rebuilt instead, stated in the log: the length the data gives now, the saved base
    learning rates, the position at the start of the epoch the run resumes at."""
    saved, want = state.get("schedule"), schedule.state_dict()
    if not isinstance(saved, dict):
        return state
    diff = [k for k in _SCHEDULE_SHAPE if k in want and saved.get(k) != want[k]]
    if not diff:
        return state
    said = ", ".join(f"{k} {saved.get(k)!r} (the flags and data give {want[k]!r})" for k in diff)
    if not allow_data_change:
        raise UsageError(f"--resume {path}: the checkpoint's learning-rate schedule does not fit the run its own "
                         f"flags describe: {said}; training on would follow another schedule (past its end at lr "
                         f"0). The file was edited or comes from another run; nothing was written. Resume from "
                         f"another checkpoint of the run, or pass --resume-allow-data-change to rebuild the "
                         f"schedule for the data as it is now")
    rebuilt = {**saved, **{k: want[k] for k in diff}, "step_count": int(state["epoch"]) * steps_per_epoch}
    if log is not None:
        log(f"warning: --resume {path}: the learning-rate schedule is rebuilt for the data as it is now ({said}); "
            f"it continues from step {rebuilt['step_count']}, the start of epoch {int(state['epoch']) + 1}")
    return {**state, "schedule": rebuilt}


def load_state(trainer, state: dict[str, Any], path: Path) -> None:
    """``trainer.load_state_dict(state)``; a state that does not fit the model, or impossible
    counters, are usage errors."""
    check_counters(path, state, trainer.epochs)
    try:
        trainer.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        if collective_failed(e):  # a peer died while the ranks loaded their shards: not the checkpoint's fault
            raise
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()][:3]  # torch: a title, then each key
        detail = f"missing entry {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {' '.join(lines)}"
        raise UsageError(f"--resume {path}: the checkpoint does not fit the model built from its flags "
                         f"({detail}); was it written by another bfpsim version or edited?") from None


def collective_failed(e: BaseException) -> bool:
    """Whether ``e`` is a failed collective (a peer died, froze or cannot be reached), which the
    command line reports as one (exit 4), never as a checkpoint that does not fit."""
    return isinstance(e, RuntimeError) and peer_failure(e) is not None


def saved_flags(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's flags as a dict; anything else is a usage error naming the file."""
    args = state["extra"].get("args") if isinstance(state.get("extra"), dict) else None
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise UsageError(f"--resume {path}: the saved flags are not a mapping of flag names to values "
                         f"(got {type(args).__name__}); the file was not written by bfpsim's CLI")
    return args
