"""Multi-head attention whose two products are named modules, so conversion quantizes them.

``Attention(dim, heads)`` computes self-attention as four named children:

==========  ================================================================
``qkv``     ``nn.Linear(dim, 3 dim)``: the query, key and value projections
``qk``      ``Matmul``: scores ``q @ k^T`` (``fi`` quantizes q, ``fw`` k^T)
``pv``      ``Matmul``: ``p @ v``; ``fi`` quantizes the softmax probabilities
            ``p``, ``fw`` the values
``proj``    ``nn.Linear(dim, dim)``: the output projection
==========  ================================================================

Conversion swaps the Linears for ``QLinear`` and the Matmuls for ``QMatmul``, each
with the nine points, addressed by name in configs (``*.attn.qk``, ``*.attn.pv``;
the probabilities are ``*.attn.pv``'s ``fi`` point). The arithmetic, in float32:
``scores = qk(q, k^T) * d**-0.5`` (the scale after the product, so the quantized
operands are q and k as the projections made them), masked entries set to
``-inf``, ``p = softmax(scores)`` (dropout on ``p`` in training when ``dropout > 0``;
off by default), ``out = proj(merge_heads(pv(p, v)))``. With quantization off this
equals ``F.scaled_dot_product_attention`` within float rounding (tested, forward
and backward). A row whose every key is masked gives NaN, as PyTorch's does.

``MultiheadAttention.from_float(mha)`` replaces an ``nn.MultiheadAttention``
(``conversion.convert`` does it for every one it finds, before quantizing): the same
call signature and results, the same Parameter objects (``in_proj_weight`` and
``in_proj_bias`` become ``qkv.weight``/``qkv.bias``, ``out_proj``'s ``proj.weight``/``proj.bias``).
Its state_dict keys change accordingly (``load_state_dict`` accepts the old ones).

Models that call ``F.scaled_dot_product_attention`` (or ``torch.matmul``) themselves, a
hand-written, Hugging Face or timm attention block, are handled by ``bfp.routes`` (``convert``
with an ``example_input`` traces the forward and routes each module's own calls through named
products computed with ``products`` below).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .layers import Matmul

__all__ = ["Attention", "MultiheadAttention", "products"]


def _mask(scores: Tensor, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
          causal: bool) -> Tensor:
    """``scores`` (N, H, T, S) with the masks applied. ``attn_mask``: bool (True = may attend,
    as ``F.scaled_dot_product_attention``) or float (added); ``key_padding_mask`` (N, S) bool,
    True = padding (ignored), as ``nn.MultiheadAttention``."""
    t, s = scores.shape[-2:]
    if causal:  # aligned at the top left when t != s, as F.scaled_dot_product_attention's is_causal
        keep = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :].bool(), float("-inf"))
    return scores


def products(qk: nn.Module, pv: nn.Module, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor],
             key_padding_mask: Optional[Tensor], causal: bool, scale: Optional[float],
             dropout_p: float) -> tuple[Tensor, Tensor]:
    """``(pv(p, v), p)`` with ``p = softmax(qk(q, k^T) * scale + masks)`` for (N, H, T, d) inputs; the
    default ``scale`` is ``d**-0.5``, applied after the product; dropout on ``p`` when ``dropout_p``."""
    scores = qk(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    p = torch.softmax(_mask(scores, attn_mask, key_padding_mask, causal), dim=-1)
    if dropout_p:
        p = F.dropout(p, dropout_p)
    return pv(p, v), p


class Attention(nn.Module):
    """Self-attention over (N, T, dim) inputs (see the module docstring)."""

    def __init__(self, dim: int, heads: int, bias: bool = True, causal: bool = False, dropout: float = 0.0):
        super().__init__()
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or dim % heads:
            raise ValueError(f"heads must be a positive integer dividing dim={dim}, got {heads!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.dim, self.heads, self.causal, self.dropout = dim, heads, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.qk = Matmul()
        self.pv = Matmul()
        self.proj = nn.Linear(dim, dim, bias=bias)

    def _split(self, x: Tensor) -> Tensor:  # (N, T, dim) -> (N, H, T, d)
        n, t, _ = x.shape
        return x.reshape(n, t, self.heads, self.dim // self.heads).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None,
               key_padding_mask: Optional[Tensor] = None, causal: Optional[bool] = None):
        """(output before ``proj`` as (N, T, dim), probabilities (N, H, T, S)) of projected q, k, v."""
        q, k, v = self._split(q), self._split(k), self._split(v)
        out, p = products(self.qk, self.pv, q, k, v, attn_mask, key_padding_mask,
                          self.causal if causal is None else causal, None, self.dropout if self.training else 0.0)
        out = out.transpose(1, 2)
        return out.reshape(out.shape[0], out.shape[1], self.dim), p

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(self.attend(q, k, v, attn_mask, key_padding_mask)[0])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}, dropout={self.dropout}"


class MultiheadAttention(Attention):
    """A drop-in for ``nn.MultiheadAttention`` (same forward signature and results) built on
    ``Attention``'s named products. Key/value inputs of other sizes (``kdim``/``vdim``) and
    ``add_bias_kv``/``add_zero_attn`` are refused by ``from_float``."""

    # nn.MultiheadAttention's public attributes, which code around it reads (torch's
    # TransformerEncoderLayer among it): the same values, the Parameters are the products' own.
    bias_k = bias_v = None
    add_zero_attn = False
    # torch's encoder layers run a fused kernel on in_proj_weight (FP32, past every quantization
    # point) when this is True in eval mode; False keeps their forward on this module's products.
    _qkv_same_embed_dim = False

    def __init__(self, dim: int, heads: int, bias: bool = True, dropout: float = 0.0, batch_first: bool = False):
        super().__init__(dim, heads, bias=bias, dropout=dropout)
        self.batch_first = batch_first
        self.embed_dim = self.kdim = self.vdim = dim
        self.num_heads, self.head_dim = heads, dim // heads
        self._register_load_state_dict_pre_hook(self._rename_mha_keys)

    @property
    def in_proj_weight(self) -> Tensor:
        return self.qkv.weight

    @property
    def in_proj_bias(self) -> Optional[Tensor]:
        return self.qkv.bias

    @property
    def out_proj(self) -> nn.Module:
        return self.proj

    @staticmethod
    def _rename_mha_keys(state_dict, prefix, *args):
        for old, new in (("in_proj_weight", "qkv.weight"), ("in_proj_bias", "qkv.bias"),
                         ("out_proj.weight", "proj.weight"), ("out_proj.bias", "proj.bias")):
            if prefix + old in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)

    @classmethod
    def from_float(cls, mha: nn.MultiheadAttention) -> "MultiheadAttention":
        if not isinstance(mha, nn.MultiheadAttention):
            raise ValueError(f"MultiheadAttention.from_float needs an nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("MultiheadAttention.from_float: kdim/vdim other than embed_dim, add_bias_kv and "
                             "add_zero_attn are not supported")
        with torch.device("meta"):
            new = cls(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, dropout=mha.dropout,
                      batch_first=mha.batch_first)
        new.qkv.weight = mha.in_proj_weight
        if mha.in_proj_bias is not None:
            new.qkv.bias = mha.in_proj_bias
        new.proj.weight = mha.out_proj.weight  # out_proj is a Linear subclass: a plain Linear here
        if mha.out_proj.bias is not None:
            new.proj.bias = mha.out_proj.bias
        new.train(mha.training)
        return new

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None,
                average_attn_weights: bool = True, is_causal: bool = False):
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        if not self.batch_first or not batched:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if query is key and key is value:
            q, k, v = self.qkv(query).chunk(3, dim=-1)
        else:  # each input through the whole projection, the third it needs kept
            q, k, v = (self.qkv(t).chunk(3, dim=-1)[i] for i, t in enumerate((query, key, value)))
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = ~attn_mask  # nn.MultiheadAttention: True = not allowed
        if attn_mask is not None and attn_mask.dim() == 3:  # (N * H, T, S)
            attn_mask = attn_mask.reshape(-1, self.heads, *attn_mask.shape[-2:])
        out, p = self.attend(q, k, v, attn_mask, key_padding_mask, causal=is_causal and attn_mask is None)
        out = self.proj(out)
        if not self.batch_first or not batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        weights = p.mean(dim=1) if average_attn_weights else p
        return out, (weights if batched else weights.squeeze(0))
