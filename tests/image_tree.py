"""A small class-folder tree of real encoded images, bad files included (imagenet.py and image-folder tests)."""
from pathlib import Path

import numpy as np
from PIL import Image


def make_tree(root: Path, classes=("cat", "dog"), per_class: int = 6, bad: bool = True) -> dict[str, Path]:
    """``root/{train,val}/<class>/``: JPEGs of mixed sizes, a greyscale PNG, an RGBA PNG, a palette
    GIF and a CMYK JPEG per class; with ``bad``, ``train/`` also holds a truncated JPEG, an empty
    ``.jpg`` and a random-byte ``.jpg``. Returns the bad files by kind."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c, name in enumerate(classes):
            d = root / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                h, w = [(40, 56), (64, 64), (33, 80), (90, 48)][i % 4]
                base = np.full((h, w, 3), 60 + 120 * c, np.uint8) + rng.integers(0, 40, (h, w, 3), np.uint8)
                img = Image.fromarray(base)
                kind = i % 6
                if kind == 2:
                    img.convert("L").save(d / f"{i}_grey.png")
                elif kind == 3:
                    img.convert("RGBA").save(d / f"{i}_rgba.png")
                elif kind == 4:
                    img.convert("P").save(d / f"{i}_pal.gif")
                elif kind == 5:
                    img.convert("CMYK").save(d / f"{i}_cmyk.jpg")
                else:
                    img.save(d / f"{i}.jpg", quality=90)
    found = {}
    if bad:
        d = root / "train" / classes[0]
        good = (d / "0.jpg").read_bytes()
        found["truncated"] = d / "zz_truncated.jpg"
        found["truncated"].write_bytes(good[: len(good) // 2])
        found["empty"] = d / "zz_empty.jpg"
        found["empty"].write_bytes(b"")
        found["random"] = d / "zz_random.jpg"
        found["random"].write_bytes(rng.integers(0, 256, 3000, np.uint8).tobytes())
    return found
