"""The mixed-precision policy a ``Trainer`` is given: compute dtype plus loss scaler, one object.

``MixedPrecision(compute_dtype, device_type, loss_scale=...)``:

* compute dtype ``"fp32"`` (no autocast), ``"bf16"`` or ``"fp16"``
  (``torch.autocast`` to that dtype). Weights, gradients and optimizer state
  stay float32 in every case.
* loss scale (``LossScaler``), a choice of its own, because simulated
  gradient formats (``--bfp`` configs with e5m2/e4m3/BFP/MX at the ``bio``,
  ``bwo``, ``big``, ``bwg`` points) underflow like float16 does, whatever the
  compute dtype:

  - ``"none"``: loss and gradients unscaled; the optimizer always steps.
  - a number ``S``: static scaling; the loss is multiplied by ``S`` and the
    gradients divided by it; a step that overflows is skipped (counted), the
    scale stays.
  - ``"dynamic"``: NVIDIA's/``torch.amp.GradScaler``'s rule: start at
    ``init_scale`` (2^16); an overflowing step is skipped and the scale
    multiplied by ``backoff_factor`` (0.5); after ``growth_interval`` (2000)
    clean steps in a row it is multiplied by ``growth_factor`` (2).
  - ``None`` (the default): ``"dynamic"`` for fp16, ``"none"`` otherwise
    (bfloat16 has float32's exponent range).

An overflow is an Inf/NaN in a parameter gradient (real float16 overflow) or
a gradient point that overflows its simulated format (``bfp.overflow``: a
saturating e5m2 point would otherwise hide it as a finite +-57344).

Numerics of the scaling: the loss is multiplied by the scale in float32; the
gradients are multiplied by ``1/scale`` rounded to float32, in float32, in the
same pass that checks them (``torch._amp_foreach_non_finite_check_and_unscale_``,
GradScaler's kernel; the check sees the scaled values).
With a power-of-two scale (the default and every dynamic scale grown or backed
off by powers of two) both are exact unless a value overflows (then the step is
skipped) or falls into float32's subnormal range; so in float32 without
simulated formats, a scaled step is bit-identical to an unscaled one (tested).
The decision needs one device-to-host sync per step (as GradScaler's does), unless
``LossScaler.on_device`` keeps it on the device (``--cuda-graph``: the optimizer always runs and an
overflowing step is undone by restoring the parameters and optimizer state it changed).
"""
from __future__ import annotations

import contextlib

import math
from typing import Any, Optional, Union

import torch

from .overflow import OverflowFlag, watching

COMPUTE_DTYPES = ("fp32", "fp16", "bf16")
_TORCH_DTYPE = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0, 0.5, 2000
LOSS_SCALE_MODES = ("none", "dynamic")
# A loss scale multiplies a float32 loss: it must be a normal float32 (1e-50 rounds to 0, 1e39 to inf).
SCALE_MIN, SCALE_MAX = float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max)


def _scale_ok(v: float) -> bool:
    return math.isfinite(v) and SCALE_MIN <= v <= SCALE_MAX


SCALE_ALLOWED = "a number in [1.2e-38, 3.4e38] (a normal float32)"
#: The dynamic rule's parameters: keyword -> (test, what is allowed); LossScaler and the
#: command-line flags (bfp.cli.amp_flags) check them with this one table.
SCALER_PARAMS = {
    "init_scale": (_scale_ok, SCALE_ALLOWED),
    "growth_factor": (lambda v: math.isfinite(v) and v > 1, "a finite number > 1"),
    "backoff_factor": (lambda v: 0 < v < 1, "a number in (0, 1)"),
    "growth_interval": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
}


def check_compute_dtype(name: str) -> str:
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"`compute_dtype` {name!r}: allowed {', '.join(COMPUTE_DTYPES)}")
    return name


def parse_loss_scale(value: Union[str, float, None]) -> Union[str, float, None]:
    """``None``, ``"none"``, ``"dynamic"`` or a number a float32 loss can be multiplied by
    (``SCALE_ALLOWED``; a string such as ``"1024"`` too)."""
    if value is None or value in LOSS_SCALE_MODES:
        return value
    try:
        s = float(value)
    except (TypeError, ValueError):
        s = math.nan
    if not _scale_ok(s):
        raise ValueError(f"`loss_scale` {value!r}: allowed none, dynamic or {SCALE_ALLOWED}, e.g. 1024")
    return s


class LossScaler:
    """Static or dynamic loss scaling with skip-on-overflow; ``mode`` as ``parse_loss_scale``."""

    def __init__(self, mode: Union[str, float] = "none", *, init_scale: float = INIT_SCALE,
                 growth_factor: float = GROWTH_FACTOR, backoff_factor: float = BACKOFF_FACTOR,
                 growth_interval: int = GROWTH_INTERVAL):
        mode = parse_loss_scale(mode)
        if mode is None:
            raise ValueError("LossScaler needs a mode: none, dynamic or a number")
        given = {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                 "growth_interval": growth_interval}
        for key, v in given.items():
            ok, allowed = SCALER_PARAMS[key]
            if not ok(v):
                raise ValueError(f"`{key}` {v!r}: allowed {allowed}")
        self.mode = "static" if isinstance(mode, float) else mode
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = growth_interval
        self._dev: Optional[dict[str, torch.Tensor]] = None  # on_device(): the state as device tensors
        self.scale = 1.0 if mode == "none" else mode if isinstance(mode, float) else float(init_scale)
        self.growth_tracker = 0      # clean steps in a row since the last change (dynamic)
        self.skipped_steps = 0       # steps skipped for overflow, over the whole run
        self.last_skipped = False    # whether the latest step was skipped

    # The state: host values, or (after on_device) device tensors, read back only when asked for.
    scale = property(lambda self: self._get("scale", float), lambda self, v: self._set("scale", float(v)))
    growth_tracker = property(lambda self: self._get("growth_tracker", int),
                              lambda self, v: self._set("growth_tracker", int(v)))
    skipped_steps = property(lambda self: self._get("skipped_steps", int),
                             lambda self, v: self._set("skipped_steps", int(v)))
    last_skipped = property(lambda self: self._get("last_skipped", bool),
                            lambda self, v: self._set("last_skipped", bool(v)))

    def _get(self, key: str, kind):
        return kind(self._dev[key].item()) if self._dev is not None else self.__dict__["_" + key]

    def _set(self, key: str, value) -> None:
        self.__dict__["_" + key] = value
        if self._dev is not None:
            self._dev[key].fill_(value)

    def on_device(self, device: torch.device) -> None:
        """Keep the state on ``device`` and decide each step there, with no host read (what a
        captured CUDA graph needs, ``bfp.engine.graphed``): the scale a float32 0-dim tensor (as
        GradScaler's; a power-of-two scale, the default, is exact either way), the skip applied by
        restoring the parameters and the optimizer's state after a step that overflowed, the
        dynamic update by ``torch._amp_update_scale_``. Reading ``scale`` or the counters then
        reads the device (a synchronisation, where a log or a checkpoint asks)."""
        if self._dev is not None and self._dev["scale"].device == device:
            return
        values = {k: self.__dict__["_" + k] for k in ("scale", "growth_tracker", "skipped_steps", "last_skipped")}
        self._dev = {"scale": torch.tensor(values["scale"], dtype=torch.float32, device=device),
                     "growth_tracker": torch.tensor(values["growth_tracker"], dtype=torch.int32, device=device),
                     "skipped_steps": torch.tensor(values["skipped_steps"], dtype=torch.int64, device=device),
                     "last_skipped": torch.tensor(values["last_skipped"], dtype=torch.bool, device=device)}

    def is_enabled(self) -> bool:
        return self.mode != "none"

    def snapshot(self) -> tuple:
        """``(scale, skipped_steps, last_skipped)`` now: values, or device tensors (copies) when the
        state is on the device, for a log to read later without a synchronisation each step."""
        if self._dev is None:
            return self.scale, self.skipped_steps, self.last_skipped
        return tuple(self._dev[k].clone() for k in ("scale", "skipped_steps", "last_skipped"))

    def get_scale(self) -> float:
        return self.scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.is_enabled():
            return loss
        return loss * (self._dev["scale"] if self._dev is not None else self.__dict__["_scale"])

    def _found(self, grads: list[torch.Tensor], simulated_overflow: Optional[torch.Tensor]):
        """Unscale ``grads`` in place and flag a non-finite one or a simulated overflow (0-dim bool)."""
        by_device: dict[Any, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault((g.device, g.dtype), []).append(g)
        found = None if simulated_overflow is None else simulated_overflow.reshape(())
        for (device, _), group in by_device.items():
            # one fused pass (GradScaler's kernel): flag a non-finite scaled gradient, multiply by 1/scale
            inf = torch.zeros(1, dtype=torch.float32, device=device)
            if self._dev is not None:  # 1/scale in float64, rounded once: the host path's value
                inv = (1.0 / self._dev["scale"].double()).float().reshape(1)
            else:
                inv = torch.full((1,), 1.0 / self.scale, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, inf, inv)
            inf = inf.reshape(()) != 0
            found = inf if found is None else inf.logical_or(found.to(device))
        return found

    def _device_step(self, optimizer: torch.optim.Optimizer, simulated_overflow: Optional[torch.Tensor]) -> None:
        """``step`` decided on the device (``on_device``): the optimizer always runs, and a step that
        overflowed is undone by restoring what it changed."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        d = self._dev
        found = self._found(grads, simulated_overflow)
        found = torch.zeros((), dtype=torch.bool, device=d["scale"].device) if found is None else found.to(
            d["scale"].device)
        def tensors(p):
            return [(k, v) for k, v in optimizer.state.get(p, {}).items() if isinstance(v, torch.Tensor)]
        kept = [(p, p.detach().clone()) for p in params] + [(v, v.detach().clone()) for p in params
                                                             for _, v in tensors(p)]
        had = {(id(p), k) for p in params for k, _ in tensors(p)}
        optimizer.step()
        for t, before in kept:
            t.detach().copy_(torch.where(found, before, t.detach()))
        for p in params:  # state the step created (a first step's momentum): zero, as if never made
            for k, v in tensors(p):
                if (id(p), k) not in had:
                    v.detach().copy_(torch.where(found, torch.zeros_like(v), v.detach()))
        if self.mode == "dynamic":
            torch._amp_update_scale_(d["scale"], d["growth_tracker"], found.float(), self.growth_factor,
                                     self.backoff_factor, self.growth_interval)
        d["skipped_steps"].add_(found.long())
        d["last_skipped"].copy_(found)

    def step(self, optimizer: torch.optim.Optimizer, simulated_overflow: Optional[torch.Tensor] = None) -> bool:
        """Unscale, step unless something overflowed, update the scale; returns whether it stepped
        (True, undecided on the host, where the state is on the device: ``on_device``)."""
        if not self.is_enabled():
            optimizer.step()
            self.last_skipped = False
            return True
        if self._dev is not None:
            self._device_step(optimizer, simulated_overflow)
            return True
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        found = self._found(grads, simulated_overflow)
        overflow = bool(_any_rank(found, grads).item())  # the step's one host sync
        if not overflow:  # a skipped step's (unscaled) gradients are never used: zero_grad comes first
            optimizer.step()
        self._update(overflow)
        return not overflow

    def _update(self, overflow: bool) -> None:
        self.last_skipped = overflow
        if overflow:
            self.skipped_steps += 1
        if self.mode != "dynamic":
            return
        if overflow:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's keys (``scale``, ``_growth_tracker`` ...) plus ``mode`` and ``skipped_steps``."""
        if not self.is_enabled():
            return {}
        return {"mode": self.mode, "scale": self.scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self.growth_tracker, "skipped_steps": self.skipped_steps,
                "last_skipped": self.last_skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` stopped. An empty state is an unscaled run; a state
        without ``mode`` is a ``torch.amp.GradScaler``'s (dynamic) from older checkpoints."""
        saved = state.get("mode", "dynamic") if state else "none"
        if saved != self.mode:
            raise ValueError(f"checkpoint loss scaling is {saved!r} but this run's is {self.mode!r}; "
                             f"pass the same `loss_scale` (and `compute_dtype`) as the interrupted run")
        if not state:
            return
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["_growth_tracker"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.last_skipped = bool(state.get("last_skipped", False))


class MixedPrecision:
    """Autocast and loss scaling for one run; its state (the scaler's) goes into checkpoints."""

    def __init__(self, compute_dtype: str = "fp32", device_type: str = "cpu", *,
                 loss_scale: Union[str, float, None] = None, init_scale: float = INIT_SCALE,
                 growth_factor: float = GROWTH_FACTOR, backoff_factor: float = BACKOFF_FACTOR,
                 growth_interval: int = GROWTH_INTERVAL):
        self.compute_dtype = check_compute_dtype(compute_dtype)
        self.dtype = _TORCH_DTYPE[compute_dtype]
        self.device_type = device_type
        mode = parse_loss_scale(loss_scale)
        if mode is None:
            mode = "dynamic" if compute_dtype == "fp16" else "none"
        self.scaler = LossScaler(mode, init_scale=init_scale, growth_factor=growth_factor,
                                 backoff_factor=backoff_factor, growth_interval=growth_interval)
        self._overflow = OverflowFlag()

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the scaled loss; with scaling on, the gradient points watch for overflow.
        Several backward calls before one ``step`` (gradient accumulation) share one flag."""
        if not self.scaler.is_enabled():
            loss.backward()
            return
        with watching(self._overflow):
            self.scaler.scale_loss(loss).backward()

    def watch(self):
        """A context in which the gradient reduction's overflows reach this step's flag (what
        ``backward`` does for the layers' points; a no-op without loss scaling)."""
        return watching(self._overflow) if self.scaler.is_enabled() else contextlib.nullcontext()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale, step unless gradients overflowed, update the scale; returns whether it stepped."""
        return self.scaler.step(optimizer, self._overflow.pop())

    def forward_backward(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                         criterion) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward under autocast, the loss in float32 and a scaled backward (gradients are
        added to ``.grad``); returns the loss and the logits, detached."""
        with self.autocast():
            out = model(x)
            loss = criterion(out.float(), y)
        self.backward(loss)
        return loss.detach(), out.detach()

    def train_step(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion,
                   optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_backward`` on cleared gradients, then the step; returns the loss and the
        logits, detached. Step strategies whose gradients are combined inside ``backward``
        (plain, DDP) are this call on their module; ``--emulate-node`` calls
        ``forward_backward`` once per worker."""
        optimizer.zero_grad(set_to_none=True)
        loss, out = self.forward_backward(model, x, y, criterion=criterion)
        self.step(optimizer)
        return loss, out

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


def _any_rank(found: Optional[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """``found`` (this process's overflow flag) ORed over the ranks of a distributed run.

    Why: a simulated gradient point sees only its own rank's micro-batch, so one
    rank can overflow where another does not; every rank must then skip the step
    and back off alike, or their weights and scales part. Single process: ``found``.
    """
    device = grads[0].device if grads else torch.device("cpu")
    flag = torch.zeros((), dtype=torch.int32, device=device) if found is None else found.to(device, torch.int32)
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return flag
