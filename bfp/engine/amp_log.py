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

from .callbacks import Callback


class LossScaleLog(Callback):
    name = "loss_scale_log"

    def __init__(self):
        self._file = None
        self._skipped_at_epoch_start = 0

    def on_train_start(self, trainer) -> None:
        if trainer.run_dir is not None and trainer.amp.scaler.is_enabled():
            self._file = open(trainer.run_dir / "loss_scale.jsonl", "a", encoding="utf-8")

    def on_epoch_start(self, trainer, epoch: int) -> None:
        self._skipped_at_epoch_start = trainer.amp.scaler.skipped_steps

    def on_batch_end(self, trainer, step: int) -> None:
        s = trainer.amp.scaler
        if not s.is_enabled():
            return
        if trainer.writer is not None:
            trainer.writer.add_scalar("amp/loss_scale", s.scale, step)
            trainer.writer.add_scalar("amp/skipped_steps", s.skipped_steps, step)
        if self._file is not None:
            self._file.write(json.dumps({"step": step, "epoch": trainer.epoch, "scale": s.scale,
                                         "skipped": s.last_skipped}) + "\n")

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        s = trainer.amp.scaler
        if not s.is_enabled():
            return
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
        self._close()

    def on_exception(self, trainer, exc: BaseException) -> None:
        self._close()
