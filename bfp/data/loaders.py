"""DataLoaders over decoded datasets: one process's batches, or its slice of distributed ones.

Why a module of its own: ``cifar.py``'s CIFAR and image-folder data and
``imagenet.py``'s folders share these loaders (``bfp.data.cifar`` and
``bfp.data.imagenet``), so a run's batches are made one way: the
shuffle order and one augmentation key per epoch are drawn in the main
process (``bfp.data.augment``) and each rank keeps its contiguous slice of
the global batch (``ShardedBatchSampler``).
"""
from __future__ import annotations

import torch

from . import images
from .augment import KeyedSampler


def loaders(train_ds, test_ds, batch_size_train: int, batch_size_test: int, g: torch.Generator, seed: int,
            shard: tuple[int, int, int], *, skipping: bool, **common):
    """Train and test ``DataLoader``s; ``train_ds`` takes ``(index, epoch key)`` items
    (``bfp.data.augment``). ``shard`` = (rank, world, workers): with more than one
    worker every batch is the global one, cut into this rank's slice
    (``ShardedBatchSampler``). ``skipping``: unreadable image files are dropped from
    their batches and reported (``bfp.data.images``)."""
    rank, world, workers = shard
    if skipping:
        common["collate_fn"] = images.collate
    if workers > 1:
        train = torch.utils.data.DataLoader(train_ds, batch_sampler=ShardedBatchSampler(
            len(train_ds), batch_size_train, rank, world, shuffle=True, seed=seed), **common)
        test = torch.utils.data.DataLoader(test_ds, batch_sampler=ShardedBatchSampler(
            len(test_ds), batch_size_test, rank, world, shuffle=False, seed=seed), **common)
    else:
        # A last batch of one image would break BatchNorm in training mode: drop it.
        train = torch.utils.data.DataLoader(train_ds, batch_size=batch_size_train,
                                            sampler=KeyedSampler(len(train_ds), g), generator=g,
                                            drop_last=len(train_ds) % batch_size_train == 1, **common)
        test = torch.utils.data.DataLoader(test_ds, batch_size=batch_size_test, shuffle=False, **common)
    if skipping:
        train, test = images.SkippingLoader(train, min_batch=2), images.SkippingLoader(test)
    return train, test


class ShardedBatchSampler(torch.utils.data.Sampler):
    """Rank ``rank``'s contiguous ``1/world`` slice of every global batch of ``batch_size``.

    ``shuffle``: a permutation and an augmentation key (training items are
    ``(index, key)``, ``bfp.data.augment``) drawn from ``seed + epoch``
    (``set_epoch``), the same on every rank; training drops an incomplete last global batch, evaluation keeps it
    (split as evenly as it goes; a rank with nothing of it skips that batch).
    """

    def __init__(self, n: int, batch_size: int, rank: int, world: int, *, shuffle: bool, seed: int = 0):
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.shuffle else -(-self.n // self.batch_size)

    def __iter__(self):
        key = None
        if self.shuffle:
            g = torch.Generator().manual_seed((self.seed + self.epoch) % 2 ** 63)
            order = torch.randperm(self.n, generator=g)
            key = int(torch.randint(0, 2 ** 62, (), generator=g))
        else:
            order = torch.arange(self.n)
        for i in range(len(self)):
            part = torch.tensor_split(order[i * self.batch_size:(i + 1) * self.batch_size], self.world)[self.rank]
            if len(part):
                yield part.tolist() if key is None else [(j, key) for j in part.tolist()]
