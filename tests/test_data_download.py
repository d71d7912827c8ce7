"""A failed CIFAR download leaves nothing behind (no empty data/cifar100/ that looks like a dataset)."""
import pytest
import torchvision

from bfp.data import cifar as data


def failing_download(written):
    def download(self):
        # what torchvision does before the network fails: the root and a partial archive
        root = __import__("pathlib").Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        (root / (self.filename + ".part")).write_bytes(b"partial")
        written.append(root)
        raise OSError("network unreachable")
    return download


@pytest.mark.parametrize("name, cls", [("CIFAR100", torchvision.datasets.CIFAR100),
                                       ("CIFAR10", torchvision.datasets.CIFAR10)])
def test_a_failed_download_removes_the_directories_it_created(tmp_path, monkeypatch, name, cls):
    written = []
    monkeypatch.setattr(cls, "download", failing_download(written))
    root = tmp_path / "data" / name.lower()
    with pytest.raises(data.DataError, match="downloading it failed"):
        data.load(name, str(root))
    assert written == [root]                 # the download did run and write
    assert list(tmp_path.iterdir()) == []    # data/ too: it did not exist before


def test_a_failed_download_into_an_existing_directory_keeps_what_was_there(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision.datasets.CIFAR100, "download", failing_download([]))
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "old").mkdir()
    with pytest.raises(data.DataError):
        data.load("CIFAR100", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "old"]


def test_an_interrupted_download_cleans_up_and_stays_an_interrupt(tmp_path, monkeypatch):
    def interrupted(self):
        __import__("pathlib").Path(self.root).mkdir(parents=True)
        raise KeyboardInterrupt
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", interrupted)
    with pytest.raises(KeyboardInterrupt):
        data.load("CIFAR10", str(tmp_path / "c10"))
    assert list(tmp_path.iterdir()) == []
