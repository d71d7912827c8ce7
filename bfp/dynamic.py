"""Dynamic precision control: change BlockFloat bits during training from the
zero-setting error (ZSE) each layer's quantization produces.

Three parts, each usable alone:

``SimpleSpec`` / ``parse_spec``
    The ``--do Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER]`` grammar
    (``docs/dynamic.md``).
``SimpleController``
    The decision rule on plain numbers: given a ZSE and the current bits of
    each (layer, linked pair), the new bits. Its state is a decision index and
    hold timers.
``DynamicPrecision``
    A training callback that measures ZSE through the Q-layers'
    ``quantize_hook`` (counts come out of the quantization kernel and are
    summed on the tensor's device; the host reads them once per decision),
    asks the controller, swaps the layers' formats, and logs every decision to
    TensorBoard, ``dynamic_precision.csv`` in the run folder and the console.

``plot_precision(run_dir)`` draws each layer's bits over training from the CSV;
``python -m bfp.dynamic plot RUN_DIR`` does the same from the shell.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

import torch

from .engine.callbacks import Callback
from .formats import BlockFloat
from .kernels import quantize_stats
from .precision import LINKED_PAIRS, POINTS, LayerPrecision

__all__ = ["SimpleSpec", "parse_spec", "SimpleController", "DynamicPrecision", "ladder_step",
           "pair_name", "format_table", "read_log", "plot_precision", "CSV_NAME", "CSV_FIELDS",
           "DEFAULT_LADDER", "DEFAULT_SAMPLE", "main"]

CSV_NAME = "dynamic_precision.csv"
CSV_FIELDS = ("decision", "step", "epoch", "layer", "pair", "zse", "old_bits", "new_bits")
DEFAULT_LADDER = (4, 8, 16)
# Counting costs the kernel ~15% of a quantization on the CPU; one step in 4 keeps --do under 5%.
DEFAULT_SAMPLE = 4
COMBINE = ("max", "mean")
METHODS = ("simple",)

SPEC_FORM = ("Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER], e.g. 'Simple/0.1/0.2/2/1', "
             "'Simple/0.1/0.2/50/1/500', 'Simple/0.1/0.2/2/1/4,8,12,16'; LOWER <= UPPER in "
             "[0, 1], INITIAL and HOLD integers >= 0, EVERY 'epoch' or an integer number of "
             "steps >= 1, LADDER increasing bit counts in 1..24 separated by commas; optional "
             "fields may also be written every=N, ladder=A,B,..., combine=max|mean, sample=N")


def pair_name(pair: Iterable[str]) -> str:
    """``("fw", "fi") -> "fw+fi"``: how pairs are named in logs and state."""
    return "+".join(pair)


PAIR_NAMES = tuple(pair_name(p) for p in LINKED_PAIRS)


# -- the spec --------------------------------------------------------------------

def _parse_every(value: Union[int, str, None], what: str) -> Union[int, str, None]:
    """``None``, ``"epoch"`` or a positive int (from an int or a digit string)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "epoch"):
        return None if value is None else "epoch"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be 'epoch' or an integer number of steps >= 1, got {value!r}")
    return value


def _parse_ladder(value: Union[str, Iterable[int]], what: str = "ladder") -> tuple[int, ...]:
    try:
        if isinstance(value, str):
            rungs = tuple(int(v) for v in value.split(","))
        else:
            rungs = tuple(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be increasing integers separated by commas "
                         f"(e.g. 4,8,16), got {value!r}") from None
    if (not rungs or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 24 for b in rungs)
            or any(a >= b for a, b in zip(rungs, rungs[1:]))):
        raise ValueError(f"{what} must be strictly increasing BlockFloat bit counts in 1..24 "
                         f"(e.g. 4,8,16), got {value!r}")
    return rungs


@dataclass(frozen=True)
class SimpleSpec:
    """The "Simple" rule of the original simulator (FlexBlock), with its knobs.

    At each decision, for every layer and linked pair: a mean ZSE below
    ``lower`` lowers the bits one rung of ``ladder``, above ``upper`` raises
    them one rung (equal to a threshold: no change). The first ``initial``
    decisions change nothing; after a change that pair keeps its bits for the
    next ``hold`` decisions. ``every``: decide at each epoch end (``"epoch"``)
    or every that many training steps; ``None`` leaves it to the caller
    (default ``"epoch"``). ``combine``: how a pair's two points' ZSEs become
    one (``"max"``: the worse one decides, ``"mean"``: their average).
    ``sample``: measure one training step in ``sample`` (the first after each
    decision, then every ``sample``-th); 1 measures every step.
    """

    lower: float
    upper: float
    initial: int = 0
    hold: int = 0
    every: Union[int, str, None] = None
    ladder: tuple[int, ...] = DEFAULT_LADDER
    combine: str = "max"
    sample: int = DEFAULT_SAMPLE

    def __post_init__(self):
        for name in ("lower", "upper"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"Simple {name} threshold must be a number in [0, 1], got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.lower > self.upper:
            raise ValueError(f"Simple thresholds need LOWER <= UPPER, got lower={self.lower} "
                             f"> upper={self.upper}")
        for name in ("initial", "hold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Simple {name} must be an integer >= 0 (decisions), got {v!r}")
        object.__setattr__(self, "every", _parse_every(self.every, "EVERY"))
        object.__setattr__(self, "ladder", _parse_ladder(self.ladder, "LADDER"))
        if self.combine not in COMBINE:
            raise ValueError(f"Simple combine must be one of {', '.join(COMBINE)}, got {self.combine!r}")
        if isinstance(self.sample, str) and self.sample.strip().isdigit():
            object.__setattr__(self, "sample", int(self.sample))
        if isinstance(self.sample, bool) or not isinstance(self.sample, int) or self.sample < 1:
            raise ValueError(f"Simple sample must be an integer >= 1 (measure one step in N), "
                             f"got {self.sample!r}")

    def __str__(self) -> str:
        """The canonical spec string; ``parse_spec(str(s)) == s``."""
        parts = ["Simple", _num(self.lower), _num(self.upper), str(self.initial), str(self.hold)]
        if self.every is not None:
            parts.append(str(self.every))
        if self.ladder != DEFAULT_LADDER:
            rungs = ",".join(map(str, self.ladder))
            parts.append(rungs if len(self.ladder) > 1 else f"ladder={rungs}")
        if self.combine != "max":
            parts.append(f"combine={self.combine}")
        if self.sample != DEFAULT_SAMPLE:
            parts.append(f"sample={self.sample}")
        return "/".join(parts)


def _num(x: float) -> str:
    return repr(x).rstrip("0").rstrip(".") if "." in repr(x) else repr(x)


def parse_spec(spec: Union[str, SimpleSpec]) -> SimpleSpec:
    """Parse ``--do``: ``Simple/LOWER/UPPER/INITIAL/HOLD[/EVERY][/LADDER]``.

    The optional fields after HOLD may come in any order and are told apart by
    their form: ``epoch`` or a plain integer is EVERY (a decision interval in
    training steps; the original's ImageNet example ``Simple/0.1/0.2/50/1/5``
    thus decides every 5 steps), a comma list is the LADDER (``4,8,12,16``),
    and ``key=value`` names a field (``every=``, ``ladder=``, ``combine=``, ``sample=``;
    ``ladder=8`` is the way to give a one-rung ladder). Raises ``ValueError``
    stating the expected form.
    """
    if isinstance(spec, SimpleSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--do spec must be a string of the form {SPEC_FORM}; got {spec!r}")
    fields = [f.strip() for f in spec.strip().split("/")]
    method = fields[0].lower()
    if method not in METHODS:
        raise ValueError(f"unknown dynamic precision method {fields[0]!r} in {spec!r}; allowed: "
                         f"Simple; expected form {SPEC_FORM}")
    if len(fields) < 5:
        raise ValueError(f"--do spec {spec!r} has {len(fields) - 1} fields after 'Simple', needs at "
                         f"least 4; expected form {SPEC_FORM}")
    try:
        lower, upper = float(fields[1]), float(fields[2])
    except ValueError:
        raise ValueError(f"--do spec {spec!r}: LOWER and UPPER must be numbers, got {fields[1]!r} "
                         f"and {fields[2]!r}; expected form {SPEC_FORM}") from None
    if not (fields[3].isdigit() and fields[4].isdigit()):
        raise ValueError(f"--do spec {spec!r}: INITIAL and HOLD must be integers >= 0, got "
                         f"{fields[3]!r} and {fields[4]!r}; expected form {SPEC_FORM}")
    kw: dict[str, Any] = {}
    for field in fields[5:]:
        if "=" in field:
            key, _, value = field.partition("=")
            key = key.strip().lower()
            if key not in ("every", "ladder", "combine", "sample"):
                raise ValueError(f"--do spec {spec!r}: unknown field {key!r}; allowed keys: every, "
                                 f"ladder, combine, sample; expected form {SPEC_FORM}")
        elif "," in field:
            key, value = "ladder", field
        elif field.isdigit() or field.lower() == "epoch":
            key, value = "every", field
        else:
            raise ValueError(f"--do spec {spec!r}: cannot read field {field!r}; expected form "
                             f"{SPEC_FORM}")
        if key in kw:
            raise ValueError(f"--do spec {spec!r} gives {key} twice; expected form {SPEC_FORM}")
        kw[key] = value.strip()
    try:
        return SimpleSpec(lower, upper, int(fields[3]), int(fields[4]), **kw)
    except ValueError as e:
        raise ValueError(f"--do spec {spec!r}: {e}; expected form {SPEC_FORM}") from None


def ladder_step(bits: int, direction: int, ladder: tuple[int, ...]) -> int:
    """The rung ``direction`` (-1, 0, +1) steps from ``bits``; ladder ends stay put.

    Bits between rungs (a config with 6 bits on a 4,8,16 ladder) step to the
    nearest rung in that direction (6 -> 4 or 8); bits beyond an end stay.
    """
    if direction > 0:
        return next((b for b in ladder if b > bits), bits)
    if direction < 0:
        return next((b for b in reversed(ladder) if b < bits), bits)
    return bits


# -- the decision rule -------------------------------------------------------------

class SimpleController:
    """The Simple rule on plain values: no model, no tensors.

    ``decide({key: (zse, bits)})`` returns ``{key: new_bits}`` for every key
    and advances the decision index. ``zse`` may be ``None`` or NaN when
    nothing was measured; such a key keeps its bits (its hold timer still
    counts down). Keys are any strings (``DynamicPrecision`` uses
    ``"layer|pair"``).
    """

    def __init__(self, spec: Union[str, SimpleSpec]):
        self.spec = parse_spec(spec)
        self.decision = 0  # index of the next decision
        self.hold: dict[str, int] = {}  # decisions a key still keeps its bits

    def decide(self, observations: Mapping[str, tuple[Optional[float], int]]) -> dict[str, int]:
        s = self.spec
        out = {}
        for key, (zse, bits) in observations.items():
            new = bits
            held = self.hold.get(key, 0)
            if held > 0:
                self.hold[key] = held - 1
            elif self.decision >= s.initial and zse is not None and not math.isnan(zse):
                if zse < s.lower:
                    new = ladder_step(bits, -1, s.ladder)
                elif zse > s.upper:
                    new = ladder_step(bits, +1, s.ladder)
                if new != bits and s.hold:
                    self.hold[key] = s.hold
            out[key] = new
        self.decision += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "hold": {k: v for k, v in self.hold.items() if v}}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.decision = int(d["decision"])
        self.hold = {str(k): int(v) for k, v in d["hold"].items()}


# -- measuring and applying -----------------------------------------------------------

_POINT_INDEX = {p: i for i, p in enumerate(POINTS)}


def _is_qlayer(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "precision", None), LayerPrecision) and hasattr(module, "set_format")


def _parse_bool(value: Union[bool, str, int], what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "none", ""):
        return False
    raise ValueError(f"{what} must be True or False, got {value!r}")


class DynamicPrecision(Callback):
    """Dynamic precision control of a converted model, as a training callback.

    Measures the ZSE of every point each Q-layer quantizes while the layer is
    in training mode (forward and backward; evaluation passes are not
    counted), on one training step in ``spec.sample``. At each decision, every linked pair (``fw+fi``, ``bio+biw``,
    ``bwo+bwi``) of every layer whose pair holds at least one ``BlockFloat``
    is judged on the ZSE of those BlockFloat points since the last decision
    (per point: zeroed / nonzero elements pooled over all calls; per pair:
    ``spec.combine`` of its points) and its points' bits move one rung of the
    ladder, keeping their group and rounding. Float and MX points are measured
    and logged but never changed.

    ``every``: ``"epoch"`` or a number of training steps; taken from the spec
    when the spec has an EVERY field (a different explicit ``every`` is an
    error), else ``"epoch"``.
    """

    name = "dynamic_precision"

    def __init__(self, model: torch.nn.Module, spec: Union[str, SimpleSpec], *,
                 color: Union[bool, str] = False, every: Union[int, str, None] = None):
        self.spec = parse_spec(spec)
        self.color = _parse_bool(color, "--do-color")
        every = _parse_every(every, "--do-every")
        if self.spec.every is not None and every not in (None, "epoch", self.spec.every):
            raise ValueError(f"decision interval given twice: the --do spec says every "
                             f"{self.spec.every!r}, --do-every says {every!r}; give one")
        self.every = self.spec.every or every or "epoch"
        self.controller = SimpleController(self.spec)
        self._batches = 0  # training steps since the last decision
        self._measuring = True  # whether the step under way is counted (spec.sample)
        self._saved_hooks: Optional[dict[str, Any]] = None
        self._bind(model)

    @classmethod
    def from_args(cls, model: torch.nn.Module, spec: Union[str, SimpleSpec], color: Union[bool, str] = False,
                  every: Union[int, str, None] = None) -> "DynamicPrecision":
        """Build from the CLI's ``--do``, ``--do-color`` and ``--do-every`` values."""
        return cls(model, spec, color=color, every=every)

    def _bind(self, model: torch.nn.Module) -> bool:
        """Take ``model``'s Q-layers; True when they differ from those held before.

        Called again at each epoch start, because a ``conf_train`` precision
        switch may swap float layers for new Q-layers; the counts of the
        decision under way then start afresh.
        """
        layers = {n: m for n, m in model.named_modules() if _is_qlayer(m)}
        if not layers:
            raise ValueError("DynamicPrecision found no converted layers (modules with a LayerPrecision "
                             "'precision'); convert the model first (bfp.convert)")
        old = getattr(self, "layers", None)
        if old is not None and list(old) == list(layers) and all(old[n] is m for n, m in layers.items()):
            return False
        installed = self._saved_hooks is not None
        self.remove()
        self.model, self.layers = model, layers
        self._row = {id(m): i for i, m in enumerate(layers.values())}
        self._acc: Optional[torch.Tensor] = None  # int64 [layers, points, (nonzero, zeroed)]
        self._views: dict[tuple[int, int], torch.Tensor] = {}
        if installed:
            self.install()
        return old is not None

    # -- measuring ------------------------------------------------------------------
    def install(self) -> None:
        """Set the quantize hook on every managed layer (idempotent)."""
        if self._saved_hooks is not None:
            return
        self._saved_hooks = {n: getattr(m, "quantize_hook", None) for n, m in self.layers.items()}
        for name, module in self.layers.items():
            module.quantize_hook = self._make_hook(self._saved_hooks[name])

    def remove(self) -> None:
        """Give the layers back the hooks they had before ``install``."""
        if self._saved_hooks is None:
            return
        for name, module in self.layers.items():
            module.quantize_hook = self._saved_hooks[name]
        self._saved_hooks = None

    def _make_hook(self, previous):
        row, views, points = self._row, self._views, _POINT_INDEX

        def hook(layer, point, tensor, fmt):
            if not (layer.training and self._measuring):
                if previous is not None:
                    return previous(layer, point, tensor, fmt)
                return quantize_stats(tensor, fmt, generator=getattr(layer, "generator", None),
                                      stats=False)[0]
            if previous is None:
                out, counts = quantize_stats(tensor, fmt, generator=getattr(layer, "generator", None),
                                             stats=True)
            else:  # someone else's hook quantizes: count from its result (slower, eager)
                out = previous(layer, point, tensor, fmt)
                nz = tensor != 0
                counts = torch.stack((nz.sum(), (nz & (out == 0)).sum()))
            key = (row[id(layer)], points[point])
            view = views.get(key)
            if view is None or view.device != counts.device:
                view = self._view(key, counts.device)
            view.add_(counts)  # on the tensor's device: no host sync here
            return out

        return hook

    def _view(self, key: tuple[int, int], device: torch.device) -> torch.Tensor:
        if self._acc is None or self._acc.device != device:
            old = self._acc
            self._acc = torch.zeros(len(self.layers), len(POINTS), 2, dtype=torch.int64, device=device)
            if old is not None:
                self._acc.copy_(old)
            self._views.clear()
        view = self._views[key] = self._acc[key]
        return view

    def counts(self) -> torch.Tensor:
        """Counts since the last decision on the host: int64 [layers, 9 points, (nonzero, zeroed)]."""
        if self._acc is None:
            return torch.zeros(len(self.layers), len(POINTS), 2, dtype=torch.int64)
        return self._acc.cpu()

    def _reset_counts(self) -> None:
        if self._acc is not None:
            self._acc.zero_()
        self._batches = 0
        self._measuring = True

    # -- deciding -------------------------------------------------------------------
    def _managed(self, module) -> dict[str, tuple[str, ...]]:
        """Pair name -> its BlockFloat points, for pairs holding at least one."""
        fmts = module.precision.formats()
        out = {}
        for pair in LINKED_PAIRS:
            pts = tuple(p for p in pair if isinstance(fmts[p], BlockFloat))
            if pts:
                out[pair_name(pair)] = pts
        return out

    def global_counts(self) -> torch.Tensor:
        """``counts()`` summed over all processes when ``torch.distributed`` is
        initialised (every rank must call it at the same decision), so all
        ranks make the same decisions; else ``counts()``."""
        dist = torch.distributed
        if self._acc is None or not (dist.is_available() and dist.is_initialized()):
            return self.counts()
        total = self._acc.clone()
        dist.all_reduce(total)
        return total.cpu()

    def point_zse(self, counts: Optional[torch.Tensor] = None) -> dict[str, dict[str, float]]:
        """ZSE per layer and measured point since the last decision (all processes)."""
        c = (self.global_counts() if counts is None else counts).tolist()
        return {name: {p: zeroed / nonzero for p, (nonzero, zeroed) in zip(POINTS, c[i]) if nonzero}
                for i, name in enumerate(self.layers)}

    def decide(self, step: Optional[int] = None, epoch: Optional[int] = None,
               zse: Optional[Mapping[str, Mapping[str, float]]] = None) -> list[dict[str, Any]]:
        """Make one decision now and return its log rows (``CSV_FIELDS`` dicts).

        ``zse`` (layer -> point -> ZSE) replaces the measured values; tests
        script ZSE sequences with it.
        """
        zse = self.point_zse() if zse is None else zse
        observations, targets = {}, {}
        for name, module in self.layers.items():
            fmts = module.precision.formats()
            for pname, pts in self._managed(module).items():
                values = [zse.get(name, {}).get(p) for p in pts]
                values = [v for v in values if v is not None and not math.isnan(v)]
                pair_zse = None if not values else (
                    max(values) if self.spec.combine == "max" else sum(values) / len(values))
                key = f"{name}|{pname}"
                observations[key] = (pair_zse, fmts[pts[0]].bits)
                targets[key] = (name, module, pname, pts)
        decision = self.controller.decision
        new_bits = self.controller.decide(observations)
        rows = []
        for key, (pair_zse, old) in observations.items():
            name, module, pname, pts = targets[key]
            direction = (new_bits[key] > old) - (new_bits[key] < old)
            if direction:
                for p in pts:
                    fmt = module.precision.formats()[p]
                    module.set_format(p, dataclasses.replace(
                        fmt, bits=ladder_step(fmt.bits, direction, self.spec.ladder)))
            rows.append({"decision": decision, "step": step, "epoch": epoch, "layer": name, "pair": pname,
                         "zse": pair_zse, "old_bits": old, "new_bits": new_bits[key]})
        self._reset_counts()
        return rows

    def bits(self) -> dict[str, dict[str, int]]:
        """Current bits of every BlockFloat point of the managed layers."""
        return {name: {p: f.bits for p, f in m.precision.formats().items() if isinstance(f, BlockFloat)}
                for name, m in self.layers.items()}

    def _apply_bits(self, bits: Mapping[str, Mapping[str, int]]) -> None:
        missing = sorted(set(bits) - set(self.layers))
        if missing:
            raise ValueError(f"dynamic precision state names layers this model lacks: {missing[:5]}")
        for name, points in bits.items():
            module = self.layers[name]
            fmts = module.precision.formats()
            for p, b in points.items():
                if not isinstance(fmts.get(p), BlockFloat):
                    raise ValueError(f"dynamic precision state has bits for {name}.{p}, which is "
                                     f"{fmts.get(p)!r} in this model, not a BlockFloat")
                if fmts[p].bits != b:
                    module.set_format(p, dataclasses.replace(fmts[p], bits=int(b)))

    # -- callback protocol ------------------------------------------------------------
    def sync_hooks(self) -> None:
        """Hooks only on measured steps: without a hook the layers reuse their
        forward roundings for ``bwi``/``biw`` (same format), so unmeasured steps
        cost what they cost without ``--do``."""
        self.install() if self._measuring else self.remove()

    def on_train_start(self, trainer) -> None:
        self._bind(trainer.model)
        self.sync_hooks()
        path = self._csv_path(trainer)
        if path is not None and path.exists():  # a resumed run: drop decisions not in the checkpoint
            rows = [r for r in read_log(path) if int(r["decision"]) < self.controller.decision]
            _write_csv(path, rows, mode="w")
        managed = sum(len(self._managed(m)) for m in self.layers.values())
        trainer.log(f"dynamic precision: {self.spec} deciding every "
                    f"{'epoch' if self.every == 'epoch' else f'{self.every} steps'} on {managed} "
                    f"BlockFloat pairs of {len(self.layers)} layers"
                    + ("" if managed else "; no BlockFloat points, so ZSE is only logged"))

    def on_epoch_start(self, trainer, epoch) -> None:
        if self._bind(trainer.model):
            trainer.log(f"dynamic precision: the model's layers changed at epoch {epoch}; measuring "
                        f"{len(self.layers)} layers afresh")

    def on_batch_end(self, trainer, step) -> None:
        self._batches += 1
        self._measuring = self._batches % self.spec.sample == 0  # for the next step
        if self.every != "epoch" and self._batches >= self.every:
            self._decide_and_log(trainer)
        self.sync_hooks()

    def on_epoch_end(self, trainer, epoch, metrics) -> None:
        if self.every == "epoch":
            self._decide_and_log(trainer)
        self.sync_hooks()

    def on_train_end(self, trainer) -> None:
        self.remove()

    def on_exception(self, trainer, exc) -> None:
        self.remove()

    def _decide_and_log(self, trainer) -> list[dict[str, Any]]:
        zse = self.point_zse()
        step, epoch = getattr(trainer, "global_step", None), getattr(trainer, "epoch", None)
        rows = self.decide(step=step, epoch=epoch, zse=zse)
        path = self._csv_path(trainer)
        if path is not None:
            _write_csv(path, rows, mode="a")
        writer = getattr(trainer, "writer", None)
        if writer is not None:
            bits = self.bits()
            for name in self.layers:
                for p, b in bits[name].items():
                    writer.add_scalar(f"dynamic_bits/{name}/{p}", b, step)
                for p, z in zse[name].items():
                    writer.add_scalar(f"dynamic_zse/{name}/{p}", z, step)
        table = format_table(rows, self.spec, color=self.color)
        if self.color:  # console only: log.txt gets no escape codes
            _console(table)
        else:
            trainer.log(table)
        return rows

    @staticmethod
    def _csv_path(trainer) -> Optional[Path]:
        run_dir = getattr(trainer, "run_dir", None)
        return None if run_dir is None else Path(run_dir) / CSV_NAME

    def state_dict(self) -> dict[str, Any]:
        """Plain types and one int64 tensor: loads with ``torch.load(weights_only=True)``."""
        return {"version": 1, "spec": str(self.spec), "every": self.every,
                "controller": self.controller.state_dict(), "batches": self._batches,
                "layers": list(self.layers), "bits": self.bits(), "counts": self.counts().clone()}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        if int(d.get("version", 0)) != 1:
            raise ValueError(f"unknown dynamic precision state version {d.get('version')!r}; expected 1")
        if list(d["layers"]) != list(self.layers):
            raise ValueError("dynamic precision state was saved for other layers: "
                             f"{list(d['layers'])[:5]}... vs {list(self.layers)[:5]}...")
        self.controller.load_state_dict(d["controller"])
        self._batches = int(d["batches"])
        self._measuring = self._batches % self.spec.sample == 0
        self._apply_bits(d["bits"])
        counts = d["counts"]
        device = self._acc.device if self._acc is not None else counts.device
        self._acc = counts.to(device=device, dtype=torch.int64).clone()
        self._views.clear()


# -- logs ----------------------------------------------------------------------------

def _console(text: str) -> None:
    try:
        from tqdm import tqdm
        tqdm.write(text)  # keeps an open progress bar intact
    except ImportError:
        print(text, flush=True)


def _write_csv(path: Path, rows: list[dict[str, Any]], mode: str) -> None:
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
        raise ValueError(f"no dynamic precision log at {path}; runs with --do write {CSV_NAME} "
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


if __name__ == "__main__":
    sys.exit(main())
