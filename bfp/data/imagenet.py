"""ImageNet-style data for ``imagenet.py``: an image-folder tree at any image size.

``load_imagenet(path, image_size, ...)`` reads ``path/train/<class>/*`` and
``path/val/<class>/*`` (``path`` defaults to ``$BFP_IMAGENET_DIR``, else
``data/imagenet``; ``test/`` is accepted for ``val/``; ``path`` may be
the folder holding that one tree, as an unpacked tarball) with the standard
ImageNet transforms of the PyTorch example, scaled to ``image_size``:
training ``RandomResizedCrop(image_size)`` and a random horizontal flip,
validation ``Resize(round(image_size * 256 / 224))`` then
``CenterCrop(image_size)``; both normalised with the ImageNet mean and std.
Files of any size and mode load as RGB; unreadable ones are skipped and
reported once, or refused before training with ``strict_images``
(``bfp.data.images``). Shuffling and one key per epoch are drawn from the
bundle's generator in the main process; each image's crop and flip from a
seed of (key, index) (``bfp.data.augment``), so the batches are the same
for any ``num_workers`` and a resume continues them exactly.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch

from . import images
from .augment import KeyedTransform
from .bundle import DataBundle, DataError, check_global_batch, check_train_size, limit
from .cifar import IMAGENET_MEAN, IMAGENET_STD
from .folders import find_image_folder, open_folders
from .loaders import loaders
from .fingerprint import fingerprint


def default_dir() -> str:
    """Where the tree is when no DIR is given: ``$BFP_IMAGENET_DIR`` (the Docker image sets
    ``/dataset/imagenet``, where the seed's ``docker run --mount`` puts it), else ``data/imagenet``."""
    return os.environ.get("BFP_IMAGENET_DIR") or os.path.join("data", "imagenet")


def tree(path: Optional[str]) -> tuple[Path, Path]:
    """``(train_dir, val_dir)`` of the tree at ``path`` (default ``default_dir()``);
    ``DataError`` naming what is missing."""
    path = path or default_dir()
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"{str(path)!r} is not a directory; expected DIR/train/<class>/*.JPEG and "
                        f"DIR/val/<class>/*.JPEG (give `path` DIR; default $BFP_IMAGENET_DIR or data/imagenet)")
    root = find_image_folder(p)
    if root is None:
        raise DataError(f"{str(path)!r} has no train/ and val/ class folders (found: "
                        f"{', '.join(sorted(c.name for c in p.iterdir())[:10]) or 'nothing'}); expected "
                        f"{path}/train/<class>/*.JPEG and {path}/val/<class>/*.JPEG")
    return root / "train", root / "val" if (root / "val").is_dir() else root / "test"


def load_imagenet(path: Optional[str], image_size: int = 224, *, batch_size_train: int = 256,
                  batch_size_test: int = 256, num_workers: int = 4, device: Any = "cpu", seed: int = 0,
                  limit_train: int = 0, limit_test: int = 0, strict_images: bool = False,
                  shard: tuple[int, int, int] = (0, 1, 1)) -> DataBundle:
    """Train and validation loaders of the tree at ``path`` (see the module docstring);
    ``shard`` = (rank, world, workers) as ``bfp.data.loaders.loaders`` takes it."""
    import torchvision.transforms as T
    check_global_batch(batch_size_train, shard[1])
    if image_size < 8:
        raise DataError(f"`image_size` must be >= 8, got {image_size}")
    train_dir, val_dir = tree(path)
    train_ds, val_ds = open_folders(train_dir, val_dir)
    classes = list(train_ds.classes)
    fp = fingerprint("imagenet", train_ds, val_ds, classes, path)
    norm = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train_ds.transform = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip()] + norm)
    val_ds.transform = T.Compose([T.Resize(round(image_size * 256 / 224)), T.CenterCrop(image_size)] + norm)
    train_ds, val_ds = limit(train_ds, limit_train), limit(val_ds, limit_test)
    check_train_size("imagenet", len(train_ds), batch_size_train, shard[2])
    if strict_images:
        for ds in (train_ds, val_ds):
            try:
                images.check_readable(ds)
            except images.UnreadableImages as e:
                raise DataError(f"`strict_images`: {e}") from None
    g = torch.Generator().manual_seed(seed)
    pin = torch.device(device).type == "cuda"
    train, val = loaders(KeyedTransform(train_ds), val_ds, batch_size_train, batch_size_test, g, seed, shard,
                         skipping=True, num_workers=num_workers, pin_memory=pin)
    return DataBundle("imagenet", train, val, len(classes), 3, classes, g, fp)
