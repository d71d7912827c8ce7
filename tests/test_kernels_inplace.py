"""In-place rounding (``quantize_``, ``add_quantize_``) equals the out-of-place expressions bit for bit."""
import pytest
import torch

from bfp import BlockFloat, Float, MX, quantize
from bfp.kernels.inplace import add_quantize_, quantize_

FORMATS = [Float(5, 10), Float(8, 7, "truncate"), Float(4, 3, encoding="fn"), Float(5, 2, "stochastic"),
           Float(3, 2, subnormals=False), Float(2, 1, encoding="finite"),
           BlockFloat(4, [1, 8]), MX("float8_e4m3fn", block=8)]  # the last two take the fallback

QNAN, NEG_QNAN = 0x7FC00000, -0x400000  # -0x400000 is 0xFFC00000 as int32


def edge_tensor(seed: int, n: int = 4099) -> torch.Tensor:
    """Values over the whole float32 range, with zeros, subnormals, infinities and NaNs of both signs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 128, (n,), generator=g).float())
    x[::13] = 0.0
    x[1::29] = torch.randn(len(x[1::29]), generator=g) * 2.0 ** -130  # subnormal
    x[2::31] = float("inf")
    x[3::37] = -float("inf")
    x.view(torch.int32)[4::41] = QNAN
    x.view(torch.int32)[5::43] = NEG_QNAN
    return x.reshape(1, 4099)


def bits(t):
    return t.view(torch.int32)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_quantize_inplace_equals_quantize(fmt):
    x = edge_tensor(1)
    want = quantize(x, fmt, generator=torch.Generator().manual_seed(5))
    y = x.clone()
    assert quantize_(y, fmt, generator=torch.Generator().manual_seed(5)) is y
    assert torch.equal(bits(y), bits(want))


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_add_quantize_inplace_equals_add_then_quantize(fmt):
    s, t = edge_tensor(2), edge_tensor(3)
    s.view(torch.int32)[0, 4::41] = NEG_QNAN  # NaN + NaN of the other sign: t's NaN wins, as in torch
    want = quantize(s + t, fmt, generator=torch.Generator().manual_seed(6))
    got = s.clone()
    assert add_quantize_(got, t, fmt, generator=torch.Generator().manual_seed(6)) is got
    assert torch.equal(bits(got), bits(want))


def test_add_quantize_inplace_draws_like_quantize_and_checks_shapes():
    fmt = Float(5, 2, "stochastic")
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    s, t = torch.randn(300), torch.randn(300)
    add_quantize_(s.clone(), t, fmt, generator=g1)
    quantize(s + t, fmt, generator=g2)
    assert g1.get_state().equal(g2.get_state())  # one draw each
    with pytest.raises(ValueError, match=r"one shape, got \(300,\) and \(299,\)"):
        add_quantize_(s, t[:299], fmt)
