"""Cleanups remove only what this project's own killed runs left, named literally (issue 53, item 1):
an archive whose top folder is ``*`` or an output folder named ``*`` must not turn the cleanup of
``.NAME.partial-PID`` into a pattern that deletes other folders; a folder whose process may still run
is kept. Each test puts decoys beside the target and checks they survive."""
import os

from bfp.data.archives import remove_dead_partials, unpack
from bfp.data.prepare import prepare_cifar10
from test_archives import _archive
from test_prepare_crafted import _archive as _cifar_archive


def _decoys(folder):
    """Folders a glob ``.*.partial-*`` would match, none of them a killed run of ``*``'s."""
    made = [folder / ".important.partial-keep", folder / ".important.partial-999999999",
            folder / ".x.partial-999999998", folder / f".*.partial-{os.getppid()}"]  # the last: its owner runs
    for d in made:
        d.mkdir(parents=True)
        (d / "data.txt").write_text("precious")
    return made


def test_an_archive_whose_top_folder_is_a_star_deletes_nothing_else(tmp_path):
    dest = tmp_path / "ex"
    decoys = _decoys(dest)
    ours = dest / ".*.partial-999999997"  # what a killed unpacking of this very archive left
    ours.mkdir()
    out = unpack(_archive(tmp_path / "star.tar.gz", [("*/train/c/0.jpg", b"1")]), dest)
    assert out == dest / "*" and (out / "train/c/0.jpg").read_bytes() == b"1"
    assert all((d / "data.txt").read_text() == "precious" for d in decoys)
    assert not ours.exists()


def test_prepare_into_a_folder_named_star_deletes_nothing_else(tmp_path):
    decoys = _decoys(tmp_path)
    counts = prepare_cifar10(_cifar_archive(tmp_path / "c.tar.gz"), tmp_path / "*", progress=False)
    assert counts == {"train": 50, "test": 10} and (tmp_path / "*" / "train").is_dir()
    assert all((d / "data.txt").read_text() == "precious" for d in decoys)


def test_the_helper_removes_only_dead_literal_matches(tmp_path):
    keep = [tmp_path / ".a.partial-12x", tmp_path / ".a.partial-", tmp_path / ".ab.partial-999999996",
            tmp_path / f".a.partial-{os.getpid()}", tmp_path / f".a.partial-{os.getppid()}"]
    for d in keep:
        d.mkdir()
    (tmp_path / ".a.partial-999999995").write_text("a file, not a folder we made")
    dead = tmp_path / ".a.partial-999999994"
    dead.mkdir()
    assert remove_dead_partials(tmp_path, "a") == [dead]
    assert all(d.exists() for d in keep) and (tmp_path / ".a.partial-999999995").exists()
    assert remove_dead_partials(tmp_path / "missing", "a") == []
