"""``verify``: rerun one recorded row from scratch and compare every epoch, and the log of those reruns.

A rerun that reproduces a row recorded on another host is the evidence that rows from the two
hosts can sit in one table: torch's float32 kernels sum in an order that depends on the CPU (its
instruction set, e.g. AVX2 against AVX-512), so two hosts that report the same CPU name may or may
not train to the same digits, and only a rerun says which. Each ``verify`` appends one line to
``results/<table>/verified.jsonl``: the row, whether it was identical, the recorded file's
fingerprint (SHA-256 of its command and epochs), host and training time, and the rerun's host,
commit, date and training time (``time_on``: a row's time is compared with FP32's on its own host).
``ties`` keeps the lines whose fingerprint still matches the row's current result file (a rerun
of a row that has since been replaced proves nothing about the new one); the report uses them to
say which hosts are shown to agree.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from . import results, runner

LOG = "verified.jsonl"
KEYS = ("train_loss", "test_loss", "test_acc1")


def fingerprint(doc: dict) -> str:
    """SHA-256 of a result document's command and epochs (what a rerun reproduces)."""
    return hashlib.sha256(json.dumps([doc.get("command"), doc["epochs"]], sort_keys=True).encode()).hexdigest()


def host(doc: dict) -> str:
    """The host a result ran on, in words: CPU name, platform (with this VM's build) and torch
    version; the fields every result file has, so files written before ``cpu_id``/``isa`` were
    recorded compare with newer ones."""
    m, v = doc.get("machine") or {}, doc.get("versions") or {}
    return f"{m.get('cpu')}, {m.get('platform')}, torch {v.get('torch')}"


def differences(recorded: dict, again: dict) -> list[str]:
    """Every epoch's train loss, test loss and top-1 that differ (exactly), and a differing epoch count."""
    diffs = [f"epoch {a.get('epoch', i) + 1} {k}: recorded {a.get(k)!r}, now {b.get(k)!r}"
             for i, (a, b) in enumerate(zip(recorded["epochs"], again["epochs"])) for k in KEYS
             if a.get(k) != b.get(k)]
    if len(recorded["epochs"]) != len(again["epochs"]):
        diffs.append(f"{len(recorded['epochs'])} epochs recorded, {len(again['epochs'])} rerun")
    return diffs


def verify(table: str, row, prof, data: str, res_dir: Path, runs_dir: Path) -> int:
    """Rerun ``row`` into ``runs_dir/.verify`` for as many epochs as recorded, compare every epoch
    exactly, append the outcome to ``res_dir/verified.jsonl``; 0 when identical, 1 otherwise."""
    path = res_dir / f"{row.name}.json"
    if not path.is_file():
        raise ValueError(f"no recorded result {path} to verify against; run the row first")
    doc = results.read_result(path, table, prof.name)  # checked: its summary agrees with its own epochs
    was = data_of(doc["command"], prof.data_flag)
    same = (was or "") == (data or "")
    if not same:
        print(f"note: {row.name} was recorded reading {prof.data_flag} {was}; this rerun reads {data}: if the "
              f"images differ, so will the numbers")
    scratch = runs_dir / ".verify"
    with runner.table_lock(runs_dir, res_dir):
        if scratch.exists():
            shutil.rmtree(scratch)
        if not runner.run_row(table, row, prof, data, scratch / "results", scratch, len(doc["epochs"])):
            return 1
    again = results.read_result(scratch / "results" / f"{row.name}.json", table, prof.name)
    diffs = differences(doc, again)
    with open(res_dir / LOG, "a") as f:
        f.write(json.dumps({"row": row.name, "identical": not diffs, "epochs": len(again["epochs"]),
                            "recorded": {"sha256": fingerprint(doc), "host": host(doc),
                                         "commit": doc.get("git_commit"), "train_time_s": doc.get("train_time_s")},
                            "data": {"recorded": was, "rerun": data, "same": same},
                            "rerun": {"host": host(again), "commit": again.get("git_commit"),
                                      "date": time.strftime("%Y-%m-%d", time.gmtime()),
                                      "train_time_s": again.get("train_time_s")}}) + "\n")
    if diffs:
        print(f"{row.name}: DIFFERS from {path} (threads {doc['threads']}, seed {doc['seed']}, "
              f"machine {doc['machine'].get('cpu')}"
              + (f"; the rerun read other data: {data}, recorded {was}" if not same else "")
              + "):\n  " + "\n  ".join(diffs))
        return 1
    print(f"{row.name}: identical to {path}: {len(again['epochs'])} epochs of {', '.join(KEYS)}")
    return 0


def data_of(command: list[str], flag: Optional[str]) -> Optional[str]:
    """The data folder a row's command reads (the value of its ``flag``), None without one."""
    if flag is None or flag not in command[:-1]:
        return None
    return command[command.index(flag) + 1]


def load(res_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``res_dir/verified.jsonl`` ([] without one); ResultError naming the file and
    line for one that is not a verify record."""
    path = Path(res_dir) / LOG
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
            ok = (isinstance(rec, dict) and isinstance(rec.get("row"), str) and isinstance(rec.get("identical"), bool)
                  and all(isinstance(rec.get(k), dict) for k in ("recorded", "rerun")))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise results.ResultError(f"{path} line {n}: not a verify record; remove the line or restore the "
                                      f"file from git")
        out.append(rec)
    return out


def ties(res: dict[str, dict], records: list[dict]) -> list[dict]:
    """The identical reruns of rows whose current result file is the one that was rerun."""
    return [r for r in records if r["identical"] and r["row"] in res
            and r["recorded"].get("sha256") == fingerprint(res[r["row"]])]


def time_on(res: dict[str, dict], records: list[dict], name: str, where: str) -> Optional[float]:
    """Row ``name``'s training seconds on host ``where``: its own result's when it ran there, else
    the latest ``verify`` rerun there of its current result file (identical or not: the same
    command either way); None when neither exists."""
    d = res.get(name)
    if d is None:
        return None
    if host(d) == where:
        return d.get("train_time_s")
    times = [r["rerun"].get("train_time_s") for r in records if r["row"] == name and r["rerun"].get("host") == where
             and r["recorded"].get("sha256") == fingerprint(d)]
    return next((t for t in reversed(times) if t), None)
