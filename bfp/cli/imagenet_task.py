"""What ``imagenet.py`` changes on the shared engine: its flags, models, data and launch.

``bfp.cli.tasks.IMAGENET``'s hooks (``bfp.cli.task_base.TaskHooks``) give the run
assembly (``bfp.cli.run``) imagenet.py's parts where ``cifar.py`` has its own: torchvision architectures instead of ``bfp.models``, the ImageNet
image-folder data of ``bfp.data.imagenet`` at ``--image-size``, the
example's distributed flags turned into the environment
(``bfp.cli.dist_launch``). Everything else (checkpoints, resume, logs,
TensorBoard, Slack, precision schedules, dynamic precision) is cifar.py's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

import torch
import torch.nn as nn

from ..dynamic import parse_spec
from ..engine import checkpoint as ckpt
from ..engine.callbacks import Callback
from ..data.imagenet import load_imagenet
from ..models import torchvision_models as tv
from . import dist_launch, imagenet_flags
from .task_base import TaskHooks


class PrintFreq(Callback):
    """``-p N``: a log line every N training steps (step, epoch, learning rate, steps/s)."""

    name = "print_freq"

    def __init__(self, every: int):
        self.every, self._last = every, None

    def on_batch_end(self, trainer, step: int) -> None:
        if step % self.every:
            return
        now = time.perf_counter()
        rate = f", {self.every / (now - self._last[1]):.2f} steps/s" if self._last else ""
        self._last = (step, now)
        trainer.log(f"step {step} (epoch {trainer.epoch + 1}/{trainer.epochs}): "
                    f"lr {trainer.schedule.get_last_lr()[0]:.6f}{rate}")


class ImagenetHooks(TaskHooks):
    """The hooks ``bfp.cli.run`` and ``bfp.cli.main`` call for ``imagenet.py``."""

    flag_spellings = {"dataset_path": "--data", "model": "-a/--arch"}

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        imagenet_flags.add_flags(parser)

    def canonical_model(self, name: str) -> str:
        return tv.canonical_name(name)

    def canonical_dataset(self, name: str) -> str:
        if str(name).lower() not in ("imagenet", "imagefolder"):
            raise ValueError(f"--dataset {name!r}: imagenet.py reads an image-folder tree; allowed: imagenet "
                             f"(give the tree as DIR, --data or -dp)")
        return "imagenet"

    def derived(self, args: argparse.Namespace) -> dict[str, Any]:
        if not args.do or "do_every" in args.explicit:
            return {}
        try:
            spec = parse_spec(args.do)
        except ValueError as e:
            raise ValueError(f"--do {args.do}: {e}") from None
        return {"do_every": imagenet_flags.DO_EVERY} if spec.every is None else {}  # the original's interval

    def check_args(self, args: argparse.Namespace) -> None:
        if args.image_size < 8:
            raise ValueError(f"--image-size must be >= 8, got {args.image_size}")
        if args.print_freq < 0:
            raise ValueError(f"--print-freq must be >= 0 (0: off), got {args.print_freq}")
        if args.gpu_data:
            raise ValueError("--gpu-data keeps a whole dataset on the device; ImageNet-size data does not "
                             "fit: leave it out")
        if args.in_channels != 3:
            raise ValueError(f"--in-channels {args.in_channels}: imagenet.py images have 3 channels")
        if args.evaluate and not (args.resume or args.pretrained):
            raise ValueError("-e/--evaluate needs weights: --resume RUN_OR_CHECKPOINT or --pretrained [PATH]")

    def example_input(self, args: argparse.Namespace, in_channels: int) -> tuple[torch.Tensor, str]:
        s = args.image_size
        return torch.zeros(2, in_channels, s, s), f"{s}x{s} images"

    def evaluate_only(self, args: argparse.Namespace) -> bool:
        return bool(args.evaluate)

    def make_model(self, args: argparse.Namespace, num_classes: int, in_channels: int) -> nn.Module:
        model = tv.create(args.model, num_classes)
        if args.pretrained:
            file = tv.pretrained_file(args.model, None if args.pretrained == "default" else args.pretrained)
            try:
                state, note = ckpt.read_weights(file)
            except ckpt.CheckpointError as e:
                raise ValueError(f"--pretrained {e}") from None
            print(tv.apply_pretrained(model, args.model, state, file) + note)
        return model

    def load_data(self, args: argparse.Namespace, device: torch.device, shard: tuple[int, int, int]):
        return load_imagenet(args.dataset_path, args.image_size, batch_size_train=args.batch_size_train,
                             batch_size_test=args.batch_size_test, num_workers=args.num_workers,
                             device=device, seed=args.seed, limit_train=args.limit_train_images,
                             limit_test=args.limit_test_images, strict_images=args.strict_images, shard=shard)

    def callbacks(self, args: argparse.Namespace) -> list[Callback]:
        return [PrintFreq(args.print_freq)] if args.print_freq else []

    def before_run(self, spec) -> Optional[int]:
        """Distributed flags: set this process's environment, or spawn the workers and
        return their exit status (``None``: go on and run here)."""
        args = spec.args
        if os.environ.get(dist_launch.SPAWNED) or not dist_launch.is_distributed(args):
            return None
        node = dist_launch.node_args(args)
        if not args.multiprocessing_distributed:
            os.environ.update(dist_launch.dist_env(**node, environ=os.environ))
            return None
        nprocs = args.nprocs or torch.cuda.device_count()
        if nprocs < 1:
            raise ValueError("--multiprocessing-distributed: no GPU visible; give --nprocs N to start N "
                             "CPU workers")
        command = [sys.executable, "-c", "import sys; from bfp.cli import run_task; "
                   f"sys.exit(run_task({spec.task.name!r}, sys.argv[1:]))", *spec.argv]
        return dist_launch.spawn(command, nprocs, node)
