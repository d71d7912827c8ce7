"""A result file checked field by field: nothing read from one is trusted as it stands.

Result files come from other people's commits, so ``check`` verifies each field's type and range
and that what the file claims agrees with what it records, before any value reaches a report, a
verdict or a subprocess:

* ``row`` is the file's stem and ``<base_row>`` with its ``seed`` (``fp32-s1`` is seed 1 of ``fp32``);
  ``table`` and ``profile`` are the ones asked for (a vit-table file or a quick-profile result is
  not a row of the full cifar10 table);
* every commit (the file's and each invocation's) is 40 lower-case hex digits, with ``+dirty`` for
  a tree with uncommitted changes, or null (run outside git); ``git_commit`` is the first
  invocation's and ``citable`` is what the invocations say (one clean commit), not what the file says;
* every accuracy is a finite number from 0 to 100, losses are numbers, times, counts, threads and
  seeds are non-negative, ``mean_bits`` is null or in (0, 64], ``machine``/``versions`` are objects;
* ``final_top1``/``best_top1`` are the last and best epoch's;
* what the file claims agrees with its own command and with its table (``agrees``): as many epochs,
  numbered from 0, as the command's ``--training-epochs``, ``steps`` the last epoch's step, ``seed``
  the command's, ``command`` the first invocation's argv; the row is one of the table's, with its
  claim and words, the profile's setup and script, and (for the published ``full`` profile) its
  epoch count.

A file that fails is a ``ResultError`` naming the file and the field.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

from . import matrix
from .spread import seed_key

COMMIT = re.compile(r"[0-9a-f]{40}(\+dirty)?")
ACCURACIES = ("test_acc1", "test_acc5", "train_acc1")
LOSSES = ("train_loss", "test_loss")


class ResultError(ValueError):
    """A result file that is not what the runner wrote; the message names the file."""


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def commit_ok(v: Any) -> bool:
    """A commit as the runner records it: 40 hex digits (``+dirty`` allowed), or None."""
    return v is None or (isinstance(v, str) and COMMIT.fullmatch(v) is not None)


def citable(invocations: list[dict]) -> bool:
    """Every invocation ran from one clean commit."""
    commits = {i.get("git_commit") for i in invocations}
    return bool(invocations) and len(commits) == 1 and commit_ok(invocations[0].get("git_commit")) \
        and invocations[0].get("git_commit") is not None and "+dirty" not in invocations[0]["git_commit"]


def _accuracy(v: Any) -> bool:
    return is_number(v) and math.isfinite(v) and 0 <= v <= 100


def _nonneg(v: Any) -> bool:
    return is_number(v) and math.isfinite(v) and v >= 0


def check(doc: Any, path: Path, table: Optional[str] = None, profile: Optional[str] = None) -> dict:
    """``doc`` when every field holds (module docstring), else ``ResultError`` naming ``path``."""
    def bad(why: str) -> ResultError:
        return ResultError(f"result file {path}: {why}; it is not what the runner wrote (remove it and "
                           f"rerun the row, or restore it from git)")
    if not isinstance(doc, dict):
        raise bad(f"a JSON {type(doc).__name__}, not an object")
    if doc.get("row") != path.stem:
        raise bad(f"its row is {doc.get('row')!r}, not {path.stem!r} (its file name)")
    for key, want in (("table", table), ("profile", profile)):
        if not isinstance(doc.get(key), str):
            raise bad(f"{key} is {doc.get(key)!r}, not a name")
        if want is not None and doc[key] != want:
            raise bad(f"it is a result of {key} {doc[key]!r}, not of {want!r} (the {key} asked for)")
    seed = doc.get("seed")
    if not is_int(seed) or seed < 0:
        raise bad(f"seed is {seed!r}, not an integer >= 0")
    if not isinstance(doc.get("base_row"), str) or seed_key(doc["base_row"], seed) != path.stem:
        raise bad(f"its base_row {doc.get('base_row')!r} with seed {seed} is row "
                  f"{seed_key(str(doc.get('base_row')), seed)!r}, not {path.stem!r} (a copy of another seed's file?)")
    if not is_int(doc.get("threads")) or doc["threads"] < 0:
        raise bad(f"threads is {doc.get('threads')!r}, not an integer >= 0")
    for key in ("command",):
        v = doc.get(key)
        if not isinstance(v, list) or not v or not all(isinstance(a, str) for a in v):
            raise bad(f"{key} is {v!r}, not a non-empty list of strings")
    inv = doc.get("invocations")
    if not isinstance(inv, list) or not all(isinstance(i, dict) for i in inv):
        raise bad(f"invocations is {type(inv).__name__}, not a list of objects")
    for n, i in enumerate(inv, 1):
        argv = i.get("argv", [])
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise bad(f"invocation {n}'s argv is {argv!r}, not a list of strings")
        if not commit_ok(i.get("git_commit")):
            raise bad(f"invocation {n}'s git_commit is {i.get('git_commit')!r}, not 40 hex digits (+dirty) or null")
    if not commit_ok(doc.get("git_commit")):
        raise bad(f"git_commit is {doc.get('git_commit')!r}, not 40 hex digits (+dirty) or null")
    first = inv[0].get("git_commit") if inv else None
    if doc["git_commit"] != first:
        raise bad(f"git_commit is {doc['git_commit']!r}, but its first invocation ran at {first!r}")
    if doc.get("citable") is not citable(inv):
        raise bad(f"citable is {doc.get('citable')!r}, but its invocations say {citable(inv)} (citable: every "
                  f"invocation at one clean commit)")
    for key in ("machine", "versions"):
        if not isinstance(doc.get(key), dict):
            raise bad(f"{key} is {type(doc.get(key)).__name__}, not an object")
    epochs = doc.get("epochs")
    if not isinstance(epochs, list) or not epochs or not all(isinstance(e, dict) for e in epochs):
        raise bad("'epochs' must be a non-empty list of objects with a numeric test_acc1")
    for n, e in enumerate(epochs, 1):
        if not is_number(e.get("test_acc1")):
            raise bad(f"'epochs' must be a non-empty list of objects with a numeric test_acc1 (epoch {n}'s "
                      f"is {e.get('test_acc1')!r})")
        for key in ACCURACIES:
            if key in e and e[key] is not None and not _accuracy(e[key]):
                raise bad(f"epoch {n}'s {key} is {e[key]!r}; an accuracy is a finite number from 0 to 100")
        for key in LOSSES:
            if e.get(key) is not None and not is_number(e[key]):
                raise bad(f"epoch {n}'s {key} is {e[key]!r}, not a number")
    top1 = [e["test_acc1"] for e in epochs]
    for key, want in (("final_top1", top1[-1]), ("best_top1", max(top1))):
        if not is_number(doc.get(key)) or doc[key] != want:
            raise bad(f"{key} is {doc.get(key)!r}, but its own epochs say {want!r}")
    for key in ("train_time_s", "wall_time_s"):
        if not _nonneg(doc.get(key)):
            raise bad(f"{key} is {doc.get(key)!r}, not a finite number of seconds >= 0")
    for key in ("steps", "skipped_steps"):
        v = doc.get(key)
        if (v is not None or key == "steps") and not (is_int(v) and v >= 0):
            raise bad(f"{key} is {v!r}, not an integer >= 0" + (" or null" if key != "steps" else ""))
    bits = doc.get("mean_bits")
    if bits is not None and not (is_number(bits) and math.isfinite(bits) and 0 < bits <= 64):
        raise bad(f"mean_bits is {bits!r}, not null or a number in (0, 64]")
    agrees(doc, bad, table, profile)
    return doc


def _flag(argv: list[str], flag: str) -> Optional[str]:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def agrees(doc: dict, bad, table: Optional[str], profile: Optional[str]) -> None:
    """The file's fields agree with its command and with its table's row and profile (module
    docstring); ``bad(why)`` is the error to raise."""
    command, epochs = doc["command"], doc["epochs"]
    inv = doc["invocations"]
    if inv and inv[0].get("argv") != command:
        raise bad("its command is not the argv its first invocation ran")
    want = _flag(command, "--training-epochs")
    if want is None or not want.isdigit() or int(want) != len(epochs):
        raise bad(f"it records {len(epochs)} epochs, but its command asks for --training-epochs {want}")
    numbers = [e.get("epoch") for e in epochs]
    if numbers != list(range(len(epochs))):
        raise bad(f"its epochs are numbered {numbers[:5]}{' ...' if len(numbers) > 5 else ''}, not 0 to "
                  f"{len(epochs) - 1}")
    if doc["steps"] != epochs[-1].get("global_step", doc["steps"]):
        raise bad(f"steps is {doc['steps']}, but its last epoch ended at step {epochs[-1].get('global_step')}")
    if str(doc["seed"]) != (_flag(command, "--seed") or "0"):
        raise bad(f"seed is {doc['seed']}, but its command has --seed {_flag(command, '--seed') or '0 (none given)'}")
    if table not in matrix.TABLES or profile not in matrix.TABLE_PROFILES.get(table, {}):
        return
    rows = {r.name: r for r in matrix.TABLES[table]}
    row, prof = rows.get(doc["base_row"]), matrix.TABLE_PROFILES[table][profile]
    if row is None:
        raise bad(f"its row {doc['base_row']!r} is not a row of {table} (rows: {', '.join(rows)})")
    for key, mine in (("claim", row.claim), ("words", row.words), ("setup", prof.about)):
        if doc.get(key) != mine:
            raise bad(f"its {key} is {doc.get(key)!r}, but {table}'s {'row' if key != 'setup' else 'profile'} "
                      f"says {mine!r}")
    if not command or command[0] != prof.script:
        raise bad(f"its command runs {command[0] if command else None!r}, but {table} runs {prof.script}")
    if profile == "full" and len(epochs) != prof.epochs:
        raise bad(f"it records {len(epochs)} epochs, but {table}'s {profile} profile trains {prof.epochs}")
