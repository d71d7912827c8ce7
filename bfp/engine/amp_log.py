"""Callback: the loss scale and skipped steps of every step, to TensorBoard and ``loss_scale.jsonl``.

Per optimizer step (only while the run scales its loss): TensorBoard scalars
``amp/loss_scale`` (the scale the *next* step uses, i.e. after this step's
update) and ``amp/skipped_steps`` (run total), and one line
``{"step", "epoch", "scale", "skipped"}`` in ``run_dir/loss_scale.jsonl``
(rank 0, with ``--log``). Per epoch it adds ``loss_scale`` (at the epoch's end)
and ``skipped_steps`` (in that epoch) to the epoch's metrics, so they reach
``metrics.jsonl`` and the console line.

Reads ``trainer.amp.scaler`` only: its state, with the run total of skipped
steps, is checkpointed by the Trainer, so this callback keeps none.
"""
from __future__ import annotations

import json
from typing import Optional

import torch

from .callbacks import Callback


class LossScaleLog(Callback):
    name = "loss_scale_log"

    def __init__(self):
        self._file = None
        self._skipped_at_epoch_start = 0
        self._pending: list = []  # (step, epoch, scaler.snapshot()) not written yet

    def on_train_start(self, trainer) -> None:
        if trainer.run_dir is not None and trainer.amp.scaler.is_enabled():
            self._file = open(trainer.run_dir / "loss_scale.jsonl", "a", encoding="utf-8")

    def on_epoch_start(self, trainer, epoch: int) -> None:
        self._skipped_at_epoch_start = trainer.amp.scaler.skipped_steps

    def on_batch_end(self, trainer, step: int) -> None:
        s = trainer.amp.scaler
        if not s.is_enabled() or (trainer.writer is None and self._file is None):
            return
        # a scaler deciding on the device (--cuda-graph) gives tensors: written at the epoch's end,
        # one read of the device an epoch instead of one a step
        self._pending.append((step, trainer.epoch, s.snapshot()))
        if not isinstance(self._pending[-1][2][0], torch.Tensor):
            self._write(trainer)

    def _write(self, trainer) -> None:
        for step, epoch, (scale, skipped_steps, last) in self._pending:
            scale, skipped_steps, last = float(scale), int(skipped_steps), bool(last)
            if trainer.writer is not None:
                trainer.writer.add_scalar("amp/loss_scale", scale, step)
                trainer.writer.add_scalar("amp/skipped_steps", skipped_steps, step)
            if self._file is not None:
                self._file.write(json.dumps({"step": step, "epoch": epoch, "scale": scale, "skipped": last}) + "\n")
        self._pending = []

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        s = trainer.amp.scaler
        if not s.is_enabled():
            return
        self._write(trainer)
        skipped = s.skipped_steps - self._skipped_at_epoch_start
        metrics["loss_scale"] = s.scale
        metrics["skipped_steps"] = skipped
        if self._file is not None:
            self._file.flush()
        trainer.log(f"epoch {epoch + 1}: loss scale {s.scale:g}, {skipped} step(s) skipped for overflow "
                    f"({s.skipped_steps} in the run)")

    def _close(self) -> None:
        f: Optional[object] = self._file
        self._file = None
        if f is not None:
            f.close()

    def on_train_end(self, trainer) -> None:
        self._write(trainer)
        self._close()

    def on_exception(self, trainer, exc: BaseException) -> None:
        self._pending = []  # the device may be what failed: what is pending is not read
        self._close()
