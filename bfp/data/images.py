"""Image files that never stop a run: decode any mode to RGB, skip what cannot be read.

Image-folder datasets (``imagenet.py``, ``cifar.py -dp FOLDER``) hold files
nobody has opened yet: a truncated JPEG, an empty ``.jpg``, random bytes under
an image name. A plain ``ImageFolder`` finds them epochs later with a traceback
that does not name the file. Here:

* ``load_rgb(path)`` decodes fully (truncation is found now, not in a
  transform) and converts every mode (L, LA, P with transparency, RGBA, CMYK,
  I;16, the first frame of a GIF) to RGB; anything else raises
  ``UnreadableImage`` naming the path and the reason.
* ``ImageFolder`` (torchvision's, plus GIFs) returns a ``(path, reason)``
  marker for an unreadable sample instead of raising; ``collate`` drops those samples from
  their batch, and ``SkippingLoader`` (the loader the engine iterates) reports
  each skipped path once per process, on stderr, and counts them. A training
  batch left with fewer than two images (BatchNorm needs two) is dropped whole.
* ``check_readable(dataset)`` decodes every file first and raises
  ``UnreadableImages`` listing the bad ones (``--strict-images``): refused
  before training, never mid-epoch.
* ``SkippedImagesReport``, a training callback, writes the count of skipped
  images (and their paths) into the run's log after each epoch.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, Optional

import torch
from PIL import Image, UnidentifiedImageError


# torchvision's IMG_EXTENSIONS plus GIF, which torchvision's ImageFolder skips without a word.
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


class UnreadableImage(OSError):
    """One image file that cannot be decoded; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


class UnreadableImages(ValueError):
    """Files ``check_readable`` refused (strict mode); the message lists them."""

    def __init__(self, bad: list[UnreadableImage], total: int):
        shown = "; ".join(f"{e.path} ({e.reason})" for e in bad[:20])
        more = f"; and {len(bad) - 20} more" if len(bad) > 20 else ""
        super().__init__(f"{len(bad)} of {total} images cannot be read: {shown}{more}. Delete or replace "
                         f"them, or leave out `strict_images` to skip them with a warning")
        self.bad = bad


def load_rgb(path: str) -> Image.Image:
    """The image at ``path`` fully decoded as RGB; ``UnreadableImage`` if it cannot be.

    Palette and greyscale images with transparency go through RGBA first, so
    the transparent colour is dropped the way PIL documents, not mapped to a
    palette entry; the alpha channel is discarded (no compositing)."""
    try:
        if Path(path).stat().st_size == 0:
            raise UnreadableImage(path, "empty file")
        with Image.open(path) as im:
            im.load()  # decode now: a truncated file fails here, with its path
            if im.mode == "RGB":
                return im.copy()
            if im.mode in ("P", "PA", "LA", "La") or "transparency" in im.info:
                im = im.convert("RGBA")
            return im.convert("RGB")
    except UnreadableImage:
        raise
    except UnidentifiedImageError:
        raise UnreadableImage(path, "not an image file PIL can identify") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # truncated, corrupt
        raise UnreadableImage(path, f"{type(e).__name__}: {e}") from None


def has_image_extension(path: str) -> bool:
    return path.lower().endswith(EXTENSIONS)


def _image_folder_class():
    import torchvision

    class ImageFolder(torchvision.datasets.ImageFolder):
        """torchvision's ``ImageFolder`` over ``EXTENSIONS`` decoding with ``load_rgb``;
        ``dataset[i]`` is a ``(path, reason)`` marker when sample ``i`` cannot be read (``collate`` drops it)."""

        def __init__(self, root: str, transform: Optional[Callable] = None):
            super().__init__(str(root), transform=transform, loader=load_rgb, is_valid_file=has_image_extension)

        def __getitem__(self, index: int) -> tuple:
            path, target = self.samples[index]
            try:
                image = load_rgb(path)
            except UnreadableImage as e:
                return _Skipped(e.path, e.reason)
            if self.transform is not None:
                image = self.transform(image)
            return image, target

    ImageFolder.__qualname__ = "ImageFolder"  # pickled by name into DataLoader workers
    return ImageFolder


def __getattr__(name: str):
    """``ImageFolder`` is made on first use: importing torchvision (and the torch._dynamo it
    pulls in) takes a second or more, which every command that opens no image folder (``--help``,
    configs, text data, digits) would otherwise pay at start-up."""
    if name == "ImageFolder":
        cls = globals()["ImageFolder"] = _image_folder_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Skipped(tuple):
    """What ``ImageFolder`` returns for a file it could not read: ``(path, reason)``."""

    def __new__(cls, path: str, reason: str):
        return super().__new__(cls, (path, reason))

    def __getnewargs__(self):  # pickled back from DataLoader workers
        return tuple(self)


def collate(batch: list) -> tuple[Optional[tuple[torch.Tensor, torch.Tensor]], list[tuple[str, str]]]:
    """``(images, labels)`` of the readable samples (``None`` if there are none) and
    the ``(path, reason)`` of every skipped one."""
    skipped = [s for s in batch if isinstance(s, _Skipped)]
    good = [s for s in batch if not isinstance(s, _Skipped)]
    data = torch.utils.data.default_collate(good) if good else None
    return data, [tuple(s) for s in skipped]


class SkippingLoader:
    """Iterates a ``DataLoader`` built with ``collate``, yielding ``(images, labels)``.

    Each unreadable path is reported once per process on ``stream`` (stderr)
    and kept in ``skipped`` (path -> reason); ``skipped_this_epoch`` counts the
    samples dropped in the current pass. ``min_batch``: smaller batches are
    dropped (2 for training: BatchNorm fails on one image)."""

    def __init__(self, loader: torch.utils.data.DataLoader, min_batch: int = 1, stream=None):
        self.loader, self.min_batch, self.stream = loader, min_batch, stream
        self.dataset = loader.dataset
        self.skipped: dict[str, str] = {}
        self.skipped_this_epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.skipped_this_epoch = 0
        for data, bad in self.loader:
            for path, reason in bad:
                self.skipped_this_epoch += 1
                if path not in self.skipped:
                    self.skipped[path] = reason
                    print(f"warning: skipping unreadable image {path}: {reason}",
                          file=self.stream or sys.stderr, flush=True)
            if data is not None and len(data[1]) >= self.min_batch:
                yield data[0], data[1]


def samples_of(dataset) -> list[tuple[str, int]]:
    """``(path, label)`` of every sample of an ``ImageFolder`` or a ``Subset`` of one."""
    if isinstance(dataset, torch.utils.data.Subset):
        base = samples_of(dataset.dataset)
        return [base[i] for i in dataset.indices]
    return list(dataset.samples)


def check_readable(dataset) -> None:
    """Decode every file of ``dataset``; ``UnreadableImages`` lists those that fail."""
    samples = samples_of(dataset)
    bad = []
    for path, _ in samples:
        try:
            load_rgb(path).close()
        except UnreadableImage as e:
            bad.append(e)
    if bad:
        raise UnreadableImages(bad, len(samples))
