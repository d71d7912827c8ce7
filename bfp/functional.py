"""Quantized GEMM-like ops as autograd Functions: the layer between kernels and modules.

One Function, ``QGemmFunction``, serves every op (linear, conv1d, conv2d,
matmul); an op object supplies the three GEMMs (forward, input gradient,
weight gradient) and the bias gradient. The nine points (``bfp.precision``)
are applied around them:

* forward: ``y = fo(op(fi(x), fw(w)) + b)``; the bias is added once, by the
  op itself (``F.linear``/``F.conv2d`` with their bias argument), before ``fo``.
* input gradient: ``dx = big(op_input_grad(bio(dy), biw(w)))``.
* weight gradient: ``dw = bwg(op_weight_grad(bwo(dy), bwi(x)))``.
* overflow: the four backward points first report a value beyond their
  format's range to a loss scaler that watches (``bfp.overflow``), which then
  skips the step; the check only reads the tensor.
* bias gradient: the sum of the *unquantized* output gradient ``dy`` over all
  non-channel dims, in float32 and outside any emulated accumulator. The
  bias gradient is a reduction in the vector unit, not a GEMM, so none of
  the nine points covers it; quantize it in the optimizer if needed.

Quantizers are straight-through: the gradient of a rounding is the identity.
``x`` and ``w`` in backward are the full-precision tensors the forward
received (``backward_source="full"``, the default) or the ``fi``/``fw``
quantized copies (``"quantized"``). Where ``bwi`` equals ``fi`` (or ``biw``
equals ``fw``), rounds deterministically and no hook is set, the forward copy
is kept instead of x (w) and reused: the same bits, one rounding fewer. With delayed scaling the
layer's quantizer keeps the forward copy too, while the two points' amax histories agree
(``_StateReuse``: checked as the forward rounds and again as the backward does; otherwise the point
rounds again). Nothing is modified in place: every
quantization returns a new tensor, so a residual branch that shares ``x``
sees it unchanged. The precision and the layer's hook are captured when the
forward runs; a change between forward and backward takes effect at the next step.

With every point off and no accumulator the functional forms call the plain
PyTorch op (no Function at all); the Function itself is also bit-identical
to PyTorch in that case (tested), because its backward calls the same ATen
kernels autograd uses.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import hadamard
from .accumulate import (Accumulator, accumulate_conv2d, accumulate_conv2d_input,
                         accumulate_conv2d_weight, accumulate_matmul)
from .formats import Format, Rounding
from .kernels import quantize
from .overflow import active as _overflow_active
from .overflow import check as _check_overflow
from .precision import FusedAccumulator, LayerPrecision
from .quantizer import Quantizer, layer_quantizer

__all__ = ["QGemmFunction", "Quantizer", "layer_quantizer", "qlinear", "qconv1d", "qconv2d", "qmatmul"]

def _plain_quantizer(generator: Optional[torch.Generator]) -> Quantizer:
    return lambda point, t, fmt: quantize(t, fmt, generator=generator)


def _point(q: Quantizer, point: str, t: Tensor, fmt: Optional[Format]) -> Tensor:
    return t if fmt is None else q(point, t, fmt)


def _grad_point(q: Quantizer, point: str, t: Tensor, fmt: Optional[Format]) -> Tensor:
    """A backward point: reports an overflow of ``fmt`` to a watching loss scaler
    (``bfp.overflow``; reads ``t`` only), then rounds as ``_point``."""
    _check_overflow(point, t, fmt)
    return _point(q, point, t, fmt)


def _rht_point(q: Quantizer, point: str, t: Tensor, fmt: Optional[Format], rht, generator, fuse: bool) -> Tensor:
    """``t``'s rows Hadamard-transformed, then rounded at ``point``. With ``fuse`` (the plain
    quantizer, no loss scaler watching) ``bfp.hadamard.transform_quantize`` does both: one
    kernel where it applies, the same bits and draws."""
    if fuse and fmt is not None:
        return hadamard.transform_quantize(t, rht, fmt, generator)
    return _grad_point(q, point, hadamard.transform_rows(t, rht), fmt)


def _acc_for(p: LayerPrecision, gemm: str, op) -> Optional[Accumulator]:
    """The accumulator of ``gemm`` (None: float32). A tensor core's fused adder learns its operands'
    smallest normal exponents from their points' formats (an FP8 subnormal operand counts as its
    format's smallest normal exponent): ``op.ACC_OPERANDS[gemm]`` names the points of (a, b)."""
    acc = p.accumulator
    if acc is None or not acc.uses(gemm):
        return None
    if isinstance(acc, FusedAccumulator):
        fa, fb = (getattr(p, point) for point in op.ACC_OPERANDS[gemm])
        ea, eb = acc.emins()
        na, nb = (f.normal_emin() if f is not None else None for f in (fa, fb))
        acc = _with_operand_emin(acc, (ea if na is None else na, eb if nb is None else nb))
    return acc


@functools.lru_cache(maxsize=256)
def _with_operand_emin(acc: FusedAccumulator, emin: tuple) -> FusedAccumulator:
    """``acc`` with its operands' smallest normal exponents (cached: three GEMMs a step ask for it)."""
    return dataclasses.replace(acc, operand_emin=emin)


# -- ops: the three GEMMs of each layer type -------------------------------------------

class _LinearOp:
    """``y = x W^T + b`` on inputs (..., C): the GEMMs run on (rows, C) matrices."""

    ACC_OPERANDS = {"forward": ("fi", "fw"), "input_grad": ("bio", "biw"), "weight_grad": ("bwo", "bwi")}

    def forward(self, x, w, b, acc, gen):
        if acc is None:
            return F.linear(x, w, b)
        y = accumulate_matmul(x.reshape(-1, x.shape[-1]), w.t(), acc, generator=gen)
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return y if b is None else y + b

    def grad_input(self, g, w, x, acc, gen):
        if acc is None:
            return g.matmul(w)
        return accumulate_matmul(g.reshape(-1, g.shape[-1]), w, acc, generator=gen).reshape(x.shape)

    def rows(self, g, x, w):
        """The weight-gradient inputs as (rows, channels) matrices: rows are the reduction axis."""
        return g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])

    def grad_weight(self, g, x, w, acc, gen):
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        if acc is None:
            return g2.t().mm(x2)
        return accumulate_matmul(g2.t(), x2, acc, generator=gen)

    def grad_bias(self, g, x, w):
        return g.reshape(-1, g.shape[-1]).sum(0)


class _ConvOp:
    """Conv1d/Conv2d with int padding; backward through the ATen kernel autograd uses."""

    # lowered to matmuls of (weights, input columns), (flipped weights, gradient columns), (g, x columns)
    ACC_OPERANDS = {"forward": ("fw", "fi"), "input_grad": ("biw", "bio"), "weight_grad": ("bwo", "bwi")}

    def __init__(self, dims: int, stride, padding, dilation, groups: int):
        self.dims, self.groups = dims, groups
        self.stride, self.padding, self.dilation = (_ntuple(v, dims) for v in (stride, padding, dilation))

    def _backward(self, g, x, w, mask):
        # ATen wants every operand in g's dtype: under autocast that is the compute dtype,
        # and x or w may be a float32 tensor passed only for its shape.
        x, w = x.to(g.dtype), w.to(g.dtype)
        return torch.ops.aten.convolution_backward(
            g, x, w, [w.shape[0]], list(self.stride), list(self.padding), list(self.dilation),
            False, [0] * self.dims, self.groups, mask)

    def _as2d(self):
        """Conv1d runs as a conv2d of height 1 in the accumulator path."""
        if self.dims == 2:
            return self.stride, self.padding, self.dilation, (lambda t: t), (lambda t: t)
        return ((1, *self.stride), (0, *self.padding), (1, *self.dilation),
                (lambda t: t.unsqueeze(-2)), (lambda t: t.squeeze(-2)))

    def forward(self, x, w, b, acc, gen):
        if acc is None:
            conv = F.conv2d if self.dims == 2 else F.conv1d
            return conv(x, w, b, self.stride, self.padding, self.dilation, self.groups)
        s, p, d, up, down = self._as2d()
        y = down(accumulate_conv2d(up(x), up(w), acc, s, p, d, self.groups, generator=gen))
        return y if b is None else y + b.reshape(-1, *([1] * self.dims))

    def _lowered_grad(self, fn, g, operand, shaped_like, acc, gen):
        s, p, d, up, down = self._as2d()
        return down(fn(up(g), up(operand), up(shaped_like).shape, acc, s, p, d, self.groups, generator=gen))

    def grad_input(self, g, w, x, acc, gen):
        if acc is None:
            return self._backward(g, x, w, [True, False, False])[0]
        return self._lowered_grad(accumulate_conv2d_input, g, w, x, acc, gen)

    def grad_weight(self, g, x, w, acc, gen):
        if acc is None:
            return self._backward(g, x, w, [False, True, False])[1]
        return self._lowered_grad(accumulate_conv2d_weight, g, x, w, acc, gen)

    def grad_bias(self, g, x, w):
        return self._backward(g, x, w, [False, False, True])[2]


class _MatmulOp:
    """``a @ b`` with broadcast batch dims: ``a`` plays the input, ``b`` the weight."""

    ACC_OPERANDS = {"forward": ("fi", "fw"), "input_grad": ("bio", "biw"), "weight_grad": ("bwi", "bwo")}

    def forward(self, a, b, bias, acc, gen):
        return torch.matmul(a, b) if acc is None else accumulate_matmul(a, b, acc, generator=gen)

    def grad_input(self, g, b, a, acc, gen):
        bt = b.transpose(-1, -2)
        ga = g @ bt if acc is None else accumulate_matmul(g, bt, acc, generator=gen)
        return ga.sum_to_size(a.shape)

    def rows(self, g, a, b):
        """The weight-gradient inputs with the reduction axis (a's rows) at dim -2."""
        if b.dim() == 2:
            return g.reshape(-1, g.shape[-1]), a.reshape(-1, a.shape[-1])
        return g, a

    def grad_weight(self, g, a, b, acc, gen):
        if b.dim() == 2:  # torch.matmul folds a's batch dims into rows here: so do we
            a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
        at = a.transpose(-1, -2)
        gb = at @ g if acc is None else accumulate_matmul(at, g, acc, generator=gen)
        return gb.sum_to_size(b.shape)

    def grad_bias(self, g, a, b):  # pragma: no cover - matmul has no bias
        raise ValueError("matmul has no bias")


def _ntuple(v, n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


class QGemmFunction(torch.autograd.Function):
    """The nine-point quantized GEMM; see the module docstring for the dataflow."""

    @staticmethod
    def forward(ctx, x, w, b, op, precision: LayerPrecision, quantizer: Optional[Quantizer], generator):
        p = precision
        q = quantizer if quantizer is not None else _plain_quantizer(generator)
        # delayed scaling: bwi/biw may take the forward copies (decided before fi/fw round)
        reuse = getattr(quantizer, "reuse", None) if p.backward_source != "quantized" else None
        tok = (reuse("fi", "bwi", p.fi, p.bwi) if reuse and p.rht is None else None,
               reuse("fw", "biw", p.fw, p.biw) if reuse else None)
        xq, wq = _point(q, "fi", x, p.fi), _point(q, "fw", w, p.fw)
        y = op.forward(xq, wq, b, _acc_for(p, "forward", op), generator)
        y = _point(q, "fo", y, p.fo)
        ctx.tok = tok
        if p.backward_source == "quantized":
            ctx.reused = (False, False)
            ctx.save_for_backward(xq, wq, None, None)
        else:
            # bwi(x) == fi(x) bit for bit when both are the same deterministic format and
            # plain bfp.quantize rounds: keep the forward copy instead of rounding again.
            # (not with a Hadamard transform: bwi then rounds the transformed input)
            ctx.reused = (_same_rounding(quantizer, p.fi, p.bwi) and p.rht is None,
                          _same_rounding(quantizer, p.fw, p.biw))
            for t in tok:
                if t is not None:
                    t.forward_done()
            ctx.save_for_backward(xq if ctx.reused[0] else x, wq if ctx.reused[1] else w,
                                  xq if tok[0] else None, wq if tok[1] else None)
        ctx.op, ctx.precision, ctx.q, ctx.generator = op, p, q, generator
        ctx.plain = quantizer is None  # no hook reads the tensors a point rounds
        ctx.has_bias = b is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, w, xq, wq = ctx.saved_tensors
        p, op, q, gen = ctx.precision, ctx.op, ctx.q, ctx.generator
        reused = (ctx.reused[0] or (ctx.tok[0] is not None and ctx.needs_input_grad[1] and ctx.tok[0].take()),
                  ctx.reused[1] or (ctx.tok[1] is not None and ctx.needs_input_grad[0] and ctx.tok[1].take()))
        x = xq if reused[0] and not ctx.reused[0] else x
        w = wq if reused[1] and not ctx.reused[1] else w
        # g has the dtype of the forward GEMM: float32, or the compute dtype under autocast,
        # which the backward GEMMs use too (as autograd does); .to is a no-op otherwise.
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            w_biw = w if reused[1] else _point(q, "biw", w, p.biw)
            gx = op.grad_input(_grad_point(q, "bio", g, p.bio), w_biw.to(g.dtype), x,
                               _acc_for(p, "input_grad", op), gen)
            gx = _grad_point(q, "big", gx, p.big)
        if ctx.needs_input_grad[1]:
            gr, xr = g, x
            if p.rht is not None:  # H along the reduction rows of both inputs: cancels in the product
                if not hasattr(op, "rows"):
                    raise ValueError("rht (a Hadamard transform of the weight-gradient inputs) needs a Linear or "
                                     f"Matmul layer, got {type(op).__name__.strip('_').replace('Op', '')}")
                gr, xr = op.rows(g, x.to(g.dtype), w)
                fuse = ctx.plain and not _overflow_active()  # nothing else reads the transformed tensors
                x_bwi = hadamard.transform_rows(xr, p.rht) if reused[0] else \
                    _rht_point(q, "bwi", xr, p.bwi, p.rht, gen, fuse)
                g_bwo = _rht_point(q, "bwo", gr, p.bwo, p.rht, gen, fuse)
            else:
                x_bwi = xr if reused[0] else _point(q, "bwi", xr, p.bwi)
                g_bwo = _grad_point(q, "bwo", gr, p.bwo)
            gw = op.grad_weight(g_bwo, x_bwi.to(g.dtype), w, _acc_for(p, "weight_grad", op), gen)
            gw = _grad_point(q, "bwg", gw, p.bwg)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = op.grad_bias(g, x, w)
        return gx, gw, gb, None, None, None, None


def _same_rounding(quantizer, fwd: Optional[Format], bwd: Optional[Format]) -> bool:
    return (quantizer is None and fwd is not None and fwd == bwd
            and fwd.rounding is not Rounding.STOCHASTIC)


def _active(precision: Optional[LayerPrecision]) -> bool:
    if precision is None:
        return False
    if not isinstance(precision, LayerPrecision):  # its accumulator is checked by LayerPrecision itself
        raise ValueError(f"precision must be a LayerPrecision or None, got {precision!r}")
    return precision.enabled


def _apply(x, w, b, op, precision, quantizer, generator):
    return QGemmFunction.apply(x, w, b, op, precision, quantizer, generator)


def qlinear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
            precision: Optional[LayerPrecision] = None, *, quantizer: Optional[Quantizer] = None,
            generator: Optional[torch.Generator] = None) -> Tensor:
    """``F.linear`` with the nine points of ``precision``; inputs (..., C), e.g. (N, T, C).

    ``quantizer(point, tensor, fmt)`` replaces ``bfp.quantize`` when given;
    ``generator`` drives stochastic rounding (points and accumulator).
    """
    if not _active(precision):
        return F.linear(x, weight, bias)
    return _apply(x, weight, bias, _LinearOp(), precision, quantizer, generator)


def _resolve_padding(x: Tensor, padding, weight: Tensor, dilation, dims: int):
    """Int padding for the Function; ``"same"`` with odd total padding pads ``x`` on the right
    first, exactly as ATen does, so results stay bit-identical to ``padding="same"``."""
    if not isinstance(padding, str):
        return x, padding
    if padding == "valid":
        return x, 0
    if padding != "same":
        raise ValueError(f"padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    dilation = _ntuple(dilation, dims)
    left, extra = [], []
    for k, d in zip(weight.shape[2:], dilation):
        total = d * (k - 1)
        left.append(total // 2)
        extra.append(total - 2 * (total // 2))
    if any(extra):
        x = F.pad(x, [v for e in reversed(extra) for v in (0, e)])
    return x, tuple(left)


def _qconv(dims: int, x, weight, bias, stride, padding, dilation, groups, precision, quantizer, generator):
    if not _active(precision):
        conv = F.conv2d if dims == 2 else F.conv1d
        return conv(x, weight, bias, stride, padding, dilation, groups)
    if x.dim() == dims + 1:  # unbatched (C, ...), as nn.ConvNd takes it: a batch of one for the points
        return _qconv(dims, x.unsqueeze(0), weight, bias, stride, padding, dilation, groups, precision,
                      quantizer, generator).squeeze(0)
    x, padding = _resolve_padding(x, padding, weight, dilation, dims)
    return _apply(x, weight, bias, _ConvOp(dims, stride, padding, dilation, groups), precision,
                  quantizer, generator)


def qconv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1,
            padding: Union[int, Sequence[int], str] = 0, dilation=1, groups: int = 1,
            precision: Optional[LayerPrecision] = None, *, quantizer: Optional[Quantizer] = None,
            generator: Optional[torch.Generator] = None) -> Tensor:
    """``F.conv2d`` with the nine points of ``precision`` (zero padding; see ``QConv2d``
    for the other padding modes)."""
    return _qconv(2, x, weight, bias, stride, padding, dilation, groups, precision, quantizer, generator)


def qconv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1,
            padding: Union[int, Sequence[int], str] = 0, dilation=1, groups: int = 1,
            precision: Optional[LayerPrecision] = None, *, quantizer: Optional[Quantizer] = None,
            generator: Optional[torch.Generator] = None) -> Tensor:
    """``F.conv1d`` with the nine points of ``precision``."""
    return _qconv(1, x, weight, bias, stride, padding, dilation, groups, precision, quantizer, generator)


def qmatmul(a: Tensor, b: Tensor, precision: Optional[LayerPrecision] = None, *,
            quantizer: Optional[Quantizer] = None,
            generator: Optional[torch.Generator] = None) -> Tensor:
    """``a @ b`` (both at least 2-D, batch dims broadcast) with the nine points.

    ``a`` takes the input roles (``fi``, ``bwi``; its gradient is ``big``),
    ``b`` the weight roles (``fw``, ``biw``; its gradient is ``bwg``): in
    attention, ``qmatmul(q, k.transpose(-2, -1))`` and ``qmatmul(p, v)``.
    """
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"qmatmul needs operands with at least 2 dims, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if not _active(precision):
        return torch.matmul(a, b)
    return _apply(a, b, None, _MatmulOp(), precision, quantizer, generator)
