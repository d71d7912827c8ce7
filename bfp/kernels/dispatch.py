"""Pick a backend, prepare float32 bits, run, and return the result and counts."""
from __future__ import annotations

import functools
import json
from typing import Optional

import torch

from ..formats import MX, NVFP4, BlockFloat, Float, Format, Rounding, Scaled, format_from_dict, kernel_for, register_kernel
from . import nvfp4, scaled
from .plan import rule_for, tile_for
from . import op_args
from .ops import _counts_torch, canonical, run_rule

from .runtime import ALIASES, BACKENDS, PREPARED, backend_for, kernel  # noqa: F401 (the backends' names, re-exported)

_FLOAT_DTYPES = op_args.FLOAT_DTYPES


class DrawnKeys:
    """Stochastic-rounding keys drawn already (an int64 tensor of two), passed where a generator
    goes: the format op (``quantize_format``) hands the family kernels the draw it was given, so
    they take no second one."""

    __slots__ = ("keys",)

    def __init__(self, keys: torch.Tensor):
        self.keys = keys


def _draw(generator: Optional[torch.Generator], on: Optional[torch.device] = None) -> torch.Tensor:
    """One draw of two 32-bit keys from ``generator`` (on its device); without one, from torch's
    default generator of ``on``'s device type (the CPU's unless ``on`` is a CUDA device: its
    generator draws on the device, so no copy and no host step, and inside a captured CUDA graph
    each replay draws anew)."""
    if isinstance(generator, DrawnKeys):
        return generator.keys
    device = generator.device if generator is not None else on if on is not None and on.type == "cuda" else "cpu"
    return torch.randint(0, 2 ** 32, (2,), generator=generator, device=device, dtype=torch.int64)


def _keys(generator: Optional[torch.Generator]) -> tuple[int, int]:
    """Two 32-bit keys for the counter-based RNG: one draw from ``generator``."""
    return tuple(int(v) for v in _draw(generator).tolist())


def device_keys(generator: Optional[torch.Generator], device: torch.device) -> torch.Tensor:
    """One draw of the keys as an int64 tensor on ``device``: the Triton kernels read it there, so
    the keys never go through the host (no synchronisation). ``generator`` None on a CUDA device
    draws from CUDA's default generator (``_draw``); a given generator draws as ``_keys`` does."""
    k = _draw(generator, torch.device(device))
    return k if k.device == device else k.to(device, non_blocking=True)


def _check(x, fmt) -> None:
    if not isinstance(fmt, Format):
        raise TypeError(f"quantize needs a bfp format (bfp.formats: Float, BlockFloat, MX, NVFP4, Scaled, P3109), "
                        f"got {fmt!r}; use bfp.format_from_name for names")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize needs a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"quantize supports float32, float16, bfloat16 and float64 tensors, "
                        f"got {x.dtype}")
    if torch.compiler.is_compiling() or x.layout != torch.strided:  # the rest of op_args.tensor's checks
        op_args.tensor(x, "quantize's tensor")


def _check_op(x, fmt: str, keys, backend: str) -> Format:
    """The format op's arguments checked (``op_args``); the format parsed."""
    op_args.tensor(x, "x")
    op_args.keys(keys)
    op_args.choice(backend, "backend", BACKENDS)
    return op_args.parsed(fmt, "fmt", parse_format)


def nvfp4_keys(fmt: NVFP4, generator) -> tuple[int, int]:
    """The stochastic-rounding keys of an NVFP4 rounding: one draw from ``generator``, none
    for nearest (``bfp.hadamard.transform_quantize`` draws them as ``quantize`` does)."""
    return _keys(generator) if fmt.rounding is Rounding.STOCHASTIC else (0, 0)


def _nvfp4(x: torch.Tensor, fmt: NVFP4, generator, backend: str, stats: bool):
    keys = device_keys(generator, x.device) if backend == "triton" and fmt.rounding is Rounding.STOCHASTIC \
        else nvfp4_keys(fmt, generator)
    if x.device.type == "meta" or x.numel() == 0:
        counts = torch.zeros(2, dtype=torch.int64, device=x.device) if stats else None
        return (torch.empty_like(x) if x.device.type == "meta" else x.detach().clone()), counts
    x32 = x.detach().to(torch.float32).contiguous()
    out = nvfp4.quantize(x32, fmt, keys, backend)
    counts = _counts_torch(x32.view(torch.int32), out.view(torch.int32)) if stats else None
    if x.dtype == torch.float32 and _needs_keeping(x, fmt, backend, stats) \
            and (go := nvfp4.prepare(tuple(x.shape), fmt, backend)) is not None:
        def run(x, keys):
            out = go(x, keys)
            return out, (_counts_torch(x.view(torch.int32), out.view(torch.int32)) if stats else None)
        _keep(x, fmt, backend, stats, fmt.rounding is Rounding.STOCHASTIC, run)
    return out.to(x.dtype), counts


def _stochastic_keys(fmt: Float, generator, x: torch.Tensor) -> Optional[torch.Tensor]:
    """The one draw a stochastic element rounding takes, as a device tensor (None for other roundings)."""
    return device_keys(generator, x.device) if fmt.rounding is Rounding.STOCHASTIC else None


def scaled_keys(fmt: Scaled, generator, backend: str, x32: torch.Tensor):
    """The stochastic-rounding keys for ``scaled.tensorwise``'s fused CPU kernels (the same one
    draw the element rounding would take), or None where the PyTorch steps run."""
    if backend != "cpu" or x32.device.type != "cpu":
        return None
    return _keys(generator) if fmt.fmt.rounding is Rounding.STOCHASTIC else (0, 0)


def quantize_stats(x: torch.Tensor, fmt: Format, *, generator: Optional[torch.Generator] = None,
                   backend: Optional[str] = None, stats: bool = True):
    """``(quantize(x, fmt), counts)``; counts is int64 ``[nonzero_in, zeroed]`` on x's
    device when ``stats`` else None. See ``bfp.quantize`` for the arguments."""
    _check(x, fmt)
    op_args.generator(generator)
    backend = backend_for(x, backend)
    x = op_args.values(x)
    if type(x) is torch.Tensor and not torch.compiler.is_compiling():  # eager: no dispatcher in the way
        hit = _fast(x, fmt, generator, backend, stats)
        return hit if hit is not None else kernel_for(fmt)(x, fmt, generator, backend, stats)
    keys = op_keys(generator, x) if needs_keys(fmt) else None  # the one draw, taken before the op
    out, counts = quantize_format(x, format_json(fmt), keys, stats, backend)
    return out, (counts if stats else None)


@torch.compiler.assume_constant_result  # a constant of the (frozen) format: torch.compile does not trace it
def needs_keys(fmt: Format) -> bool:
    """Whether quantizing to ``fmt`` draws stochastic-rounding keys (one draw a call)."""
    if isinstance(fmt, Scaled):
        return fmt.fmt.rounding is Rounding.STOCHASTIC
    if isinstance(fmt, NVFP4):
        return fmt.rounding is Rounding.STOCHASTIC
    return rule_for(fmt).mode == 2


_JSON: dict = {}


@torch.compiler.assume_constant_result  # as needs_keys (json.dumps cannot be traced)
def format_json(fmt: Format) -> str:
    """``fmt`` as the format op's string argument (its ``to_dict``, as JSON; cached)."""
    text = _JSON.get(fmt)
    if text is None:
        text = _JSON[fmt] = json.dumps(fmt.to_dict(), sort_keys=True)
    return text


@functools.lru_cache(maxsize=512)
def parse_format(text: str) -> Format:
    """Inverse of ``format_json``."""
    return format_from_dict(json.loads(text))


draw_keys = _draw  # the one draw of stochastic-rounding keys a call takes (a CPU generator's on the CPU)


def op_keys(generator: Optional[torch.Generator], x: torch.Tensor) -> torch.Tensor:
    """The one draw an op on ``x`` takes, as the op's argument: for a DTensor ``x`` (tensor
    parallelism), the keys as a DTensor replicated on its mesh, since a DTensor op takes no plain
    tensor (every rank draws the same keys from a generator seeded alike, as a run's are)."""
    keys = _draw(generator, x.device)
    mesh = dtensor_mesh(x)
    if mesh is not None and type(keys) is torch.Tensor:
        from torch.distributed.tensor import DTensor, Replicate
        keys = DTensor.from_local(keys, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return keys


def dtensor_mesh(x: torch.Tensor):
    """``x``'s device mesh if it is a DTensor, else None."""
    return getattr(x, "device_mesh", None) if type(x) is not torch.Tensor else None


def replicated_like(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out``, computed from ``x``'s whole tensor, as a DTensor replicated on ``x``'s mesh."""
    from torch.distributed.tensor import DTensor, Replicate
    mesh = x.device_mesh
    return DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim, run_check=False)


@torch.library.custom_op("bfp::quantize_format", mutates_args=())
def quantize_format(x: torch.Tensor, fmt: str, keys: Optional[torch.Tensor], stats: bool,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every format family's quantization as one op PyTorch understands (``torch.compile`` and
    FakeTensor tracing see it whole): ``fmt`` as ``format_json``, ``keys`` the stochastic draw (or
    None), ``backend`` resolved; the counts are int64 ``[2]``, or ``[0]`` without ``stats``."""
    f = _check_op(x, fmt, keys, backend)
    out, counts = kernel_for(f)(x, f, None if keys is None else DrawnKeys(keys), backend, stats)
    # contiguous, whatever the input's strides (a transposed view) or a kernel's moved axis: what the fake says
    return out.contiguous(), (counts if stats else x.new_empty(0, dtype=torch.int64))


@quantize_format.register_fake
def _(x, fmt, keys, stats, backend):
    _check_op(x, fmt, keys, backend)
    return x.new_empty(x.shape), x.new_empty(2 if stats else 0, dtype=torch.int64)


def _straight_through(ctx, grad, grad_counts):
    """The op's gradient: straight through to ``x`` (``bfp.quantize``'s rule), nothing to the rest."""
    return grad, None, None, None, None


quantize_format.register_autograd(_straight_through)


def delayed(x: torch.Tensor, fmt: Scaled, history: torch.Tensor, generator, update: bool,
            backend: Optional[str] = None) -> torch.Tensor:
    """Delayed scaling (``bfp.formats.scaled``): the scale from the largest amax of ``history`` (the
    point's state, newest first), then, with ``update`` (training), ``x``'s amax enters it. While
    torch.compile traces (or for a tensor subclass) it is one op, ``torch.ops.bfp.quantize_delayed``,
    which mutates ``history``."""
    backend = backend_for(x, backend)
    x = op_args.values(x)
    if dtensor_mesh(x) is not None:  # tensor parallelism: the amax of the whole tensor, one history on every rank
        return replicated_like(delayed(x.detach().full_tensor(), fmt, history, generator, update, backend), x)
    if type(x) is not torch.Tensor or torch.compiler.is_compiling():
        keys = _draw(generator, x.device) if needs_keys(fmt) else None
        # detached: an op that mutates cannot carry an autograd formula; bfp.quantize's straight-through
        # gradient is applied around it
        return quantize_delayed(x.detach(), format_json(fmt), history, keys, update, backend)
    return _delayed(x, fmt, history, generator, update, backend)


def _delayed(x: torch.Tensor, fmt: Scaled, history: torch.Tensor, generator, update: bool,
             backend: str) -> torch.Tensor:
    with torch.no_grad():
        x32 = x.detach().float().contiguous()
        fused = kernel("scaled_tensorwise", backend)
        seen = None  # x's amax, where the rounding pass takes it
        if fused is not None:  # the Triton kernel: the history's amax stays on the device
            done = fused(x32, fmt.fmt.max, fmt.pow2, rule_for(fmt.fmt), _stochastic_keys(fmt.fmt, generator, x32),
                         given_amax=history.max(), seen=update)
            out, seen = done if update else (done, None)
        else:
            rnd = lambda y, f: quantize_stats(y, f, generator=generator, stats=False)[0]  # noqa: E731
            out = scaled.tensorwise(x32, fmt, rnd, given_amax=history.max(),
                                    keys=scaled_keys(fmt, generator, "cpu", x32))
        if update:  # evaluation reads the history, never moves it
            seen = scaled.amax(x32) if seen is None else seen
            history.copy_(torch.cat([seen.reshape(1).to(history), history[:-1]]))
    return out.to(x.dtype)


@torch.library.custom_op("bfp::quantize_delayed", mutates_args=("history",))
def quantize_delayed(x: torch.Tensor, fmt: str, history: torch.Tensor, keys: Optional[torch.Tensor], update: bool,
                     backend: str) -> torch.Tensor:
    """``delayed`` as an op: ``fmt`` as ``format_json``, ``keys`` the stochastic draw (or None);
    ``history`` moves in place with ``update``."""
    f = _check_delayed(x, fmt, history, keys, backend)
    return _delayed(x, f, history, None if keys is None else DrawnKeys(keys), update, backend).contiguous()


@quantize_delayed.register_fake
def _(x, fmt, history, keys, update, backend):
    _check_delayed(x, fmt, history, keys, backend)
    return x.new_empty(x.shape)


def check_history(fmt: Scaled, history) -> None:
    """Delayed scaling's state: a float32 tensor of ``fmt.history_length`` values, one axis."""
    n = fmt.history_length
    if not isinstance(history, torch.Tensor) or history.dtype != torch.float32 or tuple(history.shape) != (n,):
        got = f"a {op_args.dtype_name(history.dtype)} tensor of shape {tuple(history.shape)}" \
            if isinstance(history, torch.Tensor) else type(history).__name__
        raise ValueError(f"{fmt!r} is delayed scaling: its state (the amax history) must be a float32 tensor of "
                         f"shape ({n},), newest first; got {got}")


def check_history_values(fmt: Scaled, history: torch.Tensor, x: Optional[torch.Tensor] = None) -> None:
    """Where a history enters (``bfp.quantize(state=...)``, a layer's ``load_state_dict``): its amaxes
    are finite and not negative, since an Inf would make every scale 0 and every output NaN, and a
    NaN would be ignored by the maximum. A ``meta`` history has shapes only: it rounds ``meta``
    tensors (shape inference, nothing moves) and is refused for a tensor with values."""
    if history.device.type == "meta":
        if x is not None and x.device.type != "meta":
            raise ValueError(f"{fmt!r} is delayed scaling: its amax history is a meta tensor (a shape, no "
                             f"values) and rounds only meta tensors; got a {x.device.type} tensor. Load or "
                             f"move the history to that device first (model.to(device), load_state_dict)")
        return
    bad = ~torch.isfinite(history) | (history < 0)
    if bool(bad.any()):
        raise ValueError(f"{fmt!r} is delayed scaling: its amax history must hold finite amaxes >= 0; got "
                         f"{history[bad].tolist()[:4]} at positions {bad.nonzero().flatten().tolist()[:4]} "
                         f"(the amax of a step counts finite values only)")


def _check_delayed(x, fmt: str, history, keys, backend: str) -> Scaled:
    f = _check_op(x, fmt, keys, backend)
    if not (isinstance(f, Scaled) and f.history_length):
        raise ValueError(f"quantize_delayed needs a delayed-scaling format (Scaled with history > 0), got {f!r}; "
                         f"other formats go through bfp::quantize_format")
    check_history(f, history)
    return f


def _scaled(x: torch.Tensor, fmt: Scaled, generator, backend: str, stats: bool):
    """Scale, round as ``fmt.fmt``, unscale (``kernels.scaled``)."""
    if fmt.delayed:
        raise ValueError(f"{fmt!r} is delayed scaling: its amax history is state of a quantized layer's point; "
                         f"use it in a layer's precision (bfp.quantize alone has no history)")
    if x.device.type == "meta" or not x.numel():
        return element_rule(x, fmt.fmt, generator, backend, stats)
    x32 = x.detach().to(torch.float32).contiguous()
    rnd = lambda y, f: quantize_stats(y, f, generator=generator, backend=backend, stats=False)[0]  # noqa: E731
    fused = kernel("scaled_tensorwise", backend)
    if fused is not None and (fmt.granularity == "tensor" or x32.dim() == 0):  # one pass on the device
        out = fused(x32, fmt.fmt.max, fmt.pow2, rule_for(fmt.fmt), _stochastic_keys(fmt.fmt, generator, x32))
    elif fmt.granularity == "tensor" or x32.dim() == 0:
        out = scaled.tensorwise(x32, fmt, rnd, keys=scaled_keys(fmt, generator, backend, x32))
    elif (rows := kernel("scaled_rowwise", backend)) is not None and -x32.dim() <= fmt.axis < x32.dim():
        # one fused pass along any axis, each line's amax in registers (or one program a line)
        out = rows(x32, fmt.axis % x32.dim(), fmt.fmt.max, fmt.pow2, rule_for(fmt.fmt),
                   _stochastic_keys(fmt.fmt, generator, x32))
    else:
        y, scale = scaled.prepare(x32, fmt)
        out = scaled.finish(rnd(y, fmt.fmt), scale)
    counts = _counts_torch(x32.view(torch.int32), out.view(torch.int32)) if stats else None
    return out.to(x.dtype), counts


_FAST = PREPARED  # (id(fmt), shape, dtype, is_cuda, backend, stats) -> (fmt, stochastic, run): launches prepared
# by the family kernels for ``quantize_stats``. Keyed by the format object's identity (hashing a format's
# fields costs more than the rest of the lookup); the entry holds the format, so its id is not reused.
_FAST_MAX = 4096  # distinct tensors a process rounds (a model has a few hundred); a bound, not an eviction policy


def _kind(x: torch.Tensor, fmt: Format, backend: str, stats: bool) -> tuple:
    """``_FAST``'s key of ``x`` in ``fmt``."""
    return id(fmt), x.shape, x.dtype, x.is_cuda, backend, stats


def _fast(x: torch.Tensor, fmt: Format, generator, backend: str, stats: bool):
    """``(out, counts)`` by the launch a family kernel prepared for this format and kind of tensor
    (contiguous, of this shape, dtype and device type), or None where it has none: a training
    step's repeated calls skip the format's rule, tile, plan and view (the host path, issue 54)."""
    hit = _FAST.get(_kind(x, fmt, backend, stats))
    if hit is None or hit[0] is not fmt or x.is_meta or not x.is_contiguous():
        return None
    _, stochastic, run = hit
    return run(x.detach() if x.requires_grad else x, device_keys(generator, x.device) if stochastic else None)


def _needs_keeping(x: torch.Tensor, fmt: Format, backend: str, stats: bool) -> bool:
    """Whether a family kernel should prepare a launch for ``x``'s kind: none kept yet, and room."""
    hit = _FAST.get(_kind(x, fmt, backend, stats))
    return (hit is None or hit[0] is not fmt) and len(_FAST) < _FAST_MAX


def _keep(x: torch.Tensor, fmt: Format, backend: str, stats: bool, stochastic: bool, run) -> None:
    """Keep ``run(x, keys) -> (out, counts)`` for ``_fast``: tensors like ``x`` in ``fmt``."""
    _FAST[_kind(x, fmt, backend, stats)] = (fmt, stochastic, run)


def element_rule(x: torch.Tensor, fmt: Format, generator, backend: str, stats: bool):
    """The families one element rule rounds (``plan.rule_for``): Float, BlockFloat, MX and the
    ones that register a rule with ``plan.register_rule``. A 0-dim tensor is rounded as its one
    element in a tensor of shape (1,): one tile of one element for every tiled family.

    A backend that prepares launches (``kernel("rule_prepare", backend)``: Triton's) keeps the
    launch of this format, shape and dtype for ``quantize_stats``'s next calls (``_FAST``)."""
    if x.dim() == 0 and x.device.type != "meta":
        out, counts = element_rule(x.reshape(1), fmt, generator, backend, stats)
        return out.reshape(()), counts
    rule = rule_for(fmt)
    tile = tile_for(fmt, tuple(x.shape))
    keys = None if rule.mode != 2 else device_keys(generator, x.device) if backend == "triton" else _draw(generator)
    if x.device.type == "meta":  # shapes only (model tracing, FakeTensor): the format is checked above
        counts = torch.zeros(2, dtype=torch.int64, device=x.device) if stats else None
        return torch.empty_like(x), counts
    x32 = x.detach()
    if x32.dtype != torch.float32 and not (backend == "triton" and x32.dtype in (torch.bfloat16, torch.float16)):
        x32 = x32.float()  # a copy unless x is float32 already (Triton loads and stores bf16/fp16 itself)
    x32 = x32.contiguous()
    if x32.numel() == 0:
        zero = torch.zeros(2, dtype=torch.int64, device=x.device)
        return x.detach().clone(), (zero if stats else None)
    out, counts = run_rule(x32, rule, tile, keys, stats, backend)
    if x32.dtype == x.dtype and _needs_keeping(x, fmt, backend, stats):
        _prepare(x, fmt, rule, tile, backend, stats)
    return (out if x.dtype == torch.float32 else out.to(x.dtype)), (counts if stats else None)


def _prepare(x: torch.Tensor, fmt: Format, rule, tile, backend: str, stats: bool) -> None:
    """Keep ``element_rule``'s prepared launch for ``x``'s kind of tensor, where the backend
    prepares launches and the tile folds into its canonical view (a run just succeeded)."""
    prepare = kernel("rule_prepare", backend)
    canon = canonical(tuple(x.shape), tile)
    if prepare is None or (tile is not None and canon is None):
        return
    shape4, tile4 = canon if canon is not None else (None, None)
    go = prepare(rule, x.numel(), shape4, tile4, stats, x.dtype)

    def run(x, keys):
        out = torch.empty_like(x)
        return out, go(x, out, keys)
    _keep(x, fmt, backend, stats, rule.mode == 2, run)


for _family, _kernel in ((Float, element_rule), (BlockFloat, element_rule), (MX, element_rule), (NVFP4, _nvfp4),
                         (Scaled, _scaled)):
    register_kernel(_family, _kernel)
