"""What differs between the scripts on the engine: one ``Task`` per script.

A task names its script, its datasets' defaults and the class count a model
needs before any data is loaded (``--mode generate-config``), and carries its
``hooks`` (``bfp.cli.task_base.TaskHooks``: flags, models, data, callbacks).
Everything else (flags, run assembly, checkpoints, logs) is shared.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .cifar_task import CifarHooks
from .imagenet_task import ImagenetHooks
from .lm_task import LMHooks
from .task_base import TaskHooks


@dataclass(frozen=True)
class Task:
    name: str                       # the `bfp NAME` subcommand
    prog: str                       # the script users run (error messages, --help)
    summary: str                    # one line for `bfp --help`
    description: str
    default_dataset: str
    default_model: str
    default_epochs: int
    epochs_by_dataset: dict[str, int] = field(default_factory=dict)
    classes_by_dataset: dict[str, int] = field(default_factory=dict)
    default_classes: int = 10
    # The script's models, data, flags and callbacks (bfp.cli.task_base.TaskHooks): the
    # only thing bfp.cli.run/main/flags ask about a task beyond the fields above.
    hooks: TaskHooks = field(default_factory=CifarHooks)

    def epochs(self, dataset: str) -> int:
        return self.epochs_by_dataset.get(dataset, self.default_epochs)

    def classes(self, dataset: str) -> int:
        """Class count of ``dataset`` without loading it (for generate-config)."""
        return self.classes_by_dataset.get(dataset, self.default_classes)


CIFAR = Task(
    name="cifar", prog="cifar.py", summary="train a 32x32 classifier (CIFAR-10/100, digits, image folders)",
    description="Train a 32x32 image classifier in FP32, mixed precision or simulated low precision "
                "(block floating point, small floats, MX) and log the run under runs/<name>/.",
    default_dataset="CIFAR10", default_model="ResNet18",
    default_epochs=200, epochs_by_dataset={"digits": 4},   # 200: the original's CIFAR schedule
    classes_by_dataset={"CIFAR100": 100}, hooks=CifarHooks())

IMAGENET = Task(
    name="imagenet", prog="imagenet.py", summary="train a torchvision classifier on an ImageNet-style image folder",
    description="Train a torchvision ImageNet classifier (-a resnet18 ...) on DIR/train and DIR/val class folders "
                "in FP32, mixed precision or simulated low precision, with the PyTorch ImageNet example's flags; "
                "the run is logged under runs/<name>/ as cifar.py's.",
    default_dataset="imagenet", default_model="resnet18",
    default_epochs=90, default_classes=1000, hooks=ImagenetHooks())   # 90: the example's schedule

LM = Task(
    name="lm", prog="lm.py", summary="train a character-level language model (GPT) on text",
    description="Train a small GPT to predict the next character of a text (default: Python standard-library "
                "source, offline) in FP32, mixed precision or simulated low precision; reports loss, bits per "
                "character and next-character accuracy, samples text after each epoch, and logs the run under "
                "runs/<name>/ as cifar.py's.",
    default_dataset="pysrc", default_model="GPT", default_epochs=5, default_classes=128, hooks=LMHooks())

TASKS: dict[str, Task] = {t.name: t for t in (CIFAR, IMAGENET, LM)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    return TASKS[name]
