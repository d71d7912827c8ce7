"""Measuring the zero-setting error (ZSE) of Q-layers through their ``quantize_hook``.

The counts (nonzero elements, and those quantization set to zero) come out of
the quantization kernel itself (``quantize_stats(..., stats=True)``) and are
summed on the tensor's device into one int64 tensor; the host reads them only
when asked, once per decision, so a measured step adds no host sync. Kept
apart from the callback: this part knows hooks, devices and
``torch.distributed``, the callback knows when to measure and what to decide.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from ..layers import chain_quantize_hooks, restore_quantize_hooks
from ..precision import POINTS
from ..quantizer import round_at

_POINT_INDEX = {p: i for i, p in enumerate(POINTS)}


class ZseMeter:
    """ZSE counts of ``layers`` (name -> Q-layer, in count-row order) per point.

    ``install`` sets a quantize hook on every layer that counts while the
    layer is in training mode and ``active()`` is true (the callback's
    sampling: one step in ``spec.sample``); otherwise the hook only quantizes,
    as the layer would without it.
    """

    def __init__(self, layers: Mapping[str, torch.nn.Module], active: Callable[[], bool]):
        self.layers = layers
        self._active = active
        self._row = {id(m): i for i, m in enumerate(layers.values())}
        self._acc: Optional[torch.Tensor] = None  # int64 [layers, points, (nonzero, zeroed)]
        self._views: dict[tuple[int, int], torch.Tensor] = {}
        self._saved_hooks: Optional[dict[str, Any]] = None

    @property
    def installed(self) -> bool:
        return self._saved_hooks is not None

    def install(self) -> None:
        """Set the quantize hook on every managed layer (idempotent)."""
        if self._saved_hooks is not None:
            return
        self._saved_hooks = chain_quantize_hooks(self.layers, lambda name, previous: self._make_hook(previous))

    def remove(self) -> None:
        """Give the layers back the hooks they had before ``install``."""
        if self._saved_hooks is None:
            return
        restore_quantize_hooks(self.layers, self._saved_hooks)
        self._saved_hooks = None

    def _make_hook(self, previous):
        row, views, points, active = self._row, self._views, _POINT_INDEX, self._active

        def hook(layer, point, tensor, fmt):
            if not (layer.training and active()):
                if previous is not None:
                    return previous(layer, point, tensor, fmt)
                return round_at(layer, point, tensor, fmt, stats=False)[0]
            out, counts = round_at(layer, point, tensor, fmt) if previous is None else \
                (previous(layer, point, tensor, fmt), None)
            if counts is None:  # someone else's hook or a stateful format rounded: count from the result
                nz = tensor != 0
                counts = torch.stack((nz.sum(), (nz & (out == 0)).sum()))
            key = (row[id(layer)], points[point])
            view = views.get(key)
            if view is None or view.device != counts.device:
                view = self._view(key, counts.device)
            view.add_(counts)  # on the tensor's device: no host sync here
            return out

        return hook

    def _view(self, key: tuple[int, int], device: torch.device) -> torch.Tensor:
        if self._acc is None or self._acc.device != device:
            old = self._acc
            self._acc = torch.zeros(len(self.layers), len(POINTS), 2, dtype=torch.int64, device=device)
            if old is not None:
                self._acc.copy_(old)
            self._views.clear()
        view = self._views[key] = self._acc[key]
        return view

    def counts(self) -> torch.Tensor:
        """Counts since the last decision on the host: int64 [layers, 9 points, (nonzero, zeroed)]."""
        if self._acc is None:
            return torch.zeros(len(self.layers), len(POINTS), 2, dtype=torch.int64)
        return self._acc.cpu()

    def global_counts(self) -> torch.Tensor:
        """``counts()`` summed over all processes when ``torch.distributed`` is
        initialised (every rank must call it at the same decision), so all
        ranks make the same decisions; else ``counts()``."""
        dist = torch.distributed
        if self._acc is None or not (dist.is_available() and dist.is_initialized()):
            return self.counts()
        total = self._acc.clone()
        dist.all_reduce(total)
        return total.cpu()

    def point_zse(self, counts: Optional[torch.Tensor] = None) -> dict[str, dict[str, float]]:
        """ZSE per layer and measured point since the last decision (all processes)."""
        c = (self.global_counts() if counts is None else counts).tolist()
        return {name: {p: zeroed / nonzero for p, (nonzero, zeroed) in zip(POINTS, c[i]) if nonzero}
                for i, name in enumerate(self.layers)}

    def reset(self) -> None:
        """Start the next decision's counts from zero."""
        if self._acc is not None:
            self._acc.zero_()

    def load_counts(self, counts: torch.Tensor) -> None:
        """Continue from saved ``counts()`` (kept on the device already in use, if any)."""
        device = self._acc.device if self._acc is not None else counts.device
        self._acc = counts.to(device=device, dtype=torch.int64).clone()
        self._views.clear()
