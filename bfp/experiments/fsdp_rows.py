"""The FSDP rows of docs/distributed.md: a small GPT trained by ``lm.py --fsdp`` on 2 gloo processes,
its gradient reduce-scatter in FP32, in FP8 e4m3 and in 4-bit e3m0, each 4-bit and 8-bit one with and
without APS (seed 001's question, asked of FSDP2). One command reruns them all and prints the table:

    python -m bfp.experiments.fsdp_rows --runs runs/fsdp-rows

Each row is ``torchrun --nproc-per-node 2 lm.py -- FLAGS`` with the flags below (one thread a process); the
numbers are the last epoch's test loss, bits per character and next-character accuracy from the run's
``metrics.jsonl``. The table names the commit; as for the results matrices (``runner``'s one rule),
a tree whose tracked files have uncommitted changes (untracked files do not count), or a copy outside
git, is refused, since a published number must come from a commit, unless ``--dirty-ok`` (then the
table and ``fsdp_rows.json`` say so). Each row's rendezvous takes a free port, or ``--port N`` and the
ports after it; a failing row prints its ranks' errors and stops.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from . import runner

ROOT = Path(__file__).resolve().parents[2]
SETUP = ("--model-opt", "dim=64", "--model-opt", "depth=2", "--model-opt", "heads=2", "--block-size", "64",
         "--batch-size-train", "64", "--limit-train-images", "8192", "--limit-test-images", "1024",
         "--training-epochs", "4", "--threads", "1", "--progress", "False", "--sample-chars", "0",
         "--device", "cpu", "--fsdp", "True", "--log", "True", "--seed", "0")
ROWS = (("fp32", "FP32 reduce-scatter (FSDP's own mean)", ()),
        ("e4m3", "e4m3 reduce-scatter, gloo order", ("--grad-format", "e4m3", "--grad-order", "gloo")),
        ("e4m3-aps", "e4m3, gloo order, APS", ("--grad-format", "e4m3", "--grad-order", "gloo", "--use-aps", "True")),
        ("e3m0", "e3m0 (4-bit) reduce-scatter, gloo order",
         ("--grad-exp", "3", "--grad-man", "0", "--grad-order", "gloo")),
        ("e3m0-aps", "e3m0, gloo order, APS", ("--grad-exp", "3", "--grad-man", "0", "--grad-order", "gloo",
                                                 "--use-aps", "True")))


def command(name: str, flags: tuple[str, ...], runs: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
            "lm.py", "--", *SETUP, *flags, "--run-dir", str(runs), "--run-name", name]  # --: lm.py's flags


def free_port() -> int:
    """A TCP port free on this machine now (the system's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_errors(text: str) -> str:
    """What a failed row's ranks said: their ``error:`` lines, each once, else the last lines before
    torchrun's own traceback (its summary names only exit codes)."""
    errors = list(dict.fromkeys(ln for ln in text.splitlines() if re.match(r"^(\[rank\d+\]:)?\S+: error: ", ln)))
    if errors:
        return "\n".join(errors)
    own = text.split("Traceback (most recent call last):")[0].strip().splitlines()
    return "\n".join(own[-20:]) or text[-2000:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/fsdp-rows", help="where the runs go (a fresh folder)")
    p.add_argument("--dirty-ok", action="store_true",
                   help="run from a tree with uncommitted changes, or outside git (not citable)")
    p.add_argument("--port", type=int, default=None,
                   help="the rendezvous port of the first row, the next ones after it (default: a free port a row)")
    args = p.parse_args(argv)
    if args.port is not None and not 1024 <= args.port <= 65535 - len(ROWS):
        p.error(f"--port {args.port}: give a port from 1024 to {65535 - len(ROWS)} (the rows take it and the "
                f"{len(ROWS) - 1} after it)")
    runs = Path(args.runs)
    if runs.exists():
        p.error(f"--runs {runs} exists; give a fresh folder (nothing there is replaced)")
    commit, dirty = runner.source_commit(ROOT), runner.dirty_paths(ROOT)
    if commit is None and not args.dirty_ok:
        p.error(f"{ROOT} is not a git checkout: a published number must come from a commit (or --dirty-ok, "
                f"not citable)")
    if dirty and not args.dirty_ok:
        p.error(f"the tree has uncommitted changes ({', '.join(dirty[:5])}{', ...' if len(dirty) > 5 else ''}); "
                f"commit first (or --dirty-ok, not citable)")
    rows = []
    for i, (name, words, flags) in enumerate(ROWS):
        cmd = command(name, flags, runs.resolve(), free_port() if args.port is None else args.port + i)
        print("$ " + " ".join(cmd[1:]), flush=True)
        r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"},
                           capture_output=True, text=True)
        if r.returncode:
            print(f"row {name} failed (torchrun exit {r.returncode}); its ranks said:\n"
                  f"{rank_errors(r.stdout + chr(10) + r.stderr)}", file=sys.stderr)
            return 1
        last = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()][-1]
        rows.append({"row": name, "reduce_scatter": words, "test_loss": last["test_loss"],
                     "test_bpc": last["test_loss"] / math.log(2), "test_acc1": last["test_acc1"]})
    where = "outside git" if commit is None else f"commit {commit.split('+')[0][:10]}"
    print(f"\nlm.py --fsdp, 2 gloo processes, {where}{' (uncommitted changes)' if dirty else ''}"
          f"{'; not citable' if commit is None or dirty else ''}")
    print("| row | reduce-scatter | test loss | bits/char | next-char acc % |\n|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['row']} | {r['reduce_scatter']} | {r['test_loss']:.4f} | {r['test_bpc']:.3f} | "
              f"{r['test_acc1']:.2f} |")
    (runs / "fsdp_rows.json").write_text(json.dumps({"commit": commit, "dirty": bool(dirty) or commit is None,
                                                     "citable": commit is not None and not dirty,
                                                     "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
