"""FP8 current scaling (bfp.Scaled) bit-exact against an oracle written from torchao's dynamic
scaling rule: NumPy float32 for amax, scale, x * scale and q / scale, ml_dtypes for the FP8 cast;
per tensor and per row, with and without power-of-two scales; zeros, subnormals, NaN/Inf, amax
at float32's ends."""
import ml_dtypes
import numpy as np
import pytest
import torch

from bfp import Scaled, format_from_name, quantize
from bfp.config.specs import parse_format
from bfp.formats import format_from_dict
from test_kernels import BACKENDS, assert_same_bits

F32 = np.float32
DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def oracle(x: np.ndarray, el: str, rows: bool, pow2: bool) -> np.ndarray:
    top = F32(float(ml_dtypes.finfo(DTYPES[el]).max))
    a = np.where(np.isfinite(x), np.abs(x), F32(0)).astype(F32)
    amax = a.max(axis=-1, keepdims=True) if rows else np.full((1, 1), a.max(), F32)
    with np.errstate(over="ignore"):  # top / a subnormal amax overflows to inf, then float32's max
        scale = np.where(amax > 0, top / np.maximum(amax, F32(np.finfo(F32).tiny)), F32(1)).astype(F32)
    scale = np.minimum(scale, F32(np.finfo(F32).max))
    if pow2:
        scale = np.exp2(np.floor(np.log2(scale.astype(np.float64)))).astype(F32)
    y = np.clip((x * scale).astype(F32), -top, top)
    q = y.astype(DTYPES[el]).astype(F32)
    return (q / scale).astype(F32)


def _cases():
    g = torch.Generator().manual_seed(4)
    rand = torch.randn(12, 40, generator=g) * torch.exp2(torch.randint(-30, 30, (12, 40), generator=g).float())
    edge = torch.tensor([[1.0, -448.0, 449.0, 1e-3, 0.0, -0.0, 3e-9, 2.0 ** -20],
                         [0.0] * 8,
                         [1e-40, -3e-41, 2e-45, 0.0, 7e-39, 1e-42, 0.0, 1e-44],
                         [3e38, -1e38, 1.0, 0.0, 2.0, 5.0, 7.0, 9.0],
                         [1.0, float("nan"), 5.0, 0.5, -2.0, 0.25, 3.0, 1.5]])
    return [rand, edge, torch.zeros(2, 4)]


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("el", ["e4m3", "e5m2"])
def test_current_scaling_matches_the_rule(el, rows, pow2):
    fmt = Scaled(format_from_name(el), "row" if rows else "tensor", -1, pow2)
    for x in _cases():
        want = torch.from_numpy(oracle(x.numpy(), el, rows, pow2))
        for backend in BACKENDS:
            assert_same_bits(quantize(x, fmt, backend=backend), want)


def test_inf_saturates_nan_stays_and_the_scale_uses_finite_values_only():
    x = torch.tensor([[float("inf"), 1.0, float("nan"), -float("inf")]])
    out = quantize(x, Scaled(format_from_name("e4m3")))
    assert out[0, 0] == 1.0 and out[0, 1] == 1.0 and torch.isnan(out[0, 2]) and out[0, 3] == -1.0


def test_power_of_two_scales_make_the_scaling_exact():
    """With pow2 only the FP8 rounding remains: values already on the FP8 grid come back unchanged."""
    x = torch.tensor([[1.5, 0.75, -3.0, 0.0625]])
    assert torch.equal(quantize(x, Scaled(format_from_name("e4m3"), pow2=True)), x)


def test_names_dicts_configs_and_bad_values():
    f = format_from_name("fp8_e4m3_rowwise_pow2")
    assert f == Scaled(format_from_name("e4m3"), "row", -1, True) and format_from_dict(f.to_dict()) == f
    assert parse_format({"scaled": "e5m2", "granularity": "row"}) == format_from_name("fp8_e5m2_rowwise")
    assert parse_format({"name": "fp8_e4m3_tensorwise", "rounding": "stochastic"}).rounding.value == "stochastic"
    with pytest.raises(ValueError, match="Scaled granularity 'block' unknown; allowed: tensor, row"):
        Scaled(format_from_name("e4m3"), "block")
    with pytest.raises(ValueError, match="Scaled needs a Float format"):
        Scaled(format_from_name("fb16"))
    with pytest.raises(ValueError, match="Scaled axis 3 is out of range"):
        quantize(torch.ones(2, 2), Scaled(format_from_name("e4m3"), "row", 3))
