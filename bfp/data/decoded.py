"""Image-folder datasets decoded once into a uint8 tensor, cached on disk.

``--gpu-data True`` keeps a dataset as one ``[N, 3, 32, 32]`` uint8 tensor;
for an image folder (the JPEG CIFAR-10) that means decoding every file, about
16 s for CIFAR-10's 60,000 JPEGs on one core. ``decode`` does it once and
keeps the result in a cache file, so later runs (and every row of an
experiment matrix) start compute-bound.

The cache file is keyed by what decoding depends on: the samples' relative
paths, labels, file sizes and modification times (ns), the target size, and
``FORMAT``. A file that changes size or is rewritten, a renamed or added image,
or another subset (``--limit-*``) gives another key, hence a fresh decode. The
file carries its own fingerprint (that key), the image count, the labels and a
SHA-256 of the image bytes, all checked on load: a cache trimmed, zeroed,
copied from another folder or edited in any way is decoded anew and replaced,
with a warning. (An archive never brings its ``.bfp-cache/`` along:
``bfp.data.archives`` skips it.)

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
    path, key = _cache_path(samples, root, size)
    if path is not None and path.is_file():
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            problem = _check(saved, key, samples, size)
            if problem is None:
                for p, reason in saved.get("skipped", []):
                    print(f"warning: skipping unreadable image {p}: {reason}", file=sys.stderr)
                return saved["images"], saved["labels"]
            print(f"warning: decoded-image cache {path} does not match the images ({problem}); decoding again",
                  file=sys.stderr)
        except Exception as e:  # damaged or foreign: decode again and replace it
            print(f"warning: decoded-image cache {path} unreadable ({type(e).__name__}); decoding again",
                  file=sys.stderr)
    x, y, skipped = _decode(samples, size)
    if path is not None:
        _save({"images": x, "labels": y, "skipped": skipped, "fingerprint": key, "count": len(samples),
               "sha256": _digest(x, y)}, path)
    return x, y


def _digest(x: torch.Tensor, y: torch.Tensor) -> str:
    h = hashlib.sha256(x.contiguous().numpy().tobytes())
    h.update(y.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _check(saved, key: str, samples, size: int) -> Optional[str]:
    """Why a loaded cache does not belong to ``samples`` (None: it does)."""
    if not isinstance(saved, dict) or saved.get("fingerprint") != key:
        return "another file list, size or modification time"
    x, y, skipped = saved.get("images"), saved.get("labels"), saved.get("skipped", [])
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.dtype != torch.uint8 \
            or tuple(x.shape[1:]) != (3, size, size) or len(x) != len(y):
        return "not a decoded-image tensor"
    if saved.get("count") != len(samples) or len(x) + len(skipped) != len(samples):
        return f"{len(x)} images for {len(samples)} files"
    bad = {str(p) for p, _ in skipped}
    if y.tolist() != [label for p, label in samples if str(p) not in bad]:
        return "other labels"
    if saved.get("sha256") != _digest(x, y):
        return "its images were changed after decoding"
    return None


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


def _cache_path(samples, root: Optional[Path], size: int) -> tuple[Optional[Path], str]:
    """(the cache file, the fingerprint it must carry)."""
    where = os.environ.get("BFP_CACHE_DIR", "")
    h = hashlib.sha256(f"bfp-decoded v{FORMAT} size {size}\n".encode())
    for p, label in samples:
        rel = os.path.relpath(p, root) if root is not None else p
        try:
            st = os.stat(p)
            n, t = st.st_size, st.st_mtime_ns
        except OSError:
            n, t = -1, -1
        h.update(f"{rel}\t{label}\t{n}\t{t}\n".encode())
    key = h.hexdigest()
    if where.lower() == "off":
        return None, key
    name = f"decoded-{size}px-{len(samples)}-{key[:16]}.pt"
    if where:
        return Path(where) / name, key
    if root is not None and os.access(root, os.W_OK):
        return root / ".bfp-cache" / name, key
    return Path.home() / ".cache" / "bfpsim" / "decoded" / name, key


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
