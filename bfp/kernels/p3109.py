"""The element rule's parameters of an IEEE P3109 format (``bfp.formats.p3109``): one
``plan.Rule`` and the special-value switches of ``scalar.py``; the kernels are the shared ones."""
from __future__ import annotations

from ..formats import register_kernel
from ..formats.p3109 import P3109
from .dispatch import element_rule
from .plan import KIND_FLOAT, MODE, SCALE_NONE, Rule, register_rule
from .scalar import INF_NAN, INF_SAT, NEG_NAN, NEG_ZERO, NO_NEG_ZERO


def p3109_rule(f: P3109) -> Rule:
    """Largest finite value from the top finite code; overflow and Inf by ``saturation`` and domain;
    one zero; unsigned negatives to +0 (satfinite) or NaN."""
    kept, q = f.significand_of(f.top_code)
    sat_finite = f.saturation == "satfinite"
    saturate_finite = f.saturation != "ovfinf"
    ovf = 0 if saturate_finite else (1 if f.has_inf else 2)
    specials = NO_NEG_ZERO
    if sat_finite:
        specials |= INF_SAT
    elif not f.has_inf:
        specials |= INF_NAN
    if not f.signed:
        specials |= NEG_ZERO if sat_finite else NEG_NAN
    return Rule(KIND_FLOAT, MODE[f.rounding], SCALE_NONE, 0, 0, 0, f.emin, f.man, kept, q, 0, ovf, specials)


register_rule(P3109, p3109_rule)
register_kernel(P3109, element_rule)
