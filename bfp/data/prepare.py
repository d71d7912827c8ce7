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
strings, numbers and uint8 numpy arrays, checked before they are allocated). What CIFAR-10 can
hold bounds what is read: a batch member of more than 64 MiB is refused unread, an array of more
than 10,000 x 3,072 pixels before it is built; pixels must be uint8 and labels plain integers
0..9; only the batches directly in the archive's top folder count (a name there twice is
refused); a gzip archive is checked to its end first, so damage is named as damage. A
temporary folder left by a killed run (``.OUT.partial-PID`` of a process that is gone) is removed. The output goes to a temporary sibling, renamed into place when complete.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import pickle
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .archives import ArchiveError, check_members, remove_dead_partials

__all__ = ["prepare_cifar10", "CIFAR10_CLASSES"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


# Bounds from what CIFAR-10 holds: a batch pickle is 31 MB, 10,000 rows of 3,072 pixels.
MAX_MEMBER_BYTES = 64 << 20
MAX_ROWS, ROW = 10_000, 3072


class _Array:
    """Stands for a numpy array while a batch is unpickled: the shape, dtype and data its state
    declares are checked before anything is allocated (a 200-byte pickle can declare 10^12
    elements), and only uint8 pixels are built."""

    array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise ArchiveError("an array with a state numpy does not write")
        _, shape, dtype, fortran, raw = state
        if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
            raise ArchiveError(f"an array of shape {shape!r}")
        n = math.prod(shape)
        if n > MAX_ROWS * ROW:
            raise ArchiveError(f"an array of {n} elements, more than a CIFAR-10 batch holds ({MAX_ROWS} x {ROW})")
        if not isinstance(dtype, np.dtype) or dtype != np.uint8:
            raise ArchiveError(f"an array of {dtype}, not of uint8 pixels")
        if not isinstance(raw, bytes) or len(raw) != n:
            raise ArchiveError(f"an array of {n} elements whose data is {len(raw) if isinstance(raw, bytes) else type(raw).__name__} bytes")
        self.array = np.frombuffer(raw, np.uint8).reshape(shape, order="F" if fortran else "C").copy()


class _NDArrayName:
    """What the name ``numpy.ndarray`` stands for in a batch: only ``_reconstruct``'s first argument,
    as numpy's own pickles use it. Called directly (``ndarray(shape, dtype)``, an uninitialised array
    of any size) it is refused before anything is allocated."""

    __name__ = "ndarray"

    def __call__(self, *args, **kwargs):
        raise ArchiveError("the batch builds numpy.ndarray(...) directly (uninitialised memory of a size it "
                           "chooses); numpy's pickles rebuild arrays through _reconstruct and their data")


_NDARRAY = _NDArrayName()


def _reconstruct(cls, shape, typecode):
    if cls is not _NDARRAY:
        raise ArchiveError(f"the batch rebuilds a {getattr(cls, '__name__', cls)!r}, not a numpy array")
    return _Array()


def _dtype(obj, align=False, copy=False):
    if obj != "u1":
        raise ArchiveError(f"the batch declares a {obj!r} array; CIFAR-10 holds uint8 ('u1') pixels")
    return np.dtype("u1")


def _encode(text, encoding="utf-8"):  # how a protocol-2 pickle writes bytes
    if not isinstance(text, str) or encoding != "latin1":
        raise ArchiveError(f"the batch calls _codecs.encode with {type(text).__name__}, {encoding!r}; pickle "
                           f"writes bytes as (str, 'latin1')")
    return text.encode("latin1")


# What CIFAR-10's batch pickles are made of besides plain data: numpy arrays (and the codec call
# a protocol-2 pickle uses for bytes), each through a checking stand-in. Nothing else may be named.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct, ("numpy._core.multiarray", "_reconstruct"):
            _reconstruct, ("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _dtype, ("_codecs", "encode"): _encode}


class _Plain(pickle.Unpickler):
    """Builds plain data and checked uint8 arrays only: a pickle that names any other class or
    function is refused (unpickling can run code)."""

    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise ArchiveError(f"the batch file names {module}.{name}; only plain data and numpy arrays are "
                               "accepted")
        return _ALLOWED[(module, name)]


def _load(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    if member.size > MAX_MEMBER_BYTES:
        raise ArchiveError(f"{member.name}: {member.size:,} bytes, more than a CIFAR-10 batch can be "
                           f"({MAX_MEMBER_BYTES:,}); refused unread")
    raw = tar.extractfile(member).read(MAX_MEMBER_BYTES + 1)
    try:
        d = _Plain(io.BytesIO(raw), encoding="bytes").load()
    except ArchiveError as e:
        raise ArchiveError(f"{member.name}: not a CIFAR-10 batch: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, LookupError, OverflowError, MemoryError,
            AttributeError, IndexError, KeyError, RecursionError) as e:
        raise ArchiveError(f"{member.name}: not a CIFAR-10 batch ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise ArchiveError(f"{member.name}: not a CIFAR-10 batch (a {type(d).__name__}, not a dict)")
    out = {}
    for k, v in d.items():
        if isinstance(v, _Array):
            if v.array is None:
                raise ArchiveError(f"{member.name}: not a CIFAR-10 batch (an array without its data)")
            v = v.array
        out[k.decode("latin1") if isinstance(k, bytes) else k] = v
    return out


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"a {'x'.join(map(str, v.shape))} {v.dtype} array"
    return "nothing" if v is None else f"a {type(v).__name__}"


def _images(batch: dict, name: str) -> tuple[np.ndarray, list]:
    data, labels = batch.get("data"), batch.get("labels")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == ROW):
        raise ArchiveError(f"{name}: 'data' must be an N x {ROW} array of uint8 pixels, got {_describe(data)}")
    if not isinstance(labels, list) or len(labels) != len(data):
        raise ArchiveError(f"{name}: 'labels' must be a list of {len(data)} labels (one per row of 'data'), got "
                           + (f"{len(labels)}" if isinstance(labels, list) else _describe(labels)))
    if any(type(y) is not int or not 0 <= y < 10 for y in labels):
        raise ArchiveError(f"{name}: labels must be integers 0..9 (not booleans or other numbers)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _check_stream(source: Path) -> None:
    """A gzip archive is read to its end once, in chunks, so a corrupt or truncated one is named as
    such (tarfile would stop at the damage and the batches after it would look missing)."""
    with open(source, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return
    try:
        with gzip.open(source) as g:
            while g.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as e:
        raise ArchiveError(f"source archive {str(source)!r}: a corrupt or truncated gzip file ({e}); download it "
                           f"again") from None


def _batches(members: list[tarfile.TarInfo], top: str, where: str) -> dict[str, tarfile.TarInfo]:
    """The batch members by name: only the files directly in the top folder (or at the root); a name
    there twice is refused (one copy would silently replace the other)."""
    out: dict[str, tarfile.TarInfo] = {}
    for m in members:
        parts = tuple(p for p in PurePosixPath(m.name).parts if p != ".")
        if not m.isfile() or parts[:-1] not in ((), (top,)):
            continue
        if parts[-1] in out:
            raise ArchiveError(f"{where}: {parts[-1]} is in it twice; refused (which one is the batch?)")
        out[parts[-1]] = m
    return out


def prepare_cifar10(source: Path, out: Path, progress: bool = True) -> dict[str, int]:
    """Write the class folders (module docstring); returns images written per split. Refuses an
    existing ``out`` (nothing already there is touched)."""
    source, out = Path(source), Path(out)
    if out.exists():
        raise ArchiveError(f"output folder {str(out)!r} exists; remove it or give another folder")
    remove_dead_partials(out.parent, out.name)
    try:
        _check_stream(source)
        tar = tarfile.open(source)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise ArchiveError(f"source archive {str(source)!r}: not a readable .tar.gz ({e})") from None
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    counts = {}
    try:
        with tar:
            top, members = check_members(tar, f"source archive {str(source)!r}")
            by_name = _batches(members, top, f"source archive {str(source)!r}")
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
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ArchiveError(f"source archive {str(source)!r}: corrupt or truncated ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise ArchiveError(f"output folder {str(out)!r}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts


def _progress(it, total: int, what: str, on: bool):
    if not on:
        return it
    from tqdm import tqdm
    return tqdm(it, total=total, desc=what, unit="img", leave=False)
