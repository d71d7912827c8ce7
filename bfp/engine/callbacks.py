"""Hooks into the training loop for code that watches or steers a run
(the dynamic precision controller ``bfp.dynamic``, Slack messages ...).

A callback sees the ``Trainer`` and may use ``trainer.model``,
``trainer.writer`` (a TensorBoard ``SummaryWriter`` or ``None``),
``trainer.run_dir`` (``None`` when nothing is written), ``trainer.log(msg)``,
``trainer.global_step`` (optimizer steps taken so far) and ``trainer.epoch``
(the epoch being trained, from 0).

Its ``state_dict()`` is saved in every checkpoint under its ``name`` and handed
back to ``load_state_dict`` on resume, so a callback with state (counters,
running means, hold timers) continues exactly where it stopped. Keep that state
to plain Python values and tensors: checkpoints load with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

from typing import Any, Iterable


class Callback:
    """Base class: every hook is a no-op; override the ones you need."""

    #: Key of this callback's state in checkpoints; unique within a run.
    name: str = "callback"

    def on_train_start(self, trainer) -> None:
        """Once, before the first epoch trained in this process (also after a resume)."""

    def on_epoch_start(self, trainer, epoch: int) -> None:
        """Before epoch ``epoch`` (from 0) trains."""

    def on_batch_end(self, trainer, step: int) -> None:
        """After optimizer step ``step`` (= ``trainer.global_step``, from 1)."""

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        """After epoch ``epoch`` trained and was evaluated, before its checkpoint.

        ``metrics``: ``train_loss, train_acc1, train_acc5, test_loss, test_acc1,
        test_acc5, lr, images_per_s, epoch_time_s``."""

    def on_epoch_saved(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        """After the epoch is recorded and its checkpoints are written (slow extras, such as
        sampling text, go here, so a kill during them loses nothing)."""

    def on_train_end(self, trainer) -> None:
        """Once, after the last epoch."""

    def on_exception(self, trainer, exc: BaseException) -> None:
        """When training stops on an exception (including KeyboardInterrupt); it is re-raised."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"callback {self.name!r} keeps no state but the checkpoint has {sorted(state)}")


class CallbackList:
    """Calls every callback in order; names must be unique (they key checkpoint state)."""

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks = list(callbacks)
        names = [c.name for c in self.callbacks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"callback names must be unique, repeated: {dup}")

    def __iter__(self):
        return iter(self.callbacks)

    def call(self, hook: str, *args) -> None:
        for c in self.callbacks:
            getattr(c, hook)(*args)

    def state_dict(self) -> dict[str, dict]:
        return {c.name: c.state_dict() for c in self.callbacks}

    def load_state_dict(self, states: dict[str, dict]) -> None:
        """Restore each callback that has saved state; a callback new to the run starts fresh,
        and non-empty saved state with no callback to take it is an error (it would be lost)."""
        names = {c.name for c in self.callbacks}
        orphans = sorted(n for n, st in states.items() if n not in names and st)
        if orphans:
            raise ValueError(f"checkpoint holds state of callbacks {orphans} that this run does not "
                             f"have (this run has: {sorted(names) or 'none'}); give it the same callbacks as "
                             f"the interrupted run (dynamic precision `spec`, `slackbot`)")
        for c in self.callbacks:
            if c.name in states:
                c.load_state_dict(states[c.name])
