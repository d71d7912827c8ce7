"""The pictures of the diagnostics: the heat map, a layer's SQNR over training, SQNR against bits."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from ..precision import POINTS


def heatmap(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Layers down, the nine points across, SQNR (dB) as colour; grey where a point is off."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    grid = np.full((len(layers), len(POINTS)), np.nan)
    for r in rows:
        v = r["sqnr_db"]
        grid[layers.index(r["layer"]), POINTS.index(r["point"])] = min(v, 99.0) if not math.isnan(v) else np.nan
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(layers) + 1.8))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap)
    ax.set_xticks(range(len(POINTS)), POINTS)
    ax.set_yticks(range(len(layers)), layers, fontsize=7)
    lo, hi = np.nanmin(grid), np.nanmax(grid)
    for i in range(len(layers)):
        for j in range(len(POINTS)):
            if not np.isnan(grid[i, j]):
                light = hi > lo and (grid[i, j] - lo) / (hi - lo) > 0.6  # viridis is light at the top
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=6,
                        color="black" if light else "white")
    fig.colorbar(im, ax=ax, label="SQNR (dB)")
    ax.set_title(title or "SQNR per layer and quantization point (grey: full precision)", fontsize=9)
    return _save(fig, path)


def _save(fig, path) -> Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sqnr_curve(run_dirs: list, layer: str, out: Path, labels=()) -> Path:
    """``sqnr-<layer>.png``: the SQNR of every measured point of ``layer`` over training steps,
    from each run's ``diagnostics.csv`` (written with ``--diagnose N``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for i, run in enumerate(run_dirs):
        path = Path(run) / "diagnostics.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no diagnostics in this run (train with `diagnose` N)")
        with open(path, encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r["layer"] == layer]
        if not rows:
            with open(path, encoding="utf-8") as f:
                names = sorted({r["layer"] for r in csv.DictReader(f)})
            raise ValueError(f"{path}: no layer {layer!r}; measured layers: {', '.join(names)}")
        name = labels[i] if i < len(labels) else Path(run).name
        for point in [p for p in POINTS if any(r["point"] == p for r in rows)]:
            pts = [(int(r["step"]), float(r["sqnr_db"])) for r in rows if r["point"] == point]
            ax.plot(*zip(*pts), marker="o" if len(pts) <= 30 else None, ms=3,
                    label=f"{name} {point}" if len(run_dirs) > 1 else point)
            drawn += 1
    ax.set_xlabel("training step")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title(f"{layer}: SQNR per quantization point", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, Path(out) / f"sqnr-{layer.replace('/', '_')}.png")


def sweep_plot(rows: list[dict], path: Path, title: str = "") -> Path:
    """One panel per family: SQNR (dB) against bits, one line per point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fams = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = plt.subplots(1, len(fams), figsize=(4.2 * len(fams), 3.6), sharey=True, squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for point in [p for p in POINTS if any(r["point"] == p and r["family"] == fam for r in rows)]:
            pts = [(r["bits"], min(r["sqnr_db"], 150.0)) for r in rows if r["family"] == fam and r["point"] == point]
            ax.plot(*zip(*pts), marker="o", ms=3, label=point)
        ax.set_title(fam, fontsize=10)
        ax.set_xlabel("bits")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("SQNR (dB)")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)
