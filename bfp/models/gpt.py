"""A small GPT-style decoder for character-level language modelling (``lm.py``).

Names: ``tok`` and ``pos`` (embeddings), ``blocks.<i>.{norm1, attn.qkv, attn.qk, attn.pv,
attn.proj, norm2, mlp.fc1, mlp.fc2}``, ``norm``, ``head``. Attention is ``bfp.attention``'s
(causal), so configs reach its products by name; every other GEMM is an ``nn.Linear``.
``forward(idx)`` takes token indices ``(N, T)`` and returns logits flattened to
``(N * T, vocab)``, so the engine's classification loss and accuracy (next-character
accuracy here) apply unchanged to targets flattened the same way.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .vit import Block


def check_sizes(model: str, **sizes) -> None:
    """ValueError naming the first size that is not a positive integer."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{model} {name} must be a positive integer, got {v!r}")


class Sampling:
    """``generate`` for a decoder with ``block`` (its context) and ``vocab`` attributes whose forward
    takes indices (N, T) and returns logits flattened to (N * T, vocab)."""

    block: int
    vocab: int

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, steps: int, *, temperature: float = 0.8,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``idx`` (N, T) extended by ``steps`` sampled tokens (the last ``block`` tokens as context)."""
        for _ in range(steps):
            logits = self(idx[:, -self.block:]).reshape(idx.shape[0], -1, self.vocab)[:, -1]
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


class GPT(Sampling, nn.Module):
    def __init__(self, vocab: int, block: int = 64, dim: int = 128, depth: int = 4, heads: int = 4,
                 mlp_ratio: int = 4):
        super().__init__()
        check_sizes("GPT", vocab=vocab, block=block, dim=dim, depth=depth, heads=heads, mlp_ratio=mlp_ratio)
        self.block, self.vocab = block, vocab
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, dim * mlp_ratio, causal=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[-1]
        if t > self.block:
            raise ValueError(f"GPT with block={self.block} got a sequence of {t} tokens")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        logits = self.head(self.norm(self.blocks(x)))
        return logits.reshape(-1, logits.shape[-1])
