"""``--cuda-graph``: the whole training step (forward, backward, optimizer step) captured as one CUDA
graph and replayed, so a step costs one launch of host time instead of hundreds.

How (PyTorch's "whole-network capture", ``torch.cuda.graph``): the first ``WARMUP`` steps of a
capture run eagerly on a side stream (real training steps, not discarded: they allocate the
optimizer's state and let cuBLAS/cuDNN settle); the next step is captured with its batch copied
into static input tensors and then replayed, which computes that step; every later step copies its
batch into the static inputs and replays. A replayed step runs the kernels the eager step ran, in
its order, so it is bit for bit the eager step (a ``gpu`` test checks it, with
``--deterministic``).

What the graph needs, and how this module provides it:

* **Fixed shapes.** The graph has the capture's batch shape. An epoch's last, smaller batch is
  neither dropped nor padded: that one step runs eagerly (the same kernels, so the same bits), so
  every image of every epoch is seen, at the cost of one eager step an epoch. Another image shape
  or model is captured anew.
* **The learning rate on the device.** A Python-float ``lr`` would be baked into the graph; the
  optimizer's ``lr`` becomes a 0-dim tensor on the device (PyTorch's optimizers and schedulers
  take one: the scheduler fills it in place), so the schedule still applies at every replay. The
  other settings (momentum, weight decay) are constants of the graph: when a ``-tc`` plan changes
  one, the step captures anew.
* **Stochastic-rounding keys drawn on the device.** Without a layer generator the keys come from
  CUDA's default generator (``bfp.kernels``): a captured draw advances at every replay.
* **Re-capture.** After a precision change (``--do``, a ``-tc`` schedule, a resume's restored
  precision) the layers' formats are other constants: each step compares the layers' precision
  objects with the capture's, and a change drops the graph; the next steps warm up and capture anew.
* **Measured steps run eagerly.** A step on which a layer has a quantize hook (``--do``'s and
  ``--diagnose``'s measurements call Python at every point) is not replayed but run as it is.
* **``.grad`` kept current.** After a replay each parameter's ``.grad`` is the graph's gradient
  tensor again (an eager step in between rebinds it), for callbacks that read gradients.
* **Loss scaling on the device.** The scaler's step-or-skip decision and its scale update move to
  the device (``LossScaler.on_device``): the optimizer always runs and a step that overflowed is
  undone (the parameters and optimizer state it changed restored), so no step reads the host; the
  loss-scale log reads the device once an epoch.

What cannot be captured is refused before training (``refusal``), never ignored: the CPU (no CUDA
graphs); ``--emulate-node``, torchrun's DDP and their gradient reductions (collectives
and hooks outside one graph); ``--compile`` (``reduce-overhead`` is its own CUDA graphs). Code that
reads a tensor on the host inside the step (a PyTorch fallback kernel taking its stochastic keys
as numbers, a user's hook) fails the capture with CUDA's error, which ``GraphedStep`` re-raises
naming the cause.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .step import PlainStep, measuring, quantized_layers

WARMUP = 3  # eager steps on a side stream before a capture (PyTorch's examples use 3 to 11)


def refusal(*, device: torch.device, distributed: bool, emulated: bool, compile_mode: str) -> Optional[str]:
    """Why ``--cuda-graph`` cannot be honoured with these settings (None: it can)."""
    if device.type != "cuda":
        return f"`cuda_graph` needs a CUDA device (CUDA graphs are a GPU feature); this run's device is {device}"
    if distributed or emulated:
        return ("`cuda_graph` captures a single-process step; torchrun's DDP and `emulate_node` reduce gradients "
                "outside it (collectives, communication hooks)")
    if compile_mode != "none":
        return (f"`cuda_graph` and `compile` {compile_mode} both take over the step; use one "
                f"(`compile` reduce-overhead gives CUDA graphs through Inductor)")
    return None


class GraphedStep:
    """The plain step, captured once as a CUDA graph and replayed (module docstring)."""

    def __init__(self, inner: Optional[PlainStep] = None, warmup: int = WARMUP):
        self.inner = inner if inner is not None else PlainStep()
        self.warmup = warmup
        self.captures = 0  # graphs captured so far (a test and the log read it)
        self._key: Optional[tuple] = None
        self._layers: list = []
        self.invalidate()

    def prepare(self, model: nn.Module) -> nn.Module:
        return self.inner.prepare(model)

    def invalidate(self) -> None:
        """Drop the graph: the next step warms up and captures anew."""
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        self._eager_left = self.warmup
        self._static: dict[str, torch.Tensor] = {}
        self._grads: list = []
        self._constants: Optional[tuple] = None

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, criterion, optimizer,
                 amp) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(model), id(optimizer), tuple(x.shape[1:]), x.dtype, tuple(y.shape[1:]), y.dtype, x.device)
        if key != self._key:
            self.invalidate()
            self._key = key
            self._layers = quantized_layers(model)
            if amp.scaler.is_enabled():  # the step-or-skip decision and the scale's update on the device
                amp.scaler.on_device(x.device)
        if measuring(self._layers):  # Python hooks at the points: this step runs eagerly
            return self.inner(model, x, y, criterion=criterion, optimizer=optimizer, amp=amp)
        device_lr(optimizer, x.device)  # a plan's new lr (a float) becomes a device tensor again
        constants = (tuple(id(m.precision) for m in self._layers), _hyperparameters(optimizer))
        if constants != self._constants:  # formats or optimizer settings changed: capture anew
            self.invalidate()
            self._constants = constants
        if self._graph is not None and (x.shape != self._static["x"].shape or y.shape != self._static["y"].shape):
            # an epoch's last, smaller batch: the same step, run eagerly (not dropped, not padded)
            return self.inner(model, x, y, criterion=criterion, optimizer=optimizer, amp=amp)
        if self._eager_left > 0:  # warm-up: real steps, on a side stream
            self._eager_left -= 1
            return on_side_stream(lambda: self.inner(model, x, y, criterion=criterion, optimizer=optimizer, amp=amp),
                                  x.device)
        if self._graph is None:
            self._capture(model, x, y, criterion, optimizer, amp)
        else:
            self._static["x"].copy_(x, non_blocking=True)
            self._static["y"].copy_(y, non_blocking=True)
        self._graph.replay()
        for p, g in self._grads:  # the replay wrote these; an eager step in between may have rebound .grad
            p.grad = g
        return self._static["loss"].clone(), self._static["out"].clone()

    def _capture(self, model, x, y, criterion, optimizer, amp) -> None:
        sx, sy = x.clone(), y.clone()
        try:
            graph, (loss, out) = capture(lambda: self.inner(model, sx, sy, criterion=criterion, optimizer=optimizer,
                                                            amp=amp), x.device)
        except RuntimeError as e:
            if "captur" not in str(e).lower():
                raise
            raise RuntimeError(f"`cuda_graph`: this model's step cannot be captured: something in it reads a "
                               f"tensor on the host (a synchronisation: a PyTorch fallback kernel that takes its "
                               f"keys as numbers, a hook that calls .item()); run without `cuda_graph`. CUDA "
                               f"said: {e}") from e
        self._graph = graph
        self._static = {"x": sx, "y": sy, "loss": loss, "out": out}
        self._grads = [(p, p.grad) for group in optimizer.param_groups for p in group["params"]]
        self.captures += 1


def on_side_stream(work, device: torch.device):
    """``work()`` on a fresh stream that waits for, and is waited for by, the current one (the
    warm-up PyTorch's capture examples run before ``torch.cuda.graph``)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        out = work()
    torch.cuda.current_stream(device).wait_stream(side)
    return out


def capture(work, device: torch.device):
    """``(graph, work())``: ``work`` run once under CUDA-graph capture (its kernels recorded, not
    run: ``graph.replay()`` runs them)."""
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph):
        out = work()
    return graph, out


def _hyperparameters(optimizer: torch.optim.Optimizer) -> tuple:
    """What a captured optimizer step holds as constants: every param group's non-tensor settings
    (momentum, weight decay, betas ...) and the identity of its tensor ones (the lr tensor)."""
    return tuple(tuple((k, id(v) if isinstance(v, torch.Tensor) else repr(v)) for k, v in sorted(g.items())
                       if k != "params") for g in optimizer.param_groups)


def device_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each param group's ``lr`` as a 0-dim float32 tensor on ``device`` (filled in place by the
    schedulers), so a captured step reads the current rate at every replay; Adam-style optimizers
    keep their step count on the device too (``capturable``)."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
        if "capturable" in group and not group["capturable"]:
            group["capturable"] = True
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(device=device, dtype=torch.float32)
