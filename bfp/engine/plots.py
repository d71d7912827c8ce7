"""Loss and accuracy curves of one or more runs (their ``metrics.jsonl``) as PNG files."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .logs import read_metrics

PANELS = (("loss", ("train_loss", "test_loss"), "loss"),
          ("accuracy", ("train_acc1", "test_acc1"), "top-1 accuracy (%)"))


def draw_curves(run_dirs: Sequence[os.PathLike], out_dir: os.PathLike, labels: Sequence[str] = ()) -> list[Path]:
    """Write ``loss.png`` and ``accuracy.png`` into ``out_dir``, one line per run and split."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise ValueError("no run directories given")
    if labels and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [(labels[i] if labels else Path(d).name, read_metrics(d)) for i, d in enumerate(run_dirs)]
    needed = {k for _, keys, _ in PANELS for k in keys}
    for d, (_, recs) in zip(run_dirs, runs):
        missing = sorted({k for r in recs for k in needed if k not in r})
        if missing:
            raise ValueError(f"{Path(d) / 'metrics.jsonl'}: records without {', '.join(missing)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, keys, ylabel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (label, recs) in enumerate(runs):
            color = f"C{i % 10}"
            for key, style in zip(keys, ("--", "-")):
                ax.plot([r["epoch"] + 1 for r in recs], [r[key] for r in recs], style, color=color,
                        label=f"{label} ({key.split('_')[0]})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = out / f"{fname}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
