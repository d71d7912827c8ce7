"""The quantizer a quantized layer hands its GEMMs for one step (``layer_quantizer``): plain
``bfp.quantize`` (None), the layer's ``quantize_hook``, or the layer's stateful formats (delayed
scaling: the layer holds each point's amax history), and for delayed scaling the promise that a
backward point may take its forward point's copy (``_StateReuse``)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .formats import Format, Rounding
from .kernels import check_history_values, quantize, quantize_held, quantize_stats  # noqa: F401 (re-exported for layers)

# quantizer(point, tensor, fmt) -> new tensor
Quantizer = Callable[[str, Tensor, Format], Tensor]


def layer_quantizer(layer) -> Optional[Quantizer]:
    """The quantizer of a Q-layer's next step: ``None`` (plain ``bfp.quantize`` with
    ``layer.generator``) without a ``quantize_hook``, else a call of the hook.

    Taken when the forward runs, like the precision: a hook installed between a
    forward and its backward applies from the next step.
    """
    hook = layer.quantize_hook
    if hook is None and not getattr(layer, "has_delayed", False):  # set with the layer's precision
        return None
    return _LayerQuantizer(layer, hook)


def round_at(layer, point: str, t: Tensor, fmt: Format, stats: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """The rounding a layer's ``point`` makes of ``t`` without a hook, with the kernel's counts
    (``stats``; None where the format keeps state): what a ``quantize_hook`` calls to round as the
    layer would. A stateful format (delayed scaling) rounds with the layer's history at ``point``
    and, in training, moves it, as the layer itself would."""
    if fmt is not None and fmt.history_length:  # the format keeps state: the layer holds it
        return quantize_held(t, fmt, generator=layer.generator, state=layer.format_state(point),
                             update_state=layer.training), None
    if not stats:
        return quantize(t, fmt, generator=getattr(layer, "generator", None)), None
    return quantize_stats(t, fmt, generator=getattr(layer, "generator", None), stats=True)


class _LayerQuantizer:
    """``q(point, tensor, fmt)`` of a layer with a hook or with stateful formats (delayed scaling:
    the layer holds each point's amax history)."""

    def __init__(self, layer, hook):
        self.layer, self.hook = layer, hook

    def __call__(self, point: str, t: Tensor, fmt: Format) -> Tensor:
        layer = self.layer
        if self.hook is None:
            return round_at(layer, point, t, fmt, stats=False)[0]
        out = self.hook(layer, point, t, fmt)
        if not isinstance(out, Tensor) or out.shape != t.shape:
            raise ValueError(f"quantize_hook must return a tensor of shape {tuple(t.shape)} for point "
                             f"{point!r}, got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        return out

    def reuse(self, fwd: str, bwd: str, ffmt: Optional[Format], bfmt: Optional[Format]) -> Optional["_StateReuse"]:
        """Before ``fwd`` rounds: a promise that ``bwd`` (the same tensor, the same stateful format,
        deterministic, no hook) will round it to the forward's bits, or None."""
        if (self.hook is not None or ffmt is None or ffmt != bfmt or not ffmt.history_length
                or ffmt.rounding is Rounding.STOCHASTIC):
            return None
        hf, hb = self.layer.format_state(fwd), self.layer.format_state(bwd)
        if hf.device.type != "cpu" or torch.compiler.is_compiling():
            # the check reads the histories on the host: a synchronisation on a GPU, and no graph can
            # hold it; the backward point then rounds again (the same bits, two roundings more)
            return None
        return _StateReuse(self.layer, hf, hb) if torch.equal(hf, hb) else None


class _StateReuse:
    """A backward point of delayed scaling (``bwi``, ``biw``) served by its forward point's copy.

    The two points round the same tensor with the same format; their scales come from their amax
    histories, which the forward and the backward push the same amax into, so they agree step
    after step. Exact when the histories are equal as the forward rounds (checked then) and the
    backward point's is untouched until the backward runs (its version counter, checked by
    ``take``: a layer called twice before one backward fails it, and the point rounds again). ``take``
    then pushes the forward's amax into the backward point's history, as its own rounding would in
    training. Saves two of a layer's six roundings per step (BENCHMARKS.md, issue 31)."""

    def __init__(self, layer, hf: Tensor, hb: Tensor):
        self.layer, self.hf, self.hb, self.version = layer, hf, hb, hb._version
        self.pushed: Optional[Tensor] = None

    def forward_done(self) -> None:
        """After the forward point rounded: the amax it pushed (training), for ``take``."""
        if self.layer.training:
            self.pushed = self.hf[:1].clone()

    def take(self) -> bool:
        """At the backward point: whether the forward copy is its rounding (then its history moves
        as its own rounding would have moved it)."""
        if self.hb._version != self.version or (self.layer.training and self.pushed is None):
            return False
        if self.layer.training:
            with torch.no_grad():
                self.hb.copy_(torch.cat([self.pushed, self.hb[:-1]]))
        return True
