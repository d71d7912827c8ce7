"""MLP-Mixer (Tolstikhin et al. 2021) sized for 32x32 inputs.

Names: ``stem`` (patch-embedding conv), ``blocks.<i>.{norm1, token_mlp.fc1,
token_mlp.fc2, norm2, channel_mlp.fc1, channel_mlp.fc2}``, ``norm``, ``head``.
Every GEMM is an ``nn.Linear`` (or the stem ``nn.Conv2d``) so conversion can
swap it for a quantized layer.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self, num_patches: int, dim: int, token_hidden: int, channel_hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = Mlp(num_patches, token_hidden)
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = Mlp(dim, channel_hidden)

    def forward(self, x):  # x: [N, patches, dim]
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 patch_size: int = 4, dim: int = 256, depth: int = 8,
                 token_hidden: int = 128, channel_hidden: int = 1024):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        num_patches = (image_size // patch_size) ** 2
        self.stem = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.blocks = nn.Sequential(*[MixerBlock(num_patches, dim, token_hidden, channel_hidden)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))
