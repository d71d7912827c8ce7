"""A small Vision Transformer (Dosovitskiy et al. 2021) for 32x32 images, patch 4.

Names: ``stem`` (patch-embedding conv), ``blocks.<i>.{norm1, attn.qkv, attn.qk, attn.pv,
attn.proj, norm2, mlp.fc1, mlp.fc2}``, ``norm``, ``head``. The attention products are
``bfp.layers.Matmul`` modules (``bfp.attention``), so configs reach them by name
(``*.attn.qk``); every other GEMM is an ``nn.Linear`` or the stem ``nn.Conv2d``.
Pre-norm blocks, a learned position embedding, mean pooling over the patches (no class
token): 64 tokens of ``dim`` for a 32x32 image.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..attention import Attention
from .mixer import Mlp


class Block(nn.Module):
    """A pre-norm transformer block (also the GPT's, with ``causal=True``)."""

    def __init__(self, dim: int, heads: int, hidden: int, causal: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal=causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 patch_size: int = 4, dim: int = 192, depth: int = 6, heads: int = 3, mlp_ratio: int = 2):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        tokens = (image_size // patch_size) ** 2
        self.stem = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, dim * mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))
