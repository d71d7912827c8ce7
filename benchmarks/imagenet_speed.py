"""Training images/s of ``imagenet.py`` (torchvision ResNet18), FP32 against a network config,
at several image sizes, in one run.

Each measurement is a real ``imagenet.py`` run (``bfp.cli.run_task``) on a
generated class-folder tree of 256x256 JPEGs: ``--epochs 2`` over
``--limit-train-images N`` images, and the figure is the second epoch's
``images_per_s`` from ``metrics.jsonl`` (the first pays for Numba compilation
and first-touch allocation). Data loading (JPEG decode, RandomResizedCrop) is
included, in the main process (``-j 0``) so the two sides share the same
cores. Configs alternate within each size, the order flipping every round.

    python benchmarks/imagenet_speed.py --sizes 64 224 --images 16 --batch 8 --threads 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from bfp.cli import run_task

from _harness import emit_json, machine, print_table


def make_tree(root: Path, images: int, classes: int = 4) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", images), ("val", classes)):
        for i in range(n):
            d = root / split / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), np.uint8)).save(d / f"{i}.jpg", quality=90)


def images_per_s(tree: Path, runs: Path, name: str, size: int, config: str | None, a: argparse.Namespace) -> float:
    argv = [str(tree), "-a", a.arch, "--image-size", str(size), "--epochs", "2", "-b", str(a.batch),
            "--batch-size-test", str(a.batch), "--limit-train-images", str(a.images), "-j", "0",
            "--device", "cpu", "--threads", str(a.threads), "--progress", "False", "--log", "True",
            "--run-dir", str(runs), "--run-name", name]
    if config:
        argv += ["--bfp", config]
    if run_task("imagenet", argv) != 0:
        raise SystemExit(f"imagenet.py {' '.join(argv)} failed")
    lines = (runs / name / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["images_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    p.add_argument("--config", default="ResNet18_FB12LG24")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--images", type=int, default=16, help="training images per epoch")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1,
                   help="torch and numba threads; on a shared 2-core VM 2 threads ran 8x slower than 1")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows, record = [], machine(benchmark="imagenet_speed", arch=a.arch, config=a.config, images=a.images,
                               batch=a.batch, threads=a.threads, results=[])
    with tempfile.TemporaryDirectory() as tmp:
        tree, runs = Path(tmp) / "tree", Path(tmp) / "runs"
        make_tree(tree, a.images)
        for size in a.sizes:
            got: dict[str, list[float]] = {"fp32": [], a.config: []}
            for r in range(a.rounds):
                order = [None, a.config] if r % 2 == 0 else [a.config, None]
                for cfg in order:
                    got[cfg or "fp32"].append(images_per_s(tree, runs, f"{size}_{cfg or 'fp32'}_{r}", size, cfg, a))
            fp32, q = statistics.median(got["fp32"]), statistics.median(got[a.config])
            rows.append([f"{size}x{size}", fp32, q, fp32 / q])
            record["results"].append({"size": size, "fp32_images_per_s": fp32, "config_images_per_s": q})
    record["load_average_1min_after"] = machine()["load_average_1min"]
    print_table([("image size", ""), ("FP32 img/s", ".2f"), (f"{a.config} img/s", ".2f"),
                 ("slowdown", ".2f")], rows)
    emit_json(record, a.json)


if __name__ == "__main__":
    main()
