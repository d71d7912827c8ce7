"""Callback: histograms of log2|dy|, the activation gradients each layer receives (seed 002's figure).

Every ``every`` optimizer steps, the output gradient ``dy`` of every
convertible layer (``Conv1d``/``Conv2d``/``Linear``/``Matmul`` and their Q-twins)
is binned by its binary exponent: value ``v`` goes to bin
``k = floor(log2|v|)`` (exact: ``torch.frexp``; float32 subnormals included),
clamped to ``[LO, HI]`` (the end bins hold everything beyond), plus a bin for
exact zeros and one for Inf/NaN. ``dy`` is what the layer's ``bio`` and ``bwo``
points quantize, *after* loss scaling: the histogram shows where the scale
puts the gradients relative to the formats' ranges. The counts of the sampled
steps of one epoch are summed.

Written:

* TensorBoard, per sampled step and layer: ``grad_log2/<layer>`` (a histogram
  of the exponents of the nonzero finite values) and ``grad_zero_share/<layer>``;
* with a run directory, ``grad_histograms/epoch_<n>.png`` per epoch: one panel
  per layer, the percentage of values per bin on a log axis, the zero bin at
  the left, the layer's ``bio``/``bwo`` format's range shaded (normal numbers
  dark, subnormals light; BFP and MX formats have a per-block range and are
  named, not shaded) and float16's limits (2^-24, 2^-14, 65504) as dashed lines.

Hooks (a forward hook that sets a tensor hook on the layer's output) exist
only during the sampled steps; the values are read, never changed. A tensor
hook sees the gradient of the output as the layer produced it, even if a later
op modifies the output in place (PyTorch's rule for hooks set before an
in-place change).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..conversion import short_format
from ..formats import Format
from ..layers import CONVERTIBLE, QUANTIZED_TYPES, measuring_hook
from .callbacks import Callback

LO, HI = -48, 24          # exponent bins; values below 2^LO / above 2^(HI+1) land in the end bins
FP16_LINES = ((-24, "fp16 smallest subnormal 2^-24"), (-14, "fp16 smallest normal 2^-14"),
              (math.log2(65504.0), "fp16 max 65504"))
_LAYER_TYPES = tuple(CONVERTIBLE) + tuple(QUANTIZED_TYPES.values())


def exponent_counts(t: torch.Tensor) -> torch.Tensor:
    """int64 counts on ``t``'s device: ``HI-LO+1`` exponent bins, then zeros, then Inf/NaN."""
    v = t.detach().float().reshape(-1)
    finite = torch.isfinite(v)
    a = v[finite].abs()
    nz = a[a > 0]
    k = torch.frexp(nz).exponent.to(torch.int64) - 1      # nz = m * 2^e, m in [0.5, 1)
    bins = torch.bincount((k.clamp(LO, HI) - LO), minlength=HI - LO + 1)
    extra = torch.stack([(a == 0).sum(), (~finite).sum()]).to(torch.int64)
    return torch.cat([bins, extra])


def _layer_formats(module: nn.Module) -> list[tuple[str, Optional[Format]]]:
    """(points, format) for the bio/bwo points of a Q-layer; one entry when they agree."""
    p = getattr(module, "precision", None)
    if p is None:
        return [("bio/bwo", None)]
    if p.bio == p.bwo:
        return [("bio/bwo", p.bio)]
    return [("bio", p.bio), ("bwo", p.bwo)]


def _short(fmt: Optional[Format]) -> str:
    """The report tables' name (``short_format``: a preset name where one fits); FP32 for none."""
    return "FP32" if fmt is None else short_format(fmt)


class GradHistogram(Callback):
    """Sample ``dy`` every ``every`` steps; see the module docstring."""

    name = "grad_histogram"

    def __init__(self, every: int):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"`GradHistogram.every` {every!r}: allowed an integer >= 1 (steps between samples)")
        self.every = every
        self._handles: list = []
        self._pending: dict[str, list[torch.Tensor]] = {}
        self.epoch_counts: dict[str, torch.Tensor] = {}   # layer -> summed counts of this epoch
        self.formats: dict[str, list] = {}
        self.samples = 0
        self.written: list[Path] = []

    # -- arming --------------------------------------------------------------------
    def _arm_if_due(self, trainer) -> None:
        if self._handles or (trainer.global_step + 1) % self.every:
            return
        for name, mod in trainer.model.named_modules():
            if isinstance(mod, _LAYER_TYPES):
                self.formats[name] = _layer_formats(mod)
                self._handles.append(mod.register_forward_hook(self._forward_hook(name)))

    def _forward_hook(self, name: str):
        def hook(module, inputs, out):
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda g: self._pending.setdefault(name, []).append(exponent_counts(g)))
        return measuring_hook(hook)  # a sampled step runs eagerly under --compile

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- callback hooks ------------------------------------------------------------
    def on_epoch_start(self, trainer, epoch: int) -> None:
        self.epoch_counts, self.samples = {}, 0
        self._arm_if_due(trainer)

    def on_batch_end(self, trainer, step: int) -> None:
        if self._handles:
            self._disarm()
            self._harvest(trainer, step)
        self._arm_if_due(trainer)

    def _harvest(self, trainer, step: int) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        self.samples += 1
        w = trainer.writer
        for name, parts in pending.items():
            c = torch.stack(parts).sum(0).cpu()
            self.epoch_counts[name] = self.epoch_counts.get(name, torch.zeros_like(c)) + c
            if w is not None:
                _add_tensorboard(w, name or "model", c, step)

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        if trainer.run_dir is None or not self.epoch_counts:
            return
        path = Path(trainer.run_dir) / "grad_histograms" / f"epoch_{epoch + 1:03d}.png"
        scaler = trainer.amp.scaler
        title = (f"log2|dy| of activation gradients, epoch {epoch + 1} ({self.samples} sampled step(s)"
                 + (f", loss scale {scaler.scale:g})" if scaler.is_enabled() else ", no loss scaling)"))
        self.written.append(draw(self.epoch_counts, self.formats, path, title))

    def on_train_end(self, trainer) -> None:
        self._disarm()

    def on_exception(self, trainer, exc: BaseException) -> None:
        self._disarm()


def _add_tensorboard(writer, name: str, c: torch.Tensor, step: int) -> None:
    bins = c[:HI - LO + 1].double()
    total = float(c.sum())
    if total:
        writer.add_scalar(f"grad_zero_share/{name}", float(c[-2]) / total, step)
    n = float(bins.sum())
    if n:
        centers = torch.arange(LO, HI + 1, dtype=torch.float64) + 0.5
        used = bins > 0
        writer.add_histogram_raw(f"grad_log2/{name}", min=float(centers[used].min() - 0.5),
                                 max=float(centers[used].max() + 0.5), num=int(n),
                                 sum=float((bins * centers).sum()), sum_squares=float((bins * centers ** 2).sum()),
                                 bucket_limits=(centers[used] + 0.5).tolist(), bucket_counts=bins[used].tolist(),
                                 global_step=step)


_SHADES = ("tab:green", "tab:purple")


def draw(counts: dict[str, torch.Tensor], formats: dict[str, list], path: Path, title: str) -> Path:
    """One PNG, one panel per layer (see the module docstring)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in formats if n in counts] + [n for n in counts if n not in formats]  # model order
    ncols = min(4, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.2 * nrows + 0.8), squeeze=False)
    zero_x, nan_x = LO - 3, HI + 3
    for ax, name in zip(axes.flat, names):
        c = counts[name].double()
        pct = 100.0 * c / max(1.0, float(c.sum()))
        xs = list(range(LO, HI + 1))
        ax.bar(xs, pct[:HI - LO + 1].tolist(), width=0.9, color="tab:blue")
        ax.bar([zero_x], [float(pct[-2])], width=1.8, color="tab:gray")
        if c[-1] > 0:
            ax.bar([nan_x], [float(pct[-1])], width=1.8, color="tab:red")
        labels = []
        for (points, fmt), shade in zip(formats.get(name, []), _SHADES):
            labels.append(f"{points}: {_short(fmt)}")
            rng = fmt.value_range() if fmt is not None else None
            if rng is not None:
                lo_sub, emin = math.log2(rng.min_subnormal), math.log2(rng.min_normal)
                ax.axvspan(lo_sub - 0.5, emin - 0.5, color=shade, alpha=0.12)
                ax.axvspan(emin - 0.5, math.log2(rng.max) + 0.5, color=shade, alpha=0.25,
                           label=f"{_short(fmt)} range (light: subnormal)")
        for x, label in FP16_LINES:
            ax.axvline(x + (0.5 if x == FP16_LINES[2][0] else -0.5), color="tab:orange", ls="--", lw=1,
                       label=label)
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 150)
        ax.set_xlim(zero_x - 2, nan_x + 2)
        ticks = [zero_x] + list(range(-40, HI + 1, 10)) + [nan_x]
        ax.set_xticks(ticks, ["zero"] + [str(t) for t in ticks[1:-1]] + ["Inf\nNaN"])
        ax.set_title(f"{name or 'model'}  [{', '.join(labels)}]", fontsize=9)
        ax.set_xlabel("log2 |dy|  (bin k holds [2^k, 2^(k+1)))", fontsize=8)
        ax.set_ylabel("% of values", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, h)
    fig.legend(list(legend.values()), list(legend), loc="upper right", fontsize=8, ncol=2)
    fig.suptitle(title, fontsize=11, x=0.01, y=0.995, ha="left", va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / (3.2 * nrows + 0.8)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
