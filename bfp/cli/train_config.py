"""A run's flags from the command line and a ``-tc`` training config.

Precedence: flags given on the command line, then the ``-tc`` file
(``conf_train/NAME.json``: flag values keyed by flag name, plus the
epoch-keyed ``bfp-layer-conf-dict`` and ``optimizer-dict`` schedules), then
the defaults. ``--resume`` then replaces them by the checkpoint's
(``bfp.cli.resume``), and ``bfp.cli.spec`` freezes the result.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import ConfigError, find_train_config, load_config
from ..engine.schedule import EpochPlan
from .flags import UsageError, build_parser, model_option
from .tasks import Task

PLAN_KEYS = ("bfp-layer-conf-dict", "optimizer-dict")
_NOT_IN_FILES = {"train_config_file", "resume", "slack_base_url", "help", "resume_allow_data_change"}


def _file_keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Key of a training config -> its flag's action: every option name without dashes
    (``bfp``, ``precision``, ``batch-size-train``), also with underscores."""
    keys = {}
    for a in parser._actions:
        if a.dest in _NOT_IN_FILES or not a.option_strings:
            continue
        for opt in a.option_strings:
            name = opt.lstrip("-")
            keys[name] = keys[name.replace("-", "_")] = a
    return keys


def load_train_config(path: Path, parser: argparse.ArgumentParser) -> tuple[dict[str, Any], dict]:
    """(flag defaults by dest, plan entries) from a conf_train JSON file; unknown keys are errors."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"training config {str(path)!r} is not UTF-8 text (byte {e.start}: "
                         f"{e.object[e.start:e.start + 1]!r}); save it as UTF-8 JSON") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"training config {str(path)!r} is not readable JSON: {e}") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise UsageError(f"training config {str(path)!r}: JSON nested too deeply to read (Python's limit is "
                         f"about {sys.getrecursionlimit()} levels; a training config needs fewer than 10)") from None
    if not isinstance(raw, dict):
        raise UsageError(f"training config {str(path)!r} must hold a JSON object")
    keys = _file_keys(parser)
    flags, plan = {}, {}
    for key, value in raw.items():
        if key in PLAN_KEYS:
            if not isinstance(value, dict):
                raise UsageError(f"training config {str(path)!r}: {key!r} must be an object keyed by epoch")
            plan[key] = value
            continue
        a = keys.get(str(key).lstrip("-"))
        if a is None:
            allowed = sorted(PLAN_KEYS) + sorted({k for k in keys if "_" not in k and len(k) > 2})
            raise UsageError(f"training config {str(path)!r}: unknown key {key!r}; allowed: {', '.join(allowed)}")
        where = f"training config {str(path)!r}: {key!r}"
        if a.dest == "model_opt":
            if not isinstance(value, dict):
                raise UsageError(f'{where} must be an object like {{"width": 16}}, got {value!r}')
            value = [model_option(f"{k}={v}") for k, v in value.items()]
        elif isinstance(value, (list, dict)):
            raise UsageError(f"{where} must be a single value, got {value!r}")
        elif value is None:
            if a.default is not None:
                raise UsageError(f"{where} cannot be null (default: {a.default!r})")
        else:
            try:  # as argparse would convert the same text on the command line
                value = a.type(str(value)) if a.type is not None else str(value)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                raise UsageError(f"{where}: {e}") from None
        if a.choices is not None and value not in a.choices:
            raise UsageError(f"training config {str(path)!r}: {key!r} = {value!r}; allowed: "
                             f"{', '.join(map(str, a.choices))}")
        flags[a.dest] = value
    return flags, plan


def explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Dests of the flags actually present in ``argv``."""
    quiet = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for a in parser._actions:
        if a.option_strings and a.dest != "help":
            kw = dict(dest=a.dest, nargs=a.nargs, const=a.const) if a.nargs is not None else dict(dest=a.dest)
            if isinstance(a, argparse._AppendAction):
                kw = dict(dest=a.dest, action="append")
            quiet.add_argument(*a.option_strings, **kw)
    ns, _ = quiet.parse_known_args(list(argv))
    return set(vars(ns))


def parse_args(task: Task, argv: Optional[Sequence[str]] = None
               ) -> tuple[argparse.Namespace, EpochPlan, Optional[Path]]:
    parser = build_parser(task)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    plan_raw, tc_path = {}, None
    if args.train_config_file:
        try:
            tc_path = find_train_config(args.train_config_file)
        except ConfigError as e:
            raise UsageError(f"-tc {e}") from None
        flags, plan_raw = load_train_config(tc_path, parser)
        parser.set_defaults(**flags)
        args = parser.parse_args(argv)  # command-line flags win over the file
    args.explicit = sorted(explicit_flags(parser, argv))
    try:
        plan = EpochPlan.parse(plan_raw.get("bfp-layer-conf-dict"), plan_raw.get("optimizer-dict"),
                               str(tc_path) if tc_path else "<flags>")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if tc_path is not None:
        epochs = args.training_epochs if args.training_epochs is not None else task.epochs(args.dataset)
        for line in drop_late_entries(plan, epochs, str(tc_path)):
            print(f"{task.prog}: warning: {line}", file=sys.stderr)
    return args, plan, tc_path


def drop_late_entries(plan: EpochPlan, epochs: int, source: str) -> list[str]:
    """Remove the plan entries at epochs the run does not reach; returns one warning line per schedule.

    So a shipped schedule (switches at epochs 20 and 180) can be smoke-tested with
    ``--training-epochs 1``: the later entries are dropped with a warning, not an
    error. Their network configs are still loaded (a missing preset or a bad file
    fails now), though not matched against the model, which only the entries kept
    are. Nothing is dropped for ``epochs < 1``: that is reported as its own error.
    """
    if epochs < 1:
        return []
    lines = []
    for what, entries in (("bfp-layer-conf-dict", plan.precision), ("optimizer-dict", plan.optimizer)):
        late = sorted(e for e in entries if e >= epochs)
        if not late:
            continue
        for e in late:
            cfg = entries.pop(e)
            if what == "bfp-layer-conf-dict" and cfg is not None:
                try:
                    load_config(cfg)
                except ConfigError as err:
                    raise UsageError(f"{source}: {what}[{e}]: {err}") from None
        lines.append(f"{source}: {what} entries at epochs {late} ignored: the run trains epochs "
                     f"0..{epochs - 1} (--training-epochs {epochs})")
    return lines


