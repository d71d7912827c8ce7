"""One row's result file: what a finished run directory says, plus where and how it ran.

``collect`` reads the run directory ``cifar.py --log True`` wrote
(``metrics.jsonl``: one line per epoch; ``dynamic_precision.csv`` for
``--do``) and returns the small JSON document the runner commits under
``results/<table>/<row>.json``: the command, git commit, package versions,
machine, threads, seed, per-epoch train loss / test top-1, final and best
top-1, times, mean bits (``--do``) and skipped steps (loss scaling).
"""
from __future__ import annotations

import csv
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from ..engine import logs
from .validate import ResultError, check, citable

__all__ = ["collect", "load_results", "read_result", "write_json", "ResultError", "check", "resumed"]

EPOCH_KEYS = ("epoch", "global_step", "train_loss", "train_acc1", "test_loss", "test_acc1", "test_acc5",
              "lr", "epoch_time_s", "images_per_s", "skipped_steps", "loss_scale")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The per-epoch metrics of a run (``bfp.engine.logs.read_metrics``); [] before its first epoch."""
    try:
        return logs.read_metrics(run_dir)
    except FileNotFoundError:
        return []


def mean_bits(run_dir: Path, total_steps: int) -> Optional[float]:
    """Mean bits of a ``--do`` run: every (layer, operand pair)'s bits weighted by the training
    steps they were in force, averaged over the pairs with equal weight; None without a log."""
    path = run_dir / "dynamic_precision.csv"
    if not path.is_file() or total_steps <= 0:
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    changes: dict[tuple[str, str], list[tuple[int, int]]] = {}
    start: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["layer"], r["pair"])
        start.setdefault(key, int(r["old_bits"]))
        changes.setdefault(key, []).append((int(r["step"]), int(r["new_bits"])))
    means = []
    for key, bits0 in start.items():
        acc, at, bits = 0, 0, bits0
        for step, new in sorted(changes[key]):
            step = min(step, total_steps)
            acc += bits * (step - at)
            at, bits = step, new
        acc += bits * (total_steps - at)
        means.append(acc / total_steps)
    return sum(means) / len(means)


def machine() -> dict[str, Any]:
    """Where a row ran: platform, CPU name, ``cpu_id`` (vendor family/model/stepping, which tell
    CPU generations with one marketing name apart), torch's instruction-set level (``isa``:
    AVX2, AVX512, ...; it picks the kernels and so the order of float additions), cores, Python."""
    cpu, fields = platform.processor() or "", {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "vendor_id", "cpu family", "model", "stepping"):
                fields.setdefault(key.strip(), value.strip())
            elif not line.strip() and fields:
                break
    except OSError:
        pass
    cpu = fields.get("model name", cpu)
    cpu_id = (f"{fields['vendor_id']} {fields.get('cpu family')}/{fields.get('model')}/{fields.get('stepping')}"
              if "vendor_id" in fields else None)
    isa = torch.backends.cpu.get_cpu_capability()  # torch >= 2.1 (the project needs >= 2.3)
    return {"platform": platform.platform(), "cpu": cpu, "cpu_id": cpu_id, "isa": isa, "cores": os.cpu_count(),
            "python": platform.python_version()}


def versions() -> dict[str, Optional[str]]:
    out = {}
    for pkg in ("bfpsim", "torch", "torchvision", "numba", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def resumed(invocations: Optional[list[dict]]) -> bool:
    """Whether a result's run went on from a checkpoint: one of its ``invocations`` is ``--resume``.
    Read from the invocations, not a file's stored flag, which files before this rule set for any
    second invocation (a first one killed before its first checkpoint made it a restart)."""
    return any("--resume" in (i.get("argv") or []) for i in invocations or [])


def collect(run_dir: Path, *, table: str, row, profile, command: list[str], invocations: list[dict],
            name: Optional[str] = None) -> dict[str, Any]:
    """The result document of a finished row (see the module docstring); the git commit is the
    one the row was started at (its first invocation's)."""
    metrics = read_metrics(run_dir)
    epochs = [{k: m[k] for k in EPOCH_KEYS if k in m} for m in metrics]
    top1 = [m["test_acc1"] for m in metrics]
    steps = int(metrics[-1]["global_step"]) if metrics else 0
    skipped = [m.get("skipped_steps") for m in metrics]
    return {
        "table": table, "row": name or row.name, "base_row": row.name, "claim": row.claim, "words": row.words,
        "profile": profile.name, "setup": profile.about,
        "command": command, "resumed": resumed(invocations), "invocations": invocations,
        "git_commit": invocations[0].get("git_commit") if invocations else None,
        "citable": citable(invocations),  # every invocation ran from one clean commit
        "versions": versions(), "machine": machine(),
        "threads": profile.threads, "seed": int(_flag(command, "--seed", "0")),
        "epochs": epochs,
        "final_top1": top1[-1] if top1 else None, "best_top1": max(top1) if top1 else None,
        "train_time_s": sum(m.get("epoch_time_s", 0.0) for m in metrics),
        "wall_time_s": sum(i.get("wall_s", 0.0) for i in invocations),
        "steps": steps,
        "mean_bits": mean_bits(run_dir, steps),
        "skipped_steps": sum(s for s in skipped if s is not None) if any(s is not None for s in skipped)
        else None,
    }


def _flag(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else default


def write_json(doc: dict, path: Path) -> None:
    """``doc`` to ``path`` atomically (temporary file, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def read_result(path: Path, table: Optional[str] = None, profile: Optional[str] = None) -> dict:
    """One checked result file (``validate.check``: of ``table`` and ``profile`` when given);
    ``ResultError`` naming it when unreadable or wrong."""
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultError(f"result file {path}: not JSON ({e}); truncated or damaged: remove it and "
                          f"rerun the row, or restore it from git") from None
    except OSError as e:
        raise ResultError(f"result file {path}: cannot read it ({e.strerror or e})") from None
    return check(doc, Path(path), table, profile)


def load_results(folder: Path, table: Optional[str] = None, profile: Optional[str] = None) -> dict[str, dict]:
    """Every ``<row>.json`` of ``folder``, by row name, each checked (``read_result``); a
    ``ResultError`` when ``folder`` is missing or not a folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultError(f"result folder {str(folder)!r} {'is not a folder' if folder.exists() else 'does not exist'}; "
                          f"give the folder of a table's result files (--results)")
    return {p.stem: read_result(p, table, profile) for p in sorted(folder.glob("*.json"))}
