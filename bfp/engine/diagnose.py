"""``--diagnose N``: measure one training step in every N with ``bfp.diagnostics``."""
from __future__ import annotations

from ..diagnostics import MEASURES, PointDiagnostics, write_csv
from .callbacks import Callback


class DiagnoseCallback(Callback):
    """Arms the measuring hooks before every step whose number is a multiple of ``every``
    (steps count from 1), writes the step's rows to ``<run dir>/diagnostics.csv`` and to
    TensorBoard, and disarms them. Keeps no state: a resumed run appends to the same file."""

    name = "diagnose"

    def __init__(self, every: int):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"diagnose interval must be a positive integer, got {every!r}")
        self.every = every
        self.diag = None
        self.rows_written = 0

    def on_train_start(self, trainer) -> None:
        self.diag = PointDiagnostics(trainer.model)
        if (trainer.global_step + 1) % self.every == 0:
            self.diag.arm()

    def on_batch_end(self, trainer, step: int) -> None:
        if self.diag is None:
            return
        if self.diag.armed:
            rows = self.diag.disarm()
            if trainer.run_dir is not None and rows:
                write_csv(trainer.run_dir / "diagnostics.csv", rows, step, trainer.epoch)
                self.rows_written += len(rows)
            if trainer.writer is not None:
                for r in rows:
                    for m in MEASURES:
                        if r[m] is not None:
                            trainer.writer.add_scalar(f"diagnostics/{r['layer']}/{r['point']}/{m}", r[m], step)
        if (step + 1) % self.every == 0:
            self.diag.arm()

    def on_train_end(self, trainer) -> None:
        if self.diag is not None:
            self.diag.disarm()

    def on_exception(self, trainer, exc: BaseException) -> None:
        self.on_train_end(trainer)
