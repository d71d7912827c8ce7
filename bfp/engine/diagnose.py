"""``--diagnose N`` (and ``--shadow``): measure one training step in every N with ``bfp.diagnostics``."""
from __future__ import annotations

from ..diagnostics import CSV_FIELDS, MEASURES, SHADOW_MEASURES, PointDiagnostics, Shadow, write_csv
from .callbacks import Callback


class DiagnoseCallback(Callback):
    """Arms the measuring hooks before every step whose number is a multiple of ``every``
    (steps count from 1), writes the step's rows to ``<run dir>/diagnostics.csv`` and to
    TensorBoard (``diagnostics/<layer>/<point>/<measure>``), and disarms them. With
    ``shadow`` it also compares every quantized layer with an FP32 copy on the same batch
    (``bfp.diagnostics.shadow``: ``shadow.csv``, ``shadow/<layer>/<measure>``). Keeps no
    state: a resumed run appends to the same files."""

    name = "diagnose"

    def __init__(self, every: int, shadow: bool = False):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"diagnose interval must be a positive integer, got {every!r}")
        self.every, self.use_shadow = every, shadow
        self.diag = None
        self.shadow = Shadow() if shadow else None
        self._criterion = None

    def _arm(self, trainer) -> None:
        self.diag.arm()
        if self.shadow is not None:
            self._criterion = trainer.criterion
            trainer.criterion = self.shadow.arm(trainer.model, self._criterion)

    def on_train_start(self, trainer) -> None:
        self.diag = PointDiagnostics(trainer.model)
        if (trainer.global_step + 1) % self.every == 0:
            self._arm(trainer)

    def on_batch_end(self, trainer, step: int) -> None:
        if self.diag is None:
            return
        if self.diag.armed:
            rows = self.diag.disarm()
            self._write(trainer, "diagnostics.csv", rows, step, MEASURES,
                        lambda r, m: f"diagnostics/{r['layer']}/{r['point']}/{m}")
            if self.shadow is not None:
                trainer.criterion = self._criterion
                srows = self.shadow.compare(self._criterion)
                self._write(trainer, "shadow.csv", srows, step, SHADOW_MEASURES,
                            lambda r, m: f"shadow/{r['layer']}/{m}")
        if (step + 1) % self.every == 0:
            self._arm(trainer)

    @staticmethod
    def _write(trainer, file: str, rows, step: int, measures, tag) -> None:
        if trainer.run_dir is not None and rows:
            fields = CSV_FIELDS if file == "diagnostics.csv" else ("step", "epoch", "layer", *measures)
            write_csv(trainer.run_dir / file, rows, step, trainer.epoch, fields)
        if trainer.writer is not None:
            for r in rows:
                for m in measures:
                    if r[m] is not None:
                        trainer.writer.add_scalar(tag(r, m), r[m], step)

    def on_train_end(self, trainer) -> None:
        if self.diag is not None:
            self.diag.disarm()
        if self.shadow is not None and self._criterion is not None:
            trainer.criterion = self._criterion
            self.shadow.compare(self._criterion)

    def on_exception(self, trainer, exc: BaseException) -> None:
        self.on_train_end(trainer)
