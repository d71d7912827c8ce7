"""bfpsim inside other people's training loops: the rounded gradient all-reduce installed by a
PyTorch Lightning callback (``bfp.integrations.lightning``) or a Hugging Face ``Trainer`` callback
(``bfp.integrations.hf_trainer``). Each registers ``bfp.distributed.hook.rounded_allreduce_hook``
on the DDP module the framework built, on any device (Lightning registers a strategy's
``ddp_comm_hook`` on CUDA only and ignores it elsewhere, silently), and checks at the first
optimizer step that the hook reduced the gradients: a run that would average them in float32
while its user believes a low-precision all-reduce is simulated stops with the reason.

Each module imports its framework (``lightning``, ``transformers``) when it is imported; neither
is needed by the rest of bfpsim.
"""
from __future__ import annotations

from typing import Union

from ..distributed.reduce import RoundedReduce
from ..formats import Format, format_from_name

__all__ = ["as_reduce"]


def as_reduce(reduce: Union[RoundedReduce, Format, str]) -> RoundedReduce:
    """A ``RoundedReduce``; a format or a format name gives one with its defaults (the sequential
    order, the mean divided before the sum)."""
    if isinstance(reduce, RoundedReduce):
        return reduce
    if isinstance(reduce, str):
        reduce = format_from_name(reduce)
    if not isinstance(reduce, Format):
        raise TypeError(f"the reduction must be a RoundedReduce, a Format or a format name, got "
                        f"{type(reduce).__name__}")
    return RoundedReduce(reduce)
