"""``torch.compile`` of a training run's model, and determinism: the engine's side of ``--compile``
and ``--deterministic``.

**Compilation.** ``compiled(module, mode)`` is ``torch.compile(module, mode=..., fullgraph=True)``:
the converted model's forward and, through AOTAutograd, its backward become one graph each, with no
graph break at any quantization point (the quantizers are ``torch.library`` custom ops with fake
implementations, ``bfp.kernels``: Inductor sees them as opaque calls and fuses the FP32 work around
them). ``fullgraph=True`` makes a break an error rather than a silent fall back to eager. Modes are
torch's: ``default``; ``reduce-overhead`` (CUDA graphs through Inductor on a GPU: launches replayed,
host time gone; the same as ``default`` on the CPU); ``max-autotune`` (Inductor tries GEMM and
convolution configurations; long first compile). The optimizer step and loss scaling stay eager.

What changes against eager, stated: the quantized values are the same operations (the kernels
themselves are not recompiled), but Inductor may fuse and reorder the FP32 operations between
quantization points (a bias add, a ReLU, batch norm), whose float32 results can then differ in the
last bit, and the quantizers see those bits: a compiled run is not bit-identical to an eager one,
and trains to the same accuracy within seed noise (the digits test checks half a point). Stochastic
rounding draws its keys from torch's default generator in both, but a compiled graph draws them
through Inductor's random-number path, so the draws themselves differ. Dynamo cannot trace a
``torch.Generator`` given to a layer (``layer.generator``): such a model does not compile with
``fullgraph``.

The choice between the compiled graph and eager is made at every call, not once an epoch: a step on
which ``--do``, ``--diagnose``, ``--shadow`` or ``--grad-histogram`` measures (a quantize hook or a
measuring forward hook on a layer: Python at every point) runs eagerly, and every other step runs
compiled. A precision change (``--do``'s decisions, a ``-tc`` schedule, a resume's restored precision)
is seen at the next call by comparing every quantized layer's ``precision`` object with the one the
graph was traced from: the graphs are dropped (``torch._dynamo.reset``) and the new precision traced
once. So a run compiles once per distinct precision it trains in, however many it visits, and never
hits dynamo's recompile limit (the formats are compile-time constants of the graph, which is what
lets Inductor see them as constants of the custom ops; a format as a graph input would make every
rule a runtime branch).

**Distributed.** ``Compiler.runner(model)`` is a module whose forward calls ``Compiler(model)``: the
strategies wrap it (DDP around it, as PyTorch documents for compiled modules inside DDP: DDP's own
Python hooks stay eager, the model's forward and backward are one graph each), so the same DDP
wrapper serves compiled and measured steps alike. ``--emulate-node`` runs it per micro-batch.

**Determinism.** ``deterministic()`` (a context) sets ``torch.use_deterministic_algorithms(True)``, cuDNN's
deterministic algorithms (and benchmark off) and cuBLAS's fixed workspace
(``CUBLAS_WORKSPACE_CONFIG=:4096:8``, needed before the first cuBLAS call): two runs of the same
command on the same GPU and software then repeat bit for bit. On the CPU every run repeats without
it (bfpsim's kernels and PyTorch's CPU GEMMs are deterministic at a fixed thread count).
"""
from __future__ import annotations

import contextlib
import os
from typing import Optional

import torch
import torch.nn as nn

from ..layers import measured_by_hooks
from .step import measuring, quantized_layers

COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")


def check_compile_mode(mode: str) -> str:
    if mode not in COMPILE_MODES:
        raise ValueError(f"`compile` {mode!r} unknown; allowed: {', '.join(COMPILE_MODES)}")
    return mode


class Compiler:
    """Compiled wrappers of the modules a run steps and evaluates, one per module, made on first use."""

    def __init__(self, mode: str = "none"):
        self.mode = check_compile_mode(mode)
        self._wrapped: dict[int, tuple[nn.Module, nn.Module, list]] = {}
        self._runners: dict[int, nn.Module] = {}
        self._traced: Optional[list] = None  # every quantized layer's precision the graphs were traced from
        self.resets = 0  # graphs dropped for a precision change
        self.calls = {"compiled": 0, "eager": 0}  # modules handed out, by kind

    def __call__(self, module: nn.Module) -> nn.Module:
        """``module`` compiled (``torch.compile``, ``fullgraph=True``), or ``module`` itself for
        ``none`` and while this step is measured (module docstring); graphs of another precision are
        dropped first."""
        if self.mode == "none":
            return module
        hit = self._wrapped.get(id(module))
        if hit is None or hit[0] is not module:
            hit = (module, torch.compile(module, mode=None if self.mode == "default" else self.mode,
                                         fullgraph=True), quantized_layers(module))
            self._wrapped[id(module)] = hit
        if measuring(hit[2]) or measured_by_hooks(module):
            self.calls["eager"] += 1
            return module
        now = [m.precision for m in hit[2]]
        if self._traced is not None and len(now) == len(self._traced) and \
                any(a is not b for a, b in zip(now, self._traced)):
            self._drop_graphs()
        self._traced = now
        self.calls["compiled"] += 1
        return hit[1]

    def runner(self, module: nn.Module) -> nn.Module:
        """A module whose forward runs ``self(module)`` at every call (``module`` itself for
        ``none``): what a distributed strategy wraps, one per module."""
        if self.mode == "none":
            return module
        run = self._runners.get(id(module))
        if run is None or run.model is not module:
            run = self._runners[id(module)] = _Runner(module, self)
        return run

    def _drop_graphs(self) -> None:
        torch._dynamo.reset()
        self.resets += 1

    def reset(self) -> None:
        """Forget every compiled graph (the model's precision changed)."""
        if self.mode != "none" and self._wrapped:
            self._wrapped.clear()
            self._traced = None
            self._drop_graphs()


class _Runner(nn.Module):
    """``model`` as a submodule (its parameters and state are the runner's), forward through the
    compiler: compiled, or eager on measured steps."""

    def __init__(self, model: nn.Module, compiler: Compiler):
        super().__init__()
        self.model = model
        object.__setattr__(self, "_compiler", compiler)  # not a submodule: no second path to the weights

    def forward(self, *args, **kwargs):
        return self._compiler(self.model)(*args, **kwargs)


@contextlib.contextmanager
def deterministic(enabled: bool = True):
    """Deterministic algorithms everywhere while the block runs (module docstring), the previous
    settings restored after (a run inside a longer Python process leaves it as it found it)."""
    if not enabled:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def host_reads(graph: torch.fx.Graph) -> list[str]:
    """The operations of a traced graph that read a tensor's value back to the host (``.item()``,
    ``.tolist()``, data-dependent shapes): each is a synchronisation on a GPU."""
    names = ("_local_scalar_dense", "item", "tolist", "nonzero", "masked_select", "unique", "_assert_async",
             "equal", "is_nonzero")
    out: list[str] = []
    for node in graph.nodes:
        target = getattr(node.target, "__name__", None) or str(node.target)
        if node.op in ("call_function", "call_method") and any(n == target.split(".")[0] for n in names):
            out.append(f"{node.op} {target}")
    return out
