"""Accumulator emulation: GEMMs whose partial sums live in a narrow float format.

A real low-precision GEMM unit rounds its running sum to the accumulator format
(e.g. fp16 or bf16) as it goes; an FP32 GEMM followed by one rounding hides the
error that swamping of small addends by a large running sum causes. Two
implementations, both on top of ``bfp.quantize``:

``accumulate_matmul_reference(a, b, acc)``
    The specification, sequential over the reduction dimension ``K``: every
    product ``a[m, j] * b[j, n]`` (a float32 product) is rounded to
    ``acc.fmt``, and every addition to the running sum is rounded, in order
    ``j = 0, 1, ..., K-1``. The running sum starts as the first rounded
    product. Vectorised over the output elements only, so it is slow for
    large ``K``; it exists to be obviously right.

``accumulate_matmul(a, b, acc)``
    The fast blocked emulation: ``K`` is cut into chunks of ``acc.chunk``
    elements (the last may be shorter); each chunk's dot product is computed
    in float32 by one batched GEMM (summation order inside a chunk is the BLAS
    library's), rounded to ``acc.fmt``, and added to the running sum, which is
    rounded after every chunk. With ``chunk=1`` a chunk's dot product is one
    product, so the result equals the reference bit for bit (tested). Larger
    chunks model hardware with a ``chunk``-wide dot-product unit that feeds a
    narrow accumulator.

Per-product accumulators (``acc.mul``, ``acc.fma``, ``acc.exact``; ``chunk=1``)
run one loop over ``K`` shared by both functions (``_per_product``): each
product is rounded to ``acc.mul`` (default ``acc.fmt``) and added with a
rounding to ``acc.fmt``; with ``fma`` the unrounded product is added with one
rounding; with ``exact`` every rounding sees the exact product or sum (float64
products of the float32 inputs are exact, sums are TwoSum pairs, rounded
through ``bfp.kernels.exact``), otherwise the product and sum are float32
operations first (``fma``: float32 ``fmaf``), as mptorch computes them.

With ``acc.kahan`` both add with Kahan compensation, every operation of the
compensated sum (``y = t - c``, ``s + y``, ``(s' - s) - y``) rounded to
``acc.fmt``: the compensation term lives in the same narrow registers, as in
the CPD emulator. Stochastic rounding in ``acc.fmt`` draws from ``generator``;
the two implementations then only agree in distribution.

Inputs are computed in float32 (float16/bfloat16/float64 are converted) and
the result is returned in the inputs' promoted dtype. Convolutions are lowered
to these matmuls (``accumulate_conv2d*``): the reduction order is the im2col
order ``(c, kh, kw)`` forward, ``(o, kh, kw)`` for the input gradient and
``(n, oh, ow)`` for the weight gradient.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange

from .kernels import quantize
from .kernels.exact import nearest32, round_exact, two_sum
from .kernels.inplace import add_quantize_, quantize_
# The accumulator spec is a value type beside LayerPrecision; exported here too.
from .precision import GEMMS, Accumulator, FusedAccumulator, accumulator_from_dict  # noqa: F401
from .tensorcore import fused_bmm

# Chunk partial sums are materialised in slabs of at most this many elements
# (4 MiB of float32): one chunk at a time for large outputs, so the working set stays
# in cache, many chunks per GEMM call for small ones, so Python overhead stays low.
_SLAB_ELEMENTS = 1 << 20


# -- matmul --------------------------------------------------------------------------

def _operands(a: torch.Tensor, b: torch.Tensor, acc: Accumulator):
    """Validate, broadcast the batch dims and flatten to (B, M, K) and (B, K, N) float32."""
    if not isinstance(acc, (Accumulator, FusedAccumulator)):
        raise ValueError(f"acc must be an Accumulator or a FusedAccumulator, got {acc!r}")
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"accumulated matmul needs a (..., M, K) and b (..., K, N), got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    (m, k), n = a.shape[-2:], b.shape[-1]
    bsz = batch.numel()
    a3 = a.float().expand(*batch, m, k).reshape(bsz, m, k)
    b3 = b.float().expand(*batch, k, n).reshape(bsz, k, n)
    return a3, b3, (*batch, m, n), out_dtype


def _float32_arithmetic(like: torch.Tensor):
    """Autocast off: the emulation's float32 products and chunk GEMMs must stay float32
    (under autocast a chunk GEMM would run, and round, in bfloat16/float16)."""
    return torch.autocast(like.device.type, enabled=False)


def _sum_terms(terms: Iterator[torch.Tensor], acc: Accumulator, rnd: Callable) -> Optional[torch.Tensor]:
    """Add already-rounded terms in order, rounding every step (Kahan if asked)."""
    s = comp = None
    for t in terms:
        if s is None:
            s, comp = t, torch.zeros_like(t)
        elif acc.kahan:
            y = rnd(t - comp)
            total = rnd(s + y)
            comp = rnd(rnd(total - s) - y)
            s = total
        else:
            s = rnd(s + t)
    return s


def _running_sum(terms: Iterator[torch.Tensor], acc: Accumulator,
                 generator: Optional[torch.Generator]) -> Optional[torch.Tensor]:
    """``_sum_terms`` without Kahan, in place: ``s = q(s + t)`` is one fused pass
    (``add_quantize_``: the same float32 add and rounding, the same random draws)
    instead of an add, a rounding and two fresh tensors per chunk. The first term
    (from the first slab, never a reused buffer) becomes the running sum; a copy
    if it is a slice of a larger slab, so the result does not keep the slab alive."""
    s = None
    for t in terms:
        if s is None:
            s = t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()
        else:
            add_quantize_(s, t, acc.fmt, generator=generator)
    return s


def _per_product(a3: torch.Tensor, b3: torch.Tensor, acc: Accumulator,
                 generator: Optional[torch.Generator]) -> Optional[torch.Tensor]:
    """The sequential sum of a per-product accumulator (see the module docstring).

    Every intermediate is an exact value held as a float64 pair ``(hi, lo)``
    until ``r`` rounds it: to the format directly (``exact``) or through the
    float32 result of the operation (not ``exact``).
    """
    def r(pair, fmt):
        if acc.exact:
            return round_exact(*pair, fmt, generator=generator).double()
        return quantize(nearest32(*pair), fmt, generator=generator).double()

    a64, b64, pf = a3.double(), b3.double(), acc.product_format
    s = comp = None
    for j in range(a3.shape[-1]):
        p = a64[:, :, j:j + 1] * b64[:, j:j + 1, :]  # exact: 24 x 24 significant bits
        term = (p, None) if pf is None else (r((p, None), pf), None)
        if s is None:
            s, comp = r(term, acc.fmt), torch.zeros_like(p)
        elif acc.kahan:
            y = r(two_sum(term[0], -comp), acc.fmt)
            total = r(two_sum(s, y), acc.fmt)
            comp = r(two_sum(r(two_sum(total, -s), acc.fmt), -y), acc.fmt)
            s = total
        else:
            s = r(two_sum(s, term[0]), acc.fmt)
    return None if s is None else s.float()


def _finish(s, shape, out_dtype, like):
    if s is None:  # K == 0: an empty sum
        return torch.zeros(shape, dtype=out_dtype, device=like.device)
    return s.reshape(shape).to(out_dtype)


def accumulate_matmul_reference(a: torch.Tensor, b: torch.Tensor, acc: Accumulator, *,
                                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``a @ b`` summed sequentially over K, rounding every product and every add.

    The specification of ``accumulate_matmul``; see the module docstring.
    """
    a3, b3, shape, out_dtype = _operands(a, b, acc)
    rnd = lambda t: quantize(t, acc.fmt, generator=generator)  # noqa: E731
    products = (rnd(a3[:, :, j:j + 1] * b3[:, j:j + 1, :]) for j in range(a3.shape[-1]))
    with _float32_arithmetic(a):
        s = _per_product(a3, b3, acc, generator) if acc.per_product else _sum_terms(products, acc, rnd)
    return _finish(s, shape, out_dtype, a)


def _chunk_sums(a3: torch.Tensor, b3: torch.Tensor, chunk: int, rnd: Callable,
                reuse: bool = False) -> Iterator[torch.Tensor]:
    """Rounded float32 dot products of successive K-chunks, each (B, M, N), in order.

    Full chunks are computed a slab at a time with one batched GEMM and one
    quantize call; the short tail chunk (if any) last. With ``reuse`` the slabs
    after the first are written into one buffer (fresh pages cost as much as a
    rounding pass here): then a yielded chunk is only valid until the next one
    is asked for, except those of the first slab, which may be kept.
    """
    bsz, m, k = a3.shape
    n = b3.shape[-1]
    nfull = k // chunk
    per_slab = max(1, _SLAB_ELEMENTS // max(1, bsz * m * n))
    buf = None
    for c0 in range(0, nfull, per_slab):
        c1 = min(nfull, c0 + per_slab)
        g = c1 - c0
        ab = a3[:, :, c0 * chunk:c1 * chunk].reshape(bsz, m, g, chunk).permute(2, 0, 1, 3)
        bb = b3[:, c0 * chunk:c1 * chunk, :].reshape(bsz, g, chunk, n).transpose(0, 1)
        if chunk == 1:  # an outer product: exactly the float32 products of the reference
            sums = ab * bb
        elif reuse and c0 > 0:
            if buf is None:
                buf = torch.empty((per_slab, bsz, m, n), dtype=a3.dtype, device=a3.device)
            sums = torch.matmul(ab, bb, out=buf[:g])
        else:
            sums = torch.matmul(ab, bb)
        yield from rnd(sums).unbind(0)
    if nfull * chunk < k:
        yield rnd(torch.matmul(a3[:, :, nfull * chunk:], b3[:, nfull * chunk:, :]))


def accumulate_matmul(a: torch.Tensor, b: torch.Tensor, acc: Accumulator, *,
                      generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``a @ b`` (broadcasting batch dims) with a blocked narrow accumulator, or a tensor core's
    fused adder for a ``FusedAccumulator`` (``bfp.tensorcore.fused_bmm``, the whole batch at once).

    Float32 dot products over ``acc.chunk``-element chunks of K, each rounded
    to ``acc.fmt`` and added to a running sum rounded after every chunk
    (Kahan-compensated with ``acc.kahan``). ``chunk=1`` equals
    ``accumulate_matmul_reference`` exactly.
    """
    a3, b3, shape, out_dtype = _operands(a, b, acc)
    if isinstance(acc, FusedAccumulator):  # a tensor core's fused adder (bfp.tensorcore)
        return _finish(fused_bmm(a3, b3, acc), shape, out_dtype, a)
    rnd = lambda t: quantize(t, acc.fmt, generator=generator)  # noqa: E731
    with _float32_arithmetic(a):
        if acc.per_product:  # chunk == 1, product by product: the reference's loop
            s = _per_product(a3, b3, acc, generator)
        elif acc.kahan:
            s = _sum_terms(_chunk_sums(a3, b3, acc.chunk, rnd), acc, rnd)
        else:  # chunk sums are fresh tensors of ours: round them where they are
            rnd_ = lambda t: quantize_(t, acc.fmt, generator=generator)  # noqa: E731
            s = _running_sum(_chunk_sums(a3, b3, acc.chunk, rnd_, reuse=True), acc, generator)
    return _finish(s, shape, out_dtype, a)


# -- convolution (im2col + accumulated matmul) ---------------------------------------

def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def accumulate_conv2d(x: torch.Tensor, w: torch.Tensor, acc: Accumulator, stride=1, padding=0,
                      dilation=1, groups: int = 1, *,
                      generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``F.conv2d(x, w)`` (no bias) with the reduction over ``(c, kh, kw)`` accumulated by ``acc``."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups or o % groups:
        raise ValueError(f"conv shapes do not match: input {tuple(x.shape)}, weight {tuple(w.shape)}, "
                         f"groups={groups}")
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # (N, C*kh*kw, L)
    cols = cols.reshape(n, groups, cg * kh * kw, ho * wo)
    wmat = w.reshape(groups, o // groups, cg * kh * kw)
    y = accumulate_matmul(wmat, cols, acc, generator=generator)  # (N, G, O/G, L)
    return y.reshape(n, o, ho, wo)


def accumulate_conv2d_input(grad: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
                            acc: Accumulator, stride=1, padding=0, dilation=1, groups: int = 1, *,
                            generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Input gradient of ``conv2d`` as a direct convolution, so the whole reduction is accumulated.

    The transposed convolution is rewritten as a stride-1 convolution of the
    zero-dilated, padded output gradient with the flipped, transposed weight
    (no col2im overlap-add, which would sum in float32 outside the emulated
    accumulator). The reduction runs over ``(o, kh, kw)``; the inserted zeros
    add exact zeros.
    """
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, o, ho, wo = grad.shape
    kh, kw = w.shape[-2:]
    h, wd = input_shape[-2:]
    if stride != (1, 1):
        dil = grad.new_zeros(n, o, (ho - 1) * stride[0] + 1, (wo - 1) * stride[1] + 1)
        dil[:, :, ::stride[0], ::stride[1]] = grad
        grad = dil
    pads = []
    for size, out, k, s, p, d in ((wd, wo, kw, stride[1], padding[1], dilation[1]),
                                 (h, ho, kh, stride[0], padding[0], dilation[0])):
        pads += [d * (k - 1) - p, size - (out - 1) * s - 1 + p]  # negative entries crop
    grad = F.pad(grad, pads)
    wt = rearrange(w, "(g o) c kh kw -> (g c) o kh kw", g=groups).flip(-2, -1)
    return accumulate_conv2d(grad, wt, acc, 1, 0, dilation, groups, generator=generator)


def accumulate_conv2d_weight(grad: torch.Tensor, x: torch.Tensor, weight_shape: Sequence[int],
                             acc: Accumulator, stride=1, padding=0, dilation=1, groups: int = 1, *,
                             generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Weight gradient of ``conv2d``: reduction over ``(n, oh, ow)`` accumulated by ``acc``."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    o, cg, kh, kw = weight_shape
    cols = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # (N, C*kh*kw, L)
    cols = rearrange(cols, "n (g k) l -> g (n l) k", g=groups)
    g = rearrange(grad, "n (g o) h w -> g o (n h w)", g=groups)
    return accumulate_matmul(g, cols, acc, generator=generator).reshape(o, cg, kh, kw)
