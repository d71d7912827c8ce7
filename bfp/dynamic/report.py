"""What a dynamic precision run leaves to read: the CSV log of every decision,
the per-decision console table (plain or ANSI-coloured), the plot of each
layer's bits over training, and ``python -m bfp.dynamic plot RUN_DIR``.

Everything here works from the log rows alone (``CSV_FIELDS`` dicts), so a
finished run can be plotted without its model.
"""
from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from tqdm import tqdm

from .spec import PAIR_NAMES, SimpleSpec

CSV_NAME = "dynamic_precision.csv"
CSV_FIELDS = ("decision", "step", "epoch", "layer", "pair", "zse", "old_bits", "new_bits")


def console(text: str) -> None:
    """Print to the terminal only (not ``log.txt``): the coloured table."""
    tqdm.write(text)  # keeps an open progress bar intact


def write_csv(path: Path, rows: list[dict[str, Any]], mode: str) -> None:
    """Append ``rows`` (``mode="a"``) or rewrite the file (``"w"``); a new file gets the header."""
    new = mode == "w" or not path.exists()
    with open(path, mode, newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r[k]) for k in CSV_FIELDS})


def _csv_value(v: Any) -> Any:
    return "" if v is None else f"{v:.6g}" if isinstance(v, float) else v


def read_log(path: Union[str, os.PathLike]) -> list[dict[str, str]]:
    """Rows of a ``dynamic_precision.csv`` (a run folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / CSV_NAME
    if not path.exists():
        raise ValueError(f"no dynamic precision log at {path}; runs with dynamic precision write {CSV_NAME} "
                         "in their run folder")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(CSV_FIELDS) - set(rows[0]):
        raise ValueError(f"{path} lacks columns {sorted(set(CSV_FIELDS) - set(rows[0]))}")
    return rows


_ANSI = {"raised": "\033[1;31m", "lowered": "\033[1;32m", "high": "\033[33m", "low": "\033[36m",
         "unmeasured": "\033[2m", "": "", "reset": "\033[0m"}


def _cell_kind(r: Mapping[str, Any], spec: SimpleSpec) -> str:
    if r["new_bits"] != r["old_bits"]:
        return "raised" if r["new_bits"] > r["old_bits"] else "lowered"
    if r["zse"] is None:
        return "unmeasured"
    return "high" if r["zse"] > spec.upper else "low" if r["zse"] < spec.lower else ""


def format_table(rows: list[dict[str, Any]], spec: SimpleSpec, *, color: bool = False) -> str:
    """A per-layer table of one decision: ``bits (zse)`` per pair, changes as ``old>new``.

    With ``color`` (ANSI): raised bold red, lowered bold green; unchanged
    pairs yellow when their ZSE is above UPPER (held, or at the ladder's top),
    cyan below LOWER, dim when nothing was measured.
    """
    if not rows:
        return "dynamic precision: no managed pairs"
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    cells = {(r["layer"], r["pair"]): r for r in rows}
    width = max(len(n) for n in layers + ["layer"])
    head = rows[0]
    lines = [f"dynamic precision decision {head['decision']} (step {head['step']}, epoch {head['epoch']}; "
             f"lower {spec.lower:g} < ZSE < upper {spec.upper:g} keeps)",
             f"{'layer':<{width}}  " + "  ".join(f"{p:<17}" for p in PAIR_NAMES)]
    for name in layers:
        parts = []
        for p in PAIR_NAMES:
            r = cells.get((name, p))
            if r is None:
                parts.append(f"{'-':<17}")
                continue
            z = "  n/a" if r["zse"] is None else f"{r['zse']:.3f}"
            b = f"{r['old_bits']}>{r['new_bits']}" if r["new_bits"] != r["old_bits"] else str(r["new_bits"])
            text = f"{f'{b:>5} ({z})':<17}"
            kind = _cell_kind(r, spec) if color else ""
            parts.append(f"{_ANSI[kind]}{text}{_ANSI['reset']}" if kind else text)
        lines.append(f"{name:<{width}}  " + "  ".join(parts))
    return "\n".join(lines)


def plot_precision(run_dir: Union[str, os.PathLike], out: Union[str, os.PathLike, None] = None) -> Path:
    """Draw each layer's bits over training from the run's CSV log; return the PNG path.

    One panel per linked pair; rows are layers, columns the bits at the start
    and after each decision (labelled with the training step), colour the
    bits. Default output: ``RUN_DIR/dynamic_precision.png``.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import BoundaryNorm, ListedColormap

    rows = read_log(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: the dynamic precision log has no decisions yet")
    run_path = Path(run_dir)
    folder = run_path if run_path.is_dir() else run_path.parent
    out = Path(out) if out is not None else folder / "dynamic_precision.png"
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    decisions = sorted({int(r["decision"]) for r in rows})
    col = {d: i + 1 for i, d in enumerate(decisions)}  # column 0: bits before the first decision
    labels = ["start"] + [next(r["step"] or f"#{d}" for r in rows if int(r["decision"]) == d)
                          for d in decisions]
    pairs = [p for p in PAIR_NAMES if any(r["pair"] == p for r in rows)]
    levels = sorted({int(r["new_bits"]) for r in rows} | {int(r["old_bits"]) for r in rows})
    cmap = ListedColormap(plt.get_cmap("viridis")(np.linspace(0, 1, len(levels))))
    bounds = [levels[0] - 0.5] + [(a + b) / 2 for a, b in zip(levels, levels[1:])] + [levels[-1] + 0.5]
    norm = BoundaryNorm(bounds, cmap.N)
    n_cols = len(decisions) + 1
    fig, axes = plt.subplots(1, len(pairs), figsize=(3 + 2.5 * len(pairs) + 0.05 * n_cols,
                                                      1.5 + 0.25 * len(layers)), squeeze=False, sharey=True)
    image = None
    for ax, pair in zip(axes[0], pairs):
        grid = np.full((len(layers), n_cols), np.nan)
        for r in rows:
            if r["pair"] != pair:
                continue
            i, j = layers.index(r["layer"]), col[int(r["decision"])]
            grid[i, j] = float(r["new_bits"])
            if np.isnan(grid[i, 0]):
                grid[i, 0] = float(r["old_bits"])
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
        ax.set_title(pair)
        ticks = sorted(set(range(0, n_cols, max(1, n_cols // 6))) | {n_cols - 1})
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[t] for t in ticks], rotation=45)
        ax.set_xlabel("training step")
    axes[0][0].set_yticks(range(len(layers)))
    axes[0][0].set_yticklabels(layers, fontsize=7)
    fig.colorbar(image, ax=axes[0].tolist(), ticks=levels, label="bits")
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bfp.dynamic",
                                     description="Tools for dynamic precision runs (--do).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plot", help="plot each layer's bits over training from RUN_DIR/" + CSV_NAME)
    p.add_argument("run_dir", help="run folder (or the CSV file itself)")
    p.add_argument("-o", "--out", default=None, help="PNG path (default RUN_DIR/dynamic_precision.png)")
    args = parser.parse_args(argv)
    try:
        out = plot_precision(args.run_dir, args.out)
    except ValueError as e:
        parser.error(str(e))
    print(out)
    return 0
