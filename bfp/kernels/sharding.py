"""DTensor sharding rules of the format op (``bfp::quantize_format``): what tensor parallelism
(``parallelize_module``) and FSDP2's sharded parameters need to run a quantized layer.

A rounding is computed on each shard only where that equals rounding the whole tensor:

* an element-wise format with deterministic rounding (``Float``, ``P3109``; nearest or truncate)
  keeps any placement: each element is rounded alone;
* a block format (``BlockFloat``, ``MX``) keeps a ``Shard(d)`` whose axis ``d`` its blocks do not
  span (the tile is 1 along ``d``): every block lies inside one shard, whole;
* everything else is computed on the whole tensor (as are the project's other ops: the Hadamard
  transform's ``bfp::hadamard_quantize`` mixes rows, the fused accumulator's ``bfp::fused_bmm`` sums
  a whole K; ``replicate_all``): a shard across a block's axis, a per-tensor or
  per-row scale (``NVFP4``'s tensor scale, ``Scaled``), stochastic rounding (its draws hash each
  element's index in the whole tensor). DTensor then redistributes the input to ``Replicate`` (an
  all-gather) before the op, never rounding per shard.

The counts (``stats``) of a sharded input are each shard's: ``Partial`` (summed on demand); a
replicated input's are replicated. Registered when ``torch.distributed`` is available.

DTensor caches a sharding decision by the op's tensor specs and its *static* arguments. The format
(a JSON string), ``stats`` and ``backend`` are static here: two formats on tensors of one shape and
placement never share a decision (``register_sharding`` alone would treat every non-int argument as
dynamic and reuse the first format's rule for the next)."""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor.experimental import register_sharding

from ..formats import BlockFloat, MX
from .dispatch import needs_keys, parse_format
from .plan import tile_for

__all__ = ["shardable_dims", "replicate_all"]


def shardable_dims(fmt, shape: tuple[int, ...]) -> list[int]:
    """The axes of a tensor of ``shape`` along which rounding to ``fmt`` shard by shard equals rounding
    it whole (module docstring); ``[]``: only the whole tensor."""
    if needs_keys(fmt):
        return []
    if fmt.elementwise:
        return list(range(len(shape)))
    if isinstance(fmt, (BlockFloat, MX)) and shape:
        tile = tile_for(fmt, tuple(shape))
        return [d for d, t in enumerate(tile) if t == 1]
    return []


@register_sharding(torch.ops.bfp.quantize_format.default)
def _quantize_format(x, fmt, keys, stats, backend):
    f = parse_format(fmt)
    shape = tuple(x.shape)
    key = None if keys is None else Replicate()
    out = [([Replicate(), Replicate()], [Replicate(), None, key, None, None])]
    for d in shardable_dims(f, shape):
        out.append(([Shard(d), Partial() if stats else Replicate()], [Shard(d), None, key, None, None]))
    return out


# Every argument from ``fmt`` on is static: part of the cache key of DTensor's sharding decision.
DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[torch.ops.bfp.quantize_format.default] = \
    RuntimeSchemaInfo(static_argnum=1, needs_pytree=True)


def replicate_all(op, outputs: int = 1) -> None:
    """Register for ``op`` the one rule that computes it on whole tensors: every tensor argument
    redistributed to ``Replicate`` (an all-gather of a sharded one), ``outputs`` replicated results;
    every argument from the second on is static (a cached decision never crosses arguments)."""
    def rule(*args):
        return [([Replicate()] * outputs, [None if a is None or isinstance(a, (bool, int, float, str)) else Replicate()
                                           for a in args])]
    register_sharding(op)(rule)
    DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(static_argnum=1,
                                                                                       needs_pytree=True)
