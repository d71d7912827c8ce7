"""What every dataset loader returns (``DataBundle``), the error it raises (``DataError``), and the
checks and subsetting all of them share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .loaders import ShardedBatchSampler


class DataError(ValueError):
    """A dataset name, path or option that cannot be used; the message says why."""


@dataclass
class DataBundle:
    name: str
    train: Any  # TensorLoader or DataLoader
    test: Any
    num_classes: int
    in_channels: int
    classes: list[str]
    generator: torch.Generator  # drives shuffling and augmentation of ``train``
    fingerprint: Optional[dict] = None  # classes, image counts, sizes (bfp.data.fingerprint)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle a distributed sampler for ``epoch`` (TensorLoaders draw from ``generator``)."""
        loader = getattr(self.train, "loader", self.train)  # through images.SkippingLoader
        sampler = getattr(loader, "batch_sampler", None)
        if isinstance(sampler, ShardedBatchSampler):
            sampler.set_epoch(epoch)

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train.dataset)} train / {len(self.test.dataset)} test images, "
                f"{self.num_classes} classes, {self.in_channels} channels")


def check_global_batch(batch_size_train: int, world: int) -> None:
    if world > 1 and batch_size_train % world:
        raise DataError(f"`batch_size_train` {batch_size_train} (the global batch) cannot be split evenly "
                        f"over {world} processes; use a multiple of {world}")


def check_train_size(name: str, n: int, batch_size_train: int = 0, workers: int = 1) -> None:
    """At least one training step an epoch: 2 images (a lone image is dropped as a last batch, BatchNorm
    needs two), and, with more than one worker (an incomplete last global batch is dropped), one
    whole global batch."""
    if n < 2:
        raise DataError(f"{name}: {n} training image(s) (`limit_train`); training needs at least 2")
    if workers > 1 and n < batch_size_train:
        raise DataError(f"{name}: {n} training images are fewer than one global batch of {batch_size_train} "
                        f"(`batch_size_train`); with {workers} workers an incomplete last global batch is dropped "
                        f"(it would not split evenly), so no step would be trained: use a global batch of at most "
                        f"{n - n % workers or workers} (a multiple of {workers}), or more images")


def limit(ds, n: int):
    """``n`` images spread evenly over ``ds`` (image folders are sorted by class:
    the first ``n`` could all be one class)."""
    if not n or n >= len(ds):
        return ds
    idx = torch.arange(n) * len(ds) // n
    take = getattr(ds, "take", None)  # a cifar.TensorDataset stays one tensor
    return take(idx) if take is not None else torch.utils.data.Subset(ds, idx.tolist())
