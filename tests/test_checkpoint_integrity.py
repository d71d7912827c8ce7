"""Checkpoints that are damaged, malicious, do not fit, or cannot be written: each a clear
error naming the file, pointing at the newest intact checkpoint of the run."""
import errno
import os
import shutil

import pytest
import torch

from bfp.cli import cifar as main
from bfp.engine import checkpoint as ckpt
from bfp.engine import checkpoint_set


def _flip_100_bytes(path):
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    for i in range(mid, mid + 100):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_bit_flipped_checkpoint_is_refused_naming_the_member(tmp_path):
    path = tmp_path / "last.pt"
    ckpt.save({"w": torch.arange(100_000, dtype=torch.float32)}, path)
    _flip_100_bytes(path)
    with pytest.raises(ckpt.CheckpointError,
                       match=r"last\.pt' is corrupt: member '[^']*data/0' does not match its CRC-32"):
        ckpt.load(path)


@pytest.fixture
def run_of_two_epochs(tmp_path, tiny_args):
    args = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1", "--run-name", "r")
    assert main(args) == 0
    return tmp_path / "runs" / "r", args


def test_a_corrupt_last_pt_names_the_newest_intact_checkpoint_which_resumes(run_of_two_epochs, tiny_args, capsys):
    run, args = run_of_two_epochs
    ck = run / "checkpoints"
    _flip_100_bytes(ck / "last.pt")
    assert main([*tiny_args(), "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "last.pt' is corrupt" in err and "Traceback" not in err
    assert f"newest intact checkpoint of this run is '{ck / 'epoch_002.pt'}' (2 epochs done)" in err
    # with every file of epoch 2 damaged, epoch 1's is named, and the run continues from it
    if ckpt.load(ck / "best.pt")["epoch"] == 2:
        _flip_100_bytes(ck / "best.pt")
    _flip_100_bytes(ck / "epoch_002.pt")
    assert main([*tiny_args(), "--resume", str(run)]) == 2
    assert f"is '{ck / 'epoch_001.pt'}' (1 epochs done)" in capsys.readouterr().err
    assert main([*tiny_args(), "--resume", str(ck / "epoch_001.pt")]) == 0
    assert ckpt.load(ck / "last.pt")["epoch"] == 2 and ckpt.load(ck / "epoch_002.pt")["epoch"] == 2


def test_a_run_directory_without_last_pt_names_its_newest_checkpoint(run_of_two_epochs, tiny_args, capsys):
    run, _ = run_of_two_epochs
    (run / "checkpoints" / "last.pt").unlink()
    assert main([*tiny_args(), "--resume", str(run)]) == 2
    assert "epoch_002.pt' (2 epochs done)" in capsys.readouterr().err


def test_a_malicious_pickle_is_refused_without_torchs_weights_only_false_advice(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))
    torch.save({"format": ckpt.FORMAT, "version": ckpt.VERSION, "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load(tmp_path / "evil.pt")
    msg = str(e.value)
    assert "evil.pt" in msg and "system" in msg and "Never load a file you did not write yourself" in msg
    assert "will likely succeed" not in msg and "Re-running" not in msg


def _edit(path, change):
    state = ckpt.load(path)
    change(state)
    ckpt.save({k: v for k, v in state.items() if k not in ("format", "version")}, path)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["model"].update({k: torch.zeros(3) for k in list(s["model"])[:1]}),
     "entries of another shape or dtype: conv1.weight (saved float32 [3], the model's float32 [4, 3, 3, 3])"),
    (lambda s: s.pop("schedule"), "missing entry 'schedule'"),
    (lambda s: s["extra"]["args"].update(training_epochs="two"), "--training-epochs = 'two' is not a int"),
    (lambda s: s["extra"].update(args=["not", "a", "dict"]), "saved flags are not a mapping"),
])
def test_a_checkpoint_that_does_not_fit_is_a_usage_error(run_of_two_epochs, tiny_args, capsys, change, message):
    run, _ = run_of_two_epochs
    path = run / "checkpoints" / "epoch_001.pt"
    _edit(path, change)
    (run / "checkpoints" / "last.pt").unlink()
    assert main([*tiny_args(), "--resume", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "epoch_001.pt" in err and "Traceback" not in err


def test_a_full_disk_during_a_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt.save({"x": torch.arange(3)}, path)

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(ckpt.CheckpointError, match=r"cannot write checkpoint '.*last\.pt': the disk is full"
                                                   r" \(\d+ bytes\); its previous version is kept"):
        ckpt.save({"x": torch.arange(5)}, path)
    monkeypatch.undo()
    assert torch.equal(ckpt.load(path)["x"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_too_little_space_for_the_set_writes_nothing_and_the_cli_says_so(tmp_path, tiny_args, monkeypatch,
                                                                         capsys):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    assert main(tiny_args("--training-epochs", "1", "--save", "True", "--run-name", "full")) == 2
    err = capsys.readouterr().err
    assert "not enough space" in err and "Nothing of epoch 1 was written" in err and "Traceback" not in err
    assert list((tmp_path / "runs" / "full" / "checkpoints").iterdir()) == []
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=10 ** 12))
    assert checkpoint_set.write_set({"epoch": 1}, tmp_path / "ok", best=True, periodic=False)


def test_checkpoints_carry_crcs_even_where_torch_turned_them_off(tmp_path):
    path = tmp_path / "last.pt"
    torch.serialization.set_crc32_options(False)
    try:
        ckpt.save({"w": torch.arange(100_000, dtype=torch.float32)}, path)
        assert torch.serialization.get_crc32_options() is False  # the user's setting is kept
    finally:
        torch.serialization.set_crc32_options(True)
    assert torch.equal(ckpt.load(path)["w"], torch.arange(100_000, dtype=torch.float32))
    _flip_100_bytes(path)
    with pytest.raises(ckpt.CheckpointError, match="does not match its CRC-32"):
        ckpt.load(path)


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("epoch, step", [(-1, 8), (99, 8), (1, -5), (0, 4)])
def test_a_checkpoint_with_impossible_counters_is_refused_and_nothing_is_overwritten(
        run_of_two_epochs, tiny_args, capsys, epoch, step):
    run, _ = run_of_two_epochs
    _edit(run / "checkpoints" / "last.pt", lambda s: s.update(epoch=epoch, global_step=step))
    before = _files(run)
    assert main([*tiny_args(), "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"the checkpoint says {epoch} epoch(s) and {step} step(s) are done, impossible for a run of 2" in err
    assert "Traceback" not in err and _files(run) == before


def test_the_process_layout_is_saved_and_another_one_is_refused_on_resume(run_of_two_epochs, tiny_args, capsys):
    run, _ = run_of_two_epochs
    assert ckpt.load(run / "checkpoints" / "last.pt")["extra"]["world"] == \
        {"processes": 1, "emulate_node": 1, "workers": 1}
    # as a 2-process run's checkpoint says it (resumed here by one process)
    _edit(run / "checkpoints" / "epoch_001.pt",
          lambda s: s["extra"]["world"].update(processes=2, workers=2))
    (run / "checkpoints" / "last.pt").unlink()
    before = _files(run)
    assert main([*tiny_args(), "--resume", str(run / "checkpoints" / "epoch_001.pt")]) == 2
    err = capsys.readouterr().err
    assert ("started with 2 process(es) x --emulate-node 1 = 2 workers; this resume has 1 process(es) x "
            "--emulate-node 1 = 1") in err and "torchrun --nproc-per-node 2" in err
    assert _files(run) == before


@pytest.mark.parametrize("name", ["log.txt", "metrics.jsonl"])
def test_a_full_disk_at_a_log_write_is_a_clear_exit_and_keeps_the_checkpoints(tiny_args, tmp_path, capsys, name):
    args = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1", "--log", "True",
                     "--run-name", "full")
    assert main(args) == 0
    run = tmp_path / "runs" / "full"
    (run / "checkpoints" / "last.pt").unlink()
    (run / name).unlink()
    (run / name).symlink_to("/dev/full")  # every write there fails with ENOSPC
    before = _files(run / "checkpoints")
    capsys.readouterr()
    assert main([*tiny_args(), "--resume", str(run / "checkpoints" / "epoch_001.pt"), "--log", "True"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {run / name}: No space left on device" in err and "--resume" in err
    assert "Traceback" not in err
    now = _files(run / "checkpoints")
    assert all(now[k] == v for k, v in before.items())  # epoch 2 may be rewritten, nothing is lost


def test_a_schedule_that_disagrees_with_the_saved_epochs_is_refused_or_rebuilt_as_asked(run_of_two_epochs, tiny_args,
                                                                                       capsys):
    """Issue 53, item 11: epoch_001.pt made to say 4 training epochs while its schedule ends after 2
    (4 steps): the resume is refused (it would train on at lr 0); --resume-allow-data-change rebuilds
    the schedule from the start of epoch 2 and trains at a nonzero learning rate."""
    run, _ = run_of_two_epochs
    (run / "checkpoints" / "last.pt").unlink()

    def four(s):
        s["extra"]["args"]["training_epochs"] = 4
        s["config"]["epochs"] = 4
    _edit(run / "checkpoints" / "epoch_001.pt", four)
    before = _files(run)
    assert main([*tiny_args(), "--resume", str(run / "checkpoints" / "epoch_001.pt")]) == 2
    err = capsys.readouterr().err
    assert "schedule does not fit the run its own flags describe: total_steps 4 (the flags and data give 8)" in err
    assert _files(run) == before
    assert main([*tiny_args(), "--resume", str(run / "checkpoints" / "epoch_001.pt"),
                 "--resume-allow-data-change", "True"]) == 0
    out = capsys.readouterr().out
    assert "the learning-rate schedule is rebuilt" in out and "continues from step 2, the start of epoch 2" in out
    lrs = [float(x.split("lr ")[1].split()[0]) for x in out.splitlines() if x.startswith("epoch ") and " lr " in x]
    assert len(lrs) == 3 and all(lr > 0 for lr in lrs[:2])
