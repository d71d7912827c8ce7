"""Resume and the data: the order does not depend on --num-workers, another dataset is
refused by name, and the small data flags that used to be ignored are usage errors."""
import pytest
import torch
from PIL import Image

from bfp.cli import cifar as main
from bfp.data import cifar as D
from bfp.data.augment import KeyedAugment, sample_seed


def _folder(root, classes=("a", "b"), n_train=6, n_test=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(n):
                px = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy()
                Image.fromarray(px).save(d / f"{i}.png")
    return root


def _epochs(bundle, n=2):
    return [[(x.clone(), y.clone()) for x, y in bundle.train] for _ in range(n)]


def test_batches_are_the_same_for_any_worker_count(tmp_path):
    root = _folder(tmp_path / "imgs")
    runs = [_epochs(D.load("imagefolder", str(root), batch_size_train=4, num_workers=w, seed=5)) for w in (0, 2)]
    for ep0, ep2 in zip(*runs):
        assert len(ep0) == len(ep2) == 3
        for (x0, y0), (x2, y2) in zip(ep0, ep2):
            assert torch.equal(x0, x2) and torch.equal(y0, y2)
    assert not torch.equal(runs[0][0][0][0], runs[0][1][0][0])  # two epochs are augmented differently


def test_a_samples_augmentation_depends_only_on_the_key_and_its_index():
    base = [(torch.arange(3 * 4 * 4, dtype=torch.uint8).view(3, 4, 4), 0)] * 3
    aug = KeyedAugment(base, pad=1, flip=True, mean=(0.0,) * 3, std=(1.0,) * 3)
    assert torch.equal(aug[(2, 7)][0], aug[(2, 7)][0])  # (index, epoch key)
    assert sample_seed(7, 2) != sample_seed(7, 1) and sample_seed(7, 2) != sample_seed(8, 2)
    x = aug[(2, 7)][0]
    g = torch.Generator().manual_seed(sample_seed(7, 2))
    dy, dx = torch.randint(0, 3, (2,), generator=g).tolist()
    want = torch.nn.functional.pad(base[2][0], (1, 1, 1, 1))[:, dy:dy + 4, dx:dx + 4]
    want = want.flip(2) if bool(torch.rand((), generator=g) < 0.5) else want
    assert torch.equal(x, want.float() / 255)


@pytest.fixture
def saved_run(tmp_path, tiny_args):
    _folder(tmp_path / "A")
    args = tiny_args("-d", "imagefolder", "-dp", str(tmp_path / "A"), "--training-epochs", "1",
                     "--save", "True", "--run-name", "r")
    assert main(args) == 0
    return tmp_path / "runs" / "r", ["--threads", "1", "--num-workers", "0", "--progress", "False"]


def test_resume_on_another_dataset_is_refused_by_name(tmp_path, saved_run, capsys):
    run, flags = saved_run
    _folder(tmp_path / "B", n_train=5)
    assert main([*flags, "--resume", str(run), "-dp", str(tmp_path / "B")]) == 2
    err = capsys.readouterr().err
    assert "the dataset differs" in err and "train_images 12 -> 10" in err and "train_bytes" in err
    assert "--resume-allow-data-change" in err and "Traceback" not in err
    assert main([*flags, "--resume", str(run), "-dp", str(tmp_path / "B"), "--resume-allow-data-change"]) == 0
    assert "warning: the dataset differs" in capsys.readouterr().out


def test_the_permission_to_change_data_is_not_inherited_by_a_later_resume(tmp_path, tiny_args, capsys):
    from bfp.engine import checkpoint as ckpt
    _folder(tmp_path / "A")
    _folder(tmp_path / "B", n_train=5)
    assert main(tiny_args("-d", "imagefolder", "-dp", str(tmp_path / "A"), "--training-epochs", "2", "--save",
                          "True", "--save-interval", "1", "--run-name", "r")) == 0
    ck = tmp_path / "runs" / "r" / "checkpoints"
    (ck / "last.pt").unlink()  # branch from epoch 1, as docs/training.md describes
    flags = ["--threads", "1", "--num-workers", "0", "--progress", "False"]
    assert main([*flags, "--resume", str(ck / "epoch_001.pt"), "-dp", str(tmp_path / "B"),
                 "--resume-allow-data-change"]) == 0
    last = ckpt.load(ck / "last.pt")
    assert last["epoch"] == 2 and last["extra"]["data"]["train_images"] == 10
    capsys.readouterr()
    assert main([*flags, "--resume", str(ck.parent), "-dp", str(tmp_path / "A")]) == 2
    assert "train_images 10 -> 12" in capsys.readouterr().err


def test_the_same_data_moved_elsewhere_resumes(tmp_path, saved_run):
    import shutil
    run, flags = saved_run
    shutil.copytree(tmp_path / "A", tmp_path / "moved")
    assert main([*flags, "--resume", str(run), "-dp", str(tmp_path / "moved")]) == 0


def test_another_class_count_is_refused_even_when_data_changes_are_allowed(tmp_path, saved_run, capsys):
    run, flags = saved_run
    _folder(tmp_path / "C", classes=("a", "b", "c"))
    assert main([*flags, "--resume", str(run), "-dp", str(tmp_path / "C"), "--resume-allow-data-change"]) == 2
    err = capsys.readouterr().err
    assert "trained on 2 classes" in err and "has 3" in err and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    (("-dp", "/some/folder"), "-dp/--dataset-path '/some/folder' given with dataset digits"),
    (("--do", ""), "--do '': an empty dynamic-precision spec"),
    (("--do", "  ", "--bfp", "ResNet18_FB16"), "--do '': an empty dynamic-precision spec"),
])
def test_ignored_data_flags_are_usage_errors(tiny_args, capsys, extra, message):
    assert main(tiny_args(*extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_empty_image_folder_names_its_path(tmp_path, tiny_args, capsys):
    for split in ("train", "test"):
        (tmp_path / "empty" / split / "cat").mkdir(parents=True)
    assert main(tiny_args("-d", "imagefolder", "-dp", str(tmp_path / "empty"))) == 2
    err = capsys.readouterr().err
    assert f"no images found under {tmp_path / 'empty' / 'train'}" in err and "Traceback" not in err


def test_a_run_resumed_with_another_worker_count_ends_as_the_uninterrupted_one(tmp_path, tiny_args):
    import subprocess
    import sys
    from pathlib import Path

    from bfp.engine import checkpoint as ckpt
    from test_checkpoint_crash import CHILD, assert_same_checkpoint
    _folder(tmp_path / "A")
    common = tiny_args("-d", "imagefolder", "-dp", str(tmp_path / "A"), "--training-epochs", "2",
                       "--save", "True", "--batch-size-train", "4")
    assert main([*common, "--run-name", "straight"]) == 0
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", CHILD, "last.pt", "1", "after", *common, "--run-name", "k"],
                          cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    run = tmp_path / "runs" / "k"
    assert ckpt.load(run / "checkpoints" / "last.pt")["epoch"] == 1
    assert main(["--resume", str(run), "--num-workers", "2", "--progress", "False", "--threads", "1"]) == 0
    for name in ("last.pt", "best.pt"):
        assert_same_checkpoint(ckpt.load(run / "checkpoints" / name),
                               ckpt.load(tmp_path / "runs" / "straight" / "checkpoints" / name), name)


def test_a_resume_reads_and_checks_its_checkpoint_once(tmp_path, saved_run, monkeypatch):
    from bfp.engine import checkpoint_set
    run, flags = saved_run
    loads, real = [], checkpoint_set.load_with_hint
    monkeypatch.setattr(checkpoint_set, "load_with_hint", lambda p, **kw: loads.append(p) or real(p, **kw))
    assert main([*flags, "--resume", str(run)]) == 0  # the run had finished: loads, reports, stops
    assert loads == [run / "checkpoints" / "last.pt"]
