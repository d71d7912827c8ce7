"""``--mode diagnose`` and ``--mode sweep``: what rounding does at every quantization point, on one
training batch.

The model is the one ``--resume RUN`` saved (its weights and every layer's precision), or a
fresh one converted with ``--bfp``. One forward and backward pass on the first training
batch is measured (``bfp.diagnostics``; no optimizer step). Prints the table worst first and
draws the heat map (layers down, points across, SQNR as colour). ``--mode sweep`` rounds the
same batch's tensors at 2..16 bits of each ``--sweep-family`` and plots SQNR against bits.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..diagnostics import SWEEP_FAMILIES, capture_step, heatmap, measure_step, sweep, sweep_plot, table
from .flags import UsageError
from .evaluate import saved_model
from .run import cpu_threads
from .spec import RunSpec


def _load(spec: RunSpec):
    """(model, first training batch, where: words, run directory or None) of the checkpoint or
    of a fresh model converted with --bfp."""
    args = spec.args
    if args.network_config is None and not args.resume and not spec.plan.precision:
        raise UsageError(f"--mode {args.mode} needs quantized layers: give --bfp CONFIG or --resume a run "
                         f"trained with one")
    model, data, device, initial, path = saved_model(spec)
    if initial is None:
        raise UsageError(f"--mode {args.mode}: the run at {path} trained in FP32: no quantization point to "
                         f"measure")
    x, y = next(iter(data.train))
    where = f"{args.model}, {initial if isinstance(initial, str) else 'network config'}" + \
        (f", {path}" if path else ", fresh weights")
    run_dir = None
    if path:
        run_dir = Path(path).parent.parent if Path(path).parent.name == "checkpoints" else Path(path).parent
    return model, x.to(device), y.to(device), where, run_dir


def _draw(draw, png: Path, out) -> None:
    """``draw(png)``, a failed write named as --diagnose-out's."""
    try:
        draw(png)
    except OSError as e:
        raise UsageError(f"--diagnose-out {png}: cannot write ({e.strerror or e})") from None
    print(f"wrote {png}", file=out)


def _png(args: argparse.Namespace, run_dir, name: str) -> Path:
    """Where the plot goes; an existing file is refused unless ``--overwrite True`` (checked before
    anything is measured, so nothing already saved is replaced without a word)."""
    png = Path(args.diagnose_out) if args.diagnose_out else (run_dir or Path(".")) / name
    if png.exists() and not args.overwrite:
        raise UsageError(f"{png} exists; pass --overwrite True to replace it, or --diagnose-out PATH")
    return png


def diagnose(spec: RunSpec, stream=None) -> list[dict]:
    out, args = stream or sys.stdout, spec.args
    with cpu_threads(args.threads):
        model, x, y, where, run_dir = _load(spec)
        png = _png(args, run_dir, "diagnose.png")
        rows = measure_step(model, x, y)
    if not rows:
        raise UsageError("no quantization point is active in this model's config")
    print(f"diagnose {where}: one training batch of {len(x)}, worst first", file=out)
    print(table(rows), file=out)
    _draw(lambda png: heatmap(rows, png, title=f"SQNR (dB) per layer and point: {where}"),
          png, out)
    return rows


def sweep_mode(spec: RunSpec, stream=None) -> list[dict]:
    """``--mode sweep``: the tensors of one batch at every active point, rounded to 2..16-bit
    members of each ``--sweep-family``; SQNR against bits, one line per point."""
    out, args = stream or sys.stdout, spec.args
    families = [f.strip() for f in args.sweep_family.split(",") if f.strip()]
    bad = [f for f in families if f not in SWEEP_FAMILIES]
    if bad or not families:
        raise UsageError(f"--sweep-family {args.sweep_family!r}: allowed: a comma-separated subset of "
                         f"{', '.join(SWEEP_FAMILIES)}")
    with cpu_threads(args.threads):
        model, x, y, where, run_dir = _load(spec)
        png = _png(args, run_dir, "sweep.png")
        rows = sweep(capture_step(model, x, y), families)
    print(f"sweep {where}: SQNR (dB) of one training batch's tensors per point", file=out)
    points = list(dict.fromkeys(r["point"] for r in rows))
    for fam in families:
        print(f"{fam:<6} bits " + " ".join(f"{p:>6}" for p in points), file=out)
        for b in sorted({r["bits"] for r in rows}):
            vals = {r["point"]: r["sqnr_db"] for r in rows if r["family"] == fam and r["bits"] == b}
            print(f"{'':<6} {b:>4} " + " ".join(f"{vals[p]:>6.1f}" for p in points), file=out)
    _draw(lambda png: sweep_plot(rows, png, title=f"SQNR against bits: {where}"), png, out)
    return rows
