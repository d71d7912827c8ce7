"""Model conversion: swap a model's layers for quantized ones by module name.

``convert(model, config)`` replaces every ``nn.Conv1d``/``nn.Conv2d``/
``nn.Linear`` (and ``bfp.layers.Matmul``) that the config gives a precision
with its ``bfp.layers`` twin, built by ``from_float`` so the Parameter objects
stay the same; forward methods are never patched. Calling it again on a
converted model only updates each Q-layer's precision, in place, so a schedule
can change precision mid-training without touching weights or optimizer state.

``conversion_report`` prints what was converted, ``precision_state`` /
``load_precision_state`` save and restore every layer's precision with a
checkpoint, ``generate_config`` writes an original-form config listing every
convertible layer.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from . import layers as L
from .attention import MultiheadAttention
from .coverage import Coverage, coverage_of
from .routes import route, watch_children
from .trace import describe_input, filter_of, trace_gemms, type_name_of
from .config import (CONVERTIBLE_TYPES, LEGACY_PREFIX, ConfigError, ConfigLike, NetConfig, Rule, adapt_names,
                     legacy_dict, legacy_entry, load_config)
from .formats import Format, format_names, format_from_name
from .precision import POINTS, LayerPrecision

__all__ = ["convert", "trace_model", "conversion_report", "precision_state", "load_precision_state",
           "generate_config", "convertible_layers"]

_TRACE = "_bfp_trace"  # the model's GemmTrace, kept for later conversions (schedules, checkpoints)
COVERAGE = "bfp_coverage"  # the last conversion's Coverage (bfp.coverage)


_type_name = type_name_of  # the config type name of a convertible or converted module, or None


def _is_quantized(module: nn.Module) -> bool:
    return isinstance(module, tuple(L.CONVERTIBLE.values()))


def convertible_layers(model: nn.Module) -> dict[str, str]:
    """Name -> config type name of every convertible or converted layer, in
    registration order (a module registered under two names appears under both)."""
    return {name: t for name, m in model.named_modules(remove_duplicate=False)
            if (t := _type_name(m)) is not None}


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _named_attention(model: nn.Module) -> nn.Module:
    """Every ``nn.MultiheadAttention`` replaced by ``bfp.attention.MultiheadAttention`` (same
    Parameters and results), whose products are named convertible modules (``qkv``, ``qk``,
    ``pv``, ``proj``)."""
    if isinstance(model, nn.MultiheadAttention):
        return MultiheadAttention.from_float(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.MultiheadAttention):
            _set_submodule(model, name, MultiheadAttention.from_float(module))
    for module in model.modules():
        # torch's encoder packs a padded batch into a nested tensor in eval when this is True, for its
        # fused FP32 layers: the replaced attention computes on plain tensors, so the batch stays one
        if isinstance(module, nn.TransformerEncoder) and any(isinstance(m, MultiheadAttention)
                                                              for m in module.modules()):
            module.use_nested_tensor = False
    return model


def _sharded(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules that FSDP2's ``fully_shard`` has wrapped (none without torch.distributed)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return []
    return [n or "(model)" for n, m in model.named_modules() if isinstance(m, FSDPModule)]


def trace_model(model: nn.Module, example_input: Any) -> nn.Module:
    """Trace one forward of ``example_input`` (``bfp.trace``) and keep it on ``model`` for every
    later ``convert``; ``nn.MultiheadAttention`` is replaced first (``_named_attention``). Returns
    the model (use the return value). An input the model does not take raises as its forward does."""
    model = _named_attention(model)
    model.__dict__[_TRACE] = trace_gemms(model, example_input, describe_input(example_input))
    return model


def convert(model: nn.Module, config: ConfigLike, example_input: Any = None, *,
            module_filter: Optional[Callable[[nn.Module, str], bool]] = None, strict: bool = False) -> nn.Module:
    """Quantize ``model``'s layers as ``config`` says, in place, and return the model.

    ``config``: a preset name (``"ResNet18_FB12"``, looked up in ``./conf_net``
    and the shipped presets), a JSON path, a dict in either config form, or a
    ``NetConfig``. Float layers that get a precision are swapped for Q-layers
    sharing their Parameters; Q-layers already there get the new precision
    (an all-``None`` ``LayerPrecision`` where the config now says full
    precision) and keep their class. Raises ``ConfigError`` when a layer the
    config names matches no convertible module, suggesting the closest names.

    ``example_input`` (a tensor, a tuple of arguments or a dict of keyword arguments): one
    forward of it is traced (``bfp.trace``) to find every GEMM the model computes, in order:
    modules that call ``F.scaled_dot_product_attention`` or ``torch.matmul``/``@`` in their own
    forward get named products (``bfp.routes``), ``@first``/``@last`` mean the first and last
    GEMM executed, and the coverage (``bfp.coverage``: "N of M GEMMs quantized", what stays FP32
    and why) is kept as ``model.bfp_coverage`` for ``conversion_report``. The trace is kept on
    the model, so later conversions (schedules, checkpoints) need no input. Without one, only
    module types are seen (``nn.Linear``, ``nn.Conv1d/2d``, transformers ``Conv1D``, ``Matmul``)
    and ``@first``/``@last`` follow registration order.

    ``module_filter(module, fqn) -> bool``: a layer for which it returns False stays in full
    precision (as torchao's ``filter_fn``). ``strict=True``: a GEMM of the traced forward that
    no rule quantizes and no rule, ``@first``/``@last`` or the filter keeps in full precision on
    purpose (an unsupported op such as ``einsum``, a layer only the default covers) is a
    ``ConfigError``; it needs ``example_input`` (or a model traced before).

    When ``model`` itself is a convertible layer the returned object is its
    replacement, so always use the return value.
    """
    cfg = load_config(config)
    if not isinstance(model, nn.Module):
        raise ValueError(f"convert needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise ValueError("convert needs the model itself, not torch.compile's wrapper of it (its graphs were traced "
                         "from the FP32 layers): convert first, then compile: model = torch.compile(bfp.convert("
                         "model, config)); the original is the wrapper's ._orig_mod")
    sharded = _sharded(model)
    if sharded:
        raise ValueError(f"convert cannot convert a model fully_shard has already sharded ({', '.join(sharded[:3])}: "
                         f"FSDP2 renamed their classes and holds their parameters as shards): convert first, then "
                         f"shard: bfp.convert(model, config), then fully_shard(block) per block and "
                         f"fully_shard(model)")
    scripted = [n or "(model)" for n, m in model.named_modules() if isinstance(m, torch.jit.ScriptModule)]
    if scripted:
        raise ValueError(f"convert cannot convert TorchScript modules ({', '.join(scripted[:5])}: torch.jit.script "
                         f"or trace compiled their forward, out of reach of bfp's layers); convert the Python "
                         f"module first, then script the converted model if you need to")
    module_filter = filter_of(module_filter)
    model = _named_attention(model) if example_input is None else trace_model(model, example_input)
    trace = model.__dict__.get(_TRACE)
    if strict and trace is None:
        raise ValueError("convert(strict=True) needs an example input: coverage is measured on a traced forward")
    if trace is not None:
        route(model, trace)
    layers = convertible_layers(model)
    if getattr(model, "bfp_config_renames", ()):  # torchvision models: CIFAR preset names (bfp.config.rename)
        cfg = adapt_names(cfg, model.bfp_config_renames, layers)
    modules = {n: type(m).__name__ for n, m in model.named_modules()}
    order = None if trace is None else tuple(n for n in trace.execution_order() if n in layers)
    plan = cfg.assign(layers, modules, order)
    filtered = {n for n in layers if module_filter is not None and plan[n] is not None
                and not module_filter(model.get_submodule(n) if n else model, n)}
    if trace is not None:  # checked before any layer is swapped: a refusal leaves the model as it was
        cov = coverage_of(trace, cfg, layers, order, plan, filtered)
        cov.check(cfg, strict)
    # id(module) -> what stands for it under every name: a module shared by several
    # names (weight tying) is decided once, by its first name.
    decided: dict[int, nn.Module] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if name not in layers:
            continue
        if id(module) not in decided:
            precision = None if name in filtered else plan[name]
            if _is_quantized(module):
                module.set_precision(precision if precision is not None else LayerPrecision())
            elif precision is not None and precision.enabled:
                decided[id(module)] = L.quantized_twin(module).from_float(module, precision)
            decided.setdefault(id(module), module)
        new = decided[id(module)]
        if new is module:
            continue
        if name == "":
            model = new
        else:
            _set_submodule(model, name, new)
    if trace is not None:
        model.__dict__[_TRACE] = trace
        model.__dict__[COVERAGE] = cov
        watch_children(model)  # swapped children of routed modules get their depth hooks
    return model


# -- reporting ------------------------------------------------------------------------

def _preset_lookup() -> dict[Format, str]:
    return {format_from_name(n): n for n in reversed(format_names())}


def short_format(fmt: Optional[Format], presets: Optional[dict] = None) -> str:
    """A compact name for report tables: a preset name where one fits
    (``fb16``, ``float8_e4m3fn``), else ``bfp4[1,24,3,3]``, ``e4m3``,
    ``mx:e2m1/32@1`` (``/rceil``: a scale mode other than floor); rounding other than the format's default as ``/rn``,
    ``/tr``, ``/sr``; ``-`` for full precision."""
    if fmt is None:
        return "-"
    presets = _preset_lookup() if presets is None else presets
    if fmt in presets:
        return presets[fmt]
    return fmt.short_name(lambda inner: short_format(inner, presets))


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def conversion_report(model: nn.Module) -> str:
    """A table of every convertible layer: name, class, weight shape and the
    format at each of the nine points (``-`` = full precision), plus
    backward source / accumulator columns when any layer sets them."""
    presets = _preset_lookup()
    rows, n_q, n_on = [], 0, 0
    extra_src = extra_acc = False
    entries = []
    for name, module in model.named_modules():
        if _type_name(module) is None:
            continue
        prec = getattr(module, "precision", None) if _is_quantized(module) else None
        n_q += prec is not None
        n_on += prec is not None and prec.enabled
        w = getattr(module, "weight", None)
        shape = "x".join(map(str, w.shape)) if w is not None else "-"
        entries.append((name or "(model)", type(module).__name__, shape, prec))
        extra_src |= prec is not None and prec.backward_source != "full"
        extra_acc |= prec is not None and prec.accumulator is not None
    header = ["layer", "type", "weight"] + list(POINTS)
    header += ["bwd_src"] * extra_src + ["accumulator"] * extra_acc
    for name, cls, shape, prec in entries:
        fmts = [short_format(getattr(prec, p) if prec else None, presets) for p in POINTS]
        row = [name, cls, shape] + fmts
        if extra_src:
            row.append(prec.backward_source if prec else "-")
        if extra_acc:
            row.append(repr(prec.accumulator) if prec and prec.accumulator else "-")
        rows.append(row)
    cov = model.__dict__.get(COVERAGE)
    if not entries:  # the GEMMs the trace found still say what stays FP32
        return f"no convertible layers ({', '.join(CONVERTIBLE_TYPES)})" + ("\n" + cov.report() if cov else "")
    summary = (f"{n_on} of {len(entries)} convertible layers quantized "
               f"({n_q} converted, {len(entries) - n_on} in full precision)")
    summary += "\n" + (cov.report() if cov is not None else
                       "GEMMs inside forward methods not traced (convert with example_input to see them)")
    return _table(header, rows) + "\n" + summary


# -- checkpoints and generated configs -------------------------------------------------

def precision_state(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Every Q-layer's precision as JSON-ready dicts (``LayerPrecision.to_dict``), by module name."""
    return {name: m.precision.to_dict() for name, m in model.named_modules() if _is_quantized(m)}


def load_precision_state(model: nn.Module, state: dict[str, dict[str, Any]]) -> nn.Module:
    """Restore ``precision_state``: the named layers get those precisions
    (float layers are converted), every other Q-layer goes to full precision.
    Unknown layer names raise ``ConfigError`` with the closest real names."""
    if not isinstance(state, dict):
        raise ConfigError(f"<precision state>: must be a dict of layer name -> LayerPrecision dict, "
                          f"got {type(state).__name__}")
    rules = []
    for name, d in state.items():
        try:
            prec = LayerPrecision.from_dict(d)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"<precision state>: {name!r}: {e}") from None
        rules.append(Rule(name, prec, where=repr(name), kind="exact"))
    return convert(model, NetConfig(tuple(rules), None, "<precision state>"))


def generate_config(model: nn.Module) -> dict[str, Any]:
    """An original-form config (``"default"`` plus one explicit ``"net.<name>"``
    entry per convertible layer, all 27 keys written out) that loads back unchanged.

    On a float model it is a template: every layer gets the original's
    defaults, ready for editing. On a converted model it is the model as it
    stands: Q-layers their current precision, full-precision layers
    ``{"type": "default"}``. Raises ``ConfigError`` for a precision the
    original form cannot hold (anything but truncating BlockFloat); save
    ``precision_state`` for those.
    """
    template = not any(_is_quantized(m) for m in model.modules())
    out: dict[str, Any] = {"default": legacy_dict(legacy_entry({}))}
    for name, module in model.named_modules():
        t = _type_name(module)
        if t is None or not name:
            continue
        linear = t == "Linear"
        if _is_quantized(module):
            prec = module.precision
        else:
            prec = legacy_entry({"type": "Linear"} if linear else {}) if template else None
        out[f"{LEGACY_PREFIX}{name}"] = legacy_dict(prec, linear, where=f"{LEGACY_PREFIX}{name}")
    return out
