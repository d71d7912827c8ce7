"""Loss and accuracy curves of one or more runs (their ``metrics.jsonl``) as PNG files.

Readable for any run length: a series of a few epochs gets a marker on every
point (a one-epoch run is one point per line, invisible without one), the
epoch axis has integer ticks only, and ``log_loss`` puts the loss on a log
scale, so that one early spike (a first test loss of 25 against 0.05 later)
does not flatten the rest of the curve.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Sequence

from .logs import read_metrics

PANELS = (("loss", ("train_loss", "test_loss"), "loss"),
          ("accuracy", ("train_acc1", "test_acc1"), "top-1 accuracy (%)"))
MARKERS_UP_TO = 30      # series of at most this many epochs get a marker on every point
MULTI_RUN_OUT = "curves"  # default output directory for several runs (one run: its own directory)


def default_out_dir(run_dirs: Sequence[os.PathLike]) -> Path:
    """Where the PNGs go without ``--out``: into the run directory for one run, ``curves/`` for several."""
    return Path(run_dirs[0]) if len(run_dirs) == 1 else Path(MULTI_RUN_OUT)


def draw_curves(run_dirs: Sequence[os.PathLike], out_dir: Optional[os.PathLike] = None,
                labels: Sequence[str] = (), log_loss: bool = False) -> list[Path]:
    """Write ``loss.png`` and ``accuracy.png`` into ``out_dir`` (``None``: :func:`default_out_dir`),
    one line per run and split (dashed with x: train, solid with o: test; markers up to
    ``MARKERS_UP_TO`` epochs).

    ``log_loss`` draws the loss on a log scale; a loss that is not positive
    and finite (0, a diverged run's NaN or inf) cannot be placed there and is
    a ``ValueError`` naming the run, the epoch and the value."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not run_dirs:
        raise ValueError("no run directories given")
    if labels and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [(labels[i] if labels else Path(d).resolve().name, read_metrics(d)) for i, d in enumerate(run_dirs)]
    needed = {k for _, keys, _ in PANELS for k in keys}
    for d, (_, recs) in zip(run_dirs, runs):
        missing = sorted({k for r in recs for k in needed if k not in r})
        if missing:
            raise ValueError(f"{Path(d) / 'metrics.jsonl'}: records without {', '.join(missing)}")
        if not recs:
            raise ValueError(f"{Path(d) / 'metrics.jsonl'}: no epoch records")
        if log_loss:
            for r in recs:
                for key in PANELS[0][1]:
                    v = float(r[key])
                    if not (v > 0 and math.isfinite(v)):
                        raise ValueError(f"{d}: epoch {int(r['epoch']) + 1} {key} is {v}; a log scale "
                                         f"(--log-loss) needs positive, finite losses")
    out = Path(default_out_dir(run_dirs) if out_dir is None else out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = ", ".join(label for label, _ in runs)
    written = []
    for fname, keys, ylabel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (label, recs) in enumerate(runs):
            color = f"C{i % 10}"
            short = len(recs) <= MARKERS_UP_TO
            for key, style, marker in zip(keys, ("--", "-"), ("x", "o")):
                ax.plot([r["epoch"] + 1 for r in recs], [r[key] for r in recs], style, color=color,
                        marker=marker if short else None, markersize=5, label=f"{label} ({key.split('_')[0]})")
        if fname == "loss" and log_loss:
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        first = min(r["epoch"] + 1 for _, recs in runs for r in recs)
        last = max(r["epoch"] + 1 for _, recs in runs for r in recs)
        if last - first < 2:  # MaxNLocator falls back to fractional ticks on so narrow a range
            ax.set_xticks(range(first, last + 1))
            ax.set_xlim(first - 0.5, last + 0.5)
        ax.set_title(f"{fname} per epoch: {names}" if len(names) <= 70 else f"{fname} per epoch: {len(runs)} runs",
                     fontsize="medium")
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel + (" (log scale)" if fname == "loss" and log_loss else ""))
        ax.grid(alpha=0.3, which="both" if fname == "loss" and log_loss else "major")
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = out / f"{fname}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
