"""Drop-in quantized layers: ``QConv1d``, ``QConv2d``, ``QLinear``, ``QMatmul``.

Each is a subclass of the PyTorch layer it replaces (``isinstance(q, nn.Conv2d)``
stays true, ``state_dict`` keys are unchanged) whose forward goes through
``bfp.functional``. A layer holds:

* ``precision``: a ``LayerPrecision`` (the nine points and the accumulator),
  read at every forward; change it with ``set_format(point, fmt)`` or
  ``set_precision(p)``, e.g. from the dynamic precision controller.
* ``quantize_hook``: ``None`` or ``hook(layer, point, tensor, fmt) -> Tensor``,
  called instead of ``bfp.quantize`` at every point, forward and backward
  (to measure zero-setting error, or to quantize differently).
* ``generator``: the ``torch.Generator`` of its stochastic rounding.

``from_float`` swaps a float layer for its quantized twin keeping the *same*
Parameter objects, so optimizers, weight tying and checkpoints are unaffected.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from . import functional as bfpF
from .formats import Format, format_from_name
from .precision import LayerPrecision
from .quantizer import check_history_values

__all__ = ["QConv1d", "QConv2d", "QLinear", "QTransposedLinear", "QMatmul", "Matmul", "CONVERTIBLE",
           "QUANTIZED_TYPES", "quantized_twin", "chain_quantize_hooks", "restore_quantize_hooks"]


def _check_precision(precision: Optional[LayerPrecision]) -> LayerPrecision:
    if precision is None:
        return LayerPrecision()
    if not isinstance(precision, LayerPrecision):
        raise ValueError(f"precision must be a LayerPrecision or None, got {precision!r}")
    return precision


class _QuantizedMixin:
    """Precision state and the controls the dynamic-precision engine uses."""

    def _init_quantized(self, precision: Optional[LayerPrecision]) -> None:
        self.quantize_hook = None
        self.generator: Optional[torch.Generator] = None
        self.set_precision(precision)

    def set_format(self, point: str, fmt: Union[Format, str, None]) -> None:
        """Set one point's format (a ``Format``, a preset name such as ``"fb16"``, or ``None``)."""
        if isinstance(fmt, str):
            fmt = format_from_name(fmt)
        self.set_precision(self.precision.with_format(point, fmt))

    def set_precision(self, precision: Optional[LayerPrecision]) -> None:
        self.precision = _check_precision(precision)
        self._sync_histories()

    def _sync_histories(self) -> None:
        """A buffer ``amax_history_<point>`` for every point with delayed scaling (``bfp.formats.scaled``),
        of its history's length, on the layer's device; stale ones go. Buffers are state_dict
        entries, so checkpoints carry the histories."""
        dev = next((p.device for p in self.parameters(recurse=False) if not p.is_meta), torch.device("cpu"))
        want = {f"amax_history_{p}": f.history_length for p, f in self.precision.formats().items()
                if f is not None and f.history_length}
        self.has_delayed = bool(want)  # read by functional.layer_quantizer at every forward
        for name in [n for n in self._buffers if n.startswith("amax_history_") and n not in want]:
            del self._buffers[name]
        for name, n in want.items():
            buf = self._buffers.get(name)
            if buf is None or buf.numel() != n or buf.is_meta:
                self.register_buffer(name, torch.zeros(n, dtype=torch.float32, device=dev))

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (``.to``, ``.cuda``, ``.half`` ...), except that the amax histories stay
        float32 whatever dtype the parameters take (``model.to(torch.bfloat16)``): they move to the new
        device with their values exactly."""
        kept = {n: b for n, b in self._buffers.items() if n.startswith("amax_history_") and b is not None}
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers.get(name)
            if new is not None and new.dtype != torch.float32:
                self._buffers[name] = old.to(device=new.device)
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """``nn.Module``'s, refusing an amax history that is not float32 values >= 0, finite (an Inf
        would make every output NaN; a NaN would be ignored): the error names the entry."""
        for point, fmt in self.precision.formats().items():
            saved = state_dict.get(f"{prefix}amax_history_{point}")
            if fmt is None or not fmt.history_length or not isinstance(saved, Tensor):
                continue
            problem = f"an amax history is float32, got {saved.dtype}" if saved.dtype != torch.float32 else None
            try:
                check_history_values(fmt, saved)
            except ValueError as e:
                problem = problem or str(e)
            if problem is not None:  # reported by load_state_dict; the layer's own history is kept
                error_msgs.append(f"{prefix}amax_history_{point}: {problem}")
                state_dict[f"{prefix}amax_history_{point}"] = self.amax_history(point)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def amax_history(self, point: str) -> Tensor:
        """The amax history of ``point``'s delayed scaling (created if missing)."""
        if f"amax_history_{point}" not in self._buffers:
            self._sync_histories()
        return self._buffers[f"amax_history_{point}"]

    format_state = amax_history  # the state ``bfp.quantize(state=...)`` takes for a point's format

    def _gemm_kwargs(self) -> dict:
        return {"precision": self.precision, "quantizer": bfpF.layer_quantizer(self),
                "generator": self.generator}

    def _precision_repr(self) -> str:
        return f"precision={self.precision!r}"

    @classmethod
    def _check_source(cls, module: nn.Module, base: type) -> None:
        if not isinstance(module, base):
            raise ValueError(f"{cls.__name__}.from_float needs an {base.__module__}.{base.__name__}, "
                             f"got {type(module).__name__}")

    def _adopt(self, module: nn.Module) -> None:
        """Take over ``module``'s Parameter objects and training mode (no copies)."""
        for name, param in module.named_parameters(recurse=False):
            setattr(self, name, param)
        left = [n for n, p in self.named_parameters(recurse=False) if p.is_meta]
        if left:  # e.g. a parametrized weight (weight_norm): not a Parameter of the module itself
            raise ValueError(f"{type(self).__name__}.from_float: {type(module).__name__} has no plain "
                             f"Parameter {', '.join(left)} to adopt; remove its parametrization first")
        self.train(module.training)


class QLinear(_QuantizedMixin, nn.Linear):
    """``nn.Linear`` with the nine quantization points; accepts (..., C) inputs, e.g. (N, T, C)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 precision: Optional[LayerPrecision] = None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self._init_quantized(precision)

    @classmethod
    def from_float(cls, module: nn.Linear, precision: Optional[LayerPrecision] = None) -> "QLinear":
        cls._check_source(module, nn.Linear)
        with torch.device("meta"):
            new = cls(module.in_features, module.out_features, module.bias is not None, precision=precision)
        new._adopt(module)
        new._sync_histories()  # made under the meta device: now on the weight's
        return new

    def forward(self, x: Tensor) -> Tensor:
        return bfpF.qlinear(x, self.weight, self.bias, **self._gemm_kwargs())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._precision_repr()}"


def is_transposed_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face ``transformers.pytorch_utils.Conv1D`` (GPT-2's projections):
    a linear map whose weight is stored transposed, (in, out), computed as ``addmm(bias, x, weight)``.
    Recognised by its class name and attributes, so bfp never imports transformers."""
    w = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(getattr(module, "nf", None), int)
            and isinstance(w, nn.Parameter) and w.dim() == 2 and w.shape[1] == module.nf)


class QTransposedLinear(QLinear):
    """A ``transformers`` ``Conv1D`` (weight (in, out)) with the nine points of a ``Linear``.

    The points see the weight as a Linear's, ``weight.t()`` of shape (out, in), so every axis in a
    config means what it means for ``nn.Linear`` (the config type name is ``Linear``). The Parameter
    and its state_dict key stay the model's own. With quantization off it computes exactly as
    ``Conv1D.forward`` (``torch.addmm(bias, x, weight)``), bit for bit, gradients included.
    """

    @classmethod
    def from_float(cls, module: nn.Module, precision: Optional[LayerPrecision] = None) -> "QTransposedLinear":
        if not (is_transposed_linear(module) or isinstance(module, QTransposedLinear)):
            raise ValueError(f"{cls.__name__}.from_float needs a transformers Conv1D, got {type(module).__name__}")
        n_in, n_out = module.weight.shape
        with torch.device("meta"):
            new = cls(n_in, n_out, module.bias is not None, precision=precision)
        new._adopt(module)
        new._sync_histories()
        return new

    def forward(self, x: Tensor) -> Tensor:
        if not self.precision.enabled:
            out = x.reshape(-1, x.shape[-1])
            out = torch.addmm(self.bias, out, self.weight) if self.bias is not None else out @ self.weight
            return out.view(x.shape[:-1] + (self.out_features,))
        return bfpF.qlinear(x, self.weight.t(), self.bias, **self._gemm_kwargs())


class _QConvNd(_QuantizedMixin):
    _dims = 2
    _float_type: type = nn.Conv2d

    def __init__(self, *args, precision: Optional[LayerPrecision] = None, **kwargs):
        super().__init__(*args, **kwargs)  # the nn.ConvNd after the mixin in the MRO
        self._init_quantized(precision)

    @classmethod
    def from_float(cls, module: nn.Module, precision: Optional[LayerPrecision] = None):
        cls._check_source(module, cls._float_type)
        with torch.device("meta"):
            new = cls(module.in_channels, module.out_channels, module.kernel_size, module.stride,
                      module.padding, module.dilation, module.groups, module.bias is not None,
                      module.padding_mode, precision=precision)
        new._adopt(module)
        new._sync_histories()  # made under the meta device: now on the weight's
        return new

    def forward(self, x: Tensor) -> Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":  # as nn.ConvNd: pad first; the GEMM operand is the padded x
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        qconv = bfpF.qconv2d if self._dims == 2 else bfpF.qconv1d
        return qconv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups,
                     **self._gemm_kwargs())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._precision_repr()}"


class QConv2d(_QConvNd, nn.Conv2d):
    """``nn.Conv2d`` with the nine quantization points."""

    _dims = 2
    _float_type = nn.Conv2d


class QConv1d(_QConvNd, nn.Conv1d):
    """``nn.Conv1d`` with the nine quantization points."""

    _dims = 1
    _float_type = nn.Conv1d


class Matmul(nn.Module):
    """``a @ b`` as a module, so a model's attention products have names that
    conversion configs can address (``"net.attn.qk"``); ``QMatmul`` replaces it."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.matmul(a, b)


class QMatmul(_QuantizedMixin, nn.Module):
    """Quantized ``a @ b`` for attention: ``a`` takes the input points (``fi``,
    ``bwi``, ``big``), ``b`` the weight points (``fw``, ``biw``, ``bwg``).
    With the default (all-off) precision it is a plain matmul."""

    def __init__(self, precision: Optional[LayerPrecision] = None):
        super().__init__()
        self._init_quantized(precision)

    @classmethod
    def from_float(cls, module: nn.Module, precision: Optional[LayerPrecision] = None) -> "QMatmul":
        if not isinstance(module, (Matmul, QMatmul)):
            raise ValueError(f"QMatmul.from_float needs a bfp.layers.Matmul or QMatmul, "
                             f"got {type(module).__name__}")
        new = cls(precision)
        new.train(module.training)
        return new

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return bfpF.qmatmul(a, b, **self._gemm_kwargs())

    def extra_repr(self) -> str:
        return self._precision_repr()


# The one list of convertible layer types: float class -> its quantized twin, in
# the order configs and reports name them. Conversion and config derive from it.
CONVERTIBLE: dict[type, type] = {nn.Conv1d: QConv1d, nn.Conv2d: QConv2d, nn.Linear: QLinear, Matmul: QMatmul}


def quantized_twin(module: nn.Module) -> Optional[type]:
    """The Q-layer class that replaces ``module`` (its exact type in ``CONVERTIBLE``, or a transformers
    ``Conv1D``), or None when it is not convertible."""
    twin = CONVERTIBLE.get(type(module))  # exact type: a subclass may compute something else
    if twin is None and is_transposed_linear(module):
        return QTransposedLinear
    return twin


# The torch.nn layers among them (Matmul is bfp's own module).
QUANTIZED_TYPES = {f: q for f, q in CONVERTIBLE.items() if f is not Matmul}


MEASURE_HOOK = "_bfp_measures"  # set on a forward hook that measures (grad histograms, shadow diagnostics)


def measuring_hook(fn: Callable) -> Callable:
    """``fn`` (a function or a bound method) as a forward hook marked as one that measures: a step
    with it armed runs eagerly (``measured_by_hooks``)."""
    def hook(*args, **kwargs):
        return fn(*args, **kwargs)
    setattr(hook, MEASURE_HOOK, True)
    return hook


def measured_by_hooks(model: nn.Module) -> bool:
    """Whether a measuring forward hook (``measuring_hook``) is armed on ``model`` or a submodule."""
    return any(getattr(h, MEASURE_HOOK, False) for m in model.modules()
               for hooks in (m._forward_hooks, m._forward_pre_hooks) if hooks for h in hooks.values())


def chain_quantize_hooks(layers: Mapping[str, nn.Module], make: Callable[[str, Any], Any]) -> dict[str, Any]:
    """Give each layer of ``layers`` the quantize hook ``make(name, previous)`` (``previous``: the hook it
    had, for the new one to call on); returns the previous hooks, for ``restore_quantize_hooks``."""
    saved = {n: getattr(m, "quantize_hook", None) for n, m in layers.items()}
    for name, module in layers.items():
        module.quantize_hook = make(name, saved[name])
    return saved


def restore_quantize_hooks(layers: Mapping[str, nn.Module], saved: Mapping[str, Any]) -> None:
    """Give the layers back the hooks ``chain_quantize_hooks`` returned."""
    for name, module in layers.items():
        module.quantize_hook = saved[name]
