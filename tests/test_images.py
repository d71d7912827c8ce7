"""bfp.data.images: every mode loads as RGB; unreadable files are named, skipped once, or refused."""
import pytest
import torch
from PIL import Image

from bfp.cli import cifar as cifar_main
from bfp.data import cifar as data, images
from image_tree import make_tree


def test_every_mode_loads_as_rgb_of_its_size(tmp_path):
    make_tree(tmp_path, bad=False)
    files = sorted((tmp_path / "train" / "cat").iterdir())
    modes = {}
    for f in files:
        with Image.open(f) as im:
            modes[f.suffix + ":" + im.mode] = im.size
        out = images.load_rgb(str(f))
        assert out.mode == "RGB" and out.size == modes[f.suffix + ":" + im.mode]
    assert set(modes) == {".jpg:RGB", ".png:L", ".png:RGBA", ".gif:P", ".jpg:CMYK"}


def test_unreadable_files_raise_with_their_path_and_reason(tmp_path):
    bad = make_tree(tmp_path)
    reasons = {}
    for kind, path in bad.items():
        try:
            images.load_rgb(str(path))
        except images.UnreadableImage as e:
            assert e.path == str(path) and str(path) in str(e)
            reasons[kind] = e.reason
    assert reasons["empty"] == "empty file"
    assert reasons["random"] == "not an image file PIL can identify"
    assert "truncated" in reasons["truncated"]


def test_gifs_are_samples_and_check_readable_lists_exactly_the_bad_files(tmp_path):
    bad = make_tree(tmp_path)
    ds = images.ImageFolder(str(tmp_path / "train"))
    assert sum(p.endswith(".gif") for p, _ in ds.samples) == 2
    try:
        images.check_readable(ds)
        raise AssertionError("check_readable accepted a truncated JPEG")
    except images.UnreadableImages as e:
        assert sorted(x.path for x in e.bad) == sorted(map(str, bad.values()))
        assert str(len(bad)) + " of " + str(len(ds)) in str(e)


def test_loader_drops_bad_samples_and_reports_each_path_once_across_workers_and_epochs(tmp_path, capsys):
    bad = make_tree(tmp_path)
    import torchvision.transforms as T
    ds = images.ImageFolder(str(tmp_path / "train"), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    loader = images.SkippingLoader(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1,
                                                               collate_fn=images.collate))
    for _ in range(2):
        n = sum(len(y) for _, y in loader)
        assert n == len(ds) - 3 and loader.skipped_this_epoch == 3
    err = capsys.readouterr().err
    for path in bad.values():
        assert err.count(f"skipping unreadable image {path}:") == 1
    assert sorted(loader.skipped) == sorted(map(str, bad.values()))


def test_cifar_image_folder_skips_bad_files_and_strict_refuses_them(tmp_path, tiny_args, capsys):
    bad = make_tree(tmp_path / "tree")
    args = tiny_args("-d", "imagefolder", "-dp", str(tmp_path / "tree"), "--training-epochs", "1",
                     "--log", "True", "--run-name", "folder", "--batch-size-train", "4", train_images=0,
                     test_images=0)
    assert cifar_main(args) == 0
    log = (tmp_path / "runs" / "folder" / "log.txt").read_text()
    assert "epoch 1: skipped 3 unreadable train image(s): " + ", ".join(sorted(map(str, bad.values()))) in log
    capsys.readouterr()
    assert cifar_main([*args, "--strict-images", "True", "--run-name", "strict"]) == 2
    err = capsys.readouterr().err
    assert "--strict-images: 3 of 15 images cannot be read" in err and all(str(p) in err for p in bad.values())
    assert not (tmp_path / "runs" / "strict").exists()


def test_gpu_data_decoding_skips_bad_files_with_a_warning(tmp_path, capsys):
    bad = make_tree(tmp_path)
    bundle = data.load("imagefolder", str(tmp_path), batch_size_train=4, num_workers=0, gpu_data=True)
    assert len(bundle.train.dataset) == 12 and len(bundle.test.dataset) == 12
    err = capsys.readouterr().err
    assert all(err.count(f"skipping unreadable image {p}:") == 1 for p in bad.values())


def test_an_image_folder_with_other_test_classes_names_them(tmp_path):
    # cifar.py's image folders and imagenet.py's trees share data.open_folders
    make_tree(tmp_path, per_class=2, bad=False)
    (tmp_path / "val" / "dog").rename(tmp_path / "val" / "cow")
    with pytest.raises(data.DataError, match=r"train/ and val/ class folders differ: only in train: "
                                             r"\['dog'\]; only in val: \['cow'\]"):
        data.load("imagefolder", str(tmp_path))


def test_torchvision_is_imported_only_when_an_image_folder_is_opened():
    import pickle
    import subprocess
    import sys
    code = ("import sys, bfp.cli, bfp.cli.tasks; print('torchvision' in sys.modules); "
            "from bfp.data.images import ImageFolder; print('torchvision' in sys.modules, ImageFolder.__mro__[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:2] == ["False", "True <class 'torchvision.datasets.folder.ImageFolder'>"]
    assert pickle.loads(pickle.dumps(images.ImageFolder)) is images.ImageFolder  # DataLoader workers find it
    with pytest.raises(AttributeError, match="module 'bfp.data.images' has no attribute 'Folder'"):
        images.Folder
