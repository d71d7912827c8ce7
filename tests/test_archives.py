"""Dataset archives: nothing writes outside the extraction folder (malicious archives built here,
the CVE-2025-4517 symlink-chain pattern among them), nothing half-unpacked is used, and CIFAR-10's
own archive becomes the JPEG class folders (python -m bfp.data prepare)."""
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bfp.data.archives import MARKER, ArchiveError, unpack
from bfp.data.prepare import CIFAR10_CLASSES, prepare_cifar10
from bfp.experiments.__main__ import main as experiments

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpg.tar.gz"


def _add(tar, name, data=b"x", **kw):
    info = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(info, k, v)
    if info.isreg():
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def _archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            _add(tar, *m[:2], **(m[2] if len(m) > 2 else {}))
    return path


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _cve_2025_4517_members():
    """Symlink chain whose unresolved path passes a path-length check and whose resolution escapes:
    nested directories with long names, a chain of links climbing back, then a file through them."""
    members, steps, comp = [], "", "d" * 247
    for i in range(16):
        members.append((f"top/{steps}{comp}", b"", {"type": tarfile.DIRTYPE}))
        members.append((f"top/{steps}l{i}", b"", {"type": tarfile.SYMTYPE, "linkname": comp}))
        steps += f"l{i}/"
    members.append(("top/" + steps + "escape", b"", {"type": tarfile.SYMTYPE, "linkname": "../" * 40}))
    members.append(("top/out", b"", {"type": tarfile.SYMTYPE, "linkname": steps + "escape/../../outside.txt"}))
    members.append(("top/out", b"pwned"))
    return members


@pytest.mark.parametrize("members, why", [
    ([("top/a.jpg", b"1"), ("top/../../evil.txt", b"pwned")], "climbs out"),
    ([("top/a.jpg", b"1"), ("/tmp/evil-abs.txt", b"pwned")], "absolute"),
    ([("top/link", b"", {"type": tarfile.SYMTYPE, "linkname": "../../outside"}), ("top/link/evil", b"x")],
     "symbolic link"),
    ([("top/a", b"1"), ("top/hard", b"", {"type": tarfile.LNKTYPE, "linkname": "../../../etc/passwd"})],
     "hard link"),
    ([("top/dev", b"", {"type": tarfile.CHRTYPE})], "device"),
    ([("top/a\\..\\..\\x", b"1")], "backslash"),
    ([("a/x", b"1"), ("b/y", b"1")], "one top folder"),
    (_cve_2025_4517_members(), "link"),
])
def test_no_archive_writes_outside_its_folder(tmp_path, members, why):
    evil = _archive(tmp_path / "evil.tar.gz", members)
    dest = tmp_path / "x" / "sub" / "ex"
    before = _tree(tmp_path)
    with pytest.raises(ArchiveError, match=why):
        unpack(evil, dest)
    assert _tree(tmp_path) == before  # nothing written anywhere (the checks run before any write)
    assert experiments(["list", "cifar10-table", "--data", str(evil), "--extract-to", str(dest)]) == 2


def test_a_decoded_cache_in_an_archive_is_never_taken(tmp_path):
    arc = _archive(tmp_path / "d.tar.gz", [("top/train/c/0.jpg", b"1"), ("top/.bfp-cache/x.pt", b"fake")])
    out = unpack(arc, tmp_path / "ex")
    assert (out / "train/c/0.jpg").read_bytes() == b"1" and not (out / ".bfp-cache").exists()


def test_unpacked_once_and_a_killed_or_foreign_folder_is_never_reused(tmp_path):
    arc = _archive(tmp_path / "d.tar.gz", [("top/train/c/0.jpg", b"1"), ("top/test/c/0.jpg", b"2")])
    dest = tmp_path / "ex"
    out = unpack(arc, dest)
    marker = json.loads((out / MARKER).read_text())
    assert marker["members"] == 2 and len(marker["sha256"]) == 64
    (out / "train/c/0.jpg").write_bytes(b"kept")  # a second call reuses the folder (marker matches)
    assert unpack(arc, dest) == out and (out / "train/c/0.jpg").read_bytes() == b"kept"
    (dest / ".top.partial-999999999").mkdir()  # what a kill during unpacking leaves: removed, never used
    (out / MARKER).unlink()  # a folder not (completely) unpacked from this archive: refused
    with pytest.raises(ArchiveError, match="exists but was not unpacked from this archive"):
        unpack(arc, dest)
    assert not (dest / ".top.partial-999999999").exists()
    other = _archive(tmp_path / "e.tar.gz", [("top/train/c/0.jpg", b"other")])
    (out / MARKER).write_text(json.dumps(marker))
    with pytest.raises(ArchiveError, match="not unpacked from this archive"):
        unpack(other, dest)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_archive_is_a_clear_error(tmp_path, damage, capsys):
    arc = _archive(tmp_path / "d.tar.gz", [("top/train/c/0.jpg", bytes(range(256)) * 400)])
    raw = arc.read_bytes()
    arc.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"\x1f\x8b" + b"nonsense" * 50)
    with pytest.raises(ArchiveError, match="d.tar.gz"):
        unpack(arc, tmp_path / "ex")
    assert not (tmp_path / "ex" / "top").exists()
    assert experiments(["list", "cifar10-table", "--data", str(arc), "--extract-to", str(tmp_path / "ex")]) == 2
    assert "d.tar.gz" in capsys.readouterr().err


def test_extract_to_a_file_or_a_read_only_folder_is_a_clear_error(tmp_path):
    arc = _archive(tmp_path / "d.tar.gz", [("top/a", b"1")])
    (tmp_path / "file").write_text("")
    with pytest.raises(ArchiveError, match="extraction folder .* is a file"):
        unpack(arc, tmp_path / "file")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not (ro / "probe").parent.exists() or _writable(ro):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(ArchiveError, match="cannot write there"):
            unpack(arc, ro / "sub")
    finally:
        ro.chmod(0o700)


def _writable(folder):
    try:
        (folder / "probe").write_text("")
        (folder / "probe").unlink()
        return True
    except OSError:
        return False


def _cifar_python(path, per_class_train=3, per_class_test=2):
    """A small archive in the CIFAR-10 site's format (pickled dicts with bytes keys)."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        def batch(name, n):
            labels = [i % 10 for i in range(n)]
            d = {b"batch_label": name.encode(), b"labels": labels,
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"filenames": [b"f"] * n}
            _add(tar, f"cifar-10-batches-py/{name}", pickle.dumps(d, protocol=2))
            return d
        made = [batch(f"data_batch_{i}", 10 * per_class_train) for i in range(1, 6)]
        made.append(batch("test_batch", 10 * per_class_test))
        _add(tar, "cifar-10-batches-py/batches.meta", pickle.dumps({b"label_names": [c.encode() for c in
                                                                                     CIFAR10_CLASSES]}))
    return made


def test_prepare_writes_the_shared_archives_layout_from_cifars_own_archive(tmp_path):
    made = _cifar_python(tmp_path / "cifar-10-python.tar.gz")
    out = tmp_path / "data" / "cifar10_jpg"
    counts = prepare_cifar10(tmp_path / "cifar-10-python.tar.gz", out, progress=False)
    assert counts == {"train": 150, "test": 20}
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(CIFAR10_CLASSES)
    assert sorted(p.name for p in (out / "train" / "cat").iterdir()) == [f"{i:04d}.jpg" for i in range(15)]
    # airplane/0001.jpg is the second airplane of data_batch_1 (labels cycle 0..9): its pixels, as JPEG
    want = made[0][b"data"][10].reshape(3, 32, 32).transpose(1, 2, 0)
    img = Image.open(out / "train" / "airplane" / "0001.jpg")
    assert img.size == (32, 32) and img.mode == "RGB"
    assert np.abs(np.asarray(img, dtype=float) - want).mean() < 60  # lossy, but these pixels
    ref = Image.open(io.BytesIO(_encode(want)))
    assert img.quantization == ref.quantization  # Pillow's quality-75 tables
    with pytest.raises(ArchiveError, match="exists"):
        prepare_cifar10(tmp_path / "cifar-10-python.tar.gz", out, progress=False)


def _encode(arr):
    b = io.BytesIO()
    Image.fromarray(arr).save(b, format="JPEG")
    return b.getvalue()


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared JPEG CIFAR-10 archive is not beside the project")
def test_prepares_encoder_settings_are_the_shared_archives():
    with tarfile.open(SHARED) as tar:
        member = tar.getmember("cifar10_jpg/train/airplane/0000.jpg")
        shared = Image.open(io.BytesIO(tar.extractfile(member).read()))
    ours = Image.open(io.BytesIO(_encode(np.asarray(shared.convert("RGB")))))
    assert ours.quantization == shared.quantization and ours.layer == shared.layer  # tables, 4:2:0


def test_prepare_refuses_what_is_not_cifars_archive(tmp_path):
    bad = _archive(tmp_path / "x.tar.gz", [("top/data_batch_1", b"not a pickle")])
    with pytest.raises(ArchiveError, match="no data_batch_2"):
        prepare_cifar10(bad, tmp_path / "out", progress=False)
    evil = _archive(tmp_path / "y.tar.gz", [(f"top/{n}", pickle.dumps(Path("/")))
                                            for n in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]])
    with pytest.raises(ArchiveError, match="only plain data and numpy arrays"):
        prepare_cifar10(evil, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_list_needs_no_data():
    assert experiments(["list", "cifar10-table"]) == 0


def _jpeg_tree_archive(tmp_path):
    """A .tar.gz of a small CIFAR-style JPEG class-folder tree (train/ and test/)."""
    from image_tree import make_tree
    root = tmp_path / "src" / "mini_jpg"
    make_tree(root, per_class=4, bad=False)
    (root / "val").rename(root / "test")
    archive = tmp_path / "mini-jpg.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="mini_jpg")
    return archive


def test_a_training_run_reads_an_archive_unpacked_once(tmp_path, capsys):
    from bfp.data import load
    archive = _jpeg_tree_archive(tmp_path)
    got = load("CIFAR10", str(archive), num_workers=0, extract_to=str(tmp_path / "data"))
    assert "unpacking" in capsys.readouterr().out and (tmp_path / "data" / "mini_jpg" / MARKER).is_file()
    again = load("CIFAR10", str(archive), num_workers=0, extract_to=str(tmp_path / "data"))
    assert "unpacking" not in capsys.readouterr().out  # reused, by its marker
    assert got.fingerprint == again.fingerprint and len(got.train.dataset) == 8
    assert got.classes == ["cat", "dog"]


def test_the_cli_takes_an_archive_at_dp(tmp_path, tiny_args, monkeypatch):
    from bfp.cli import cifar as main
    archive = _jpeg_tree_archive(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = [a for a in tiny_args("--training-epochs", "1") if a not in ("digits",)]
    args[args.index("-d") + 1:args.index("-d") + 1] = ["CIFAR10"]
    assert main([*args, "-dp", str(archive), "--limit-train-images", "0", "--limit-test-images", "0",
                 "--batch-size-train", "8"]) == 0
    assert (tmp_path / "data" / "mini_jpg" / MARKER).is_file()


def test_ranks_unpacking_one_archive_at_once_share_the_first_folder(tmp_path, monkeypatch):
    """Another process renames its copy into place first: this one takes that folder, no error."""
    import bfp.data.archives as archives
    archive = _jpeg_tree_archive(tmp_path)
    real_rename, calls = archives.os.rename, []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 1:  # the other rank wins the race
            unpack(archive, tmp_path / "out")
            raise OSError(39, "Directory not empty")
        return real_rename(src, dst)
    monkeypatch.setattr(archives.os, "rename", rename)
    target = unpack(archive, tmp_path / "out")
    assert target == tmp_path / "out" / "mini_jpg" and (target / MARKER).is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mini_jpg"]  # no temporary folder left


def test_no_cifar_and_no_network_names_the_offline_ways_in(tmp_path, monkeypatch):
    import torchvision
    from bfp.data import DataError, load

    class Offline:  # torchvision's CIFAR10 on a machine without a network
        base_folder = "cifar-10-batches-py"

        def __init__(self, root, train=True, download=False):
            if download:
                raise OSError("<urlopen error [Errno -2] Name or service not known>")
            raise RuntimeError("Dataset not found or corrupted")
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Offline)
    with pytest.raises(DataError, match=r"downloading it failed .* Without a network, give `path` one of: a "
                                        r"\.tar\.gz of the JPEG class folders .*python -m bfp\.data prepare cifar10 "
                                        r"--from cifar-10-python\.tar\.gz"):
        load("CIFAR10", str(tmp_path / "cifar"), num_workers=0)
