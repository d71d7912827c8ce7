"""MX shared-scale modes (floor, ceil, even, rceil) bit-exact against an oracle written here from
the published rules: OCP MX v1.0 (floor), torchao's CEIL and EVEN, NVIDIA's RCEIL
(ceil(log2(amax / element max))), with exact rational arithmetic for the scale and a float64
element rounding; on zeros, float32 subnormals, amax at and just above powers of two and the
element maximum, NaN/Inf in a block, block tails and blocks of equal values."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from bfp import MX, format_from_name, quantize
from bfp.formats.mx import INT8
from test_kernels import BACKENDS, assert_same_bits, float_oracle

MODES = ("floor", "ceil", "even", "rceil")
ELEMENTS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8")


def oracle_scale(amax: float, elem, mode: str) -> int:
    """The E8M0 exponent of a block with largest finite magnitude ``amax`` > 0 (exact)."""
    a = Fraction(amax)
    if elem == INT8:
        emax, man, top = 0, 6, Fraction(127, 64)
    else:
        emax, man, top = elem.emax, elem.man, Fraction(elem.max)
    fl = math.floor(math.log2(amax))  # amax is a float32: log2 is exact enough to floor it
    while Fraction(2) ** fl > a:
        fl -= 1
    while Fraction(2) ** (fl + 1) <= a:
        fl += 1
    if mode == "floor":
        s = fl - emax
    elif mode == "ceil":
        s = fl - emax + (a != Fraction(2) ** fl)
    elif mode == "even":  # amax rounded half up to the element's mantissa bits, then floor
        ulp = Fraction(2) ** (fl - man)
        r = math.floor(a / ulp + Fraction(1, 2)) * ulp
        s = fl - emax + (r >= Fraction(2) ** (fl + 1))
    else:  # rceil: the smallest s with amax <= element max * 2**s
        s = fl - emax - 2
        while a > top * Fraction(2) ** s:
            s += 1
    return min(max(s, -127), 127)


def oracle(x: np.ndarray, fmt: MX) -> np.ndarray:
    """float64 blocks along the last axis (``fmt.axis`` must be -1)."""
    out = np.empty(x.shape, np.float64)
    for i in range(x.shape[0]):
        for b in range(0, x.shape[1], fmt.block):
            t = x[i, b:b + fmt.block].astype(np.float64)
            fin = np.isfinite(t)
            amax = float(np.max(np.abs(np.where(fin, t, 0.0))))
            s = oracle_scale(amax, fmt.element, fmt.scale_mode) if amax > 0 else 0
            v = t / 2.0 ** s
            if fmt.element == INT8:
                y = np.clip(np.rint(v * 64), -127, 127) / 64
            else:
                e = fmt.element
                y = float_oracle(np.where(fin, v, 0.0), e.exp, e.man, True, e.max).astype(np.float64)
            keep_inf = fmt.element != INT8 and fmt.element.has_inf  # E5M2 elements keep Inf, others: NaN
            out[i, b:b + fmt.block] = np.where(fin, y * 2.0 ** s, np.where(np.isinf(t) & keep_inf, t, np.nan))
    with np.errstate(over="ignore"):  # a block at float32's top can round to 2**128: inf, as the kernels
        return out.astype(np.float32)


def _edge_blocks() -> torch.Tensor:
    """Rows of 8-element blocks (and a 5-element tail) hitting every edge of the scale rules."""
    rows = []
    for p in (-130, -127, -20, 0, 3, 8, 15, 127):
        for m in (1.0, 1.0 + 2 ** -23, 1.5, 1.75, 1.75 + 2 ** -20, 1.8125, 1.875, 1.9375, 2 - 2 ** -23):
            a = m * 2.0 ** p
            rows.append([a, -a / 3, a / 7, 0.0, -a, a / 1024, a * 0.9, a / 2 ** 30, a, 1.0, 0.5, -0.25, 0.1])
    rows.append([0.0] * 13)                                          # a block of zeros
    rows.append([1e-40, -3e-41, 2e-45, 0.0, 7e-39, 1e-42, 0, 0, 1e-40, 5e-41, 0, 0, 0])  # subnormals
    rows.append([3.0] * 13)                                          # all equal
    rows.append([1.0, float("nan"), 480.0, float("inf"), -2.0, 0.0, 1e-3, 3.0, float("-inf"), 1, 2, 3, 4])
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ELEMENTS)
def test_each_scale_mode_matches_the_published_rule_on_every_edge(name, mode):
    base = format_from_name(name)
    fmt = MX(base.element, block=8, axis=-1, scale_mode=mode)
    g = torch.Generator().manual_seed(7)
    rand = torch.randn(40, 37, generator=g) * torch.exp2(torch.randint(-40, 40, (40, 37), generator=g).float())
    for x in (_edge_blocks(), rand):
        want = torch.from_numpy(oracle(x.numpy(), fmt))
        for backend in BACKENDS:
            assert_same_bits(quantize(x, fmt, backend=backend), want)


def test_the_modes_differ_where_they_should():
    """448 = E4M3's max: only ceil moves it up (not a power of two); 460 saturates under floor
    and even (it rounds down to E4M3's top binade), moves up a binade under ceil and rceil; 2**8
    is a power of two: ceil keeps floor's scale."""
    e4m3 = format_from_name("mxfp8_e4m3").element
    assert [oracle_scale(448.0, e4m3, m) for m in MODES] == [0, 1, 0, 0]
    assert [oracle_scale(460.0, e4m3, m) for m in MODES] == [0, 1, 0, 1]
    assert [oracle_scale(496.0, e4m3, m) for m in MODES] == [0, 1, 1, 1]
    assert [oracle_scale(256.0, e4m3, m) for m in MODES] == [0, 0, 0, 0]
    x = torch.tensor([[460.0, 1.0, 0.0, 0.0]])
    got = {m: quantize(x, MX(e4m3, block=4, scale_mode=m))[0, 0].item() for m in MODES}
    assert got == {"floor": 448.0, "ceil": 448.0, "even": 448.0, "rceil": 448.0}
    x = torch.tensor([[500.0, 1.0, 0.0, 0.0]])
    got = {m: quantize(x, MX(e4m3, block=4, scale_mode=m))[0, 0].item() for m in MODES}
    assert got == {"floor": 448.0, "ceil": 512.0, "even": 512.0, "rceil": 512.0}


def test_scale_modes_by_name_dict_and_config():
    from bfp.config.specs import parse_format
    from bfp.formats import format_from_dict
    f = format_from_name("mxfp8_e4m3_rceil")
    assert f.scale_mode == "rceil" and f.element == format_from_name("mxfp8_e4m3").element
    assert format_from_dict(f.to_dict()) == f and f.to_dict()["scale_mode"] == "rceil"
    assert "scale_mode" not in format_from_name("mxfp8_e4m3").to_dict()  # older saved dicts stay equal
    assert repr(format_from_name("mxfp4_e2m1_even")) == "MX(e2m1, block=32, axis=-1, scale_mode=even)"
    assert parse_format({"mx": "e4m3", "block": 16, "scale_mode": "ceil"}) == \
        MX(format_from_name("e4m3"), block=16, scale_mode="ceil")
    with pytest.raises(ValueError, match="MX scale_mode 'round' unknown; allowed: floor, ceil, even, rceil"):
        MX("float8_e4m3fn", scale_mode="round")
    with pytest.raises(ValueError, match="an MX name may end in a scale mode"):
        format_from_name("mxfp8_e4m3_up")


def oracle_2d(x: np.ndarray, fmt: MX) -> np.ndarray:
    """float64 tiles of ``fmt.block`` (rows, cols) over a 2-D array, any scale mode."""
    br, bc = fmt.block
    out = np.empty(x.shape, np.float32)
    for i in range(0, x.shape[0], br):
        for j in range(0, x.shape[1], bc):
            t = x[i:i + br, j:j + bc]
            flat = MX(fmt.element, block=t.size, scale_mode=fmt.scale_mode)
            out[i:i + br, j:j + bc] = oracle(t.reshape(1, -1), flat).reshape(t.shape)
    return out


@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("block", [(16, 16), (4, 8), (3, 5)])
def test_2d_blocks_share_one_scale_and_a_weight_and_its_transpose_round_alike(block, mode):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(37, 45, generator=g) * torch.exp2(torch.randint(-8, 8, (37, 45), generator=g).float())
    fmt = MX(format_from_name("mxfp8_e4m3").element, block=block, axis=-1, scale_mode=mode)
    want = torch.from_numpy(oracle_2d(w.numpy(), fmt))
    for backend in BACKENDS:
        assert_same_bits(quantize(w, fmt, backend=backend), want)
    # the transpose, with the block transposed, rounds to the same values (fw and biw of one weight)
    tfmt = MX(fmt.element, block=block[::-1], axis=-1, scale_mode=mode)
    assert_same_bits(quantize(w.t(), tfmt).t(), want)
    assert_same_bits(quantize(w, MX(fmt.element, block=block, axis=1, scale_mode=mode)), want)


def test_2d_block_names_and_errors():
    from bfp.formats import format_from_dict
    f = MX("float4_e2m1fn", block=[16, 16], axis=1)
    assert f.block == (16, 16) and repr(f) == "MX(e2m1, block=16x16, axis=1)"
    assert format_from_dict(f.to_dict()) == f and MX("float4_e2m1fn", block=[32]).block == 32
    with pytest.raises(ValueError, match="MX block 16x16 ending on axis 0 needs 2 axes"):
        quantize(torch.ones(4, 4), MX("float4_e2m1fn", block=(16, 16), axis=0))
    with pytest.raises(ValueError, match="MX block entry"):
        MX("float4_e2m1fn", block=(16, 0))
