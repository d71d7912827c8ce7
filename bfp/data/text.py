"""Character-level text for ``lm.py``: an offline default corpus, windows, batches.

The default corpus, ``pysrc``, is Python source text that every Python installation
ships: the standard library modules ``CORPUS_FILES``, concatenated in that order (about
0.5 MB; it differs between Python versions, so its SHA-256 is in the run's data
fingerprint and a resume checks it). ``--data FILE.txt`` (or ``-dp``) reads any UTF-8 text.

The vocabulary is the sorted set of the corpus' characters. The first 90 % of the text
trains, the last 10 % tests. Both are cut into non-overlapping windows of ``block + 1``
characters; a batch is ``x = window[:-1]`` (N, block) and the targets ``window[1:]``
flattened to (N * block,), matching the GPT's flattened logits. The training windows are
shuffled each epoch from the bundle's generator (resume restores it), as the image loaders.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from .bundle import DataBundle, DataError

CORPUS_FILES = ("argparse.py", "textwrap.py", "string.py", "fractions.py", "difflib.py", "heapq.py",
                "bisect.py", "statistics.py", "shlex.py", "calendar.py")
TEST_SHARE = 0.1


def default_corpus() -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in CORPUS_FILES if not (lib / f).is_file()]
    if missing:
        raise DataError(f"the default corpus needs the standard library sources {missing} under {lib}; "
                        f"give a text file with `path` FILE.txt")
    return "".join((lib / f).read_text(encoding="utf-8") for f in CORPUS_FILES)


def read_text(path: Optional[str]) -> tuple[str, str]:
    """(name, text) of ``path`` or of the default corpus (``path`` None or ``pysrc``)."""
    if path is None or path == "pysrc":
        return "pysrc", default_corpus()
    p = Path(path)
    if not p.is_file():
        raise DataError(f"`path` {path}: no such file (give a UTF-8 text file)")
    try:
        return p.name, p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"`path` {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


class Windows:
    """Non-overlapping windows of ``block + 1`` token ids: ``x`` (N, block), ``y`` (N, block)."""

    def __init__(self, ids: torch.Tensor, block: int):
        n = (len(ids) - 1) // block
        self.x = ids[:n * block].view(n, block)
        self.y = ids[1:n * block + 1].view(n, block)

    def __len__(self) -> int:
        return len(self.x)


class TextLoader:
    """Batches of windows on their device; ``shuffle`` draws the order from ``generator``;
    ``shard`` = (rank, world) keeps slice ``rank`` of every global batch (as ``TensorLoader``)."""

    def __init__(self, dataset: Windows, batch_size: int, *, shuffle: bool = False,
                 generator: Optional[torch.Generator] = None, shard: tuple[int, int] = (0, 1)):
        self.dataset, self.batch_size, self.shuffle, self.shard = dataset, batch_size, shuffle, shard
        self.generator = generator if generator is not None else torch.Generator()

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.dataset)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            idx = idx[torch.tensor_split(torch.arange(len(idx)), self.shard[1])[self.shard[0]]]
            if len(idx):
                idx = idx.to(self.dataset.x.device)
                yield self.dataset.x.index_select(0, idx), self.dataset.y.index_select(0, idx).reshape(-1)


class TextBundle(DataBundle):
    def describe(self) -> str:
        chars = lambda ds: len(ds) * ds.x.shape[1]  # noqa: E731
        return (f"{self.name}: {chars(self.train.dataset)} train / {chars(self.test.dataset)} test characters "
                f"in windows of {self.train.dataset.x.shape[1]}, vocabulary of {self.num_classes}")


def load_text(path: Optional[str], block: int, *, batch_size_train: int = 32, batch_size_test: int = 64,
              device: Any = "cpu", seed: int = 0, limit_train: int = 0, limit_test: int = 0,
              rank: int = 0, world: int = 1) -> TextBundle:
    """The corpus as a ``DataBundle``; ``limit_*``: at most that many windows (0: all)."""
    name, text = read_text(path)
    vocab = sorted(set(text))
    if len(text) < 20 * (block + 1):
        raise DataError(f"{name}: {len(text)} characters is too little text for windows of {block} "
                        f"(need at least {20 * (block + 1)})")
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * (1 - TEST_SHARE))
    train, test = Windows(ids[:cut], block), Windows(ids[cut:], block)
    for ds, limit in ((train, limit_train), (test, limit_test)):
        if limit:
            ds.x, ds.y = ds.x[:limit], ds.y[:limit]
    for ds in (train, test):
        ds.x, ds.y = ds.x.to(device), ds.y.to(device)
    g = torch.Generator().manual_seed(seed)
    fingerprint = {"corpus": name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                   "characters": len(text), "vocabulary": len(vocab), "block": block,
                   "train_windows": len(train), "test_windows": len(test)}
    return TextBundle(name, TextLoader(train, batch_size_train, shuffle=True, generator=g, shard=(rank, world)),
                      TextLoader(test, batch_size_test, shard=(rank, world)), len(vocab), 1, vocab, g,
                      fingerprint)
