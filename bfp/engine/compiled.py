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

A step on which ``--do`` or ``--diagnose`` measures (a quantize hook on a layer: Python at every
point) runs eagerly. A precision change (``--do``, a ``-tc`` schedule, a resume's restored
precision) changes the modules the graph was traced from: ``Compiler.reset`` drops every compiled graph so the next step
traces the new precision (torch's guards would catch it too, after up to eight recompilations).

**Determinism.** ``deterministic()`` (a context) sets ``torch.use_deterministic_algorithms(True)``, cuDNN's
deterministic algorithms (and benchmark off) and cuBLAS's fixed workspace
(``CUBLAS_WORKSPACE_CONFIG=:4096:8``, needed before the first cuBLAS call): two runs of the same
command on the same GPU and software then repeat bit for bit. On the CPU every run repeats without
it (bfpsim's kernels and PyTorch's CPU GEMMs are deterministic at a fixed thread count).
"""
from __future__ import annotations

import contextlib
import os
import torch
import torch.nn as nn

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

    def __call__(self, module: nn.Module) -> nn.Module:
        """``module`` compiled (``torch.compile``, ``fullgraph=True``), or ``module`` itself for
        ``none`` and while a layer has a quantize hook (a step ``--do`` or ``--diagnose`` measures
        calls Python at every point: that step runs eagerly)."""
        if self.mode == "none":
            return module
        hit = self._wrapped.get(id(module))
        if hit is None or hit[0] is not module:
            hit = (module, torch.compile(module, mode=None if self.mode == "default" else self.mode,
                                         fullgraph=True), quantized_layers(module))
            self._wrapped[id(module)] = hit
        if measuring(hit[2]):
            return module
        return hit[1]

    def reset(self) -> None:
        """Forget every compiled graph (the model's precision changed)."""
        if self.mode != "none" and self._wrapped:
            self._wrapped.clear()
            torch._dynamo.reset()


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
