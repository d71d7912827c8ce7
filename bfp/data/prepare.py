"""Make the JPEG CIFAR-10 class folders from the archive anyone can download.

``prepare_cifar10(source, out)`` reads ``cifar-10-python.tar.gz`` (the CIFAR-10 site's Python
version, what torchvision downloads: ``data_batch_1`` .. ``data_batch_5``, ``test_batch`` and
``batches.meta``, pickled dicts of uint8 rows ``[1024 R | 1024 G | 1024 B]`` and labels) and
writes ``out/train/<class>/NNNN.jpg`` and ``out/test/<class>/NNNN.jpg``: the layout of
``shared/data/cifar10-jpg.tar.gz`` (the "CIFAR-10-images" folders), 5,000 / 1,000 images per
class, numbered from 0000 per class in the order the batches hold them (data_batch_1 first).

The JPEGs are written by Pillow with its defaults, quality 75 and 4:2:0 chroma subsampling, the
settings the shared archive's images carry (their quantization tables are Pillow's at quality 75;
``tests/test_prepare.py`` compares them). The same Pillow/libjpeg version writes the same bytes;
another libjpeg may differ in the last bits of the entropy-coded data, not in the settings. The
source archive is read through ``bfp.data.archives``' member checks (no file is extracted: each
batch is unpickled from memory with a restricted unpickler that builds only dicts, lists, bytes,
strings, numbers and numpy arrays). The output goes to a temporary sibling, renamed into place when complete.
"""
from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from .archives import ArchiveError, check_members

__all__ = ["prepare_cifar10", "CIFAR10_CLASSES"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


# What CIFAR-10's batch pickles are made of besides plain data: numpy arrays (and the codec call
# a protocol-2 pickle uses for bytes). Nothing else may be named.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _Plain(pickle.Unpickler):
    """Builds plain data and numpy arrays only: a pickle that names any other class or function is
    refused (unpickling can run code)."""

    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise ArchiveError(f"the batch file names {module}.{name}; only plain data and numpy arrays are "
                               "accepted")
        return super().find_class(module, name)


def _load(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    try:
        d = _Plain(io.BytesIO(tar.extractfile(member).read()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise ArchiveError(f"{member.name}: not a CIFAR-10 batch ({e})") from None
    if not isinstance(d, dict):
        raise ArchiveError(f"{member.name}: not a CIFAR-10 batch (a {type(d).__name__}, not a dict)")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


def _images(batch: dict, name: str) -> tuple[np.ndarray, list]:
    data, labels = batch.get("data"), batch.get("labels")
    arr = np.asarray(data, dtype=np.uint8) if data is not None else None
    if arr is None or labels is None or arr.ndim != 2 or arr.shape[1] != 3072 or len(labels) != len(arr):
        raise ArchiveError(f"{name}: expected 'data' (N x 3072 uint8) and N 'labels'")
    if any(not isinstance(y, int) or not 0 <= y < 10 for y in labels):
        raise ArchiveError(f"{name}: labels must be integers 0..9")
    return arr.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), list(labels)


def prepare_cifar10(source: Path, out: Path, progress: bool = True) -> dict[str, int]:
    """Write the class folders (module docstring); returns images written per split. Refuses an
    existing ``out`` (nothing already there is touched)."""
    source, out = Path(source), Path(out)
    if out.exists():
        raise ArchiveError(f"output folder {str(out)!r} exists; remove it or give another folder")
    try:
        tar = tarfile.open(source)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ArchiveError(f"source archive {str(source)!r}: not a readable .tar.gz ({e})") from None
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    counts = {}
    try:
        with tar:
            _, members = check_members(tar, f"source archive {str(source)!r}")
            by_name = {_base_name(m.name): m for m in members if m.isfile()}
            missing = [n for n in (*_TRAIN, "test_batch") if n not in by_name]
            if missing:
                raise ArchiveError(f"source archive {str(source)!r}: no {', '.join(missing)} in it; expected the CIFAR-10 "
                                   "site's cifar-10-python.tar.gz")
            for split, names in (("train", _TRAIN), ("test", ("test_batch",))):
                seen = [0] * 10
                for d in CIFAR10_CLASSES:
                    (tmp / split / d).mkdir(parents=True, exist_ok=True)
                for bname in names:
                    images, labels = _images(_load(tar, by_name[bname]), bname)
                    for img, y in _progress(zip(images, labels), len(labels), f"{split} {bname}", progress):
                        Image.fromarray(img).save(tmp / split / CIFAR10_CLASSES[y] / f"{seen[y]:04d}.jpg")
                        seen[y] += 1
                counts[split] = sum(seen)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, out)
    except OSError as e:
        raise ArchiveError(f"output folder {str(out)!r}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts


def _base_name(name: str) -> str:
    """A member's file name (``cifar-10-batches-py/data_batch_1`` -> ``data_batch_1``)."""
    return name.rstrip("/").rpartition("/")[2]


def _progress(it, total: int, what: str, on: bool):
    if not on:
        return it
    from tqdm import tqdm
    return tqdm(it, total=total, desc=what, unit="img", leave=False)
