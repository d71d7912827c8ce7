"""The random Hadamard transform (RHT) of the weight-gradient GEMM's inputs (NVFP4 recipe).

``H = diag(s) @ W_b / sqrt(b)``: ``W_b`` the ``b x b`` Walsh-Hadamard (Sylvester) matrix,
``s`` a vector of random signs drawn once from ``seed``. ``H`` is orthogonal (``H^T H = I``),
so transforming both inputs of ``dW = dY^T X`` along the reduction axis (tokens / rows) in
blocks of ``b`` leaves the product unchanged: ``(H dY)^T (H X) = dY^T X``. Quantizing the
transformed operands (``bwo``, ``bwi``) spreads outliers over a block before they are rounded,
which is why the recipe does it. Rows past the last whole block are zero-padded (zeros add
nothing to the product). The transform is the fast Walsh-Hadamard transform (butterflies,
``transform_rows``) in the tensor's dtype: with every point off the weight gradient equals
PyTorch's within float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .formats import Format
from .kernels import DrawnKeys, format_json, needs_keys, op_keys, parse_format, quantize
from .kernels import op_args
from .kernels.runtime import kernel_for
from .precision import Hadamard


@functools.lru_cache(maxsize=32)
def _matrix(block: int, seed: int) -> torch.Tensor:
    """``H`` (float64, CPU) of ``block`` and ``seed``."""
    w = torch.ones(1, 1, dtype=torch.float64)
    while w.shape[0] < block:
        w = torch.cat([torch.cat([w, w], 1), torch.cat([w, -w], 1)], 0)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (block,), generator=g, dtype=torch.int64).to(torch.float64) * 2 - 1
    return signs[:, None] * w / block ** 0.5


def matrix(rht: Hadamard, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return _matrix(rht.block, rht.seed).to(dtype=dtype, device=device)


def factor(rht: Hadamard, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Row ``i``'s factor ``s_i / sqrt(block)``: ``H``'s first column, ``W_b``'s being all ones
    (cached per device: a training step copies nothing from the host, and a CUDA graph can hold it)."""
    return _factor(rht.block, rht.seed, dtype, str(torch.device(device)))


@functools.lru_cache(maxsize=64)
def _factor(block: int, seed: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return _matrix(block, seed)[:, 0].to(dtype=dtype, device=device)


def butterflies(blocks: torch.Tensor) -> torch.Tensor:
    """``W_b`` (Sylvester) applied along dim -2 of ``blocks`` (``..., b, C``) by the fast
    Walsh-Hadamard transform: ``log2 b`` stages, each pairing rows ``j`` and ``j + h`` in
    groups of ``2h`` (``h`` = 1, 2, 4 ...) into ``u + v`` and ``u - v``, in the dtype of
    ``blocks``. This order is the transform's definition: the Numba kernel follows it."""
    b, c = blocks.shape[-2], blocks.shape[-1]
    lead = blocks.shape[:-2]
    h = 1
    while h < b:
        x = blocks.reshape(*lead, b // (2 * h), 2, h, c)
        u, v = x[..., 0, :, :], x[..., 1, :, :]
        blocks = torch.stack((u + v, u - v), dim=-3).reshape(*lead, b, c)
        h *= 2
    return blocks


def transform_rows(t: torch.Tensor, rht: Hadamard, backend: Optional[str] = None) -> torch.Tensor:
    """``H`` applied to the rows (dim -2) of ``t`` in blocks of ``rht.block``, zero-padding the
    last block; the result has ``ceil(rows / block) * block`` rows. The arithmetic: the
    butterflies of ``butterflies`` in ``t``'s dtype, then row ``i`` times ``s_i / sqrt(block)``
    rounded to that dtype once (exact for block 4, 16, 64, 256: a power of two). A float32 ``t``
    runs its backend's kernel (``backend``: default its device's; Numba on the CPU,
    ``numba_cpu/hadamard_cpu``; Triton on CUDA, ``triton_cuda/hadamard``), the same bits."""
    fast = kernel_for("hadamard_rows", t, backend) if t.dtype == torch.float32 and t.dim() >= 2 else None
    if fast is not None:  # Numba or Triton, loaded on first use
        return fast(t.contiguous(), factor(rht, device=t.device))
    return reference_rows(t, rht)


def reference_rows(t: torch.Tensor, rht: Hadamard) -> torch.Tensor:
    """``transform_rows`` in PyTorch steps (any dtype and device)."""
    rows, b = t.shape[-2], rht.block
    pad = (-rows) % b
    if pad:
        t = torch.nn.functional.pad(t, (0, 0, 0, pad))
    blocks = butterflies(t.reshape(*t.shape[:-2], -1, b, t.shape[-1]))
    out = blocks * factor(rht, t.dtype, t.device)[:, None]
    return out.reshape(*t.shape[:-2], -1, t.shape[-1])


def fusable(t: torch.Tensor, rht: Hadamard, fmt: Optional[Format]) -> bool:
    """Whether ``transform_quantize`` runs a fused kernel: NVFP4 with 1-D blocks of the
    transform's size along the rows (dim -2) of a float32 tensor (CPU: Numba, CUDA: Triton)."""
    return (fmt is not None and fmt.rht_fused_block() == rht.block
            and t.dim() >= 2 and fmt.scale_axis() in (-2, t.dim() - 2) and t.device.type in ("cpu", "cuda")
            and t.dtype == torch.float32)


def transform_quantize(t: torch.Tensor, rht: Hadamard, fmt: Format,
                       generator: Optional[torch.Generator] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``quantize(transform_rows(t, rht), fmt, generator=generator)``, the same bits and the same
    draws from ``generator``; where ``fusable``, one kernel that never writes the transformed
    tensor (Numba on the CPU, ``numba_cpu/nvfp4_rht``; Triton on CUDA, ``triton_cuda/hadamard``;
    ``backend`` as ``bfp.quantize``'s). While torch.compile traces (or for a
    tensor subclass) it is one op, ``torch.ops.bfp.hadamard_quantize``. ``t`` has 2 or more
    dimensions (the transform mixes its rows, dim -2): a 1-D tensor is a ValueError."""
    op_args.tensor(t, "the tensor of transform_quantize", min_dim=2)
    if type(t) is not torch.Tensor or torch.compiler.is_compiling():
        keys = op_keys(generator, t) if needs_keys(fmt) else None
        return _hadamard_quantize(t, rht.block, rht.seed, format_json(fmt), keys)
    return _transform_quantize(t, rht, fmt, generator, backend)


def _transform_quantize(t: torch.Tensor, rht: Hadamard, fmt: Format, generator, backend: Optional[str] = None
                        ) -> torch.Tensor:
    t = op_args.values(t)
    fused = kernel_for("hadamard_nvfp4", t, backend) if fusable(t, rht, fmt) else None
    if fused is None:
        return quantize(transform_rows(t, rht, backend), fmt, generator=generator, backend=backend)
    return fused(t, factor(rht, device=t.device), fmt, generator, lambda: transform_rows(t, rht, backend))


def hadamard_quantize(t: torch.Tensor, block: int, seed: int, fmt: str, keys: Optional[torch.Tensor] = None
                      ) -> torch.Tensor:
    """``torch.ops.bfp.hadamard_quantize`` with its arguments checked first: ``block`` and ``seed``
    as ``Hadamard`` takes them (a seed in [0, 2**63), which the op's int64 holds), a ValueError
    naming the bad one (torch's own argument parser would only say it is not an int)."""
    Hadamard(block, seed)
    return _hadamard_quantize(t, block, seed, fmt, keys)


@torch.library.custom_op("bfp::hadamard_quantize", mutates_args=())
def _hadamard_quantize(t: torch.Tensor, block: int, seed: int, fmt: str, keys: Optional[torch.Tensor]
                       ) -> torch.Tensor:
    """``transform_quantize`` as an op: the transform ``Hadamard(block, seed)``, the format as
    ``bfp.kernels.format_json``, ``keys`` the stochastic draw (or None)."""
    f = _check_op(t, block, fmt, keys)
    out = _transform_quantize(t, Hadamard(block, seed), f, None if keys is None else DrawnKeys(keys))
    return out.contiguous()  # as the fake says


def _check_op(t, block, fmt: str, keys):
    op_args.tensor(t, "the tensor of hadamard_quantize", min_dim=2)  # the transform mixes rows (dim -2)
    op_args.keys(keys)
    return op_args.parsed(fmt, "fmt", parse_format)


if torch.distributed.is_available():  # tensor parallelism: the transform mixes rows, so on whole tensors
    from .kernels.sharding import replicate_all
    replicate_all(torch.ops.bfp.hadamard_quantize.default)


@_hadamard_quantize.register_fake
def _(t, block, seed, fmt, keys):
    _check_op(t, block, fmt, keys)
    rows = t.shape[-2]  # the transform pads the rows to whole blocks
    return t.new_empty(*t.shape[:-2], -(-rows // block) * block, t.shape[-1])
