"""What a conversion covered: every GEMM of a traced forward, quantized or in FP32 and why.

``coverage_of`` (called by ``bfp.convert`` with an ``example_input``) lists each GEMM the traced
forward computed (``bfp.trace``): a layer's GEMM, each of an attention call's two products, each
routed matmul, and the GEMM-like ops nothing can quantize (``einsum``, ``addmm``, ...). A GEMM in
FP32 is *on purpose* when a rule (an explicit ``"full"``, ``@first``/``@last``) or the
``module_filter`` keeps it so, and *uncovered* otherwise (no rule matches it and the default is
full precision, or its op has no quantized twin). ``Coverage.check`` turns uncovered GEMMs into
a ``ConfigError`` under ``strict`` and a warning for a preset that promises every GEMM
(its description starts with "Any model").
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from .config import ConfigError, NetConfig
from .precision import LayerPrecision
from .trace import GemmTrace

__all__ = ["Coverage", "Gemm", "coverage_of"]

_PRODUCT = {"qk": "q k^T", "pv": "p v"}


@dataclass(frozen=True)
class Gemm:
    """One GEMM of the traced forward: what it is, the layer computing it (``-``: none), whether it
    is quantized, and why not (with ``on_purpose``: a rule or the filter chose full precision)."""

    what: str
    layer: str
    quantized: bool
    reason: str = ""
    on_purpose: bool = True
    macs: Optional[int] = None  # multiply-adds the dispatcher counted (None: opaque, or no census)


@dataclass(frozen=True)
class Coverage:
    gemms: tuple[Gemm, ...]
    input_desc: str = ""

    @property
    def quantized(self) -> int:
        return sum(g.quantized for g in self.gemms)

    @property
    def uncovered(self) -> tuple[Gemm, ...]:
        return tuple(g for g in self.gemms if not g.quantized and not g.on_purpose)

    @property
    def total_macs(self) -> int:
        return sum(g.macs or 0 for g in self.gemms)

    def share(self, g: Gemm) -> str:
        """``g``'s share of the forward's multiply-adds, in words ('' without a census)."""
        if g.macs is None:
            return " (opaque: its multiply-adds cannot be counted)" if self.total_macs else ""
        return f" ({100 * g.macs / self.total_macs:.1f}% of the multiply-adds)" if self.total_macs else ""

    def summary(self) -> str:
        on = f" (traced forward of {self.input_desc})" if self.input_desc else ""
        total = self.total_macs
        work = ""
        if total:
            done = sum(g.macs or 0 for g in self.gemms if g.quantized)
            work = f", {100 * done / total:.1f}% of the forward's {total:,} multiply-adds"
        return f"{self.quantized} of {len(self.gemms)} GEMMs quantized{work}{on}"

    def report(self) -> str:
        """The summary and one line per GEMM left in FP32, with why and its share of the work."""
        lines = [self.summary()]
        lines += [f"  FP32: {g.what}{'' if g.layer == '-' or g.layer in g.what else f' ({g.layer})'}: {g.reason}"
                  f"{self.share(g)}" for g in self.gemms if not g.quantized]
        return "\n".join(lines)

    def check(self, cfg: NetConfig, strict: bool) -> None:
        bad = self.uncovered
        if not bad:
            return
        words = "; ".join(f"{g.what}: {g.reason}" for g in bad[:8]) + (f"; ... ({len(bad)} in all)"
                                                                       if len(bad) > 8 else "")
        if strict:
            raise ConfigError(f"{cfg.source}: strict coverage: {len(bad)} GEMM(s) of the traced forward stay "
                              f"FP32 without a rule saying so: {words}")
        if cfg.description.startswith("Any model"):
            warnings.warn(f"{cfg.source} promises every GEMM, but {len(bad)} stay FP32: {words}", stacklevel=3)


def _entry(what: str, name: str, type_name: str, cfg: NetConfig, order, plan, filtered) -> Gemm:
    prec: Optional[LayerPrecision] = plan.get(name)
    if name in filtered:
        return Gemm(what, name, False, "module_filter returned False")
    if prec is not None and prec.enabled:
        return Gemm(what, name, True)
    rule = cfg.deciding_rule(name, type_name, order)
    if rule is None:
        return Gemm(what, name, False, "no rule matches it; the default is full precision", on_purpose=False)
    if rule.kind in ("first", "last"):
        return Gemm(what, name, False, f"@{rule.kind}: the {rule.kind} GEMM executed keeps full precision")
    return Gemm(what, name, False, f"{rule.where or repr(rule.match)} gives it full precision")


def _why_fp32(site, opaque: bool) -> str:
    """Why an ``unsupported`` or ``recurrent`` site stays FP32, and what would quantize it."""
    if site.kind == "recurrent":
        return (f"{site.op}'s GEMMs run inside one fused recurrent op that bfp cannot quantize (build the cell "
                f"from nn.Linear layers to have them quantized)")
    if "grouped_mm" in site.op:
        return (f"a grouped GEMM ({site.op}) has no quantized twin yet; a Hugging Face MoE model computes its "
                f"experts as routed, quantized bmm with model.set_experts_implementation('batched_mm')")
    if opaque:
        return (f"{site.op} is an opaque custom op: bfp can neither see nor round what it computes inside")
    return f"{site.op} has no quantized twin (compute it with torch.matmul or a module to have it routed)"


def coverage_of(trace: GemmTrace, cfg: NetConfig, layers: Mapping[str, str], order, plan, filtered) -> Coverage:
    """The ``Coverage`` of ``plan`` (layer name -> precision) over the GEMMs of ``trace``, each with
    the multiply-adds the trace's census counted for it (an attention call's split over its two
    products)."""
    gemms = []
    for site in trace.sites:
        macs = trace.macs(site) if trace.census else None
        if site.kind in ("unsupported", "recurrent"):
            opaque = any(r.opaque for r in trace.census if r.key == site)
            gemms.append(Gemm(site.describe(), "-", False, _why_fp32(site, opaque), on_purpose=False, macs=macs))
            continue
        names = [n for n in site.layer_names() if n in layers]
        for name in names:
            tail = name.rpartition(".")[2].rstrip("0123456789")
            what = f"{_PRODUCT[tail]} of attention in {site.owner or '(model)'}" if site.kind == "sdpa" \
                else f"{site.op} {name}" if site.kind == "layer" else f"{site.op} in {site.owner or '(model)'}"
            g = _entry(what, name, layers[name], cfg, order, plan, filtered)
            gemms.append(replace(g, macs=None if macs is None else macs // len(names)))
    return Coverage(tuple(gemms), trace.input_desc)
