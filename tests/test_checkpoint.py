"""Checkpoints: atomic writes, clear errors for bad files, and bit-exact resume
of a run killed after its first epoch."""
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bfp.engine import checkpoint as ckpt
from bfp.cli import cifar as main

ROOT = Path(__file__).resolve().parents[1]


def test_save_replaces_atomically_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt.save({"x": torch.arange(3)}, path)

    def broken_save(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save({"x": torch.arange(5)}, path)
    monkeypatch.undo()
    assert torch.equal(ckpt.load(path)["x"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temp file left


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_file_gives_an_error_naming_it(tmp_path, damage):
    path = tmp_path / "ck.pt"
    ckpt.save({"w": torch.randn(100, 100)}, path)
    raw = path.read_bytes()
    path.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": b"\x00not a zip" * 10, "empty": b""}[damage])
    with pytest.raises(ckpt.CheckpointError, match=r"ck\.pt.*corrupt or truncated"):
        ckpt.load(path)


def test_foreign_and_missing_files_are_named(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"other\.pt' is not a bfpsim checkpoint"):
        ckpt.load(tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "nope.pt")
    with pytest.raises(ckpt.CheckpointError, match="has no checkpoints/last.pt"):
        ckpt.resolve(tmp_path)


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    g = torch.Generator().manual_seed(7)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ckpt.save({"rng": ckpt.rng_state({"data": g})}, tmp_path / "r.pt")
    expect = (random.random(), np.random.rand(), torch.rand(1), torch.rand(1, generator=g))
    random.seed(9), np.random.seed(9), torch.manual_seed(9), g.manual_seed(9)
    ckpt.set_rng_state(ckpt.load(tmp_path / "r.pt")["rng"], {"data": g})
    got = (random.random(), np.random.rand(), torch.rand(1), torch.rand(1, generator=g))
    assert expect[:2] == got[:2] and torch.equal(expect[2], got[2]) and torch.equal(expect[3], got[3])


def _final_model(run_dir: Path):
    return ckpt.load(run_dir / "checkpoints" / "last.pt")


def test_killed_and_resumed_run_ends_with_the_same_weights(tmp_path, tiny_args):
    # Precision and learning rate switch at epoch 1, the first epoch the resumed
    # process trains; every RNG, the optimizer and the switch must survive the kill.
    tc = tmp_path / "sched.json"
    tc.write_text('{"bfp-layer-conf-dict": {"0": "ResNet18_FB16", "1": "ResNet18_FB12"},'
                  ' "optimizer-dict": {"1": {"lr": 0.05}}}')
    common = tiny_args("--training-epochs", "2", "--save", "True", "-tc", str(tc))
    killed = tmp_path / "runs" / "killed"
    proc = subprocess.Popen([sys.executable, str(ROOT / "cifar.py"), *common, "--run-name", "killed"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        last = killed / "checkpoints" / "last.pt"
        deadline = time.monotonic() + 300
        while not last.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint after the first epoch"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    stopped_at = ckpt.load(last)["epoch"]
    assert stopped_at == 1, "the run finished before it could be killed"

    assert main([*common, "--resume", str(killed)]) == 0
    assert main([*common, "--run-name", "straight"]) == 0
    resumed, straight = _final_model(killed), _final_model(tmp_path / "runs" / "straight")
    assert resumed["epoch"] == straight["epoch"] == 2
    assert resumed["model"].keys() == straight["model"].keys()
    for k in straight["model"]:
        assert torch.equal(resumed["model"][k], straight["model"][k]), k
    assert len(resumed["optimizer"]["state"]) == len(straight["optimizer"]["state"]) > 0
    for a, b in zip(resumed["optimizer"]["state"].values(), straight["optimizer"]["state"].values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert resumed["precision_state"] == straight["precision_state"]
    assert resumed["network_config"] == "ResNet18_FB12"
    assert [h["test_acc1"] for h in resumed["history"]] == [h["test_acc1"] for h in straight["history"]]
    # the interrupted run's config.json is kept; the resume writes its own beside it
    assert (killed / "config.json").is_file() and (killed / f"config.resumed-at-epoch{stopped_at}.json").is_file()


def test_resume_refuses_changed_flags(tmp_path, tiny_args, capsys):
    args = tiny_args("--training-epochs", "1", "--save", "True", "--run-name", "r")
    assert main(args) == 0
    rc = main([*tiny_args("--optim-lr", "0.5"), "--resume", str(tmp_path / "runs" / "r")])
    assert rc == 2
    assert "--optim-lr" in capsys.readouterr().err


def test_resume_from_an_earlier_checkpoint_never_overwrites_a_later_one(tmp_path, tiny_args, capsys):
    import shutil
    args = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1")
    assert main([*args, "--run-name", "r"]) == 0
    run = tmp_path / "runs" / "r"
    saved = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    assert main([*args, "--resume", str(run / "checkpoints" / "epoch_001.pt")]) == 2
    err = capsys.readouterr().err
    assert "last.pt" in err and "2 epochs done" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == saved
    # the documented way to branch: a copy without last.pt continues in the copy
    branch = tmp_path / "runs" / "branch"
    shutil.copytree(run, branch)
    (branch / "checkpoints" / "last.pt").unlink()
    assert main([*args, "--resume", str(branch / "checkpoints" / "epoch_001.pt")]) == 0
    assert ckpt.load(branch / "checkpoints" / "last.pt")["epoch"] == 2
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == saved


def test_resume_of_a_corrupt_checkpoint_names_the_file(tmp_path, tiny_args, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert main([*tiny_args(), "--resume", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.pt" in err and "corrupt or truncated" in err and "Traceback" not in err


def test_resume_of_a_checkpoint_without_flags_says_so(tmp_path, tiny_args, capsys):
    ckpt.save({"epoch": 1, "extra": {}}, tmp_path / "api.pt")  # as a Trainer without extra_state writes
    assert main([*tiny_args(), "--resume", str(tmp_path / "api.pt")]) == 2
    err = capsys.readouterr().err
    assert "api.pt" in err and "no cifar.py flags" in err and "Traceback" not in err


def test_dataloader_path_resumes_exactly(tmp_path):
    """The torch DataLoader path (image folders, CIFAR) draws its order and crops
    from the saved generator and global RNG: a trainer rebuilt from the epoch-1
    state ends where an uninterrupted one does."""
    from PIL import Image

    import bfp.models
    from bfp.engine import TrainConfig, Trainer
    from bfp.data import cifar as D
    from bfp.cli.run import cpu_threads
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 12), ("test", 4)):
        for c in range(2):
            d = tmp_path / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n):
                px = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy()
                Image.fromarray(px).save(d / f"{i}.png")

    def trainer():
        torch.manual_seed(0)
        data = D.load("imagefolder", str(tmp_path), batch_size_train=8, num_workers=0, seed=3)
        model = bfp.models.create("ResNet10", 2, width=4)
        return Trainer(model, data, TrainConfig(epochs=2, progress=False), checkpoint_dir=tmp_path / "ck")

    with cpu_threads(1):
        straight = trainer()
        straight.fit()
        first = trainer()
        first.epochs = 1
        first.fit()
        state = ckpt.load(tmp_path / "ck" / "last.pt")
        resumed = trainer()
        torch.manual_seed(123), random.seed(123), resumed.data.generator.manual_seed(123)  # whatever ran in between
        resumed.load_state_dict(state)
        resumed.fit()
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
