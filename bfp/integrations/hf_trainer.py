"""``RoundedAllReduceCallback``: a Hugging Face ``Trainer`` callback that simulates a
low-precision gradient all-reduce when the Trainer runs under DDP (torchrun, any device).

    trainer = Trainer(model, TrainingArguments(..., ddp_backend="gloo"), train_dataset=...)
    trainer.add_callback(RoundedAllReduceCallback(trainer, "e4m3"))

At ``on_train_begin`` (after the Trainer wrapped the model) it registers
``bfp.distributed.hook.rounded_allreduce_hook`` with ``reduce`` (a ``RoundedReduce``, a format or
its name) on ``trainer.model_wrapped``, and at the first optimizer step it checks that the hook
reduced a bucket (``check_hook_ran``). It needs the Trainer itself: the callback interface hands
callbacks the unwrapped model only. A single process (no DDP module) and a DDP module with a hook
already are refused at ``on_train_begin``. ``state`` is the hook's ``RoundedHookState``.
"""
from __future__ import annotations

from typing import Optional, Union

from transformers import TrainerCallback

from ..distributed.hook import RoundedHookState, check_hook_ran, install_rounded_hook
from ..distributed.reduce import RoundedReduce
from ..formats import Format
from . import as_reduce

__all__ = ["RoundedAllReduceCallback"]


class RoundedAllReduceCallback(TrainerCallback):
    def __init__(self, trainer, reduce: Union[RoundedReduce, Format, str]):
        self.trainer = trainer
        self.reduce = as_reduce(reduce)
        self.state: Optional[RoundedHookState] = None
        self._checked = False

    def on_train_begin(self, args, state, control, **kwargs):
        try:
            self.state = install_rounded_hook(self.trainer.model_wrapped, self.reduce)
        except ValueError as e:
            raise ValueError(f"RoundedAllReduceCallback: {e}") from None
        self._checked = False

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not self._checked and self.state is not None:
            self._checked = True
            check_hook_ran(self.state, "RoundedAllReduceCallback")
