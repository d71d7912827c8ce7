"""Where precision is lost: what rounding does at every quantization point of every Q-layer.

``PointDiagnostics(model)`` wraps each quantized layer's ``quantize_hook`` while armed and
records, per (layer, point), over every rounding of that point during the armed step (the
nine points of ``bfp.layers``, attention products included) the sums below, on the
finite elements of the unrounded tensor ``x`` and its rounding ``q`` (float64 sums):

* ``sqnr_db = 10 log10(sum x^2 / sum (x - q)^2)``: signal to quantization noise
  (``inf`` when nothing changed; ``nan`` for an all-zero tensor);
* ``rel_l2 = sqrt(sum (x - q)^2 / sum x^2)``;
* ``flushed``: the share of nonzero elements (NaN and Inf count as nonzero) that became
  zero: the dynamic precision controller's zero-setting error, from the same kernel
  counts (``quantize_stats``);
* ``saturated``: the share of finite elements whose magnitude exceeds the format's largest
  finite value (``Float``; None for formats whose range moves with a shared or tensor
  scale: BlockFloat, MX, NVFP4, Scaled);
* ``range_use = max|x| / max`` (``Float``; None as above): above 1 the point overflows.

It only measures layers in training mode. When another hook is already set, such as the
dynamic controller's ZSE meter, it asks that hook for the rounding, so both measure the
same step. ``DiagnoseCallback`` measures one training step in every ``every``, writes
``diagnostics.csv`` to the run directory, and sends scalars to TensorBoard under
``diagnostics/<layer>/<point>/<measure>``. ``table`` and ``heatmap`` show one
measurement (``--mode diagnose``).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Optional

import torch

from .conversion import short_format
from .formats import Float
from .kernels import quantize, quantize_stats
from .layers import CONVERTIBLE
from .precision import POINTS

MEASURES = ("sqnr_db", "rel_l2", "flushed", "saturated", "range_use")
_Q_TYPES = tuple(CONVERTIBLE.values())


def format_max(fmt) -> Optional[float]:
    """The largest finite magnitude of a fixed-range format (``Float``), else None."""
    return float(fmt.max) if isinstance(fmt, Float) else None


class _Sums:
    """Float64 sums of one point over the roundings of a measured step."""

    def __init__(self, fmt):
        self.fmt, self.fmax = fmt, format_max(fmt)
        self.sig = self.err = 0.0
        self.nonzero = self.flushed = self.finite = self.saturated = self.numel = 0
        self.amax = 0.0

    def add(self, x: torch.Tensor, q: torch.Tensor, counts: Optional[torch.Tensor]) -> None:
        x, q = x.detach().double().reshape(-1), q.detach().double().reshape(-1)
        fin = torch.isfinite(x) & torch.isfinite(q)
        xf, qf = x[fin], q[fin]
        self.sig += float((xf * xf).sum())
        self.err += float(((xf - qf) ** 2).sum())
        if counts is None:  # another hook rounded: count as the kernel does
            nz = x != 0
            counts = torch.stack((nz.sum(), (nz & (q == 0)).sum()))
        self.nonzero += int(counts[0])
        self.flushed += int(counts[1])
        self.finite += int(fin.sum())
        self.numel += x.numel()
        if xf.numel():
            self.amax = max(self.amax, float(xf.abs().max()))
        if self.fmax is not None:
            self.saturated += int((xf.abs() > self.fmax).sum())

    def row(self) -> dict[str, Any]:
        sig, err = self.sig, self.err
        sqnr = math.nan if sig == 0 else (math.inf if err == 0 else 10 * math.log10(sig / err))
        rel = (0.0 if err == 0 else math.inf) if sig == 0 else math.sqrt(err / sig)
        return {"sqnr_db": sqnr, "rel_l2": rel,
                "flushed": self.flushed / self.nonzero if self.nonzero else 0.0,
                "saturated": None if self.fmax is None else (self.saturated / self.finite if self.finite else 0.0),
                "range_use": None if self.fmax is None else self.amax / self.fmax,
                "numel": self.numel}


def point_stats(x: torch.Tensor, q: torch.Tensor, fmt=None) -> dict[str, Any]:
    """The measures of one rounding ``q`` of ``x`` (see the module docstring)."""
    s = _Sums(fmt)
    s.add(x, q, None)
    return s.row()


class PointDiagnostics:
    """Arms and disarms the measuring hooks on every quantized layer of ``model``."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers: dict[str, torch.nn.Module] = {}
        self._sums: dict[tuple[str, str], _Sums] = {}
        self._saved: Optional[dict[str, Any]] = None

    @property
    def armed(self) -> bool:
        return self._saved is not None

    def arm(self) -> None:
        if self._saved is not None:
            return
        # looked up at every arm: a precision schedule may have converted more layers since
        self.layers = {n: m for n, m in self.model.named_modules() if isinstance(m, _Q_TYPES)}
        self._sums = {}
        self._saved = {n: m.quantize_hook for n, m in self.layers.items()}
        for name, m in self.layers.items():
            m.quantize_hook = self._hook(name, self._saved[name])

    def _hook(self, name: str, previous):
        def hook(layer, point, tensor, fmt):
            if previous is not None:
                out, counts = previous(layer, point, tensor, fmt), None
            else:
                out, counts = quantize_stats(tensor, fmt, generator=getattr(layer, "generator", None), stats=True)
            if layer.training:
                key = (name, point)
                if key not in self._sums:
                    self._sums[key] = _Sums(fmt)
                self._sums[key].add(tensor, out, counts)
            return out
        return hook

    def disarm(self) -> list[dict[str, Any]]:
        """Restore the layers' hooks; the rows measured since ``arm``, in layer then point order."""
        if self._saved is None:
            return []
        for name, m in self.layers.items():
            m.quantize_hook = self._saved[name]
        self._saved = None
        order = {n: i for i, n in enumerate(self.layers)}
        keys = sorted(self._sums, key=lambda k: (order[k[0]], POINTS.index(k[1])))
        return [{"layer": k[0], "point": k[1], "format": describe(self._sums[k].fmt), **self._sums[k].row()}
                for k in keys]


def describe(fmt) -> str:
    """A format in short words (the conversion report's spelling)."""
    return short_format(fmt)


def measure_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[dict[str, Any]]:
    """One forward and backward pass of ``model`` on a batch, measured (no optimizer step;
    the gradients it leaves are zeroed)."""
    diag = PointDiagnostics(model)
    model.train()
    diag.arm()
    try:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    finally:
        rows = diag.disarm()
        model.zero_grad(set_to_none=True)
    return rows


def _fmt(v, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else format(v, spec)


def table(rows: list[dict[str, Any]], limit: Optional[int] = None) -> str:
    """Rows worst first (lowest SQNR), one line each."""
    rows = sorted(rows, key=lambda r: (math.isnan(r["sqnr_db"]), r["sqnr_db"]))[:limit]
    head = f"{'layer':<28} {'point':<5} {'format':<22} {'SQNR dB':>8} {'rel L2':>8} {'flushed':>8} " \
           f"{'satur.':>7} {'range':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['layer']:<28} {r['point']:<5} {r['format'][:22]:<22} {r['sqnr_db']:>8.2f} "
                     f"{r['rel_l2']:>8.4f} {100 * r['flushed']:>7.2f}% {_fmt(r['saturated'], '>7.2%', 7)} "
                     f"{_fmt(r['range_use'], '>6.2f', 6)}")
    return "\n".join(lines)


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


CSV_FIELDS = ("step", "epoch", "layer", "point", "format", *MEASURES, "numel")


def write_csv(path: Path, rows: list[dict[str, Any]], step: int, epoch: int) -> None:
    """Append ``rows`` (with their step and epoch) to ``path``, header first when it is new."""
    new = not Path(path).exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({"step": step, "epoch": epoch, **{k: r.get(k) for k in CSV_FIELDS[2:]}})


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
            raise FileNotFoundError(f"{path}: no diagnostics in this run (train with --diagnose N)")
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


# -- the bit-width sweep (--mode sweep) ----------------------------------------------------

SWEEP_FAMILIES = ("bfp", "float", "mx")


def _float_exp(bits: int) -> int:
    return {2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3, 8: 4}.get(bits, 5)


def sweep_format(family: str, bits: int, ndim: int):
    """The ``bits``-bit member of ``family`` for a tensor of ``ndim`` axes: ``bfp``:
    BlockFloat(bits) in groups of 16 along the channel axis (1 for 4-D, the last otherwise);
    ``float``: Float with 1/2/3/4 exponent bits up to 3/5/7/8 bits, 5 above (e4m3 at 8, e5m10
    at 16); ``mx``: that Float as an MX element, blocks of 32 along the same axis."""
    from .formats import MX, BlockFloat, Encoding
    axis = 1 if ndim == 4 else max(ndim - 1, 0)
    if family == "bfp":
        group = [1] * max(ndim, 1)
        group[axis] = 16
        return BlockFloat(bits, group, rounding="nearest")
    e = _float_exp(bits)
    elem = Float(e, bits - 1 - e, encoding=Encoding.FINITE if e == 1 else Encoding.IEEE)
    if family == "float":
        return elem
    if family == "mx":
        return MX(elem, block=32, axis=axis)
    raise ValueError(f"unknown sweep family {family!r}; allowed: {', '.join(SWEEP_FAMILIES)}")


def capture_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """The unrounded tensors at every active point of one forward and backward pass, by point
    (copies; the pass itself rounds as the model's config says; gradients are zeroed after)."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, _Q_TYPES)}
    saved = {n: m.quantize_hook for n, m in layers.items()}
    got: dict[str, list[torch.Tensor]] = {}

    def make(previous):
        def hook(layer, point, tensor, fmt):
            got.setdefault(point, []).append(tensor.detach().float().clone())
            if previous is not None:
                return previous(layer, point, tensor, fmt)
            return quantize_stats(tensor, fmt, generator=getattr(layer, "generator", None), stats=False)[0]
        return hook

    model.train()
    for n, m in layers.items():
        m.quantize_hook = make(saved[n])
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    finally:
        for n, m in layers.items():
            m.quantize_hook = saved[n]
        model.zero_grad(set_to_none=True)
    return got


def sweep(tensors: dict[str, list[torch.Tensor]], families=SWEEP_FAMILIES, bits=range(2, 17)) -> list[dict]:
    """SQNR of every point's tensors (summed over its layers) rounded to each family's member
    of each width: rows ``{family, bits, point, sqnr_db}``."""
    rows = []
    for fam in families:
        for b in bits:
            for point in [p for p in POINTS if p in tensors]:
                s = _Sums(None)
                for t in tensors[point]:
                    s.add(t, quantize(t, sweep_format(fam, b, t.dim())), None)
                rows.append({"family": fam, "bits": b, "point": point, "sqnr_db": s.row()["sqnr_db"]})
    return rows


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
