"""A run killed (SIGKILL) in or between the writes of an epoch's checkpoint set, then
resumed, ends with the full set of an uninterrupted run, tensor for tensor."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfp.cli import cifar as main
from bfp.engine import checkpoint as ckpt
from bfp.engine import checkpoint_set

ROOT = Path(__file__).resolve().parents[1]

# A child that runs cifar.py and kills itself (SIGKILL) at the nth write of one file:
# before it starts, half way through its temporary file, or right after it is in place.
CHILD = r"""
import os, signal, sys
from pathlib import Path
from bfp.engine import checkpoint as c
name, nth, phase = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seen = {}
write = c.write_bytes
def killing_write(data, path):
    path = Path(path)
    seen[path.name] = seen.get(path.name, 0) + 1
    if path.name == name and seen[path.name] == nth:
        if phase == "mid":
            with open(c.temp_path(path), "wb") as f:
                f.write(data[: len(data) // 2])
        if phase == "after":
            write(data, path)
        os.kill(os.getpid(), signal.SIGKILL)
    return write(data, path)
c.write_bytes = killing_write
from bfp.cli import cifar
sys.exit(cifar(sys.argv[4:]))
"""

SAME = ("epoch", "global_step", "best_acc", "model", "optimizer", "schedule", "scaler", "rng",
        "network_config", "precision_state", "callbacks", "config")


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def assert_same_checkpoint(got: dict, want: dict, name: str) -> None:
    for k in SAME:
        assert _equal(got[k], want[k]), f"{name}: {k} differs"
    metrics = ("train_loss", "test_loss", "test_acc1")  # times differ between runs
    assert [[h[m] for m in metrics] for h in got["history"]] == [[h[m] for m in metrics] for h in want["history"]]


@pytest.fixture
def straight(tmp_path_factory, tiny_args):
    """The uninterrupted run's checkpoints, by file name."""
    base = tmp_path_factory.mktemp("straight")
    args = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1",
                     "--run-dir", str(base), "--run-name", "s")
    assert main(args) == 0
    return {p.name: ckpt.load(p) for p in (base / "s" / "checkpoints").glob("*.pt")}


def _kill_and_resume(tmp_path, tiny_args, straight, name, nth, phase):
    common = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1")
    run = tmp_path / "runs" / "k"
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(nth), phase, *common, "--run-name", "k"],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == -9, f"the kill point {name} #{nth} {phase} was never reached: " \
                                  f"{proc.stderr.decode()[-2000:]}"
    temps = [p for p in (run / "checkpoints").iterdir() if ckpt.TEMP_MARK in p.name]
    assert bool(temps) == (phase == "mid")
    assert main([*common, "--resume", str(run)]) == 0
    got = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert got == sorted(straight), "the resumed run's set is not the uninterrupted run's"
    for n in got:
        assert_same_checkpoint(ckpt.load(run / "checkpoints" / n), straight[n], n)


# Epoch 2 writes epoch_002.pt, best.pt (when its accuracy is the best so far), last.pt.
# Writing last.pt first (as before) fails the first two: the resume would find the epoch done.
@pytest.mark.parametrize("name, nth, phase", [
    ("epoch_002.pt", 1, "before"),   # after the epoch trained, before any of its files
    ("last.pt", 2, "after"),         # last.pt in place, nothing after it
    ("last.pt", 2, "mid"),           # half of last.pt in its temporary file
])
def test_a_kill_during_the_checkpoint_writes_is_repaired_by_the_resume(tmp_path, tiny_args, straight,
                                                                       name, nth, phase):
    _kill_and_resume(tmp_path, tiny_args, straight, name, nth, phase)


@pytest.mark.slow
@pytest.mark.parametrize("name, nth, phase", [
    (n, 2 if n == "last.pt" else 1, ph) for n in ("epoch_002.pt", "last.pt") for ph in ("before", "mid", "after")
    if (n, ph) not in (("epoch_002.pt", "before"), ("last.pt", "after"), ("last.pt", "mid"))
] + [("best.pt", 2, ph) for ph in ("before", "mid", "after")])
def test_more_kill_points(tmp_path, tiny_args, straight, name, nth, phase):
    if name == "best.pt" and "best.pt" in straight and straight["best.pt"]["epoch"] != 2:
        pytest.skip("epoch 2 is not the best epoch of this tiny run: best.pt is written once")
    _kill_and_resume(tmp_path, tiny_args, straight, name, nth, phase)


def test_the_set_is_written_with_last_pt_last(tmp_path, monkeypatch):
    order = []
    write = ckpt.write_bytes
    monkeypatch.setattr(ckpt, "write_bytes", lambda data, path: (order.append(Path(path).name), write(data, path))[1])
    checkpoint_set.write_set({"epoch": 4}, tmp_path, best=True, periodic=True)
    assert order == ["epoch_004.pt", "best.pt", "last.pt"]
    order.clear()
    checkpoint_set.write_set({"epoch": 5}, tmp_path, best=False, periodic=False)
    assert order == ["last.pt"]


def test_temporary_files_of_dead_writers_are_removed_and_a_live_writers_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = ckpt.temp_path(tmp_path / "last.pt", dead.pid)
    live = ckpt.temp_path(tmp_path / "best.pt", os.getppid())  # the process that started pytest
    for p in (stale, live):
        p.write_bytes(b"half")
    assert checkpoint_set.remove_stale_temps(tmp_path) == [stale]
    assert not stale.exists() and live.exists()
