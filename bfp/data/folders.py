"""Image folders: ``ROOT/{train,test|val}/<class>/*``, found in ``ROOT`` or its one subdirectory
(an unpacked tarball), opened as ``images.ImageFolder``s with matching classes."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import images
from .bundle import DataError


def _is_image_folder(p: Path) -> bool:
    return p.is_dir() and (p / "train").is_dir() and ((p / "test").is_dir() or (p / "val").is_dir())


def find_image_folder(path: Path) -> Optional[Path]:
    """``path`` itself or its one subdirectory holding train/ and test/ (as an unpacked tarball)."""
    if _is_image_folder(path):
        return path
    subs = [s for s in path.iterdir() if _is_image_folder(s)] if path.is_dir() else []
    return subs[0] if len(subs) == 1 else None


def open_folders(train_dir: Path, test_dir: Path):
    """The ``images.ImageFolder``s of ``train_dir`` and ``test_dir``; ``DataError`` when one has
    no images or their class folders differ (naming the classes found in only one)."""
    train, test = _open_folder(train_dir), _open_folder(test_dir)
    if train.classes != test.classes:
        only_t = sorted(set(train.classes) - set(test.classes))
        only_v = sorted(set(test.classes) - set(train.classes))
        raise DataError(f"{train_dir.parent}: train/ and {test_dir.name}/ class folders differ: only in train: "
                        f"{only_t[:10] or 'none'}; only in {test_dir.name}: {only_v[:10] or 'none'}")
    return train, test


def _open_folder(folder: Path):
    try:
        return images.ImageFolder(str(folder))
    except (FileNotFoundError, RuntimeError) as e:  # torchvision's "Found no valid file for the classes ..."
        raise DataError(f"no images found under {folder} (it needs <class>/ folders holding image "
                        f"files): {e}") from None
