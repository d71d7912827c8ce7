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

Models that call ``F.scaled_dot_product_attention`` themselves (a hand-written or
Hugging Face attention block) are handled by ``route_sdpa`` (``convert`` does it
first): every module whose class's source calls that function gets two children,
``qk`` and ``pv`` (``Matmul``), and while it runs its forward the call is computed
by ``products`` with them, so the two products are quantized and addressed by name
as ``Attention``'s are (``*.attn.qk``). The arguments are SDPA's: ``attn_mask``
(bool or float), ``dropout_p`` (applied as given, as SDPA does), ``is_causal``
(top-left aligned), ``scale`` and ``enable_gqa``. With quantization off the result
equals SDPA within float rounding (tested).
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .layers import Matmul

__all__ = ["Attention", "MultiheadAttention", "route_sdpa"]


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

    def __init__(self, dim: int, heads: int, bias: bool = True, dropout: float = 0.0, batch_first: bool = False):
        super().__init__(dim, heads, bias=bias, dropout=dropout)
        self.batch_first = batch_first
        self._register_load_state_dict_pre_hook(self._rename_mha_keys)

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


class _Route(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention(...)`` is ``products`` with ``module``'s
    ``qk`` and ``pv``; every other function runs unchanged."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return _sdpa(self.module, *args, **kwargs)


def _sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
          dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
          enable_gqa: bool = False) -> Tensor:
    if enable_gqa and key.shape[-3] != query.shape[-3]:  # grouped query attention: each key head serves a group
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    return products(module.qk, module.pv, query, key, value, attn_mask, None, is_causal, scale, dropout_p)[0]


def _enter(module: nn.Module, args) -> None:
    route = _Route(module)
    route.__enter__()
    module._bfp_routes.append(route)


def _leave(module: nn.Module, args, output) -> None:
    module._bfp_routes.pop().__exit__(None, None, None)


@functools.lru_cache(maxsize=None)
def _source_calls_sdpa(cls: type) -> bool:
    try:
        return "scaled_dot_product_attention" in inspect.getsource(cls)
    except (OSError, TypeError):  # defined in an interpreter session: no source to read
        return False


def _calls_sdpa(module: nn.Module) -> bool:
    """Whether ``module``'s class, or a class it inherits from outside PyTorch, calls SDPA."""
    if isinstance(module, Attention):
        return False
    return any(_source_calls_sdpa(c) for c in type(module).__mro__
               if c is not object and not c.__module__.startswith("torch"))


def route_sdpa(model: nn.Module) -> nn.Module:
    """Give every module of ``model`` whose class calls ``F.scaled_dot_product_attention`` the
    named products ``qk`` and ``pv`` and route the call through them (module docstring); a
    module already routed is left as it is. Returns ``model``."""
    for name, module in model.named_modules():
        if not _calls_sdpa(module) or hasattr(module, "_bfp_routes"):
            continue
        taken = [n for n in ("qk", "pv") if hasattr(module, n)]
        if taken:
            raise ValueError(f"{name or type(module).__name__} calls F.scaled_dot_product_attention but already "
                             f"has {taken}: the names its products would take")
        module.qk, module.pv = Matmul(), Matmul()
        module._bfp_routes = []
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_leave, always_call=True)
    return model
