"""The interface every script's task implements (``bfp.cli.tasks.Task.hooks``).

The run assembly (``bfp.cli.run``, ``bfp.cli.main``, ``bfp.cli.flags``) calls these
methods and nothing else that differs between scripts, so a new script is a new
``TaskHooks`` subclass and a ``Task`` entry: no branch in the CLI changes. The
defaults are what a task without the feature does.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

import torch
import torch.nn as nn


class TaskHooks:
    """What differs between ``cifar.py``, ``imagenet.py`` and ``lm.py``."""

    #: how this script's messages spell a flag, where not as ``bfp.cli.param_flags.flag_of`` does
    flag_spellings: dict[str, str] = {}

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Flags beyond the shared ones (``bfp.cli.flags``)."""

    def help_overrides(self) -> dict[str, str]:
        """``dest -> help`` for shared flags whose help says something else for this script
        (``argparse.SUPPRESS`` hides a flag that does not apply)."""
        return {}

    def canonical_model(self, name: str) -> str:
        raise NotImplementedError

    def canonical_dataset(self, name: str) -> str:
        raise NotImplementedError

    def derived(self, args: argparse.Namespace) -> dict[str, Any]:
        """Flag values that follow from the others (``dest -> value``), set before the run's
        specification is frozen (``bfp.cli.spec``); a ValueError names a bad flag value."""
        return {}

    def check_args(self, args: argparse.Namespace) -> None:
        """Raise ValueError naming a bad flag value or combination; changes nothing."""

    def make_model(self, args: argparse.Namespace, num_classes: int, in_channels: int) -> nn.Module:
        raise NotImplementedError

    def example_input(self, args: argparse.Namespace, in_channels: int) -> tuple[torch.Tensor, str]:
        """A batch for the trial forward of a fresh model, and how to name it in an error
        ("32x32 images"): a model built for other inputs fails before training."""
        raise NotImplementedError

    def load_data(self, args: argparse.Namespace, device: torch.device, shard: tuple[int, int, int]):
        """The run's ``DataBundle``; ``shard`` = (rank, world, workers)."""
        raise NotImplementedError

    def callbacks(self, args: argparse.Namespace) -> list:
        """Extra ``bfp.engine.callbacks.Callback`` objects of this task."""
        return []

    def before_run(self, spec) -> Optional[int]:
        """Runs once the run's specification (``bfp.cli.spec.RunSpec``) is built; an exit status
        ends the run there (None: go on)."""
        return None

    def evaluate_only(self, args: argparse.Namespace) -> bool:
        """True when the flags ask for an evaluation, not training (imagenet.py -e)."""
        return False
