"""Training augmentation for torch DataLoaders that does not depend on the worker count.

Why: torchvision's random transforms draw from the global torch RNG of the
process that runs them; with ``num_workers > 0`` each worker seeds its own,
so the same seed gave other crops (and other weights) with another
``--num-workers``, and a resume with another worker count changed the run.

Here the main process draws everything random: ``KeyedSampler`` draws the
epoch's shuffle order and one 62-bit epoch key from the loader's generator
(saved in checkpoints; the draws depend only on the seed and the epoch) and
hands each worker ``(index, key)``. ``KeyedAugment`` then crops and flips
sample ``index`` with a generator seeded from ``(key, index)`` alone, so a
sample's augmentation is the same whichever process decodes it.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

_MASK64 = (1 << 64) - 1


def sample_seed(key: int, index: int) -> int:
    """A 63-bit seed from the epoch key and the sample index (splitmix64 finaliser:
    neighbouring indices get unrelated seeds)."""
    z = (key + 0x9E3779B97F4A7C15 * (index + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class KeyedSampler(torch.utils.data.Sampler):
    """Yields ``(index, epoch key)`` in a random order; both come from ``generator``."""

    def __init__(self, n: int, generator: torch.Generator):
        self.n, self.generator = n, generator

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = torch.randperm(self.n, generator=self.generator).tolist()
        key = int(torch.randint(0, 2 ** 62, (), generator=self.generator))
        return iter([(i, key) for i in order])


class KeyedAugment(torch.utils.data.Dataset):
    """``dataset[index]`` (a uint8 ``[C, H, W]`` image tensor and its label), randomly
    cropped after zero padding by ``pad`` and flipped with probability 1/2 when
    ``flip``, then normalised as ``(x / 255 - mean) / std`` in float32.

    The crop offsets and the flip are drawn, in that order, from a CPU generator
    seeded with ``sample_seed(key, index)``; the same pixels as torchvision's
    ``RandomCrop(padding=pad)`` and ``RandomHorizontalFlip`` for the same draws."""

    def __init__(self, dataset, *, pad: int, flip: bool, mean, std):
        self.dataset, self.pad, self.flip = dataset, pad, flip
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, key = item
        sample = self.dataset[index]
        if not isinstance(sample[0], torch.Tensor):  # an unreadable file's (path, reason) marker: collate drops it
            return sample
        x, y = sample
        g = torch.Generator().manual_seed(sample_seed(key, index))
        p = self.pad
        if p:
            _, h, w = x.shape
            dy, dx = (int(v) for v in torch.randint(0, 2 * p + 1, (2,), generator=g))
            x = F.pad(x, (p, p, p, p))[:, dy:dy + h, dx:dx + w]
        if self.flip and bool(torch.rand((), generator=g) < 0.5):
            x = x.flip(2)
        return (x.float() / 255 - self.mean) / self.std, y


class KeyedTransform(torch.utils.data.Dataset):
    """``dataset[index]`` with the global torch RNG seeded from ``sample_seed(key, index)``
    for the call: torchvision's random transforms (``RandomResizedCrop``, flips)
    then draw the same values in any worker process. The caller's RNG state is
    restored after each sample (``torch.random.fork_rng``)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, key = item
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(key, index))
            return self.dataset[index]
