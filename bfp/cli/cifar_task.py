"""``cifar.py``'s parts on the shared engine: ``bfp.models`` at 32x32, ``bfp.data.cifar``."""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

from .. import models
from ..data import cifar as data_mod
from .task_base import TaskHooks


class CifarHooks(TaskHooks):
    """CIFAR-10/100, digits and image folders; the models of ``bfp.models``."""

    image_size = 32

    def canonical_model(self, name: str) -> str:
        return models.canonical_name(name)

    def canonical_dataset(self, name: str) -> str:
        return data_mod.canonical_name(name)

    def make_model(self, args: argparse.Namespace, num_classes: int, in_channels: int) -> nn.Module:
        return models.create(args.model, num_classes, in_channels, **dict(args.model_opt))

    def example_input(self, args: argparse.Namespace, in_channels: int) -> tuple[torch.Tensor, str]:
        s = self.image_size
        return torch.zeros(2, in_channels, s, s), f"{s}x{s} images"

    def load_data(self, args: argparse.Namespace, device: torch.device, shard: tuple[int, int, int]):
        return data_mod.load(args.dataset, args.dataset_path, batch_size_train=args.batch_size_train,
                             batch_size_test=args.batch_size_test, num_workers=args.num_workers,
                             device=device, gpu_data=args.gpu_data, seed=args.seed, channels=args.in_channels,
                             limit_train=args.limit_train_images, limit_test=args.limit_test_images,
                             strict_images=args.strict_images, rank=shard[0], world=shard[1],
                             workers=shard[2])
