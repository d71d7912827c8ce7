"""``DynamicPrecision``: dynamic precision control of a converted model, as a
training callback (``bfp.engine.callbacks.Callback``).

It sits above the engine as a plug-in: the engine calls it at batch and epoch
ends without knowing it. It decides which steps are measured (``ZseMeter``
counts them), when to decide (``SimpleController`` on each linked pair's
ZSE), swaps the layers' BlockFloat bits, logs each decision (``report``) and
saves all of that in checkpoints.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch

from ..engine.callbacks import Callback
from ..precision import LINKED_PAIRS, LayerPrecision
from .controller import SimpleController
from .meter import ZseMeter
from .report import CSV_NAME, console, format_table, read_log, write_csv
from .spec import SimpleSpec, ladder_step, pair_name, parse_every, parse_spec


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
        self.color = _parse_bool(color, "`color`")
        every = parse_every(every, "`every`")
        if self.spec.every is not None and every not in (None, "epoch", self.spec.every):
            raise ValueError(f"decision interval given twice: the `spec` says every "
                             f"{self.spec.every!r}, `every` says {every!r}; give one")
        self.every = self.spec.every or every or "epoch"
        self.controller = SimpleController(self.spec)
        self._batches = 0  # training steps since the last decision
        self._measuring = True  # whether the step under way is counted (spec.sample)
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
        old = getattr(self, "meter", None)
        if old is not None and list(old.layers) == list(layers) and all(
                old.layers[n] is m for n, m in layers.items()):
            return False
        installed = old is not None and old.installed
        if old is not None:
            old.remove()
        self.model, self.layers = model, layers
        self.meter = ZseMeter(layers, active=lambda: self._measuring)
        if installed:
            self.meter.install()
        return old is not None

    # -- measuring (delegated to the meter) ----------------------------------------------
    def install(self) -> None:
        """Set the quantize hook on every managed layer (idempotent)."""
        self.meter.install()

    def remove(self) -> None:
        """Give the layers back the hooks they had before ``install``."""
        self.meter.remove()

    def counts(self) -> torch.Tensor:
        """Counts since the last decision on the host: int64 [layers, 9 points, (nonzero, zeroed)]."""
        return self.meter.counts()

    def global_counts(self) -> torch.Tensor:
        """``counts()`` summed over all processes under ``torch.distributed`` (see ``ZseMeter``)."""
        return self.meter.global_counts()

    def point_zse(self, counts: Optional[torch.Tensor] = None) -> dict[str, dict[str, float]]:
        """ZSE per layer and measured point since the last decision (all processes)."""
        return self.meter.point_zse(counts)

    def _reset_counts(self) -> None:
        self.meter.reset()
        self._batches = 0
        self._measuring = True

    # -- deciding -------------------------------------------------------------------
    def _managed(self, module) -> dict[str, tuple[str, ...]]:
        """Pair name -> its BlockFloat points, for pairs holding at least one."""
        fmts = module.precision.formats()
        out = {}
        for pair in LINKED_PAIRS:
            pts = tuple(p for p in pair if fmts[p] is not None and fmts[p].adjustable_bits is not None)
            if pts:
                out[pair_name(pair)] = pts
        return out

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
                observations[key] = (pair_zse, fmts[pts[0]].adjustable_bits)
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
                    module.set_format(p, fmt.with_bits(ladder_step(fmt.adjustable_bits, direction,
                                                                   self.spec.ladder)))
            rows.append({"decision": decision, "step": step, "epoch": epoch, "layer": name, "pair": pname,
                         "zse": pair_zse, "old_bits": old, "new_bits": new_bits[key]})
        self._reset_counts()
        return rows

    def bits(self) -> dict[str, dict[str, int]]:
        """Current bits of every BlockFloat point of the managed layers."""
        return {name: {p: f.adjustable_bits for p, f in m.precision.formats().items()
                       if f is not None and f.adjustable_bits is not None}
                for name, m in self.layers.items()}

    def _apply_bits(self, bits: Mapping[str, Mapping[str, int]]) -> None:
        missing = sorted(set(bits) - set(self.layers))
        if missing:
            raise ValueError(f"dynamic precision state names layers this model lacks: {missing[:5]}")
        for name, points in bits.items():
            module = self.layers[name]
            fmts = module.precision.formats()
            for p, b in points.items():
                fmt = fmts.get(p)
                if fmt is None or fmt.adjustable_bits is None:
                    raise ValueError(f"dynamic precision state has bits for {name}.{p}, which is "
                                     f"{fmt!r} in this model, not a BlockFloat")
                if fmt.adjustable_bits != b:
                    module.set_format(p, fmt.with_bits(b))

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
            write_csv(path, rows, mode="w")
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
            if self._last_step(trainer, step):
                self._skip_final_decision(trainer, f"after the last training step ({step})")
            else:
                self._decide_and_log(trainer)
        self.sync_hooks()

    def on_epoch_end(self, trainer, epoch, metrics) -> None:
        if self.every == "epoch":
            epochs = getattr(trainer, "epochs", None)  # None: a trainer stand-in without a length
            if epochs is not None and epoch == epochs - 1:
                self._skip_final_decision(trainer, f"at the end of the last epoch ({epoch + 1})")
            else:
                self._decide_and_log(trainer)
        self.sync_hooks()

    @staticmethod
    def _last_step(trainer, step) -> bool:
        """Whether ``step`` is the run's last training step (a trainer without a
        schedule, as in tests driving the callback by hand, has none)."""
        schedule = getattr(trainer, "schedule", None)
        return schedule is not None and step == schedule.total_steps

    def _skip_final_decision(self, trainer, where: str) -> None:
        """No decision where training ends: no training step would ever use its
        bits, and an every-N decision after the last step would only change the
        formats of the final evaluation. The counts stay pending (as in a
        checkpoint between decisions) and the log says why nothing was decided."""
        trainer.log(f"dynamic precision: no decision {where}: no training step would use its bits")

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
            write_csv(path, rows, mode="a")
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
            console(table)
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
        self.meter.load_counts(d["counts"])
