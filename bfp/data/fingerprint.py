"""A dataset's fingerprint: what a resume checks before it continues a run.

Why: ``-dp`` may point a resumed run at another folder (the data moved), but a
folder with other images trains another model and, with another image count,
another learning-rate schedule, without a word. The fingerprint is cheap to
take (file sizes, no decoding) and names what differs: the class list, and the
image count and total size of each split. The folder's path is recorded too
but not compared (moving the data is allowed).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

COMPARED = ("dataset", "classes", "train_images", "train_bytes", "test_images", "test_bytes",
            # a text corpus (bfp.data.text): its content's SHA-256, size, vocabulary and windows
            "sha256", "characters", "vocabulary", "block", "train_windows", "test_windows")


def _images_and_bytes(ds) -> tuple[int, int]:
    """(image count, bytes) of a dataset: file sizes for image folders, array sizes else."""
    if isinstance(ds, torch.utils.data.Subset):
        ds = ds.dataset
    if hasattr(ds, "samples"):  # torchvision ImageFolder: one file per image
        return len(ds.samples), sum(os.stat(p).st_size for p, _ in ds.samples)
    if hasattr(ds, "images") and isinstance(ds.images, torch.Tensor):  # bfp TensorDataset
        return len(ds.images), ds.images.numel() * ds.images.element_size()
    if hasattr(ds, "data") and isinstance(ds.data, np.ndarray):  # torchvision CIFAR
        return len(ds.data), int(ds.data.nbytes)
    return len(ds), 0


def fingerprint(name: str, train, test, classes: list[str], path: Optional[str]) -> dict[str, Any]:
    """The fingerprint of the full (not ``--limit``ed) train and test sets."""
    n_train, b_train = _images_and_bytes(train)
    n_test, b_test = _images_and_bytes(test)
    return {"dataset": name, "path": str(path) if path else None, "classes": [str(c) for c in classes],
            "train_images": n_train, "train_bytes": b_train, "test_images": n_test, "test_bytes": b_test}


def differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, one phrase per field, e.g.
    ``"train_images 1437 -> 1200"``; the class lists are shown as the names added and removed."""
    out = []
    for k in COMPARED:
        a, b = saved.get(k), now.get(k)
        if a == b:
            continue
        if k == "sha256":
            out.append(f"the text's SHA-256 {str(a)[:12]}... -> {str(b)[:12]}... (another text)")
        elif k == "classes" and isinstance(a, list) and isinstance(b, list):
            gone, new = [c for c in a if c not in b], [c for c in b if c not in a]
            detail = ", ".join(filter(None, [f"missing {gone}" if gone else "", f"new {new}" if new else ""]))
            out.append(f"classes ({len(a)} -> {len(b)}{': ' + detail if detail else ', reordered'})")
        else:
            out.append(f"{k} {a} -> {b}")
    return out
