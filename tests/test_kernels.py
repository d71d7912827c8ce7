"""Quantization numerics: ml_dtypes and float64 oracles, and exact backend agreement.

The oracles here are independent of bfp's code: ml_dtypes for the named float
formats, short float64 NumPy re-derivations of the rules for the rest.
"""
import itertools
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numba
import numpy as np
import pytest
import torch

import bfp
from bfp import BlockFloat, Float, MX, format_from_name, quantize
from bfp.kernels import quantize_stats

SMALL_FLOATS = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn, "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}
WIDE_FLOATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
BACKENDS = ["reference", "cpu"]


def bits(t):
    return t.contiguous().view(torch.int32)


def assert_same_bits(a, b):
    """Bitwise equality, except that any NaN equals any NaN."""
    nan = torch.isnan(a) & torch.isnan(b)
    same = (bits(a) == bits(b)) | nan
    if not bool(same.all()):
        i = (~same).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{int((~same).sum())} differ; got {a.flatten()[i].tolist()}, "
                             f"want {b.flatten()[i].tolist()}")


def codes(dtype):
    """Every finite value of an ml_dtypes type, as float32."""
    nbits = 16 if dtype in (ml_dtypes.bfloat16, np.float16) else ml_dtypes.finfo(dtype).bits
    raw = np.arange(2 ** nbits, dtype=np.uint16 if nbits == 16 else np.uint8)
    v = raw.view(dtype).astype(np.float32)
    return v[np.isfinite(v)]


def oracle(v32, dtype):
    return torch.from_numpy(np.asarray(v32, np.float32).astype(dtype).astype(np.float32))


# -- float formats against ml_dtypes -------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SMALL_FLOATS) + list(WIDE_FLOATS))
def test_every_encoding_and_every_tie_matches_ml_dtypes(name, backend):
    dt = {**SMALL_FLOATS, **WIDE_FLOATS}[name]
    fmt = format_from_name(name)
    vals = np.unique(codes(dt).astype(np.float64))
    mids = (vals[1:] + vals[:-1]) / 2  # ties: exactly halfway, representable in float32
    quarter = vals[:-1] + (vals[1:] - vals[:-1]) / 4
    x = np.concatenate([vals, mids, quarter]).astype(np.float32)
    assert np.all(np.concatenate([mids, quarter]).astype(np.float32) == np.concatenate([mids, quarter]))
    got = quantize(torch.from_numpy(x), fmt, backend=backend)
    assert_same_bits(got, oracle(x, dt))
    # representable values are fixed points, signed zeros included
    assert_same_bits(quantize(torch.from_numpy(vals.astype(np.float32)), fmt, backend=backend),
                     torch.from_numpy(vals.astype(np.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SMALL_FLOATS) + list(WIDE_FLOATS))
def test_random_wide_range_matches_ml_dtypes(name, backend):
    dt = {**SMALL_FLOATS, **WIDE_FLOATS}[name]
    fmt = format_from_name(name)
    g = torch.Generator().manual_seed(1)
    n = 100_000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 40, (n,), generator=g).float())
    x = x.clamp(-fmt.max, fmt.max)
    x[:64] = torch.tensor([0.0, -0.0] * 32)
    assert_same_bits(quantize(x, fmt, backend=backend), oracle(x.numpy(), dt))


def test_float32_subnormal_inputs():
    x = torch.tensor([1e-45, -3e-44, 1.1e-38, 5.9e-39], dtype=torch.float32)
    assert_same_bits(quantize(x, format_from_name("bfloat16")), oracle(x.numpy(), ml_dtypes.bfloat16))
    assert_same_bits(quantize(x, format_from_name("float32")), x)
    assert_same_bits(quantize(x, format_from_name("float16")), torch.zeros(4) * torch.sign(x))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_nan_and_inf():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1.0])
    f16 = quantize(x, format_from_name("float16"))
    assert torch.isnan(f16[0]) and f16[1] == float("inf") and f16[2] == -float("inf")
    assert f16[3] == 65504 and f16[4] == -65504 and f16[5] == 1  # saturate by default
    f16inf = quantize(x, Float(5, 10, overflow="inf"))  # numpy float16 casts overflow to inf
    assert_same_bits(f16inf[1:], torch.from_numpy(x[1:].numpy().astype(np.float16).astype(np.float32)))
    e4m3 = quantize(x, format_from_name("float8_e4m3fn"))  # no Inf in the format: NaN
    assert torch.isnan(e4m3[:3]).all() and e4m3[3] == 448 and e4m3[4] == -448
    fp4 = quantize(x, format_from_name("float4_e2m1fn"))
    assert torch.isnan(fp4[:3]).all() and fp4[3] == 6


def float_oracle(x, exp, man, subnormals=True, maxval=None):
    """float64 NumPy rounding to nearest-even of any Float(exp, man), saturating."""
    x = np.asarray(x, np.float64)
    emin = 2 - 2 ** (exp - 1)
    _, e2 = np.frexp(x)
    e = np.where(x == 0, emin, e2 - 1)
    lsb = np.exp2(np.maximum(e, emin) - man)
    y = np.rint(x / lsb) * lsb
    if not subnormals:
        y = np.where(np.abs(y) < 2.0 ** emin, 0.0 * y, y)
    return np.clip(y, -maxval, maxval).astype(np.float32)


@pytest.mark.parametrize("exp,man", [(8, 10), (3, 4), (6, 9), (2, 0), (8, 0), (5, 1), (7, 23)])
@pytest.mark.parametrize("subnormals", [True, False])
def test_any_float_matches_float64_oracle(exp, man, subnormals):
    fmt = Float(exp, man, subnormals=subnormals)
    g = torch.Generator().manual_seed(exp * 100 + man)
    x = torch.randn(50_000, generator=g) * torch.exp2(torch.randint(-150, 126, (50_000,), generator=g).float())
    want = torch.from_numpy(float_oracle(x.numpy(), exp, man, subnormals, fmt.max))
    for backend in BACKENDS:
        assert_same_bits(quantize(x, fmt, backend=backend), want)


# -- BlockFloat ------------------------------------------------------------------

def test_reference_example_of_the_original():
    x = torch.tensor([1.9, 0.3, 0.1, -0.05])
    assert_same_bits(quantize(x, BlockFloat(4, [4])), torch.tensor([1.875, 0.25, 0.0, -0.0]))


def bfp_oracle(x, bits, group, rounding):
    """float64 NumPy: per aligned tile, Emax, LSB 2**(Emax-bits+1), round, clamp."""
    x = x.astype(np.float64)
    out = x.copy()
    group = tuple(group[: x.ndim]) + (1,) * (x.ndim - len(group))
    ranges = [range(0, d, g) for d, g in zip(x.shape, group)]
    for start in itertools.product(*ranges):
        sl = tuple(slice(s, s + g) for s, g in zip(start, group))
        t = x[sl]
        fin = np.isfinite(t) & (t != 0)
        if not fin.any():
            continue
        emax = np.max(np.frexp(np.abs(t[fin]))[1] - 1)
        lsb = 2.0 ** (emax - bits + 1)
        v = np.abs(t) / lsb
        k = np.trunc(v) if rounding == "truncate" else np.rint(v)
        k = np.minimum(k, 2 ** bits - 1)
        out[sl] = np.where(np.isfinite(t), np.copysign(k * lsb, t), t)
    return out.astype(np.float32)


BFP_CASES = [((53,), (8,)), ((7, 53), (3, 8)), ((5, 53, 7), (2, 8, 3)), ((3, 53, 7, 5), (1, 24, 3, 3)),
             ((4, 10, 6, 6), (2, 4, 4, 5)), ((2, 9, 5, 5), (1, 4)), ((9, 30), (1, 12, 3, 3)),
             ((6, 7, 8), (6, 7, 8))]


@pytest.mark.parametrize("rounding", ["truncate", "nearest"])
@pytest.mark.parametrize("shape,group", BFP_CASES)
@pytest.mark.parametrize("bits_", [1, 4, 8, 16, 24])
def test_blockfloat_matches_float64_oracle(shape, group, rounding, bits_):
    g = torch.Generator().manual_seed(len(shape) * 7 + bits_)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    x.view(-1)[::11] = 0.0
    want = torch.from_numpy(bfp_oracle(x.numpy(), bits_, group, rounding))
    for backend in BACKENDS:
        assert_same_bits(quantize(x, BlockFloat(bits_, group, rounding), backend=backend), want)


def test_blockfloat_nan_inf_do_not_corrupt_their_tile():
    x = torch.tensor([1.9, float("nan"), 0.3, float("inf"), 0.1, -float("inf")])
    for backend in BACKENDS:
        y = quantize(x, BlockFloat(4, [6]), backend=backend)
        assert torch.isnan(y[1]) and y[3] == float("inf") and y[5] == -float("inf")
        assert_same_bits(y[[0, 2, 4]], torch.tensor([1.875, 0.25, 0.0]))


def test_blockfloat_nearest_saturates_instead_of_growing_a_bit():
    x = torch.tensor([1.97, 0.5])  # 1.97 rounds up to 2.0 = 2**(Emax+1): clamped to 15 LSBs
    assert_same_bits(quantize(x, BlockFloat(4, [2], "nearest")), torch.tensor([1.875, 0.5]))


def test_all_zero_tiles_and_subnormal_tiles():
    x = torch.tensor([0.0, -0.0, 0.0, 0.0, 3e-45, 1e-42, -2e-44, 0.0])
    want = torch.from_numpy(bfp_oracle(x.numpy(), 3, (4,), "truncate"))
    for backend in BACKENDS:
        assert_same_bits(quantize(x, BlockFloat(3, [4]), backend=backend), want)


# -- MX -------------------------------------------------------------------------

def mx_oracle(x, elem, block, axis):
    """float64 NumPy: OCP MX scale 2**clamp(floor(log2 amax) - emax, -127, 127)."""
    xm = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty_like(xm)
    for s in range(0, xm.shape[-1], block):
        t = xm[..., s:s + block]
        a = np.max(np.where(np.isfinite(t), np.abs(t), 0), axis=-1, keepdims=True)
        emax_el = 0 if elem == "int8" else elem.emax
        e = np.where(a > 0, np.frexp(np.where(a > 0, a, 1))[1] - 1, 0)
        scale = 2.0 ** np.clip(e - emax_el, -127, 127)
        v = t / scale
        if elem == "int8":
            y = np.clip(np.rint(v * 64), -127, 127) / 64
        else:
            y = float_oracle(v, elem.exp, elem.man, True, elem.max).astype(np.float64)
        out[..., s:s + block] = y * scale
    return np.moveaxis(out, -1, axis).astype(np.float32)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8"])
@pytest.mark.parametrize("shape,axis", [((6, 100), -1), ((4, 70, 3), 1), ((33, 5), 0)])
def test_mx_matches_float64_oracle(name, shape, axis):
    fmt = format_from_name(name)
    fmt = MX(fmt.element, fmt.block, axis)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape, generator=g).float())
    want = torch.from_numpy(mx_oracle(x.numpy(), fmt.element, 32, axis))
    for backend in BACKENDS:
        assert_same_bits(quantize(x, fmt, backend=backend), want)


def test_mx_scale_clamps_to_e8m0():
    x = torch.tensor([1e-40, 3e-41] + [0.0] * 30)  # amax far below 2**-127
    fmt = format_from_name("mxfp8_e4m3")
    want = torch.from_numpy(mx_oracle(x.numpy(), fmt.element, 32, -1))
    assert_same_bits(quantize(x, fmt), want)


def test_mx_nonfinite_elements():
    x = torch.tensor([1.0, float("nan"), float("inf"), 0.75])
    y = quantize(x, MX("float4_e2m1fn", block=4))
    assert torch.isnan(y[1]) and torch.isnan(y[2]) and y[0] == 1.0 and y[3] == 0.75


# -- stochastic rounding ------------------------------------------------------------

@pytest.mark.parametrize("fmt", [Float(5, 2, "stochastic"), BlockFloat(4, [1, 8], "stochastic"),
                                 MX(Float(2, 1, "stochastic"), block=8)], ids=repr)
def test_stochastic_rounding_is_unbiased(fmt):
    n = 400_000
    x = torch.full((n // 8, 8), 1.0 + 1.0 / 3.0)  # between two representable neighbours
    x[:, 0] = 1.75  # sets the block scale for BFP/MX; exact in all three
    y = quantize(x, fmt, generator=torch.Generator().manual_seed(0))
    vals = torch.unique(y[:, 1:])
    assert len(vals) == 2  # only the two neighbours occur
    mean = y[:, 1:].double().mean().item()
    lo, hi = vals.tolist()
    sd = (hi - lo) * 0.5 / np.sqrt(y[:, 1:].numel())
    assert abs(mean - (1 + 1 / 3)) < 5 * sd


def test_stochastic_rounding_reproducible_and_thread_independent():
    fmt = BlockFloat(5, [1, 16, 3, 3], "stochastic")
    x = torch.randn(4, 32, 9, 9)
    y1 = quantize(x, fmt, generator=torch.Generator().manual_seed(7))
    y2 = quantize(x, fmt, generator=torch.Generator().manual_seed(7))
    y3 = quantize(x, fmt, generator=torch.Generator().manual_seed(8))
    assert torch.equal(bits(y1), bits(y2)) and not torch.equal(y1, y3)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        y4 = quantize(x, fmt, generator=torch.Generator().manual_seed(7))
    finally:
        numba.set_num_threads(old)
    assert torch.equal(bits(y1), bits(y4))
    ref = quantize(x, fmt, generator=torch.Generator().manual_seed(7), backend="reference")
    assert torch.equal(bits(y1), bits(ref))


def test_default_generator_follows_manual_seed():
    fmt = Float(4, 3, "stochastic", encoding="fn")
    x = torch.randn(1000)
    torch.manual_seed(3)
    a = quantize(x, fmt)
    torch.manual_seed(3)
    assert torch.equal(a, quantize(x, fmt))


# -- API behaviour -------------------------------------------------------------------

def test_input_is_never_modified_and_output_is_new():
    x = torch.randn(8, 24, 3, 3)
    keep = x.clone()
    for name in ["fb12", "float8_e4m3fn", "mxfp4_e2m1", "float32"]:
        y = quantize(x, format_from_name(name))
        assert y.data_ptr() != x.data_ptr()
        assert torch.equal(x, keep)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_input_dtypes(dtype):
    x = (torch.randn(300) * 10).to(dtype)
    fmt = format_from_name("float8_e4m3fn")
    y = quantize(x, fmt)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, quantize(x.float(), fmt).to(dtype))


def test_noncontiguous_scalar_and_empty_inputs():
    x = torch.randn(16, 24).t()
    fmt = BlockFloat(4, [3, 8])
    assert torch.equal(quantize(x, fmt), quantize(x.contiguous(), fmt))
    s = torch.tensor(1.9)
    assert quantize(s, BlockFloat(4, [1, 24])).item() == 1.875
    e = torch.empty(0, 5)
    assert quantize(e, fmt).shape == (0, 5)


def test_rank_above_four_falls_back_exactly():
    x = torch.randn(2, 3, 4, 5, 6)
    fmt = BlockFloat(4, (2, 2, 2, 2, 2))
    want = torch.from_numpy(bfp_oracle(x.numpy(), 4, (2, 2, 2, 2, 2), "truncate"))
    assert_same_bits(quantize(x, fmt), want)


def test_bad_arguments_have_clear_errors():
    with pytest.raises(TypeError, match="bfp format"):
        quantize(torch.randn(3), "float8_e4m3fn")
    with pytest.raises(TypeError, match="int64"):
        quantize(torch.arange(3), format_from_name("fb12"))
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        quantize(torch.randn(3), format_from_name("fb12"), backend="tpu")
    with pytest.raises(ValueError, match="MX axis 2 is out of range"):
        quantize(torch.randn(3, 4), MX("float8_e4m3fn", axis=2))


def test_zero_setting_error_counts_only_nonzero_inputs():
    x = torch.tensor([1.9, 0.3, 0.1, -0.05, 0.0, 0.0, 0.0, 0.0])
    # 0.1 and -0.05 are set to zero; the four zeros are not counted
    assert bfp.zero_setting_error(x, BlockFloat(4, [8])) == 2 / 4
    assert bfp.zero_setting_error(torch.zeros(5), BlockFloat(4, [8])) == 0.0
    g = torch.Generator().manual_seed(0)
    y = torch.randn(64, 48, 5, 5, generator=g) * torch.exp2(torch.randint(-10, 5, (64, 48, 5, 5), generator=g).float())
    y[y.abs() < 0.01] = 0
    fmt = format_from_name("fb12")
    q = torch.from_numpy(bfp_oracle(y.numpy(), 4, (1, 24, 3, 3), "truncate"))
    want = ((q == 0) & (y != 0)).sum().item() / (y != 0).sum().item()
    assert bfp.zero_setting_error(y, fmt) == want
    _, ref_counts = quantize_stats(y, fmt, backend="reference")
    _, cpu_counts = quantize_stats(y, fmt, backend="cpu")
    assert torch.equal(ref_counts, cpu_counts)


# -- fast paths equal the reference bit for bit -------------------------------------------

FORMATS = [format_from_name(n) for n in bfp.format_names()
           if not getattr(format_from_name(n), "delayed", False)] + [  # delayed scaling needs a layer
    BlockFloat(7, (2, 5, 2, 3), "nearest"), BlockFloat(3, (1, 4), "stochastic"),
    Float(3, 5, "stochastic", subnormals=False), Float(5, 2, "truncate"), MX(Float(4, 3, "stochastic", encoding="fn"), 16, 1),
    Float(3, 0), Float(2, 0, encoding="finite"), MX(Float(3, 0, encoding="finite"), 8),
]
SHAPES = [(3, 50, 7, 7), (37, 29), (1001,), (2, 3, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_cpu_kernel_equals_reference(fmt, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-60, 60, shape, generator=g).float())
    x.view(-1)[::13] = 0.0
    x.view(-1)[5::97] = float("nan")
    x.view(-1)[7::89] = float("inf")
    if isinstance(fmt, MX) and fmt.axis >= len(shape):
        pytest.skip("axis beyond rank")
    ref, rc = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(1), backend="reference")
    out, oc = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(1), backend="cpu")
    assert_same_bits(out, ref)
    assert torch.equal(bits(out), bits(ref))  # NaN payloads too
    assert torch.equal(rc, oc)


@pytest.mark.parametrize("fmt", [format_from_name("mxfp8_e4m3"), MX(Float(4, 3, "stochastic", encoding="fn"), 32),
                                 MX(Float(2, 1, "stochastic"), 32, 0)], ids=repr)
def test_long_tiles_over_several_segments_equal_reference(fmt):
    """Rows longer than a kernel segment (4096 elements): the long-tile path's maxima, constants
    and elements, each per segment, with a tail tile and stochastic draws by flat index."""
    for shape in [(2, 4096 * 2 + 40), (3, 10000), (9000, 3)]:
        g = torch.Generator().manual_seed(shape[1])
        x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
        x.view(-1)[7::101] = float("nan")
        got, want = (quantize_stats(x, fmt, generator=torch.Generator().manual_seed(1), backend=b)
                     for b in ("cpu", "reference"))
        assert torch.equal(bits(got[0]), bits(want[0])) and torch.equal(got[1], want[1]), shape


@pytest.mark.parametrize("fmt", [MX(format_from_name(n), 32, a) for n, a in
                                 [("float8_e4m3fn", 0), ("float8_e5m2", 1), ("float6_e3m2fn", 1), ("float4_e2m1fn", 0)]]
                         + [MX("float8_e4m3fn", block=8, axis=1, scale_mode="rceil"),
                            MX("float4_e2m1fn", block=16, axis=0, scale_mode="ceil"),
                            MX("float8_e5m2", block=32, axis=0, scale_mode="even")], ids=repr)
def test_mx_across_rows_rounds_scaled_elements_exactly(fmt):
    """Blocks across rows (the column path) round ``x * 2**-s`` with the element format's own
    constants and multiply by ``2**s``: the reference's bits and counts at the edges of float32
    (tiles near its smallest normals, where the kernel keeps the integer rule, and near FLT_MAX),
    with zeros of both signs, float32 subnormals, Inf, and quiet and signaling NaNs as they are."""
    g = torch.Generator().manual_seed(5)
    for shape, lo, hi in [((64, 40, 5), -30, 30), ((96, 33), -140, -100), ((40, 64, 3), 90, 127), ((64, 64), -149, 127), ((8, 64, 3, 3), -30, 30), ((40, 64, 1, 2), -140, 60)]:
        x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(lo, hi, shape, generator=g).float())
        flat = x.view(-1)
        flat[::13], flat[9::91], flat[5::97], flat[7::89] = 0.0, -0.0, float("nan"), float("inf")
        flat.view(torch.int32)[11::83] = 0x7F800001  # signaling NaN
        flat.view(torch.int32)[15::79] = 3  # a float32 subnormal
        got, want = (quantize_stats(x, fmt, backend=b) for b in ("cpu", "reference"))
        assert torch.equal(bits(got[0]), bits(want[0])) and torch.equal(got[1], want[1]), (shape, lo, hi)


SIM_SCRIPT = textwrap.dedent("""
    import torch, bfp
    from bfp.kernels import quantize_stats
    from bfp import BlockFloat, Float, MX, format_from_name
    fmts = [format_from_name(n) for n in ["fb12", "float8_e4m3fn", "float6_e2m3fn", "mxfp4_e2m1", "mxint8", "bfloat16"]]
    fmts += [BlockFloat(5, (2, 3), "nearest"), BlockFloat(6, (1, 4, 2, 3), "stochastic"),
             Float(4, 3, "stochastic", encoding="fn"), MX("float6_e3m2fn", block=8, axis=1),
             MX("float8_e4m3fn", block=8, axis=1, scale_mode="rceil"), MX("int8", block=4, scale_mode="even"),
             MX("float4_e2m1fn", block=16, scale_mode="ceil"), MX("float8_e5m2", block=32, scale_mode="even"),
             MX("float8_e4m3fn", block=(4, 3), axis=-1, scale_mode="rceil"), Float(3, 0),
             MX(Float(3, 0, encoding="finite"), block=8)]
    fmts += [format_from_name(n) for n in ["p3109_k8p4ue_ovfinf", "p3109_k8p1sf", "p3109_k6p3se_sr_satpropagate",
                                           "p3109_k8p3se_rz"]]
    bad = 0
    for shape in [(3, 10, 5, 7), (13, 11)]:
        x = torch.randn(shape) * torch.exp2(torch.randint(-30, 30, shape).float())
        x.view(-1)[::9] = 0
        x.view(-1)[4] = float("nan"); x.view(-1)[6] = -float("inf")
        for f in fmts:
            r = quantize_stats(x, f, generator=torch.Generator().manual_seed(2), backend="reference")
            c = quantize_stats(x, f, generator=torch.Generator().manual_seed(2), backend="triton")
            same = torch.equal(r[0].view(torch.int32), c[0].view(torch.int32)) and torch.equal(r[1], c[1])
            bad += not same
            print(shape, f, "ok" if same else "MISMATCH")
    print("mismatches", bad)
""")


def test_triton_kernels_equal_reference_in_a_fresh_interpreter_process():
    """The Triton backend in a process that sets TRITON_INTERPRET=1 itself (as a user without a GPU
    would), not only under the test session's setting."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", SIM_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mismatches 0" in res.stdout, res.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_triton_kernel_equals_reference_on_gpu(fmt):
    x = torch.randn(3, 50, 7, 7, device="cuda") * 10
    x.view(-1)[::13] = 0.0
    ref, rc = quantize_stats(x, fmt, generator=torch.Generator("cuda").manual_seed(1), backend="reference")
    out, oc = quantize_stats(x, fmt, generator=torch.Generator("cuda").manual_seed(1))
    assert torch.equal(bits(out), bits(ref)) and torch.equal(rc, oc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float_without_mantissa_bits_breaks_ties_to_the_even_exponent_code(backend):
    # Float(3, 0): one code per binade (bias 3: 0.25 is code 1, 0.5 code 2, 1 code 3, 2 code 4, 4 code 5,
    # 8 code 6); a tie goes to the even code, which is the smaller or the larger value by turns.
    x = torch.tensor([0.375, 0.75, 1.5, 3.0, 6.0, -3.0, 0.125, 0.1875, 2.5])
    want = [0.5, 0.5, 2.0, 2.0, 8.0, -2.0, 0.0, 0.25, 2.0]
    assert quantize_stats(x, Float(3, 0), backend=backend)[0].tolist() == want
    # Under an MX scale the code counts from the scaled smallest normal: block max 32 gives the scale
    # 2**(5 - emax) = 2 (E3M0 finite: emax 4), and 6, 12, 3 are the ties 3, 6, 1.5 of the element grid.
    mx = MX(Float(3, 0, encoding="finite"), block=4)
    y = torch.tensor([32.0, 6.0, 12.0, 3.0])
    assert quantize_stats(y, mx, backend=backend)[0].tolist() == [32.0, 4.0, 16.0, 4.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncation_never_rounds_past_max_even_where_overflow_gives_inf(backend):
    x = torch.tensor([1e6, -1e6, 61440.0, 65536.0, float("inf")])  # e5m2: max 57344, next binade 65536
    trunc = Float(5, 2, "truncate", overflow="inf")
    assert quantize_stats(x, trunc, backend=backend)[0].tolist() == [57344.0, -57344.0, 57344.0, 57344.0, float("inf")]
    near = Float(5, 2, "nearest", overflow="inf")
    assert quantize_stats(x, near, backend=backend)[0].tolist() == [float("inf"), -float("inf"), float("inf"),
                                                                    float("inf"), float("inf")]
