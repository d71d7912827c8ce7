"""Datasets and loaders for 32x32 image classification.

``load(name, path, ...)`` returns a ``DataBundle`` with train and test loaders:

* ``digits``: scikit-learn's 8x8 digits (ships with scikit-learn, works
  offline): scaled 3x to 24x24 (nearest), zero-padded to 32x32, repeated to
  ``channels`` channels; a fixed stratified 80/20 split (1437 / 360 images).
* ``CIFAR10`` / ``CIFAR100``: torchvision's on-disk format under ``path``
  (downloaded when absent and online).
* ``imagefolder``: ``path/{train,test}/<class>/*`` (``val`` is accepted for
  ``test``; ``path`` may also be the folder holding that one directory, as an
  unpacked tarball), images resized to 32x32 if they are not. ``CIFAR10`` with
  a ``path`` that is such a folder and has no torchvision files (the JPEG
  CIFAR-10) loads the folder with CIFAR-10's normalisation. Files are decoded
  by ``bfp.data.images``: any mode as RGB, GIFs included; unreadable ones are
  skipped and reported once (``strict_images``: refused before training).

Two loader kinds, both iterating ``(images, labels)`` batches, with
``set_epoch``-free determinism: their randomness comes from one
``torch.Generator`` each (saved in checkpoints).

* ``TensorLoader`` keeps the whole dataset as one uint8 tensor on a device
  and crops/flips whole batches there (``--gpu-data``; always used for digits).
  Small models then run at the speed of the GPU, not of the data loader.
* a torch ``DataLoader`` decoding with torchvision and augmenting with
  ``bfp.data.augment`` (the default for CIFAR and image folders).

Test data is never augmented. The DataLoader path draws its shuffle order and
per-sample augmentation keys in the main process (``bfp.data.augment``), so
the batches are the same for any ``num_workers``. ``DataBundle.fingerprint``
(``bfp.data.fingerprint``) is what a resume checks the dataset against.

Distributed runs (``rank``/``world`` of ``load``): every rank draws the same
global batch of ``batch_size_train`` images (the same shuffle and the same
augmentation draws, from generators seeded alike) and keeps its contiguous
``1/world`` slice of it, so rank ``r`` trains on what worker ``r`` of an
``--emulate-node`` run sees; an incomplete last global batch is dropped.
The DataLoader path does this with ``ShardedBatchSampler``, whose shuffle is
seeded by ``seed + epoch`` (``DataBundle.set_epoch``, called by the Trainer
every epoch). Test batches are split the same way, and the Trainer adds the
ranks' counts.
"""
from __future__ import annotations

import random

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .augment import KeyedAugment
from .downloads import removed_on_failure
from .fingerprint import fingerprint
from .bundle import DataBundle, DataError, check_global_batch, check_train_size, limit
from .archives import ARCHIVE_SUFFIXES, ArchiveError, image_folder
from .folders import find_image_folder, open_folders
from .loaders import loaders
from . import decoded, images

DATASETS = ("digits", "CIFAR10", "CIFAR100", "imagefolder")
CIFAR_MEAN = {"CIFAR10": (0.4914, 0.4822, 0.4465), "CIFAR100": (0.5071, 0.4865, 0.4409)}
CIFAR_STD = {"CIFAR10": (0.2470, 0.2435, 0.2616), "CIFAR100": (0.2673, 0.2564, 0.2762)}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Augment:
    """Training augmentation: random crop after zero padding by ``pad`` pixels, random horizontal flip."""

    pad: int = 4
    flip: bool = True


def canonical_name(name: str) -> str:
    for d in DATASETS:
        if str(name).lower() == d.lower():
            return d
    raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)} "
                    f"(or a directory with train/ and test/ class folders)")


class TensorDataset:
    """uint8 images ``[N, C, 32, 32]`` and int64 labels, on one device."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, idx: torch.Tensor) -> "TensorDataset":
        return TensorDataset(self.images[idx], self.labels[idx])

    def to(self, device) -> "TensorDataset":
        return TensorDataset(self.images.to(device), self.labels.to(device))


class TensorLoader:
    """Batches of a ``TensorDataset``, normalised and augmented where the data lives.

    Random crop offsets, flips and the shuffle order are drawn from
    ``generator`` (a CPU generator) and applied to the batch on its device, so
    the result is the same on any device and reproducible from the
    generator's state.
    """

    def __init__(self, dataset: TensorDataset, batch_size: int, mean, std, *, shuffle: bool = False,
                 augment: Optional[Augment] = None, generator: Optional[torch.Generator] = None,
                 drop_last: bool = False, shard: tuple[int, int] = (0, 1)):
        self.dataset, self.batch_size = dataset, batch_size
        self.shard = shard  # (rank, world): keep slice ``rank`` of ``world`` of every batch
        self.shuffle, self.augment, self.drop_last = shuffle, augment, drop_last
        self.generator = generator if generator is not None else torch.Generator()
        dev = dataset.images.device
        self.mean = torch.tensor(mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32, device=dev).view(1, -1, 1, 1) * 255

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, dev = len(self.dataset), self.dataset.images.device
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            draws = self._draws(len(idx)) if self.augment is not None else None
            part = torch.tensor_split(torch.arange(len(idx)), self.shard[1])[self.shard[0]]
            if len(part) == 0:
                continue
            idx = idx[part].to(dev)
            x = self.dataset.images.index_select(0, idx)
            if draws is not None:
                x = self._augment(x, *(d[part] if d is not None else None for d in draws))
            x = (x.float() - self.mean) / self.std
            yield x, self.dataset.labels.index_select(0, idx)

    def _draws(self, b: int):
        """Crop offsets and flips of a whole (global) batch of ``b`` images."""
        p, g = self.augment.pad, self.generator
        dy = torch.randint(0, 2 * p + 1, (b,), generator=g) if p else None
        dx = torch.randint(0, 2 * p + 1, (b,), generator=g) if p else None
        flip = (torch.rand(b, generator=g) < 0.5) if self.augment.flip else None
        return dy, dx, flip

    def _augment(self, x: torch.Tensor, dy, dx, flip) -> torch.Tensor:
        b, _, h, w = x.shape
        p = self.augment.pad
        if p:
            dy, dx = dy.to(x.device), dx.to(x.device)
            xp = F.pad(x, (p, p, p, p))  # zero pixels, as torchvision's RandomCrop(padding=p)
            rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
            cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
            bidx = torch.arange(b, device=x.device)[:, None, None, None]
            cidx = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
            x = xp[bidx, cidx, rows, cols]
        if self.augment.flip:
            flip = flip.to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        return x


def load(name: str, path: Optional[str] = None, *, batch_size_train: int = 128, batch_size_test: int = 256,
         num_workers: int = 2, device: Any = "cpu", gpu_data: bool = False, seed: int = 0,
         channels: int = 3, download: bool = True, limit_train: int = 0, limit_test: int = 0,
         strict_images: bool = False, rank: int = 0, world: int = 1, workers: int = 0,
         extract_to: str = "data") -> DataBundle:
    """Train/test loaders for dataset ``name`` (see the module docstring).

    ``gpu_data``: keep the dataset as a tensor on ``device`` and augment there.
    ``seed`` seeds the generator that shuffles and augments the training set.
    ``limit_train`` / ``limit_test``: keep N images spread evenly over the set (smoke tests; 0 = all).
    ``strict_images``: decode every image-folder file first and refuse unreadable ones
    (``bfp.data.images``); otherwise they are skipped and reported.
    ``rank`` / ``world``: this process's slice of every batch (module docstring);
    ``batch_size_train`` is the global batch and must be a multiple of ``world``.
    ``workers``: how many workers the global batch is split over (processes times
    emulated workers; 0: ``world``); with more than one, an incomplete last global
    batch is dropped, since it would not split evenly.
    ``path`` may be an archive (``.tar.gz``/``.tgz``/``.tar``) of the image folders: it is unpacked
    once into ``extract_to`` (``bfp.data.archives``: every member checked first) and read from there.
    """
    workers = workers or world
    check_global_batch(batch_size_train, world)
    name = canonical_name(name)
    if channels != 3 and name != "digits":
        raise DataError(f"`channels` {channels}: only the digits dataset can change its channel "
                        f"count; {name} images have 3 channels")
    if channels not in (1, 3) and name == "digits":
        raise DataError(f"`channels` must be 1 or 3, got {channels}")
    g = torch.Generator().manual_seed(seed)
    if name == "digits":
        if path:
            raise DataError(f"`path` {path!r} given with dataset digits, which ships with scikit-learn and "
                            f"reads no folder; drop `path`, or use `name` imagefolder with `path` {path}")
        train, test, classes = _digits(channels)
        fp = fingerprint(name, train, test, classes, None)
        train, test = limit(train, limit_train), limit(test, limit_test)
        check_train_size(name, len(train), batch_size_train, workers)
        mean, std = _mean_std(train)
        aug = Augment(pad=2, flip=False)  # digits are not mirror-symmetric
        bundle = _tensor_bundle(name, train, test, classes, mean, std, aug, batch_size_train,
                                batch_size_test, device if gpu_data else "cpu", g, (rank, world), workers)
        bundle.fingerprint = fp
        return bundle
    if path is not None and Path(path).is_file() and str(path).endswith(ARCHIVE_SUFFIXES):
        try:  # an archive of the JPEG class folders: unpacked once into extract_to, checked member by member
            path = str(image_folder(path, Path(extract_to), "`path`"))
        except ArchiveError as e:
            raise DataError(str(e)) from None
    # CIFAR named with a path to an image folder (the JPEG CIFAR-10) loads the folder
    folder = name == "imagefolder" or (path is not None and _cifar_files_absent(name, Path(path))
                                       and find_image_folder(Path(path)) is not None)
    train_ds, test_ds = _image_folder(path) if folder else _cifar(name, path, download)
    mean, std = (CIFAR_MEAN[name], CIFAR_STD[name]) if name in CIFAR_MEAN else (IMAGENET_MEAN, IMAGENET_STD)
    aug = Augment()
    classes = list(train_ds.classes)
    fp = fingerprint(name, train_ds, test_ds, classes, path)
    train_ds, test_ds = limit(train_ds, limit_train), limit(test_ds, limit_test)
    check_train_size(name, len(train_ds), batch_size_train, workers)
    if folder and strict_images:
        for ds in (train_ds, test_ds):
            try:
                images.check_readable(ds)
            except images.UnreadableImages as e:
                raise DataError(f"`strict_images`: {e}") from None
    if gpu_data:
        train, test = _to_tensor_dataset(train_ds), _to_tensor_dataset(test_ds)
        bundle = _tensor_bundle(name, train, test, classes, mean, std, aug, batch_size_train,
                                batch_size_test, device, g, (rank, world), workers)
        bundle.fingerprint = fp
        return bundle
    import torchvision
    import torchvision.transforms as T
    norm = [T.ToTensor(), T.Normalize(mean, std)]
    resize = [T.Resize((32, 32))] if isinstance(_base(train_ds), torchvision.datasets.ImageFolder) else []
    # training images stay uint8 here; KeyedAugment crops, flips and normalises them
    _base(train_ds).transform = T.Compose(resize + [T.PILToTensor()])
    _base(test_ds).transform = T.Compose(resize + norm)
    pin = torch.device(device).type == "cuda"
    common = dict(num_workers=num_workers, pin_memory=pin, persistent_workers=False)
    train_aug = KeyedAugment(train_ds, pad=aug.pad, flip=aug.flip, mean=mean, std=std)
    return DataBundle(name, *loaders(train_aug, test_ds, batch_size_train, batch_size_test, g, seed,
                                     (rank, world, workers), skipping=folder, **common),
                      len(classes), 3, classes, g, fp)


def _base(ds):
    return ds.dataset if isinstance(ds, torch.utils.data.Subset) else ds


def _tensor_bundle(name, train, test, classes, mean, std, aug, bs_train, bs_test, device, g, shard, workers):
    train, test = train.to(device), test.to(device)
    drop = len(train) % bs_train == 1 or (workers > 1 and len(train) % bs_train != 0)
    return DataBundle(name, TensorLoader(train, bs_train, mean, std, shuffle=True, augment=aug, generator=g,
                                         drop_last=drop, shard=shard),
                      TensorLoader(test, bs_test, mean, std, shard=shard), len(classes), train.images.shape[1],
                      classes, g)


def _mean_std(ds: TensorDataset):
    x = ds.images.float() / 255
    return tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist())


def _digits(channels: int):
    state = random.getstate()  # scikit-learn may import rich, which draws from Python's RNG at import:
    from sklearn.datasets import load_digits  # a run's random state must not depend on what was imported
    from sklearn.model_selection import train_test_split
    random.setstate(state)
    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    x = torch.from_numpy(images)[:, None]  # [N, 1, 8, 8]
    x = x.repeat_interleave(3, dim=2).repeat_interleave(3, dim=3)  # 24x24, nearest
    x = F.pad(x, (4, 4, 4, 4)).repeat(1, channels, 1, 1).contiguous()
    y = torch.from_numpy(d.target).long()
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.2, random_state=0,
                                           stratify=d.target)
    idx_train, idx_test = torch.from_numpy(np.sort(idx_train)), torch.from_numpy(np.sort(idx_test))
    return (TensorDataset(x[idx_train], y[idx_train]), TensorDataset(x[idx_test], y[idx_test]),
            [str(c) for c in d.target_names])


# What a CIFAR run can read without a network (the end of the error when the download fails).
OFFLINE = ("a .tar.gz of the JPEG class folders (train/<class>/*.jpg and test/<class>/*.jpg, such as "
           "cifar10-jpg.tar.gz; unpacked once into data/), such a folder, or torchvision's CIFAR folder. The "
           "JPEG folders can be made from the CIFAR-10 site's cifar-10-python.tar.gz: python -m bfp.data "
           "prepare cifar10 --from cifar-10-python.tar.gz --out data/cifar10_jpg")


def _cifar(name: str, path: Optional[str], download: bool):
    import torchvision
    root = Path(path or os.path.join("data", name.lower()))
    cls = torchvision.datasets.CIFAR10 if name == "CIFAR10" else torchvision.datasets.CIFAR100
    try:
        return cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
    except RuntimeError:
        pass  # not there (or damaged): torchvision says "Dataset not found or corrupted"
    if not download:
        raise DataError(f"{name} not found under {str(root)!r} and downloading is off")
    try:
        with removed_on_failure(root):  # Ctrl-C mid-download too: the partial files go, the interrupt stays
            return (cls(str(root), train=True, download=True), cls(str(root), train=False, download=True))
    except Exception as e:
        raise DataError(f"{name} is not under {str(root)!r} (expected torchvision's "
                        f"{cls.base_folder}/ folder there) and downloading it failed "
                        f"({type(e).__name__}: {e}). Without a network, give `path` one of: "
                        f"{OFFLINE}") from None


def _cifar_files_absent(name: str, root: Path) -> bool:
    folder = "cifar-10-batches-py" if name == "CIFAR10" else "cifar-100-python"
    return not (root / folder).is_dir()


def _image_folder(path: Optional[str]):
    if not path:
        raise DataError("`name` imagefolder needs `path` DIR with train/ and test/ class folders")
    root = find_image_folder(Path(path))
    if root is None:
        if not Path(path).exists():
            raise DataError(f"{path!r} does not exist; give the folder with train/ and test/ class folders, or "
                            f"their .tar.gz")
        raise DataError(f"{path!r} is not an image folder: expected {path}/train/<class>/*.jpg and "
                        f"{path}/test/<class>/*.jpg (or val/ for test)")
    test_dir = root / "test" if (root / "test").is_dir() else root / "val"
    return open_folders(root / "train", test_dir)


def _to_tensor_dataset(ds) -> TensorDataset:
    """Decode a torchvision dataset once into one uint8 tensor."""
    if isinstance(ds, torch.utils.data.Subset) and hasattr(ds.dataset, "data"):
        full = _to_tensor_dataset(ds.dataset)
        idx = torch.as_tensor(list(ds.indices))
        return TensorDataset(full.images[idx], full.labels[idx])
    if hasattr(ds, "data") and isinstance(ds.data, np.ndarray):  # CIFAR: [N, 32, 32, 3] uint8
        data = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return TensorDataset(data, torch.as_tensor(ds.targets))
    base = _base(ds)  # an ImageFolder or a Subset of one: decoded once, then from the cache
    root = Path(base.root).parent if getattr(base, "root", None) else None
    return TensorDataset(*decoded.decode(images.samples_of(ds), root))
