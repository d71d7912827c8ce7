"""``python -m bfp.data prepare`` on crafted archives: every one gets a clear error naming what is
wrong, nothing is allocated or read past what CIFAR-10 can hold, and a killed run's temporary
folder does not stay (issue 47, items 7 and 9)."""
import codecs
import io
import os
import pickle
import tarfile

import numpy as np
import pytest

from bfp.data import prepare
from bfp.data.archives import ArchiveError
from bfp.data.prepare import prepare_cifar10

NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


class Call:
    """Pickles as ``fn(*args)`` (then ``__setstate__(state)``): how a crafted batch names a callable."""

    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def _batch(n=10, data=None, labels=None):
    rng = np.random.default_rng(n)
    return pickle.dumps({b"batch_label": b"x", b"labels": [i % 10 for i in range(n)] if labels is None else labels,
                         b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8) if data is None else data},
                        protocol=2)


def _archive(path, first=None, extra=(), mode="w:gz"):
    """CIFAR-10's layout with ``first`` as data_batch_1's bytes; ``extra``: (name, bytes) added after."""
    with tarfile.open(path, mode) as tar:
        for name, raw in [(f"cifar-10-batches-py/{n}", first if n == "data_batch_1" and first is not None
                           else _batch()) for n in NAMES] + list(extra):
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


_reconstruct = np.ndarray.__reduce__(np.zeros(1, np.uint8))[0]  # numpy's own array rebuilder
CRAFTED = {
    "codec": (pickle.dumps(Call(codecs.encode, ("x", "no-such-codec")), protocol=2),
              "_codecs.encode with str, 'no-such-codec'"),
    "10^12 elements": (pickle.dumps({b"data": Call(_reconstruct, (np.ndarray, (0,), b"b"),
                                                   (1, (10 ** 12,), np.dtype("u1"), False, b"\0")), b"labels": []},
                                    protocol=2), "an array of 1000000000000 elements, more than a CIFAR-10 batch"),
    "ndarray called directly": (pickle.dumps({b"data": Call(np.ndarray, ((2, 3072), np.dtype("u1"))), b"labels": [0, 1]},
                                             protocol=2), "builds numpy.ndarray(...) directly"),
    "ndarray of 1.5e9 called directly": (pickle.dumps({b"data": Call(np.ndarray, ((1_500_000_000,), np.dtype("u1"))),
                                                       b"labels": []}, protocol=2), "builds numpy.ndarray(...) directly"),
    "huge ints": (_batch(1, data=np.array([[10 ** 30] * 3072], dtype=object)), "declares a 'O8' array"),
    "negative pixels": (_batch(1, data=-np.ones((1, 3072), np.int64)), "declares a 'i8' array"),
    "strings": (_batch(1, data=np.array([["a"] * 3072])), "declares a 'U1' array"),
    "float pixels": (_batch(1, data=np.full((1, 3072), 300.7)), "declares a 'f8' array"),
    "string data": (_batch(1, data="abc"), "'data' must be an N x 3072 array of uint8 pixels, got a str"),
    "int labels": (_batch(1, labels=5), "'labels' must be a list of 1 labels (one per row of 'data'), got a int"),
    "bool labels": (_batch(1, labels=[True]), "labels must be integers 0..9 (not booleans"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_batch_is_refused_naming_what_is_wrong(tmp_path, case):
    raw, why = CRAFTED[case]
    with pytest.raises(ArchiveError, match="data_batch_1: .*" + why.replace("(", r"\(").replace(")", r"\)")):
        prepare_cifar10(_archive(tmp_path / "c.tar.gz", raw), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_a_member_larger_than_a_batch_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "MAX_MEMBER_BYTES", 50_000)  # CIFAR's bound is 64 MiB; the logic is the same
    big = _batch(20)  # 92 kB
    read = []
    real = tarfile.ExFileObject.read
    monkeypatch.setattr(tarfile.ExFileObject, "read", lambda self, *a: read.append(a) or real(self, *a))
    with pytest.raises(ArchiveError, match=r"data_batch_1: \d\d,\d{3} bytes, more than a CIFAR-10 batch can be "
                                           r"\(50,000\); refused unread"):
        prepare_cifar10(_archive(tmp_path / "c.tar.gz", big), tmp_path / "out", progress=False)
    assert read == []


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gzip_is_named_as_damage_not_as_missing_batches(tmp_path, damage):
    path = _archive(tmp_path / "c.tar.gz")
    raw = bytearray(path.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) * 2 // 3]
    else:
        raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match="a corrupt or truncated gzip file"):
        prepare_cifar10(path, tmp_path / "out", progress=False)


def test_a_header_larger_than_its_data_is_an_error_not_a_traceback(tmp_path):
    path = _archive(tmp_path / "c.tar", mode="w")
    raw = bytearray(path.read_bytes())
    raw = raw[: 512 + 4000]  # data_batch_1's header, then less data than it declares
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match=r"c\.tar': corrupt or truncated \(ReadError: unexpected end of data\)"):
        prepare_cifar10(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_only_the_top_folders_batches_count_and_a_twice_named_one_is_refused(tmp_path):
    nested = _batch(10, labels=[3] * 10)  # all cats: it would move the class counts if taken
    counts = prepare_cifar10(_archive(tmp_path / "a.tar.gz", extra=[("cifar-10-batches-py/sub/data_batch_1", nested)]),
                             tmp_path / "out", progress=False)
    assert counts == {"train": 50, "test": 10} and len(list((tmp_path / "out" / "train" / "cat").iterdir())) == 5
    with pytest.raises(ArchiveError, match="data_batch_1 is in it twice"):
        prepare_cifar10(_archive(tmp_path / "b.tar.gz", extra=[("cifar-10-batches-py/data_batch_1", nested)]),
                        tmp_path / "out2", progress=False)


def test_a_killed_prepares_temporary_folder_is_removed(tmp_path):
    dead = tmp_path / ".out.partial-999999999"
    alive = tmp_path / f".out.partial-{os.getpid()}"  # a prepare still running: left alone
    for d in (dead, alive):
        (d / "train").mkdir(parents=True)
    prepare_cifar10(_archive(tmp_path / "a.tar.gz"), tmp_path / "out", progress=False)
    assert not dead.exists() and (tmp_path / "out" / "train").is_dir()
