"""Hugging Face transformers' GPT-2 as ``lm.py``'s model (``-m HFGPT2``): random initialisation, no download.

``HFGPT2(vocab, block, dim, depth, heads, mlp_ratio)`` builds ``transformers.GPT2LMHeadModel`` from a
``GPT2Config`` of those sizes (``n_positions=block``, ``n_embd=dim``, ``n_layer=depth``, ``n_head=heads``,
``n_inner=dim * mlp_ratio``) with its dropouts at 0, as ``bfp.models.gpt.GPT`` has none, so the two
decoders of one size differ only in what GPT-2 is (its ``Conv1D`` projections, GELU "new", tied
input and output embeddings, its initialisation). ``forward(idx)`` returns the logits flattened to
``(N * T, vocab)`` like ``GPT``'s. ``bfp.convert`` reaches its GEMMs by tracing (``Conv1D`` becomes
``QTransposedLinear``, SDPA's products are routed; docs/transformers.md). Needs ``transformers``
(the project's ``[test]`` extra has it); without it the constructor says how to install it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .gpt import Sampling, check_sizes


class HFGPT2(Sampling, nn.Module):
    def __init__(self, vocab: int, block: int = 64, dim: int = 128, depth: int = 4, heads: int = 4,
                 mlp_ratio: int = 4):
        super().__init__()
        check_sizes("HFGPT2", vocab=vocab, block=block, dim=dim, depth=depth, heads=heads, mlp_ratio=mlp_ratio)
        if dim % heads:
            raise ValueError(f"HFGPT2 dim {dim} must be a multiple of heads {heads}")
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            raise ValueError("`arch` 'HFGPT2' needs Hugging Face transformers: pip install transformers "
                             "(or the project's test extra '.[test]')") from None
        cfg = GPT2Config(vocab_size=vocab, n_positions=block, n_embd=dim, n_layer=depth, n_head=heads,
                         n_inner=dim * mlp_ratio, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0, use_cache=False)
        self.block, self.vocab = block, vocab
        self.gpt2 = GPT2LMHeadModel(cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[-1] > self.block:
            raise ValueError(f"HFGPT2 with block={self.block} got a sequence of {idx.shape[-1]} tokens")
        logits = self.gpt2(input_ids=idx, use_cache=False).logits
        return logits.reshape(-1, logits.shape[-1])
