"""The CPU's float32 shortcut for nearest rounding (``bfp.kernels.numba_cpu.rule_cpu._elem_nearest``) against the
integer element rule it replaces (``scalar._quant_elem``, mode 1), input by input.

The inputs are every sign and float32 exponent field with, for each number of dropped bits, the
mantissas just below, at and above the halfway point, the all-ones and the odd-kept patterns, plus
random mantissas: every rounding decision the rule makes. The shortcut was also compared on all
2**32 inputs of float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, float16,
p3109_k8p3se, p3109_k8p4se and of fb12, fb24, mxfp8_e4m3, mxfp4_e2m1 and mxint8 at five tile
maxima each, with no difference (BENCHMARKS.md, "Nearest rounding in float32").
"""
import numpy as np
import pytest
from numba import njit

import bfp
from bfp.kernels.numba_cpu import rule_cpu
from bfp.kernels.plan import rule_for


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    mants = [0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF, 0x400001]
    for d in range(1, 24):
        half = 1 << (d - 1)
        mants += [half - 1, half, half + 1, (1 << d) - 1, half | (1 << d), (half + 1) | (1 << d)]
    mants = np.unique(np.concatenate([np.array(mants), rng.integers(0, 1 << 23, 64)]) & 0x7FFFFF)
    hi = np.arange(512, dtype=np.int64) << 23  # sign and exponent fields
    bits = (hi[:, None] | mants[None, :]).reshape(-1)
    return bits.astype(np.uint32).view(np.int32)


@njit
def _compare(xs, kind, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan):
    """Indices where the shortcut and the integer rule disagree."""
    bad = []
    for i in range(xs.size):
        xb = np.int64(xs[i])
        a = rule_cpu._elem(xb, kind, 1, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan, 0)
        b = rule_cpu._elem_nearest(xb, kind, qt, p2q, hi, lo, man, ftz, ovf_inf, inf_nan)
        if np.int32(a) != np.int32(b):
            bad.append(i)
    return bad


FORMATS = ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "float16",
           "p3109_k8p3se", "p3109_k8p4se", "fb12", "fb16", "fb24", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3",
           "mxfp4_e2m1", "mxint8"]
P3109 = [bfp.P3109(8, 3, signed=False), bfp.P3109(8, 4, domain="finite"), bfp.P3109(6, 2, saturation="ovfinf"),
         bfp.P3109(8, 5, saturation="satpropagate"), bfp.P3109(4, 2, signed=False, domain="finite"),
         bfp.Float(6, 22), bfp.Float(3, 22, subnormals=False), bfp.Float(7, 1)]
TILE_MAXIMA = [0, 0x3F800000, 0x00400000, 0x1F000000, 0x5F123456, 0x7F7FFFFF, 0x0C000000]


@pytest.mark.parametrize("fmt", FORMATS + P3109, ids=str)
def test_float32_shortcut_equals_the_integer_rule(fmt):
    fmt = bfp.format_from_name(fmt) if isinstance(fmt, str) else fmt
    r = rule_for(fmt)
    xs = _inputs()
    on_path = 0
    for tmax in TILE_MAXIMA if r.scale else [0]:
        qt, p2q, hi, lo = rule_cpu._tile_consts(tmax, r.kind, r.scale, r.soff, r.qoff, r.lim, r.emin, r.man,
                                           r.maxkept, r.emaxq)
        if not rule_cpu._nearest_ok(r.kind, qt, p2q, hi, r.man):
            continue
        on_path += 1
        bad = _compare(xs, r.kind, qt, p2q, hi, lo, r.man, r.ftz, r.ovf_inf, r.inf_nan)
        assert not bad, f"{fmt} tile max {tmax:#x}: {len(bad)} inputs differ, first {int(xs[bad[0]]) & 0xFFFFFFFF:#010x}"
    assert on_path, f"{fmt}: never on the shortcut"


@pytest.mark.parametrize("fmt", ["bfloat16", "tf32", bfp.Float(7, 23), bfp.Float(2, 23)], ids=str)
def test_wide_formats_keep_the_integer_rule(fmt):
    """A format whose largest binade is near float32's (``c`` would overflow) or with 23 mantissa
    bits (``c`` would not exceed its binade): the integer rule stays."""
    r = rule_for(bfp.format_from_name(fmt) if isinstance(fmt, str) else fmt)
    qt, p2q, hi, _ = rule_cpu._tile_consts(0, r.kind, r.scale, r.soff, r.qoff, r.lim, r.emin, r.man, r.maxkept, r.emaxq)
    assert not rule_cpu._nearest_ok(r.kind, qt, p2q, hi, r.man)


def test_no_mantissa_bits_keep_the_integer_rule():
    """One code per binade: ties go to the even exponent field, not the even multiple."""
    r = rule_for(bfp.P3109(8, 1))
    qt, p2q, hi, _ = rule_cpu._tile_consts(0, r.kind, r.scale, r.soff, r.qoff, r.lim, r.emin, r.man, r.maxkept, r.emaxq)
    assert r.man == 0 and not rule_cpu._nearest_ok(r.kind, qt, p2q, hi, r.man)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float6_e3m2fn", "fb16", "mxfp8_e4m3", "mxfp8_e4m3@0"])
def test_quantize_takes_the_shortcut_with_flush_to_zero_set(name):
    """The shortcut's grid is >= 2**-125, so a CPU treating subnormals as zero changes nothing:
    whole tensors of every rounding decision (float32 subnormals included, run by the parallel
    kernel) under ``torch.set_flush_denormal(True)`` equal the integer rule (the PyTorch
    reference backend) bit for bit."""
    import torch
    fmt = bfp.format_from_name(name.partition("@")[0])
    if "@" in name:  # MX blocks across rows: the column path rounds x * 2**-s, then multiplies
        fmt = bfp.MX(fmt.element, fmt.block, int(name.partition("@")[2]))
    r = rule_for(fmt.element if "@" in name else fmt)
    if not r.scale:  # element-wise: the kernel's constants are on the shortcut (tiles: per tile)
        qt, p2q, hi, _ = rule_cpu._tile_consts(0, r.kind, 0, 0, r.qoff, r.lim, r.emin, r.man, r.maxkept, r.emaxq)
        assert rule_cpu._nearest_ok(r.kind, qt, p2q, hi, r.man)
    x = torch.from_numpy(_inputs()).view(torch.float32).reshape(-1, 32)
    assert (x.view(torch.int32) & 0x7F800000 == 0).sum() >= 300  # float32 subnormals (both signs)
    want = bfp.quantize(x, fmt, backend="reference").view(torch.int32)
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        got = bfp.quantize(x, fmt, backend="cpu").view(torch.int32)
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(got, want), f"{(got != want).sum()} of {x.numel()} differ"
    if name == "float8_e4m3fn":
        y = torch.tensor([1e-40, -1e-39, 2.0 ** -10 * 1.0625, 3.0])
        assert bfp.quantize(y, fmt).tolist() == [0.0, -0.0, 2.0 ** -9, 3.0]

@njit
def _ufp_bad(lo_bits, hi_bits):
    """Positive float32s in [lo_bits, hi_bits) whose ``_ufp`` is not their exponent field's power."""
    bad = 0
    for b in range(lo_bits, hi_bits):
        a = np.int32(b).view(np.float32)
        want = np.int32(b & 0x7F800000).view(np.float32)
        bad += rule_cpu._ufp(a) != want
    return bad


@pytest.mark.parametrize("e", [-100, -99, -7, -1, 0, 1, 8, 15, 99])
def test_ufp_is_the_leading_power_of_two_on_whole_binades(e):
    """Rump's float32 ``ufp`` on every float32 of the binades ``_elem_scaled`` relies on (its
    clamp range lies within 2**-100 .. 2**100)."""
    lo_bits = (e + 127) << 23
    assert _ufp_bad(lo_bits, lo_bits + (1 << 23)) == 0


@njit
def _compare_scaled(xs, s, e0, e1, e2, e3, man, ftz, ovf_inf, inf_nan):
    """Indices where ``_elem_scaled`` (float32 lanes) differs from ``_elem_nearest`` of ``x * 2**-s``
    times ``2**s`` (the integer-constant shortcut, itself equal to the integer rule)."""
    lo, top, hi, c23, qnan, ok = rule_cpu.scaled_consts(e0, e1, e2, e3, man, inf_nan)
    inv = np.int32((127 - s) << 23).view(np.float32)
    fac = np.int32((127 + s) << 23).view(np.float32)
    bad = []
    for i in range(xs.size):
        xj = xs[i]
        x = np.int32(xj).view(np.float32)
        if (xj & 0x7FFFFFFF) > 0x7F800000:
            want = np.int32(xj)
        else:
            y = np.float32(x * inv)
            qb = rule_cpu._elem_nearest(np.int64(y.view(np.int32)), 0, e0, e1, e2, e3, man, ftz, ovf_inf, inf_nan)
            want = np.float32(np.int32(qb).view(np.float32) * fac).view(np.int32)
        got = rule_cpu._elem_scaled(xj, inv, fac, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan)
        # element-wise (no scaling at all): _elem_f must give the same bits too
        plain = rule_cpu._elem_f(xj, lo, top, hi, c23, qnan, ftz, ovf_inf, inf_nan) if s == 0 else got
        if np.int32(got) != want or np.int32(plain) != want:
            bad.append(i)
    return bad


@njit
def _compare_fixed(xs, qt, p2q, hi, lo, inf_nan, mode):
    """Indices where ``_fixed_f`` (float32 lanes) differs from the integer rule of a fixed-point tile
    (``mode`` 1: nearest, 0: truncation)."""
    c = np.int32(p2q + (23 << 23)).view(np.float32)
    u = np.int32(p2q).view(np.float32)
    fhi = np.int32(hi).view(np.float32)
    qnan = np.int32(0x7FC00000).view(np.float32)
    bad = []
    for i in range(xs.size):
        want = rule_cpu._elem(np.int64(xs[i]), 1, mode, qt, p2q, hi, lo, 0, False, 0, inf_nan, 0)
        if np.int32(rule_cpu._fixed_f(xs[i], c, u, fhi, qnan, inf_nan, mode == 0)) != np.int32(want):
            bad.append(i)
    return bad


@pytest.mark.parametrize("fmt", ["fb12", "fb16", "fb24", "mxint8", bfp.MX("int8", block=32, scale_mode="rceil")],
                         ids=str)
def test_float32_lanes_of_fixed_point_tiles_equal_the_integer_rule(fmt):
    """``_fixed_f`` (BlockFloat and MX int tiles in float32 lanes) against the integer rule, nearest
    and truncating, on every rounding decision of every float32 binade, at the tile maxima of the
    shortcut's test above."""
    fmt = bfp.format_from_name(fmt) if isinstance(fmt, str) else fmt
    r = rule_for(fmt)
    assert r.kind == 1 and r.inf_nan < 4
    xs = _inputs()
    on_path = 0
    for tmax in TILE_MAXIMA:
        qt, p2q, hi, lo = rule_cpu._tile_consts(tmax, r.kind, r.scale, r.soff, r.qoff, r.lim, r.emin, r.man,
                                                r.maxkept, r.emaxq)
        if not rule_cpu._nearest_ok(1, qt, p2q, hi, r.man):
            continue
        on_path += 1
        for mode in (0, 1):
            bad = _compare_fixed(xs, qt, p2q, hi, lo, r.inf_nan, mode)
            assert not bad, (f"{fmt} mode {mode} tile max {tmax:#x}: {len(bad)} differ, "
                             f"first {int(xs[bad[0]]) & 0xFFFFFFFF:#010x}")
    assert on_path >= 3


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
                                 "float16", bfp.Float(4, 3, overflow="inf"), bfp.Float(3, 2, subnormals=False)]
                         + P3109[:5], ids=str)
def test_float32_lanes_of_mx_elements_equal_the_integer_constants(fmt):
    """``_elem_scaled`` (an MX element in float32 lanes) against ``_elem_nearest`` on ``x * 2**-s``,
    every rounding decision of every float32 binade (both signs, Inf, NaN, subnormals), at block
    scales from 2**-126 to 2**126."""
    fmt = bfp.format_from_name(fmt) if isinstance(fmt, str) else fmt
    r = rule_for(fmt)
    e0, e1, e2, e3 = rule_cpu._tile_consts(0, r.kind, 0, 0, r.qoff, r.lim, r.emin, r.man, r.maxkept, r.emaxq)
    assert rule_cpu.scaled_consts(e0, e1, e2, e3, r.man, r.inf_nan)[-1], f"{fmt}: not on the float32-lane path"
    xs = _inputs()
    for s in (-126, -40, -7, 0, 3, 60, 126):
        bad = _compare_scaled(xs, s, e0, e1, e2, e3, r.man, r.ftz, r.ovf_inf, r.inf_nan)
        assert not bad, f"{fmt} scale 2**{s}: {len(bad)} inputs differ, first {int(xs[bad[0]]) & 0xFFFFFFFF:#010x}"
