"""The random Hadamard transform of the weight-gradient inputs (bfp.hadamard): orthogonal, a
Sylvester matrix with a seeded sign per row, cancelling in dW = dY^T X (equal to PyTorch within
float32 rounding with every point off), applied before bwo/bwi round (checked bit for bit
against the dataflow written here), configurable, saved with the precision, refused on convs."""
import numpy as np
import pytest
import scipy.linalg
import torch

import bfp
import bfp.models
from bfp import LayerPrecision, format_from_name, quantize
from bfp.config import ConfigError
from bfp.config.specs import parse_precision
from bfp.hadamard import factor, matrix, reference_rows, transform_rows
from bfp.layers import QLinear
from bfp.precision import Hadamard


@pytest.mark.parametrize("block", [2, 16, 32, 256])
def test_the_transform_is_an_orthogonal_signed_sylvester_matrix(block):
    h = matrix(Hadamard(block, seed=3))
    assert torch.allclose(h.t() @ h, torch.eye(block, dtype=torch.float64), atol=1e-12)
    signs = h * block ** 0.5 / torch.from_numpy(scipy.linalg.hadamard(block)).double()
    assert torch.equal(signs, signs[:, :1].expand_as(signs)) and set(signs[:, 0].tolist()) <= {-1.0, 1.0}
    assert not torch.equal(matrix(Hadamard(block, seed=4)), h) or block == 2
    if block == 16:  # entries +-1/4: exactly H^T H = I
        assert torch.equal(h.t() @ h, torch.eye(16, dtype=torch.float64))


def _grads(precision, x, w, g):
    layer = QLinear(w.shape[1], w.shape[0], bias=False, precision=precision)
    with torch.no_grad():
        layer.weight.copy_(w)
    xx = x.clone().requires_grad_(True)
    y = layer(xx)
    y.backward(g)
    return y.detach(), xx.grad, layer.weight.grad


def test_with_every_point_off_the_transform_cancels_within_float32_rounding():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 21, 40, generator=gen), torch.randn(24, 40, generator=gen)
    g = torch.randn(3, 21, 24, generator=gen)
    y0, gx0, gw0 = _grads(None, x, w, g)
    y1, gx1, gw1 = _grads(LayerPrecision(rht=Hadamard(16, seed=1)), x, w, g)
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1)  # only the weight gradient is transformed
    assert not torch.equal(gw0, gw1) and torch.allclose(gw0, gw1, rtol=1e-5, atol=1e-5)


def test_the_points_round_the_transformed_inputs_then_the_gemm_runs():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 19, 32, generator=gen), torch.randn(16, 32, generator=gen)
    g = torch.randn(2, 19, 16, generator=gen)
    fmt = format_from_name("mxfp4_e2m1")
    rows = bfp.MX(fmt.element, block=16, axis=-2)
    p = LayerPrecision(bwo=rows, bwi=rows, bwg=format_from_name("bfloat16"), rht=Hadamard(16, seed=7))
    _, _, gw = _grads(p, x, w, g)
    # written out: rows of both inputs, zero-padded to 48, H per block of 16 (butterflies x signs / 4)
    def hx(t):
        t = torch.nn.functional.pad(t.reshape(-1, t.shape[-1]), (0, 0, 0, 48 - 38))
        return torch.from_numpy(_fwht_oracle(t.numpy(), Hadamard(16, seed=7)))
    want = quantize(quantize(hx(g), rows).t().mm(quantize(hx(x), rows)), format_from_name("bfloat16"))
    assert torch.equal(gw, want)
    assert torch.equal(transform_rows(g.reshape(-1, 16), Hadamard(16, seed=7)), hx(g))


def test_configs_state_and_refusals():
    p = parse_precision({"operands": "nvfp4", "rht": 16})
    assert p.rht == Hadamard(16, 0) and LayerPrecision.from_dict(p.to_dict()) == p
    assert "rht" not in LayerPrecision(fw=format_from_name("fb16")).to_dict()  # older states stay equal
    assert parse_precision({"bwo": "e4m3", "rht": {"block": 32, "seed": 5}}).rht == Hadamard(32, 5)
    with pytest.raises(ConfigError, match=r"\.rht: Hadamard block must be a power of two from 2 to 256, got 12"):
        parse_precision({"bwo": "e4m3", "rht": 12})
    model = bfp.models.create("ResNet10", width=4)
    with pytest.raises(ConfigError, match=r"\(Conv2d\): rht .* Linear and Matmul layers only"):
        bfp.convert(model, {"version": 1, "default": {"bwo": "e4m3", "rht": 16}})
    lin = torch.nn.Sequential(torch.nn.Linear(8, 4))
    bfp.convert(lin, {"version": 1, "default": {"bwo": "e4m3", "rht": 16}})
    assert lin[0].precision.rht == Hadamard(16)


def _fwht_oracle(t: np.ndarray, rht: Hadamard) -> np.ndarray:
    """Element by element in numpy float32: each block of rows through the butterflies
    (h = 1, 2, 4 ...: rows j, j + h -> u + v, u - v), then row i times s_i / sqrt(b)."""
    b, out = rht.block, t.astype(np.float32).copy()
    f = factor(rht).numpy()
    for r0 in range(0, out.shape[0], b):
        blk = out[r0:r0 + b]
        h = 1
        while h < b:
            for g in range(0, b, 2 * h):
                for j in range(g, g + h):
                    u, v = blk[j].copy(), blk[j + h].copy()
                    blk[j], blk[j + h] = u + v, u - v
            h *= 2
        blk *= f[:, None]
    return out


@pytest.mark.parametrize("block", [2, 16, 32, 256])
@pytest.mark.parametrize("shape", [(37, 5), (3, 16, 2048 + 3), (2, 2, 300, 1)])
def test_the_numba_kernel_and_the_pytorch_steps_give_the_same_bits(block, shape):
    rht = Hadamard(block, seed=5)
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(block)) * 3
    fast, ref = transform_rows(t, rht), reference_rows(t, rht)
    rows = -(-shape[-2] // block) * block
    assert fast.shape == ref.shape == (*shape[:-2], rows, shape[-1])
    assert torch.equal(fast.view(torch.int32), ref.view(torch.int32))
    assert torch.equal(transform_rows(t.transpose(-2, -1).contiguous().transpose(-2, -1), rht), fast)  # strided in
    # the math: H x within float32 rounding of the float64 product
    t64 = torch.nn.functional.pad(t.double(), (0, 0, 0, rows - shape[-2]))
    exact = torch.matmul(matrix(rht), t64.reshape(*shape[:-2], -1, block, shape[-1])).reshape(fast.shape)
    assert torch.allclose(fast.double(), exact, rtol=1e-5, atol=1e-5)
    assert torch.allclose(reference_rows(t.double(), rht), exact, rtol=1e-12, atol=1e-12)


def test_the_kernel_equals_a_written_out_oracle_with_infinities_and_nans():
    rht = Hadamard(16, seed=2)
    t = torch.randn(40, 7, generator=torch.Generator().manual_seed(9))
    t[3, 1], t[20, 4], t[33, 0] = float("inf"), float("nan"), -float("inf")
    got, want = transform_rows(t, rht), torch.from_numpy(_fwht_oracle(
        torch.nn.functional.pad(t, (0, 0, 0, 8)).numpy(), rht))
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite]) and got.isnan().any()


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("shape", [(37, 5), (3, 40, 2050), (2, 16, 33)])
def test_the_fused_nvfp4_kernel_gives_the_two_steps_bits_and_draws(rounding, shape):
    from bfp.hadamard import transform_quantize
    from bfp.formats.nvfp4 import NVFP4
    fmt, rht = NVFP4(axis=-2, rounding=rounding), Hadamard(16, seed=3)
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * 5
    t.view(-1)[7] = float("nan")
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    fused, steps = transform_quantize(t, rht, fmt, g1), quantize(transform_rows(t, rht), fmt, generator=g2)
    assert torch.equal(fused.view(torch.int32), steps.view(torch.int32))
    assert torch.equal(torch.randint(0, 2 ** 30, (4,), generator=g1), torch.randint(0, 2 ** 30, (4,), generator=g2))
    zero = torch.zeros(*shape)  # no finite nonzero element: the reference path, the same draws
    assert torch.equal(transform_quantize(zero, rht, fmt, g1), quantize(transform_rows(zero, rht), fmt, generator=g2))
    mx = bfp.MX(format_from_name("float4_e2m1fn"), block=16, axis=-2)  # not fusable: the two steps
    assert torch.equal(transform_quantize(t, rht, mx).view(torch.int32), quantize(transform_rows(t, rht), mx).view(torch.int32))


def test_training_with_the_fused_kernel_equals_the_two_steps(monkeypatch):
    import bfp.kernels.numba_cpu.nvfp4_rht as fused_kernel
    from bfp.formats.nvfp4 import NVFP4
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(3, 21, 40, generator=gen), torch.randn(24, 40, generator=gen)
    g = torch.randn(3, 21, 24, generator=gen)
    rows = NVFP4(axis=-2, rounding="stochastic")
    p = LayerPrecision(bwo=rows, bwi=NVFP4(axis=-2), rht=Hadamard(16, seed=1))
    calls = []
    real = fused_kernel.quantize
    monkeypatch.setattr(fused_kernel, "quantize", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)  # the layers' stochastic rounding draws from the default generator
    fused = _grads(p, x, w, g)
    assert len(calls) == 2  # bwo and bwi went through the fused kernel
    monkeypatch.setattr(bfp.hadamard, "fusable", lambda *a: False)
    torch.manual_seed(0)
    steps = _grads(p, x, w, g)
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(fused, steps))  # no kernel call more


def test_a_1d_tensor_and_a_seed_past_int64_are_refused_naming_them():
    from bfp.hadamard import hadamard_quantize, transform_quantize
    from bfp.kernels import format_json
    fmt = format_from_name("e4m3")
    with pytest.raises(ValueError, match=r"the tensor of transform_quantize .*2"):
        transform_quantize(torch.randn(16), Hadamard(16, 0), fmt)
    with pytest.raises(ValueError, match=r"Hadamard seed must be an integer in \[0, 2\*\*63\), got "
                                         r"1180591620717411303424"):
        hadamard_quantize(torch.randn(4, 16), 16, 2 ** 70, format_json(fmt))
    x = torch.randn(4, 16)  # the control: in range, the op and the function agree
    assert torch.equal(hadamard_quantize(x, 16, 2 ** 63 - 1, format_json(fmt)),
                       transform_quantize(x, Hadamard(16, 2 ** 63 - 1), fmt))
