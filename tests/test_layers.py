"""Quantized layers: bit-identity when off, each point against a manual reference."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bfp import BlockFloat, Float, quantize
from bfp.accumulate import Accumulator, accumulate_matmul_reference
from bfp.functional import qmatmul
from bfp.layers import QUANTIZED_TYPES, Matmul, QConv1d, QConv2d, QLinear, QMatmul
from bfp.precision import POINTS, LayerPrecision

# Nine different formats, so a point wired to the wrong tensor shows up.
NINE = dict(
    fw=BlockFloat(4, (1, 4, 3, 3)), fi=Float(4, 3), fo=Float(5, 2),
    bwo=Float(3, 2, encoding="finite"), bwi=Float(5, 4), bwg=BlockFloat(5, (2, 2)),
    bio=Float(4, 2), biw=Float(6, 3), big=BlockFloat(3, (1, 2)),
)
ALL_ON = LayerPrecision(**NINE)


def _q(fmt, t):
    return t if fmt is None else quantize(t, fmt)


# Each case: a float module, an input, and the plain op(x, w, b) it computes.
def _cases():
    g = torch.Generator().manual_seed(1)
    conv2 = nn.Conv2d(6, 8, 3, stride=2, padding=1, dilation=1, groups=2)
    conv1 = nn.Conv1d(4, 6, 5, stride=2, padding=2, dilation=2)
    return {
        "linear2d": (nn.Linear(12, 7), torch.randn(5, 12, generator=g), F.linear),
        "linear3d": (nn.Linear(12, 7), torch.randn(3, 4, 12, generator=g), F.linear),
        "conv2d": (conv2, torch.randn(2, 6, 9, 8, generator=g),
                   lambda x, w, b: F.conv2d(x, w, b, 2, 1, 1, 2)),
        "conv1d": (conv1, torch.randn(3, 4, 17, generator=g),
                   lambda x, w, b: F.conv1d(x, w, b, 2, 2, 2)),
    }


CASES = list(_cases())


def _convert(mod, precision):
    return QUANTIZED_TYPES[type(mod)].from_float(mod, precision)


def _run(layer, x, g=None, seed=0):
    """Forward and backward; returns (y, dx, dW, db)."""
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    if g is None:
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    params = [layer.weight] + ([layer.bias] if layer.bias is not None else [])
    grads = torch.autograd.grad(y, [x] + params, g)
    return (y.detach(), *grads)


def _reference(op, x, w, b, g, p: LayerPrecision):
    """Each GEMM rebuilt by hand: quantize the operands, run the plain op, quantize the result."""
    y = _q(p.fo, op(_q(p.fi, x), _q(p.fw, w), b))
    xs, ws = (_q(p.fi, x), _q(p.fw, w)) if p.backward_source == "quantized" else (x, w)
    xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    dx = torch.autograd.grad(op(xl, _q(p.biw, ws), None), xl, _q(p.bio, g))[0]
    dw = torch.autograd.grad(op(_q(p.bwi, xs), wl, None), wl, _q(p.bwo, g))[0]
    bl = b.detach().clone().requires_grad_()
    db = torch.autograd.grad(op(x, w, bl), bl, g)[0]
    return y, _q(p.big, dx), _q(p.bwg, dw), db


def _identity_hook(layer, point, t, fmt):
    return t


@pytest.mark.parametrize("case", CASES)
def test_off_is_bit_identical_to_pytorch(case):
    mod, x, _ = _cases()[case]
    ref = _run(mod, x)
    for layer in (_convert(mod, None), _convert(mod, LayerPrecision())):
        for a, b in zip(_run(layer, x), ref):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", CASES)
def test_function_path_is_bit_identical_when_no_point_rounds(case):
    # All nine points on but the hook returns its input: the autograd Function
    # (not the plain-op shortcut) must reproduce PyTorch's bits, gradients too.
    mod, x, _ = _cases()[case]
    ref = _run(mod, x)
    layer = _convert(mod, ALL_ON)
    layer.quantize_hook = _identity_hook
    for a, b in zip(_run(layer, x), ref):
        assert torch.equal(a, b)


def _run_autocast(layer, x, seed=0):
    """``_run`` with the forward under CPU bfloat16 autocast (``--precision bf16``)."""
    x = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.dtype)
    grads = torch.autograd.grad(y, [x, layer.weight, layer.bias], g)
    return (y.detach(), *grads)


@pytest.mark.parametrize("case", CASES)
def test_under_autocast_matches_pytorch_and_trains(case):
    # The backward GEMMs run in the forward's compute dtype, as autograd's do:
    # bit-identical to PyTorch under autocast when no point rounds, and the
    # gradients come back in the parameters' dtype with real formats too.
    mod, x, _ = _cases()[case]
    ref = _run_autocast(mod, x)
    assert ref[0].dtype == torch.bfloat16
    layer = _convert(mod, ALL_ON)
    layer.quantize_hook = _identity_hook
    for a, b in zip(_run_autocast(layer, x), ref):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for source in ("full", "quantized"):
        got = _run_autocast(_convert(mod, LayerPrecision(**NINE, backward_source=source)), x)
        assert [t.dtype for t in got] == [t.dtype for t in ref]
        assert all(torch.isfinite(t).all() for t in got)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("source", ["full", "quantized"])
def test_all_nine_points_match_manual_reference(case, source):
    mod, x, op = _cases()[case]
    p = LayerPrecision(**NINE, backward_source=source)
    y, dx, dw, db = _run(_convert(mod, p), x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(0))
    ref = _reference(op, x, mod.weight.detach(), mod.bias.detach(), g, p)
    for name, a, b in zip(("y", "dx", "dw", "db"), (y, dx, dw, db), ref):
        assert torch.equal(a, b), name
    assert not torch.equal(y, op(x, mod.weight, mod.bias))  # the formats really round


@pytest.mark.parametrize("point", POINTS)
def test_single_point_matches_reference(point):
    mod, x, op = _cases()["conv2d"]
    p = LayerPrecision(**{point: NINE[point]})
    got = _run(_convert(mod, p), x)
    g = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(0))
    ref = _reference(op, x, mod.weight.detach(), mod.bias.detach(), g, p)
    plain = _run(mod, x)
    changed = [not torch.equal(a, b) for a, b in zip(got, plain)]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    # Exactly the tensor the point belongs to differs from plain PyTorch.
    owner = {"f": 0, "bi": 1, "bw": 2}[point[:-1] if point[0] == "f" else point[:2]]
    assert changed == [i == owner for i in range(4)]


def test_fw_on_equals_conv_of_quantized_weight():
    mod, x, _ = _cases()["conv2d"]
    fmt = BlockFloat(4, (1, 3, 3, 3))
    y = _convert(mod, LayerPrecision(fw=fmt))(x)
    assert torch.equal(y, F.conv2d(x, quantize(mod.weight, fmt), mod.bias, 2, 1, 1, 2))


def test_equal_forward_and_backward_formats_reuse_the_forward_copy(monkeypatch):
    import bfp.functional as bfpF
    mod, x, op = _cases()["conv2d"]
    fb = BlockFloat(8, (1, 3, 3, 3))
    p = LayerPrecision(fw=fb, fi=fb, bwi=fb, biw=fb, bio=Float(4, 3), bwo=Float(4, 3))
    calls = []
    monkeypatch.setattr(bfpF, "quantize", lambda t, fmt, generator=None: calls.append(fmt) or quantize(t, fmt))
    got = _run(_convert(mod, p), x)
    assert len(calls) == 4  # fi, fw, bio, bwo: bwi and biw reuse the forward copies
    g = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(0))
    for a, b in zip(got, _reference(op, x, mod.weight.detach(), mod.bias.detach(), g, p)):
        assert torch.equal(a, b)
    stochastic = LayerPrecision(fi=Float(4, 3, rounding="stochastic"), bwi=Float(4, 3, rounding="stochastic"))
    calls.clear()
    _run(_convert(mod, stochastic), x)
    assert len(calls) == 2  # independent draws: no reuse


def test_backward_precision_can_exceed_forward_precision():
    # fi rounds hard, bwi is off: with the default source the weight gradient
    # sees the full-precision input (the original re-used the rounded copy).
    mod, x, op = _cases()["linear2d"]
    coarse = Float(2, 1, encoding="finite")
    full = _run(_convert(mod, LayerPrecision(fi=coarse)), x)
    quant = _run(_convert(mod, LayerPrecision(fi=coarse, backward_source="quantized")), x)
    plain = _run(mod, x)
    assert torch.equal(full[2], plain[2])
    assert not torch.equal(quant[2], plain[2])


@pytest.mark.parametrize("case", CASES)
def test_inputs_and_parameters_are_never_modified(case):
    mod, x, _ = _cases()[case]
    layer = _convert(mod, ALL_ON)
    before = [t.detach().clone() for t in (x, mod.weight, mod.bias)]
    g = torch.randn(layer(x).shape)
    g_before = g.clone()
    xr = x.clone().requires_grad_()
    layer(xr).backward(g)
    for a, b in zip((xr.detach(), mod.weight.detach(), mod.bias.detach(), g), before + [g_before]):
        assert torch.equal(a, b)


def test_residual_branch_sees_unquantized_input():
    lin = QLinear(6, 6, precision=LayerPrecision(fi=Float(2, 1, encoding="finite")))
    x = torch.randn(4, 6)
    x0 = x.clone()
    y = lin(x) + x  # the shortcut must add the original x, not the rounded one
    assert torch.equal(x, x0)
    assert torch.equal(y, lin(x0) + x0)
    assert not torch.equal(y, lin(x0) + quantize(x0, lin.precision.fi))


@pytest.mark.parametrize("bias", [True, False])
def test_from_float_keeps_parameters_mode_and_dtype(bias):
    mod = nn.Linear(5, 3, bias=bias).double().eval()
    q = QLinear.from_float(mod, LayerPrecision(fw=Float(4, 3)))
    assert q.weight is mod.weight and q.bias is mod.bias
    assert not q.training and q.weight.dtype == torch.float64
    assert [n for n, _ in q.named_parameters()] == [n for n, _ in mod.named_parameters()]
    x = torch.randn(2, 5, dtype=torch.float64)
    expect = F.linear(x, quantize(mod.weight, Float(4, 3)), mod.bias)  # bias added once
    assert torch.equal(q(x), expect)


def test_from_float_conv_keeps_padding_mode_and_same_padding():
    for mod in (nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
                nn.Conv2d(3, 4, 4, padding="same"), nn.Conv1d(3, 4, 2, padding="same")):
        x = torch.randn(2, 3, 7, 6) if isinstance(mod, nn.Conv2d) else torch.randn(2, 3, 9)
        layer = QUANTIZED_TYPES[type(mod)].from_float(mod, ALL_ON)
        layer.quantize_hook = _identity_hook
        for a, b in zip(_run(layer, x), _run(mod, x)):
            assert torch.equal(a, b)
        assert layer.padding_mode == mod.padding_mode and layer.weight is mod.weight


def test_conv_takes_unbatched_input_like_pytorch():
    for mod, x in ((nn.Conv2d(3, 4, 3, padding=1), torch.randn(3, 7, 6)), (nn.Conv1d(3, 4, 2), torch.randn(3, 9))):
        layer = QUANTIZED_TYPES[type(mod)].from_float(mod, ALL_ON)
        layer.quantize_hook = _identity_hook
        for a, b in zip(_run(layer, x), _run(mod, x)):
            assert torch.equal(a, b)
        layer.quantize_hook = None  # real rounding: as the same input with a batch dim of one
        for a, b in zip(_run(layer, x), _run(layer, x.unsqueeze(0))):
            assert torch.equal(a, b.squeeze(0) if a.dim() == b.dim() - 1 else b)


def test_from_float_rejects_wrong_module():
    with pytest.raises(ValueError, match="Conv2d"):
        QConv2d.from_float(nn.Linear(2, 2), None)
    with pytest.raises(ValueError, match="Matmul"):
        QMatmul.from_float(nn.Linear(2, 2), None)
    normed = nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 4, 3))
    with pytest.raises(ValueError, match="no plain Parameter weight"):  # was adopted as a meta tensor
        QConv2d.from_float(normed, None)


def test_set_format_and_set_precision():
    mod, x, _ = _cases()["linear2d"]
    layer = _convert(mod, None)
    layer.set_format("fw", Float(4, 3))
    assert layer.precision.fw == Float(4, 3)
    assert torch.equal(layer(x), F.linear(x, quantize(mod.weight, Float(4, 3)), mod.bias))
    layer.set_format("fw", "fb16")
    assert layer.precision.fw == BlockFloat(8, (1, 12, 3, 3))
    layer.set_format("fw", None)
    assert torch.equal(layer(x), mod(x))
    with pytest.raises(ValueError, match="'fx'"):
        layer.set_format("fx", Float(4, 3))
    with pytest.raises(ValueError, match="LayerPrecision"):
        layer.set_precision({"fw": None})
    layer.set_precision(ALL_ON)
    assert layer.precision is ALL_ON


def test_hook_sees_every_point_with_layer_and_format():
    mod, x, _ = _cases()["conv2d"]
    layer = _convert(mod, ALL_ON)
    seen = []

    def hook(lay, point, t, fmt):
        assert lay is layer and fmt == NINE[point]
        seen.append(point)
        return quantize(t, fmt)

    layer.quantize_hook = hook
    _run(layer, x)
    assert sorted(seen) == sorted(POINTS)
    layer.quantize_hook = lambda lay, point, t, fmt: torch.zeros_like(t) if point == "fw" else t
    bias_only = mod.bias.reshape(1, -1, 1, 1).expand(2, -1, 5, 4)
    assert torch.equal(layer(x), bias_only)
    layer.quantize_hook = lambda lay, point, t, fmt: t[:1]
    with pytest.raises(ValueError, match="quantize_hook"):
        layer(x)


def test_generator_makes_stochastic_rounding_reproducible():
    mod, x, _ = _cases()["linear2d"]
    layer = _convert(mod, LayerPrecision(fi=Float(4, 1, rounding="stochastic")))
    outs = []
    for seed in (3, 3, 4):
        layer.generator = torch.Generator().manual_seed(seed)
        outs.append(layer(x))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_extra_repr_shows_active_formats():
    layer = QConv2d(3, 4, 3, precision=LayerPrecision(fw=BlockFloat(4, (1, 24, 3, 3))))
    text = repr(layer)
    assert "fw=BlockFloat(bits=4, group=[1, 24, 3, 3]" in text and "fi=" not in text
    assert "precision=LayerPrecision(off)" in repr(QLinear(2, 2))
    assert "fi=Float(e4m3" in repr(QConv1d(2, 2, 3, precision=LayerPrecision(fi=Float(4, 3))))


@pytest.mark.parametrize("case", CASES)
def test_gradcheck_with_points_off(case):
    mod, x, _ = _cases()[case]
    mod = mod.double()
    layer = _convert(mod, ALL_ON)
    layer.quantize_hook = _identity_hook  # float64 through the Function without rounding
    xd = x.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, w, b: torch.func.functional_call(
        layer, {"weight": w, "bias": b}, (a,)), (xd, mod.weight, mod.bias), fast_mode=True)


def test_qmatmul_points_and_off_identity():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 3, 5, 7, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    dy = torch.randn(2, 3, 5, 4, generator=g)
    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    plain = (al @ bl, *torch.autograd.grad(al @ bl, (al, bl), dy))
    mm = QMatmul()
    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = mm(al, bl)
    assert all(torch.equal(u, v) for u, v in zip((y, *torch.autograd.grad(y, (al, bl), dy)), plain))
    p = LayerPrecision(fi=Float(4, 3), fw=Float(5, 2), fo=Float(4, 2), bio=Float(4, 1), biw=Float(3, 2),
                       big=Float(5, 3), bwo=Float(4, 4), bwi=Float(6, 2), bwg=Float(5, 1))
    mm = QMatmul.from_float(Matmul(), p)
    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = mm(al, bl)
    da, db = torch.autograd.grad(y, (al, bl), dy)
    assert torch.equal(y, _q(p.fo, _q(p.fi, a) @ _q(p.fw, b)))
    assert torch.equal(da, _q(p.big, _q(p.bio, dy) @ _q(p.biw, b).transpose(-1, -2)))
    assert torch.equal(db, _q(p.bwg, _q(p.bwi, a).transpose(-1, -2) @ _q(p.bwo, dy)))
    with pytest.raises(ValueError, match="at least 2 dims"):
        qmatmul(torch.ones(3), torch.ones(3, 2), p)


def test_qmatmul_broadcast_batch_gradient_is_summed():
    a = torch.randn(4, 5, 3, requires_grad=True)
    w = torch.randn(3, 2, requires_grad=True)
    p = LayerPrecision(fo=Float(8, 23))  # on, but float32 rounding changes nothing
    y = qmatmul(a, w, p)
    dy = torch.randn(4, 5, 2)
    got = torch.autograd.grad(y, (a, w), dy)
    ref = torch.autograd.grad(a @ w, (a, w), dy)
    assert got[1].shape == w.shape
    assert all(torch.equal(u, v) for u, v in zip(got, ref))


def test_linear_with_accumulator_uses_it_in_the_chosen_gemms():
    torch.manual_seed(5)
    mod, x = nn.Linear(40, 6), torch.randn(3, 2, 40)
    acc = Accumulator(Float(5, 4), chunk=1, gemms=("forward",))
    layer = QLinear.from_float(mod, LayerPrecision(accumulator=acc))
    y, dx, dw, db = _run(layer, x)
    expect = accumulate_matmul_reference(x.reshape(6, 40), mod.weight.detach().t(), acc) + mod.bias
    assert torch.equal(y, expect.reshape(3, 2, 6))
    plain = _run(mod, x)
    assert not torch.equal(y, plain[0])
    assert all(torch.equal(u, v) for u, v in zip((dx, dw, db), plain[1:]))  # backward GEMMs unaffected
