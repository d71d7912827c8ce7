"""What differs between the scripts on the engine: one ``Task`` per script.

A task names its script, its datasets' defaults, the image size its models
are built for and the class count a model needs before any data is loaded
(``--mode generate-config``). Everything else (flags, run assembly,
checkpoints, logs) is shared.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    name: str                       # the `bfp NAME` subcommand
    prog: str                       # the script users run (error messages, --help)
    summary: str                    # one line for `bfp --help`
    description: str
    default_dataset: str
    default_model: str
    image_size: int                 # models get a trial forward of this size before training
    default_epochs: int
    epochs_by_dataset: dict[str, int] = field(default_factory=dict)
    classes_by_dataset: dict[str, int] = field(default_factory=dict)
    default_classes: int = 10

    def epochs(self, dataset: str) -> int:
        return self.epochs_by_dataset.get(dataset, self.default_epochs)

    def classes(self, dataset: str) -> int:
        """Class count of ``dataset`` without loading it (for generate-config)."""
        return self.classes_by_dataset.get(dataset, self.default_classes)


CIFAR = Task(
    name="cifar", prog="cifar.py", summary="train a 32x32 classifier (CIFAR-10/100, digits, image folders)",
    description="Train a 32x32 image classifier in FP32, mixed precision or simulated low precision "
                "(block floating point, small floats, MX) and log the run under runs/<name>/.",
    default_dataset="CIFAR10", default_model="ResNet18", image_size=32,
    default_epochs=200, epochs_by_dataset={"digits": 4},   # 200: the original's CIFAR schedule
    classes_by_dataset={"CIFAR100": 100})

TASKS: dict[str, Task] = {t.name: t for t in (CIFAR,)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    return TASKS[name]
