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
``diagnostics/<layer>/<point>/<measure>``. ``table`` (here) and ``plots.heatmap`` show one
measurement (``--mode diagnose``).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..conversion import short_format
from ..formats import Rounding
from ..layers import CONVERTIBLE, chain_quantize_hooks, restore_quantize_hooks
from ..precision import POINTS
from ..quantizer import round_at

MEASURES = ("sqnr_db", "rel_l2", "flushed", "saturated", "range_use")
_Q_TYPES = tuple(CONVERTIBLE.values())


def format_max(fmt) -> Optional[float]:
    """The largest finite magnitude of a fixed-range format (``Float``, ``P3109``), else None."""
    rng = fmt.value_range() if fmt is not None else None
    return float(rng.max) if rng is not None else None


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

    def merge(self, other: "_Sums") -> None:
        self.sig += other.sig
        self.err += other.err
        self.nonzero += other.nonzero
        self.flushed += other.flushed
        self.finite += other.finite
        self.numel += other.numel
        self.saturated += other.saturated
        self.amax = max(self.amax, other.amax)

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


_SHARED = ("fw", "biw", "fi", "bwi")  # points that may round a tensor another point rounds too


def _stochastic(fmt) -> bool:
    """True when rounding ``fmt`` draws random numbers (two roundings of one tensor differ)."""
    inner = getattr(fmt, "fmt", fmt)  # Scaled rounds as its Float
    return getattr(inner, "rounding", None) is Rounding.STOCHASTIC or \
        getattr(getattr(inner, "element", None), "rounding", None) is Rounding.STOCHASTIC


class PointDiagnostics:
    """Arms and disarms the measuring hooks on every quantized layer of ``model``."""

    def __init__(self, model: torch.nn.Module, keep: bool = False):
        self.model, self.keep = model, keep
        self.kept: dict[str, list[torch.Tensor]] = {}  # keep: copies of the unrounded tensors, by point
        self.layers: dict[str, torch.nn.Module] = {}
        self._sums: dict[tuple[str, str], _Sums] = {}
        self._seen: dict[tuple, tuple] = {}  # one armed step's roundings, by tensor and format
        self._saved: Optional[dict[str, Any]] = None

    @property
    def armed(self) -> bool:
        return self._saved is not None

    def arm(self) -> None:
        if self._saved is not None:
            return
        # looked up at every arm: a precision schedule may have converted more layers since
        self.layers = {n: m for n, m in self.model.named_modules() if isinstance(m, _Q_TYPES)}
        self._sums, self._seen, self.kept = {}, {}, {}
        self._saved = chain_quantize_hooks(self.layers, self._hook)

    def _hook(self, name: str, previous):
        def hook(layer, point, tensor, fmt):
            if self.keep and layer.training:
                self.kept.setdefault(point, []).append(tensor.detach().float().clone())
            # fw/biw (and fi/bwi) often round the very same tensor the same way: measure it once. The
            # entry keeps the tensor alive, so its memory cannot be reused under the same key.
            cacheable = point in _SHARED and previous is None and not _stochastic(fmt) and \
                not getattr(fmt, "history_length", 0)  # a stateful format moves each point's own history: round every one
            same = (tensor.data_ptr(), tensor._version, tuple(tensor.shape), tensor.stride(), tensor.dtype, fmt)
            cached = self._seen.get(same) if cacheable else None
            if cached is not None:
                _, out, part = cached
            else:
                if previous is not None:
                    out, counts = previous(layer, point, tensor, fmt), None
                else:
                    out, counts = round_at(layer, point, tensor, fmt)
                part = None
                if layer.training:
                    part = _Sums(fmt)
                    part.add(tensor, out, counts)
                    if cacheable:
                        self._seen[same] = (tensor, out, part)
            if layer.training and part is not None:
                key = (name, point)
                if key not in self._sums:
                    self._sums[key] = _Sums(fmt)
                self._sums[key].merge(part)
            return out
        return hook

    def disarm(self) -> list[dict[str, Any]]:
        """Restore the layers' hooks; the rows measured since ``arm``, in layer then point order."""
        if self._saved is None:
            return []
        restore_quantize_hooks(self.layers, self._saved)
        self._saved, self._seen = None, {}
        order = {n: i for i, n in enumerate(self.layers)}
        keys = sorted(self._sums, key=lambda k: (order[k[0]], POINTS.index(k[1])))
        return [{"layer": k[0], "point": k[1], "format": short_format(self._sums[k].fmt), **self._sums[k].row()}
                for k in keys]


def measure_step(model: torch.nn.Module, x: Any, y: Optional[torch.Tensor] = None,
                 diag: Optional[PointDiagnostics] = None, *,
                 loss_fn: Optional[Callable[[Any, Optional[torch.Tensor]], torch.Tensor]] = None
                 ) -> list[dict[str, Any]]:
    """One forward and backward pass of ``model`` on a batch, measured by ``diag`` (a fresh
    ``PointDiagnostics`` by default; no optimizer step; the gradients it leaves are zeroed).

    ``x`` is the input (a dict is passed as keyword arguments: a Hugging Face batch with
    ``input_ids``, ``attention_mask``, ``labels`` ...). The loss is ``loss_fn(output, y)`` when
    given; otherwise ``default_loss``: an output's own ``.loss`` (a Hugging Face model given
    labels), else the cross-entropy of its ``.logits`` or of the output tensor against ``y``,
    a sequence model's ``(N, T, V)`` against ``(N, T)`` flattened."""
    diag = diag or PointDiagnostics(model)
    model.train()
    diag.arm()
    try:
        out = model(**x) if isinstance(x, dict) else model(x)
        loss = (loss_fn or default_loss)(out, y)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise TypeError(f"measure_step: the loss must be a one-element tensor, got {got}")
        loss.reshape(()).backward()
    finally:
        rows = diag.disarm()
        model.zero_grad(set_to_none=True)
    return rows


def default_loss(out: Any, y: Optional[torch.Tensor]) -> torch.Tensor:
    """``measure_step``'s loss when none is given (its docstring); a TypeError says what to pass
    for an output it cannot read."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(out, "logits", out)
    if isinstance(logits, (tuple, list)) and logits and isinstance(logits[0], torch.Tensor):
        logits = logits[0]  # a model returning (logits, ...)
    if not isinstance(logits, torch.Tensor) or y is None:
        raise TypeError(f"measure_step: cannot take a loss from a {type(out).__name__} output"
                        f"{' without targets y' if y is None else ''}; pass loss_fn=lambda out, y: ... (a "
                        f"one-element tensor), or targets y for the output's logits")
    if logits.dim() == y.dim() + 1 and logits.dim() > 2:  # (N, T, V) against (N, T)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    return torch.nn.functional.cross_entropy(logits.float(), y)


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


CSV_FIELDS = ("step", "epoch", "layer", "point", "format", *MEASURES, "numel")


def write_csv(path: Path, rows: list[dict[str, Any]], step: int, epoch: int, fields=CSV_FIELDS) -> None:
    """Append ``rows`` (with their step and epoch) to ``path`` as ``fields`` (``step, epoch`` first),
    header first when the file is new."""
    new = not Path(path).exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({"step": step, "epoch": epoch, **{k: r.get(k) for k in fields[2:]}})


