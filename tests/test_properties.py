"""Property tests (hypothesis): invariants every format must keep, on random formats and inputs."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bfp import BlockFloat, Float, MX, quantize
from bfp.formats import Encoding

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
vectors = st.lists(finite32, min_size=1, max_size=64).map(lambda v: torch.tensor(v, dtype=torch.float32))


@st.composite
def floats_fmt(draw, roundings=("nearest", "truncate")):
    exp = draw(st.integers(2, 8))
    man = draw(st.integers(1, 23))
    enc = Encoding.IEEE if exp == 8 else draw(st.sampled_from(list(Encoding)))  # others pass float32's max
    return Float(exp, man, rounding=draw(st.sampled_from(roundings)),
                 subnormals=draw(st.booleans()), encoding=enc)


@st.composite
def any_fmt(draw):
    kind = draw(st.integers(0, 2))
    rnd = draw(st.sampled_from(["nearest", "truncate"]))
    if kind == 0:
        return draw(floats_fmt())
    if kind == 1:
        return BlockFloat(draw(st.integers(1, 24)), (draw(st.integers(1, 9)),), rnd)
    return MX(Float(draw(st.integers(2, 5)), draw(st.integers(1, 3)), rnd, encoding=Encoding.FINITE),
              block=draw(st.integers(1, 40)))


def same(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@settings(max_examples=60, deadline=None)
@given(vectors, any_fmt())
def test_idempotent(x, fmt):
    q = quantize(x, fmt)
    assert same(quantize(q, fmt), q)


@settings(max_examples=60, deadline=None)
@given(vectors, any_fmt())
def test_sign_symmetric(x, fmt):
    assert same(quantize(-x, fmt), -quantize(x, fmt))


@settings(max_examples=60, deadline=None)
@given(vectors, any_fmt())
def test_truncation_never_grows_and_nearest_is_nearest(x, fmt):
    q = quantize(x, fmt).double()
    xd = x.double()
    if fmt.rounding.value == "truncate":
        assert bool((q.abs() <= xd.abs()).all())
    if isinstance(fmt, Float) and fmt.rounding.value == "nearest" and fmt.subnormals:
        # no representable value of the grid around x is closer than q (inside the range)
        inside = xd.abs() <= fmt.max
        ulp = torch.exp2(torch.clamp(torch.floor(torch.log2(xd.abs().clamp(min=1e-300))), min=fmt.emin)
                         - fmt.man)
        assert bool(((q - xd).abs() <= ulp / 2)[inside].all())


@settings(max_examples=40, deadline=None)
@given(st.lists(finite32, min_size=2, max_size=2), floats_fmt(roundings=("nearest", "truncate")))
def test_float_rounding_is_monotonic(pair, fmt):
    a, b = sorted(pair)
    qa, qb = quantize(torch.tensor([a, b]), fmt).tolist()
    assert qa <= qb


@settings(max_examples=30, deadline=None)
@given(st.lists(finite32, min_size=1, max_size=200), any_fmt())
def test_cpu_equals_reference_on_random_formats(v, fmt):
    x = torch.tensor(v, dtype=torch.float32)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert same(quantize(x, fmt, generator=g(), backend="cpu"),
                quantize(x, fmt, generator=g(), backend="reference"))


def test_bfp_values_lie_on_the_tile_grid():
    x = torch.randn(6, 50) * 100
    fmt = BlockFloat(5, (2, 8), "nearest")
    q = quantize(x, fmt).numpy().astype(np.float64)
    for i in range(0, 6, 2):
        for j in range(0, 50, 8):
            t, qt = x[i:i + 2, j:j + 8].numpy(), q[i:i + 2, j:j + 8]
            lsb = 2.0 ** (np.max(np.frexp(np.abs(t))[1] - 1) - 4)
            assert np.all(qt / lsb == np.round(qt / lsb)) and np.all(np.abs(qt) <= 31 * lsb)
