"""Accumulator emulation: the sequential reference, the blocked emulation, conv lowering."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bfp import Float, LayerPrecision, quantize
from bfp.accumulate import (Accumulator, accumulate_conv2d, accumulate_conv2d_input,
                            accumulate_conv2d_weight, accumulate_matmul, accumulate_matmul_reference,
                            accumulator_from_dict)
from bfp.layers import QConv1d, QConv2d, QLinear

FP16, BF16, E4M3 = Float(5, 10), Float(8, 7), Float(4, 3)
FP32 = Float(8, 23)


def _ints(*shape, seed=0, lo=-3, hi=4):
    """Small integers: every float32 sum of them is exact, so any order agrees."""
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed)).float()


# -- the spec on a hand-checked case --------------------------------------------------
# fp16 has spacing 2 at 2048, so 2048 + 1 ties back to 2048 (even) and small addends vanish.
SWAMP_A = torch.tensor([[2048.0, 1.0, 1.0, 1.0, 1.0]])
SWAMP_B = torch.ones(5, 1)


@pytest.mark.parametrize("chunk, kahan, expect", [
    (1, False, 2048.0),   # every +1 lost
    (2, False, 2052.0),   # chunks [2049->2048], [2], [1]: 2048, 2050, 2051->2052 (tie to even)
    (5, False, 2052.0),   # one float32 chunk: exact
    (1, True, 2052.0),    # Kahan recovers the lost ones
])
def test_swamping_table(chunk, kahan, expect):
    acc = Accumulator(FP16, chunk=chunk, kahan=kahan)
    assert accumulate_matmul(SWAMP_A, SWAMP_B, acc).item() == expect
    if chunk == 1:
        assert accumulate_matmul_reference(SWAMP_A, SWAMP_B, acc).item() == expect


@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3, Float(3, 2, subnormals=False)])
@pytest.mark.parametrize("kahan", [False, True])
def test_chunk_one_equals_sequential_reference(fmt, kahan):
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(2, 6, 37, generator=g), torch.randn(37, 5, generator=g) * 3
    acc = Accumulator(fmt, chunk=1, kahan=kahan)
    ref = accumulate_matmul_reference(a, b, acc)
    assert ref.shape == (2, 6, 5)
    assert torch.equal(accumulate_matmul(a, b, acc), ref)
    assert not torch.equal(ref, quantize(a @ b, fmt))  # rounding every add really differs


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_float32_accumulator_on_exact_data_equals_matmul(chunk):
    a, b = _ints(3, 4, 19, seed=1), _ints(3, 19, 6, seed=2)
    for kahan in (False, True):
        assert torch.equal(accumulate_matmul(a, b, Accumulator(FP32, chunk=chunk, kahan=kahan)), a @ b)


def test_one_chunk_rounds_once():
    a, b = _ints(5, 12, seed=3, lo=-40, hi=41), _ints(12, 4, seed=4, lo=-40, hi=41)
    assert torch.equal(accumulate_matmul(a, b, Accumulator(E4M3, chunk=12)), quantize(a @ b, E4M3))


def test_blocked_chunks_match_a_manual_chunk_loop():
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(4, 23, generator=g), torch.randn(23, 3, generator=g)
    acc = Accumulator(BF16, chunk=5)
    s = quantize(a[:, :5] @ b[:5], BF16)
    for j in range(5, 23, 5):
        s = quantize(s + quantize(a[:, j:j + 5] @ b[j:j + 5], BF16), BF16)
    assert torch.allclose(accumulate_matmul(a, b, acc), s, rtol=2 ** -7, atol=0)  # chunk-internal order is BLAS's
    # Integers: each chunk's float32 sum is exact in any order, so only the bf16
    # roundings of chunk sums and running sums remain, and they must match exactly.
    a, b = _ints(4, 23, seed=19, lo=-40, hi=41), _ints(23, 3, seed=20, lo=-40, hi=41)
    s = quantize(a[:, :5] @ b[:5], BF16)
    for j in range(5, 23, 5):
        s = quantize(s + quantize(a[:, j:j + 5] @ b[j:j + 5], BF16), BF16)
    assert torch.equal(accumulate_matmul(a, b, acc), s)
    assert not torch.equal(s, quantize(a @ b, BF16))  # the per-chunk roundings matter here


def test_autocast_does_not_change_the_emulation():
    # Under autocast the chunk GEMMs would run in bfloat16; the emulation keeps float32.
    a, b = _ints(4, 64, seed=17, lo=-40, hi=41), _ints(64, 3, seed=18, lo=-40, hi=41)
    acc = Accumulator(FP32, chunk=32)
    layer = QLinear.from_float(nn.Linear(64, 3), LayerPrecision(accumulator=Accumulator(BF16, chunk=8)))
    x = a.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = accumulate_matmul(a, b, acc), accumulate_matmul_reference(a[:, :8], b[:8], acc)
        y = layer(x)
    assert torch.equal(got[0], a @ b) and torch.equal(got[1], a[:, :8] @ b[:8])
    assert torch.equal(y, layer(a))
    y.sum().backward()  # the backward GEMMs take the float32 gradient of the emulated forward
    assert x.grad.dtype == torch.float32


def test_empty_reduction_and_dtype():
    acc = Accumulator(FP16)
    out = accumulate_matmul(torch.ones(3, 0, dtype=torch.float64), torch.ones(0, 2, dtype=torch.float64), acc)
    assert torch.equal(out, torch.zeros(3, 2, dtype=torch.float64))
    assert accumulate_matmul(SWAMP_A.half(), SWAMP_B.half(), acc).dtype == torch.float16


def test_stochastic_accumulator_is_reproducible_with_a_generator():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g)
    acc = Accumulator(Float(5, 3, rounding="stochastic"), chunk=4)
    run = lambda seed: accumulate_matmul(a, b, acc, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


# -- validation and serialisation ---------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(fmt="fp16"), "fmt must be a Float"),
    (dict(fmt=FP16, chunk=0), "chunk must be a positive integer, got 0"),
    (dict(fmt=FP16, chunk=2.0), "chunk must be a positive integer, got 2.0"),
    (dict(fmt=FP16, kahan="yes"), "kahan must be True or False, got 'yes'"),
    (dict(fmt=FP16, gemms=("fwd",)), r"\['fwd'\].*forward, input_grad, weight_grad"),
    (dict(fmt=FP16, gemms=()), "non-empty"),
])
def test_accumulator_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Accumulator(**kwargs)


def test_accumulator_dict_round_trip_and_unknown_keys():
    acc = Accumulator(BF16, chunk=16, kahan=True, gemms=("weight_grad", "forward"))
    assert acc.gemms == ("forward", "weight_grad")
    assert accumulator_from_dict(acc.to_dict()) == acc
    p = LayerPrecision(accumulator=acc)
    assert LayerPrecision.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="'size'"):
        accumulator_from_dict({**acc.to_dict(), "size": 3})
    assert repr(acc) == "Accumulator(e8m7, chunk=16, kahan=True, gemms=['forward', 'weight_grad'])"


def test_layer_rejects_a_non_accumulator():
    with pytest.raises(ValueError, match="accumulator must be .*Accumulator or None, got 'fp16'"):
        LayerPrecision(accumulator="fp16")


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\)"):
        accumulate_matmul(torch.ones(3, 4), torch.ones(5, 2), Accumulator(FP16))


# -- convolution lowering -------------------------------------------------------------

CONV_CASES = [  # stride, padding, dilation, groups
    (1, 0, 1, 1), (2, 1, 1, 2), (2, 3, 2, 1), (3, 2, 1, 4), ((2, 1), (0, 2), (1, 2), 1),
]


@pytest.mark.parametrize("stride, padding, dilation, groups", CONV_CASES)
def test_conv_lowering_is_exact_with_float32_accumulator(stride, padding, dilation, groups):
    # Exact integer data: any summation order gives the same float32 result, so
    # the im2col forward and the direct-convolution input gradient must equal ATen.
    x, w = _ints(2, 8, 11, 10, seed=5), _ints(8, 8 // groups, 3, 3, seed=6)
    acc = Accumulator(FP32, chunk=4)
    y = F.conv2d(x, w, None, stride, padding, dilation, groups)
    g = _ints(*y.shape, seed=7)
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    dx, dw, _ = torch.ops.aten.convolution_backward(g, x, w, None, pair(stride), pair(padding),
                                                    pair(dilation), False, [0, 0], groups,
                                                    [True, True, False])
    args = (stride, padding, dilation, groups)
    assert torch.equal(accumulate_conv2d(x, w, acc, *args), y)
    assert torch.equal(accumulate_conv2d_input(g, w, x.shape, acc, *args), dx)
    assert torch.equal(accumulate_conv2d_weight(g, x, w.shape, acc, *args), dw)


def test_conv_forward_reduces_in_im2col_order():
    torch.manual_seed(11)
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    acc = Accumulator(FP16, chunk=1)
    cols = F.unfold(x, 3)  # (N, 27, L), rows ordered (c, kh, kw)
    ref = accumulate_matmul_reference(w.reshape(4, 27), cols, acc).reshape(2, 4, 4, 4)
    assert torch.equal(accumulate_conv2d(x, w, acc), ref)


@pytest.mark.parametrize("cls, base, shape", [(QConv2d, nn.Conv2d, (2, 4, 7, 6)),
                                               (QConv1d, nn.Conv1d, (2, 4, 9)),
                                               (QLinear, nn.Linear, (3, 5, 4))])
def test_layers_with_float32_accumulator_equal_plain_on_exact_data(cls, base, shape):
    torch.manual_seed(12)
    mod = base(4, 6) if base is nn.Linear else base(4, 6, 3, stride=2, padding=1)
    with torch.no_grad():
        mod.weight.copy_(_ints(*mod.weight.shape, seed=13))
        mod.bias.copy_(_ints(6, seed=14))
    layer = cls.from_float(mod, LayerPrecision(accumulator=Accumulator(FP32, chunk=2)))
    x = _ints(*shape, seed=15)
    outs = []
    for m in (mod, layer):
        xr = x.clone().requires_grad_()
        y = m(xr)
        outs.append((y, *torch.autograd.grad(y, (xr, mod.weight, mod.bias), _ints(*y.shape, seed=16))))
    for u, v in zip(*outs):
        assert torch.equal(u, v)


def test_narrow_accumulator_changes_all_three_gemms():
    torch.manual_seed(13)
    mod, x = nn.Conv2d(4, 4, 3, padding=1), torch.randn(2, 4, 4, 4)
    layer = QConv2d.from_float(mod, LayerPrecision(accumulator=Accumulator(Float(5, 2), chunk=1)))
    outs = []
    for m in (mod, layer):
        xr = x.clone().requires_grad_()
        y = m(xr)
        outs.append((y, *torch.autograd.grad(y, (xr, mod.weight, mod.bias), torch.ones_like(y))))
    changed = [not torch.equal(u, v) for u, v in zip(*outs)]
    assert changed == [True, True, True, False]  # the bias gradient is no GEMM
