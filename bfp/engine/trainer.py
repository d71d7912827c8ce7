"""The training loop: one ``Trainer`` per run, shared by every script on the engine.

It owns the loop, evaluation, the learning-rate schedule (cosine, or thirds), the epoch
plan of network-config/optimizer switches, metrics, checkpoints and the
callbacks. Its collaborators are injected: an optimizer factory
(``bfp.optim``, SGD by default), a mixed-precision policy (``bfp.amp``:
compute dtype and loss scaler) and a step strategy (``bfp.engine.step``: what
one batch does). Everything that makes a run continue bit for bit after a
resume is in ``state_dict()``. Only rank 0 writes (``bfp.engine.ranks``).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from .. import optim
from ..optim import check_hyperparam, set_momentum
from ..amp import MixedPrecision, check_compute_dtype
from ..conversion import conversion_report, convert, load_precision_state, precision_state
from . import checkpoint as ckpt
from . import checkpoint_set
from .callbacks import Callback, CallbackList
from .compiled import Compiler, check_compile_mode
from .logs import RunLog
from .progress import ProgressLines
from .state_fit import check_state_fits
from .ranks import broadcast_buffers, is_main, sum_over_ranks
from .lr_thirds import SCHEDULES, make_schedule
from .schedule import EpochPlan
from .step import PlainStep


class NonFiniteTraining(RuntimeError):
    """Training stopped: weights or the loss stayed NaN/Inf for ``TrainConfig.nonfinite_epochs`` epochs."""


@dataclass
class TrainConfig:
    epochs: int = 200
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    warmup_epochs: float = 0.0
    compute_dtype: str = "fp32"    # fp32, fp16 or bf16 under autocast (bfp.amp); weights stay float32
    label_smoothing: float = 0.0
    save_interval: int = 0         # also keep epoch_<n>.pt every n epochs (0: only last/best)
    histograms: bool = False       # weight histograms in TensorBoard each epoch
    progress: bool = True          # tqdm bar
    lr_schedule: str = "cosine"    # cosine, or thirds: 10x lower at each third of epochs (bfp.engine.lr_thirds)
    nonfinite_epochs: int = 1      # stop after this many non-finite epochs in a row (0: never stop)
    max_steps: int = 0             # end the run after this many optimizer steps in all (0: run every epoch);
    #                                the epoch that reaches it is cut short, evaluated and saved
    sample_unit: str = "img"       # what a target element is, for the throughput line: img, or tok (lm.py)
    compile: str = "none"          # torch.compile mode of the model (bfp.engine.compiled): none, default,
    #                                reduce-overhead, max-autotune; fullgraph, forward and backward

    def __post_init__(self):
        if self.epochs < 1:
            raise ValueError(f"`epochs` must be >= 1, got {self.epochs}")
        check_compute_dtype(self.compute_dtype)
        check_compile_mode(self.compile)
        for name in ("lr", "momentum", "weight_decay"):
            check_hyperparam(name, getattr(self, name))
        for what, v in (("`warmup_epochs`", self.warmup_epochs), ("`save_interval`", self.save_interval)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{what} must be a finite number >= 0, got {v!r}")
        if isinstance(self.nonfinite_epochs, bool) or not isinstance(self.nonfinite_epochs, int) \
                or self.nonfinite_epochs < 0:
            raise ValueError(f"`nonfinite_epochs` must be an integer >= 0 (0: never stop), got {self.nonfinite_epochs!r}")
        if self.warmup_epochs > self.epochs:
            raise ValueError(f"`warmup_epochs` {self.warmup_epochs} exceeds `epochs` {self.epochs}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 0:
            raise ValueError(f"`max_steps` must be an integer >= 0 (0: no limit), got {self.max_steps!r}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"`lr_schedule` {self.lr_schedule!r} unknown; allowed: {', '.join(SCHEDULES)}")
        if not 0.0 <= self.label_smoothing <= 1.0:  # NaN fails too; torch would fail only at the first step
            raise ValueError(f"`label_smoothing` must be in [0, 1], got {self.label_smoothing!r}")


# Network config None: FP32. Float layers stay as they are; Q-layers (a plan switching
# back to FP32) keep their class with quantization off, which computes as plain PyTorch.
FP32_CONFIG = {"version": 1, "default": "full"}


def convert_model(model: nn.Module, config: Any, strict: bool = False) -> nn.Module:
    """``bfp.convert(model, config)``; ``config`` None means FP32 (never strict)."""
    return convert(model, FP32_CONFIG if config is None else config, strict=strict and config is not None)


def topk_correct(logits: torch.Tensor, target: torch.Tensor, ks=(1, 5)) -> list[torch.Tensor]:
    maxk = min(max(ks), logits.size(1))
    hit = logits.topk(maxk, dim=1).indices.eq(target[:, None])
    return [hit[:, :min(k, maxk)].any(dim=1).sum() for k in ks]


class Trainer:
    """Trains ``model`` on ``data`` (a ``bfp.data.DataBundle``).

    ``network_config``: the network config the model was converted with
    (``None``: FP32), recorded so a later switch or a resume knows what is in force.
    ``plan``: epoch-keyed network-config and optimizer changes (``conf_train``).
    ``log``: a ``RunLog`` (prints, and writes the run directory if it has one).
    ``checkpoint_dir``: where ``last.pt``/``best.pt`` go; None saves nothing.
    ``extra_state``: plain values stored in every checkpoint (the CLI's flags).
    ``optimizer_factory``: ``factory(params, config)`` (default ``bfp.optim.sgd``).
    ``amp``: a ``bfp.amp.MixedPrecision`` (default: ``config.compute_dtype`` on ``device``).
    ``step``: the step strategy (default ``bfp.engine.step.PlainStep()``).
    """

    def __init__(self, model: nn.Module, data, config: TrainConfig, *, device: Any = "cpu",
                 log: Optional[RunLog] = None, checkpoint_dir: Optional[Path] = None,
                 callbacks: Iterable[Callback] = (), plan: Optional[EpochPlan] = None,
                 network_config: Any = None, extra_state: Optional[dict] = None, name: str = "",
                 optimizer_factory: optim.OptimizerFactory = optim.sgd,
                 amp: Optional[MixedPrecision] = None, step: Optional[PlainStep] = None):
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.data, self.cfg = data, config
        self.epochs = config.epochs
        self._log = log if log is not None else RunLog(None)
        self.writer = self._log.writer
        self.run_dir = self._log.run_dir
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.callbacks = CallbackList(callbacks)
        self.plan = plan or EpochPlan()
        self.network_config = network_config
        self.extra_state = extra_state or {}
        self._bad_epochs = 0  # non-finite epochs in a row (_stop_or_warn)
        self.name = name
        self.epoch = 0          # epoch being trained (0-based); == epochs when done
        self.global_step = 0    # optimizer steps taken
        self.best_acc = 0.0
        self._estimated = [False]  # the run's length is estimated once (bfp.engine.progress)
        self.history: list[dict[str, float]] = []

        self.optimizer = optimizer_factory(self.model.parameters(), config)
        steps_per_epoch = len(data.train)
        self.schedule = make_schedule(config.lr_schedule, self.optimizer, epochs=config.epochs,
                                      steps_per_epoch=steps_per_epoch,
                                      warmup_steps=round(config.warmup_epochs * steps_per_epoch))
        self.amp = amp if amp is not None else MixedPrecision(config.compute_dtype, self.device.type)
        self.step = step if step is not None else PlainStep()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        self.compiled = Compiler(config.compile)

    # ---- helpers the callbacks use -------------------------------------------------
    def log(self, msg: str) -> None:
        self._log(msg)

    def _config_name(self) -> str:
        if self.network_config is None:
            return "none (FP32)"
        return self.network_config if isinstance(self.network_config, str) else "custom config"

    def describe(self) -> str:
        return (f"{self.name or type(self.model).__name__} on {self.data.name}, "
                f"network config {self._config_name()}, {self.cfg.compute_dtype} compute")

    # ---- precision and optimizer switches -----------------------------------------
    def set_precision(self, config: Any) -> None:
        """Convert the model to network ``config`` (preset name, path or dict) in place,
        keeping weights, optimizer state and the learning-rate schedule."""
        before = [id(p) for p in self.model.parameters()]
        self.model = convert_model(self.model, config).to(self.device)
        self.compiled.reset()  # graphs traced from the old precision are stale
        # bfp.convert swaps layers for Q-layers sharing their Parameters, so the
        # optimizer (and its momentum) goes on updating the model's weights.
        if [id(p) for p in self.model.parameters()] != before:
            raise RuntimeError("conversion replaced the model's parameters; the optimizer would "
                               "keep updating the old ones")
        self.network_config = config
        self.log_precision()

    def log_precision(self) -> None:
        report = self.precision_report()
        if report:
            self.log(report)
            if self.writer is not None:
                self.writer.add_text("precision", "```\n" + report + "\n```", self.epoch)

    def precision_report(self) -> str:
        if self.network_config is None:
            return ""
        return (f"network config {self._config_name()} from epoch {self.epoch + 1}:\n"
                f"{conversion_report(self.model)}")

    def _apply_plan(self, epoch: int) -> None:
        wanted = self.plan.precision_at(epoch, self.network_config)
        if epoch in self.plan.precision and wanted != self.network_config:
            self.log(f"epoch {epoch + 1}/{self.epochs} (plan key {epoch}): switching network config to {wanted!r}")
            self.set_precision(wanted)
        for k, v in self.plan.optimizer.get(epoch, {}).items():
            if k == "lr":
                self.schedule.set_base_lr(v)  # position in the schedule is kept
            elif k == "momentum":
                set_momentum(self.optimizer, v)
            else:
                for g in self.optimizer.param_groups:
                    g[k] = v
            self.log(f"epoch {epoch + 1}/{self.epochs} (plan key {epoch}): optimizer {k} = {v}")

    # ---- the loop ------------------------------------------------------------------
    def fit(self) -> list[dict[str, float]]:
        """Train from ``self.epoch`` to ``self.epochs``; returns every epoch's metrics."""
        try:
            self.callbacks.call("on_train_start", self)
            while self.epoch < self.epochs:
                epoch = self.epoch
                self._apply_plan(epoch)
                self.data.set_epoch(epoch)  # a distributed sampler's shuffle for this epoch
                self.callbacks.call("on_epoch_start", self, epoch)
                metrics = self.train_epoch(epoch)
                metrics.update(self.evaluate())
                bad = self._nonfinite(metrics)
                if not bad:
                    self.best_acc = max(self.best_acc, metrics["test_acc1"])
                self.callbacks.call("on_epoch_end", self, epoch, metrics)
                self._record(epoch, metrics)
                self.epoch = epoch + 1
                if bad:
                    self._stop_or_warn(epoch, bad)
                else:
                    self._bad_epochs = 0
                    self._save(epoch, metrics)
                self.callbacks.call("on_epoch_saved", self, epoch, metrics)
                if self.cfg.max_steps and self.global_step >= self.cfg.max_steps:
                    self.log(f"reached {self.cfg.max_steps} steps (`max_steps`): the run ends after epoch {epoch + 1}")
                    break
            if self.compiled.mode != "none":
                c = self.compiled
                self.log(f"torch.compile ({c.mode}): {c.calls['compiled']} forward calls ran compiled, {c.calls['eager']} "
                         f"eagerly (steps that were measured); graphs dropped for a precision change: {c.resets}")
            self.callbacks.call("on_train_end", self)
        except BaseException as e:
            self.callbacks.call("on_exception", self, e)
            raise
        return self.history

    def _nonfinite(self, metrics: dict[str, float]) -> str:
        """What is not finite after an epoch ('' if nothing): the weights or BatchNorm statistics,
        or, without loss scaling (which skips such steps), the training loss, or the test loss (finite
        weights whose forward overflows: the model cannot be evaluated, so the epoch is not kept)."""
        for name, t in [*self.model.named_parameters(), *self.model.named_buffers()]:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{name} holds NaN or Inf"
        if not self.amp.scaler.is_enabled() and not math.isfinite(metrics["train_loss"]):
            return f"the training loss is {metrics['train_loss']}"
        if not math.isfinite(metrics.get("test_loss", 0.0)):
            return f"the test loss is {metrics['test_loss']} (the weights are finite; the forward overflows)"
        return ""

    def _stop_or_warn(self, epoch: int, what: str) -> None:
        """A non-finite epoch is never saved (the checkpoints keep the last finite one); after
        ``cfg.nonfinite_epochs`` of them in a row the run stops with ``NonFiniteTraining``."""
        self._bad_epochs += 1
        good = epoch - self._bad_epochs + 1  # the last finite epoch (0: none)
        kept = ("no checkpoints are written" if self.checkpoint_dir is None else
                f"checkpoints/last.pt keeps epoch {good}" if good else "no epoch was finite, none is saved")
        line = f"epoch {epoch + 1}: {what}; this epoch is not saved ({kept})"
        limit = self.cfg.nonfinite_epochs
        if limit and self._bad_epochs >= limit:
            raise NonFiniteTraining(f"{line}. Stopped after {self._bad_epochs} non-finite epoch(s) in a row "
                                    f"(`nonfinite_epochs` {limit}): the run diverged. Start again with a lower "
                                    f"`lr`, loss scaling (`loss_scale` dynamic) or wider formats; "
                                    f"`resume` continues from the last finite checkpoint")
        self.log(f"warning: {line}")

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()  # evaluate() left it in eval mode
        model = self.step.prepare(self.compiled.runner(self.model))  # compiled or eager: chosen each step
        loader = self.data.train
        n_seen, n_items, loss_sum = 0, 0, torch.zeros((), device=self.device)
        correct = torch.zeros(2, dtype=torch.long, device=self.device)
        bar = _progress(loader, f"epoch {epoch + 1}/{self.epochs}", self.cfg.progress)
        steps = len(loader) if not self.cfg.max_steps else \
            max(1, min(len(loader), self.cfg.max_steps - self.global_step))
        lines = ProgressLines(self.log, epoch, self.epochs, steps, self.cfg.sample_unit, self.epochs - epoch,
                              self._estimated, enabled=self.cfg.progress and is_main())
        t0 = time.perf_counter()
        for i, (x, y) in enumerate(bar):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            loss, out = self.step(model, x, y, criterion=self.criterion, optimizer=self.optimizer, amp=self.amp)
            self.schedule.step()
            self.global_step += 1
            with torch.no_grad():
                loss_sum += loss * len(y)
                correct += torch.stack(topk_correct(out, y))
            n_seen += len(y)
            n_items += y.numel()  # images, or tokens for a language model's (N, T) targets
            self.callbacks.call("on_batch_end", self, self.global_step)
            lines.step(i + 1, n_items)
            if self.cfg.max_steps and self.global_step >= self.cfg.max_steps:
                break
            if bar is not loader and (i % 10 == 0 or i == len(loader) - 1):  # .item() syncs: not every step
                dt = time.perf_counter() - t0
                bar.set_postfix(loss=f"{loss_sum.item() / n_seen:.4f}",
                                acc=f"{100 * correct[0].item() / n_seen:.2f}%",
                                **{f"{self.cfg.sample_unit}_s": f"{n_items / max(dt, 1e-9):.0f}"}, refresh=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        acc = (100.0 * correct.double() / max(1, n_seen)).tolist()
        return {"train_loss": loss_sum.item() / max(1, n_seen), "train_acc1": acc[0], "train_acc5": acc[1],
                "lr": self.schedule.get_last_lr()[0], "images_per_s": n_items / max(dt, 1e-9),
                "epoch_time_s": dt}

    @torch.no_grad()
    def evaluate(self, loader=None) -> dict[str, float]:
        """Loss and accuracy on ``loader`` (default the test set); in a distributed run each
        rank evaluates its shard and the sums are added over ranks."""
        self.model.eval()
        broadcast_buffers(self.model)
        loader = loader if loader is not None else self.data.test
        n, loss_sum = 0, torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros(2, dtype=torch.long, device=self.device)
        for x, y in loader:
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            with self.amp.autocast():
                out = self.compiled(self.model)(x).float()
            loss_sum += F.cross_entropy(out, y, reduction="sum").double()
            correct += torch.stack(topk_correct(out, y))
            n += len(y)
        totals = sum_over_ranks(torch.cat([torch.tensor([n], device=self.device), correct]).double())
        loss_sum = sum_over_ranks(loss_sum)
        n, correct = int(totals[0].item()), totals[1:]
        acc = (100.0 * correct / max(1, n)).tolist()
        return {"test_loss": loss_sum.item() / max(1, n), "test_acc1": acc[0], "test_acc5": acc[1]}

    def _record(self, epoch: int, m: dict[str, float]) -> None:
        self.history.append({"epoch": epoch, **m})
        self.log(f"epoch {epoch + 1}/{self.epochs}: train loss {m['train_loss']:.4f} "
                 f"acc {m['train_acc1']:.2f}% | test loss {m['test_loss']:.4f} acc {m['test_acc1']:.2f}% "
                 f"top5 {m['test_acc5']:.2f}% (best {self.best_acc:.2f}%) | lr {m['lr']:.5f} | "
                 f"{m['images_per_s']:.0f} {self.cfg.sample_unit}/s, {m['epoch_time_s']:.1f} s")
        self._log.metrics({"epoch": epoch, "global_step": self.global_step, **m})
        w = self.writer
        if w is not None:
            step = epoch + 1
            for split in ("train", "test"):
                w.add_scalar(f"loss/{split}", m[f"{split}_loss"], step)
                w.add_scalar(f"accuracy/{split}_top1", m[f"{split}_acc1"], step)
                w.add_scalar(f"accuracy/{split}_top5", m[f"{split}_acc5"], step)
            w.add_scalar("lr", m["lr"], step)
            w.add_scalar("throughput/images_per_s", m["images_per_s"], step)
            w.add_scalar("throughput/epoch_time_s", m["epoch_time_s"], step)
            if self.cfg.histograms:
                for n, p in self.model.named_parameters():
                    w.add_histogram(f"weights/{n}", p.detach().float().cpu(), step)
            w.flush()

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        layers = precision_state(self.model)  # every Q-layer, callbacks' changes included
        return {
            "epoch": self.epoch, "global_step": self.global_step, "best_acc": self.best_acc,
            **self._model_and_optimizer(),
            "schedule": self.schedule.state_dict(), "scaler": self.amp.state_dict(),
            "rng": ckpt.rng_state({"data": self.data.generator}),
            "network_config": self.network_config, "precision_state": layers,
            "callbacks": self.callbacks.state_dict(), "history": self.history,
            "config": asdict(self.cfg), "extra": self.extra_state,
        }

    def _model_and_optimizer(self) -> dict[str, Any]:
        """The model's and optimizer's state, whole: a sharding step (``--fsdp``) gathers it from
        every rank (``step.full_state``, a collective), otherwise the modules' own."""
        full = getattr(self.step, "full_state", None)
        model, optimizer = full(self.model, self.optimizer) if full is not None else \
            (self.model.state_dict(), self.optimizer.state_dict())
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a run; the model must already be converted with ``state['network_config']``. The
        model's and optimizer's states are checked entry by entry first (``state_fit``): one that does
        not fit is refused before anything is loaded."""
        check_state_fits(self.model, self.optimizer, state["model"], state["optimizer"])
        load = getattr(self.step, "load_full_state", None)
        if load is not None:  # --fsdp: each rank takes its shards of the whole state
            load(self.model, self.optimizer, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        saved = state.get("precision_state")
        if saved is not None and saved != precision_state(self.model):  # layers changed since conversion (--do, -tc)
            load_precision_state(self.model, saved)
        self.schedule.load_state_dict(state["schedule"])
        self.amp.load_state_dict(state["scaler"])
        self.callbacks.load_state_dict(state["callbacks"])
        self.epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        self.best_acc, self.history = float(state["best_acc"]), list(state["history"])
        self.network_config = state["network_config"]
        ckpt.set_rng_state(state["rng"], {"data": self.data.generator})  # last: nothing after may draw

    def _save(self, epoch: int, metrics: dict[str, float]) -> None:
        sharded = hasattr(self.step, "full_state")  # gathering the state is a collective: every rank takes part
        if self.checkpoint_dir is None or not (sharded or is_main()):
            return
        state = self.state_dict()
        if not is_main():
            return
        # epoch_NNN.pt and best.pt first, last.pt last: a crash in between is repaired by
        # the resume, which trains this epoch again (bfp.engine.checkpoint_set)
        checkpoint_set.write_set(state, self.checkpoint_dir,
                                 best=metrics["test_acc1"] >= self.best_acc,
                                 periodic=bool(self.cfg.save_interval) and (epoch + 1) % self.cfg.save_interval == 0)


def _progress(loader, desc: str, enabled: bool):
    if not enabled or not is_main():
        return loader
    return tqdm(loader, desc=desc, leave=False, dynamic_ncols=True, disable=None)
