"""Image-folder datasets decoded once into a uint8 tensor, cached on disk.

``--gpu-data True`` keeps a dataset as one ``[N, 3, 32, 32]`` uint8 tensor;
for an image folder (the JPEG CIFAR-10) that means decoding every file, about
16 s for CIFAR-10's 60,000 JPEGs on one core. ``decode`` does it once and
keeps the result in a cache file, so later runs (and every row of an
experiment matrix) start compute-bound.

The cache file is keyed by what decoding depends on: the samples' relative
paths, labels and file sizes, the target size, and ``FORMAT``. A file that
changes size, a renamed or added image, or another subset (``--limit-*``)
gives another key, hence a fresh decode. A file rewritten with the same size
is not noticed: delete the cache (``BFP_CACHE_DIR``, below) after editing
images in place.

Where: ``$BFP_CACHE_DIR`` if set, else ``.bfp-cache/`` inside the image
folder when it is writable, else ``~/.cache/bfpsim/decoded``. ``BFP_CACHE_DIR=off``
turns the cache off. Writes are atomic (temporary file + ``os.replace``), a
cache that cannot be written is skipped with a warning, and a cache that
cannot be read (damaged, another format) is decoded anew and replaced. The
tensors are exactly what decoding gives, so a run from the cache equals one
without it bit for bit.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Optional

import torch

from . import images

FORMAT = 1  # bump when what decoding produces changes


def decode(samples: list[tuple[str, int]], root: Optional[Path], size: int = 32
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[N, 3, size, size]`` images and int64 labels of ``samples`` (``(path, label)``
    pairs), unreadable files skipped with a warning; from the cache when it has them."""
    path = _cache_path(samples, root, size)
    if path is not None and path.is_file():
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            for p, reason in saved.get("skipped", []):
                print(f"warning: skipping unreadable image {p}: {reason}", file=sys.stderr)
            return saved["images"], saved["labels"]
        except Exception as e:  # damaged or foreign: decode again and replace it
            print(f"warning: decoded-image cache {path} unreadable ({type(e).__name__}); decoding again",
                  file=sys.stderr)
    x, y, skipped = _decode(samples, size)
    if path is not None:
        _save({"images": x, "labels": y, "skipped": skipped}, path)
    return x, y


def _decode(samples, size):
    import torchvision.transforms.functional as TF
    from PIL import Image
    imgs, labels, skipped = [], [], []
    for p, label in samples:
        try:
            im = images.load_rgb(p)
        except images.UnreadableImage as e:
            print(f"warning: skipping unreadable image {e.path}: {e.reason}", file=sys.stderr)
            skipped.append([str(e.path), str(e.reason)])
            continue
        if im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR)
        imgs.append(TF.pil_to_tensor(im))
        labels.append(label)
    if not imgs:
        return torch.zeros(0, 3, size, size, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), skipped
    return torch.stack(imgs), torch.tensor(labels, dtype=torch.long), skipped


def _cache_path(samples, root: Optional[Path], size: int) -> Optional[Path]:
    where = os.environ.get("BFP_CACHE_DIR", "")
    if where.lower() == "off":
        return None
    h = hashlib.sha256(f"bfp-decoded v{FORMAT} size {size}\n".encode())
    for p, label in samples:
        rel = os.path.relpath(p, root) if root is not None else p
        try:
            n = os.stat(p).st_size
        except OSError:
            n = -1
        h.update(f"{rel}\t{label}\t{n}\n".encode())
    name = f"decoded-{size}px-{len(samples)}-{h.hexdigest()[:16]}.pt"
    if where:
        return Path(where) / name
    if root is not None and os.access(root, os.W_OK):
        return root / ".bfp-cache" / name
    return Path.home() / ".cache" / "bfpsim" / "decoded" / name


def _save(state: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        os.replace(tmp, path)
    except OSError as e:
        print(f"warning: decoded-image cache not written to {path} ({e.strerror or e}); "
              f"the next run decodes again", file=sys.stderr)
        try:
            tmp.unlink()
        except OSError:
            pass
