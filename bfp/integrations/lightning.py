"""``RoundedAllReduce``: a PyTorch Lightning callback that simulates a low-precision gradient
all-reduce under ``DDPStrategy`` on any device.

    trainer = L.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), accelerator="cpu", devices=2,
                        callbacks=[RoundedAllReduce("e4m3")])

At ``on_fit_start`` (the model is wrapped in DDP by then) it registers
``bfp.distributed.hook.rounded_allreduce_hook`` with ``reduce`` (a ``RoundedReduce``, a format or
its name) on the strategy's DDP module; before the first optimizer step it checks that the hook
reduced a bucket (``check_hook_ran``). Not ``DDPStrategy(ddp_comm_hook=...)``: Lightning registers
that on CUDA only, and a CPU run would average in float32 with no word. A strategy that is not DDP
(one device, FSDP, DeepSpeed) is refused at ``on_fit_start``; so is a DDP module that already has
a hook. ``state`` (after ``on_fit_start``) is the hook's ``RoundedHookState``. The callback is
made for ``lightning.pytorch`` when the ``lightning`` package is installed, else for
``pytorch_lightning`` (``pl`` here is the one in use: a Trainer takes only its own callbacks).
"""
from __future__ import annotations

from typing import Optional, Union

try:  # the "lightning" package, else the same framework as "pytorch-lightning"
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

from ..distributed.hook import RoundedHookState, check_hook_ran, install_rounded_hook
from ..distributed.reduce import RoundedReduce
from ..formats import Format
from . import as_reduce

__all__ = ["RoundedAllReduce", "pl"]


class RoundedAllReduce(pl.Callback):
    def __init__(self, reduce: Union[RoundedReduce, Format, str]):
        self.reduce = as_reduce(reduce)
        self.state: Optional[RoundedHookState] = None
        self._checked = False

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        try:
            self.state = install_rounded_hook(trainer.strategy.model, self.reduce)
        except ValueError as e:
            raise ValueError(f"RoundedAllReduce under {type(trainer.strategy).__name__}: {e}") from None
        self._checked = False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self._checked and self.state is not None:
            self._checked = True  # after the first step's backward: its buckets are reduced by now
            check_hook_ran(self.state, "RoundedAllReduce")
