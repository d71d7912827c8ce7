"""The tensor-core accumulator (bfp.tensorcore) against an independent exact oracle written with
Python's Fraction and integers, element by element, on E4M3 (and E5M2) GEMMs with K from 16 to
4096: random, all-positive and wide-range inputs, and edge cases (cancellation, terms below the
alignment window, signed zeros, subnormal operands, K not a multiple of the step)."""
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

import bfp
from bfp.tensorcore import FusedAccumulator, accumulator_from_name, fused_matmul

E4M3 = bfp.format_from_name("float8_e4m3fn")
E5M2 = bfp.format_from_name("float8_e5m2")


def _flog2(x: Fraction) -> int:
    n, d = abs(x.numerator), x.denominator
    e = n.bit_length() - d.bit_length()
    return e if Fraction(2) ** e <= Fraction(n, d) else e - 1


def _cut(x: Fraction, e: int, bits: int) -> Fraction:
    return Fraction(int(x * Fraction(2) ** (bits - e))) * Fraction(2) ** (e - bits)  # int(): toward zero


def _oracle_chain(a, b, acc):
    c = Fraction(0)
    k = len(a)
    k += -k % acc.terms
    a, b = a + [0.0] * (k - len(a)), b + [0.0] * (k - len(b))
    for g in range(0, k, acc.terms):
        ps, es = [], []
        for x, y in zip(a[g:g + acc.terms], b[g:g + acc.terms]):
            p = Fraction(x) * Fraction(y)
            ps.append(p)
            if p != 0:
                es.append(max(_flog2(Fraction(x)), acc.operand_emin) + max(_flog2(Fraction(y)), acc.operand_emin))
        if c != 0:
            es.append(_flog2(c))
        e = max(es + [acc.align_emin])
        s = sum(_cut(p, e, acc.align_bits) for p in ps) + _cut(c, e, acc.align_bits)
        if s != 0:
            s = _cut(s, max(_flog2(s), acc.sum_emin), acc.sum_bits)
        c = s
    return c


def oracle(a: torch.Tensor, b: torch.Tensor, acc: FusedAccumulator) -> torch.Tensor:
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    span = acc.promote_every or a.shape[1]
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            total = None
            for s in range(0, a.shape[1], span):
                part = np.float32(float(_oracle_chain(a[i, s:s + span].tolist(), b[s:s + span, j].tolist(), acc)))
                total = part if total is None else np.float32(total + part)
            out[i, j] = total
    return torch.from_numpy(out)


def _e4m3(*shape, kind="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if kind == "positive":
        x = x.abs()
    if kind == "wide":  # 2**-9 .. 2**8: subnormal E4M3 operands and large ones in one dot product
        x = x.sign() * torch.exp2(torch.randint(-9, 9, shape, generator=g).float()) * (1 + torch.rand(*shape, generator=g))
    return bfp.quantize(x, E4M3)


@pytest.mark.parametrize("name", ["h100_fp8_fast", "h100_fp8"])
@pytest.mark.parametrize("k", [16, 32, 48, 100, 256, 4096])
@pytest.mark.parametrize("kind", ["random", "positive", "wide"])
def test_presets_equal_the_exact_oracle(name, k, kind):
    acc = accumulator_from_name(name)
    m, n = (2, 2) if k == 4096 else (3, 4)
    a, b = _e4m3(m, k, kind=kind, seed=k), _e4m3(k, n, kind=kind, seed=k + 1)
    got = fused_matmul(a, b, acc)
    assert torch.equal(got, oracle(a, b, acc)), (got, oracle(a, b, acc))


def test_fast_and_promoted_differ_at_large_k_and_the_error_grows_with_k():
    a, b = _e4m3(4, 4096, kind="wide", seed=5), _e4m3(4096, 4, kind="wide", seed=6)
    exact = (a.double() @ b.double()).float()
    fast = fused_matmul(a, b, accumulator_from_name("h100_fp8_fast"))
    slow = fused_matmul(a, b, accumulator_from_name("h100_fp8"))
    assert not torch.equal(fast, slow)
    assert (fast - exact).abs().max() > (slow - exact).abs().max()  # promotion wins accuracy back


def test_edge_cases():
    acc = accumulator_from_name("h100_fp8_fast")
    cases = {
        "cancellation": ([448.0, -448.0, 2 ** -9], [1.0, 1.0, 1.0]),
        "below the window": ([448.0] + [2 ** -9] * 31, [448.0] + [1.0] * 31),   # small terms cut to zero
        "signed zero": ([-1.0, 1.0], [1.0, 1.0]),                                # -1 + 1: +0
        "subnormal operands": ([2 ** -9, 2 ** -8, 0.5], [2 ** -9, 3 * 2 ** -9, 2.0]),
        "not a multiple of the step": ([1.5] * 33, [1.25] * 33),
    }
    for what, (a, b) in cases.items():
        a, b = torch.tensor([a]), torch.tensor([b]).t()
        got = fused_matmul(a, b, acc)
        assert torch.equal(got, oracle(a, b, acc)), what
    z = fused_matmul(torch.tensor([[-1.0, 1.0]]), torch.tensor([[1.0], [1.0]]), acc)
    assert z.item() == 0 and not torch.signbit(z).item()
    # the big product sets E; every 2**-9 term lies 26 binades below and is cut to zero
    assert fused_matmul(torch.tensor([[448.0] + [2 ** -9] * 31]), torch.tensor([[448.0] + [1.0] * 31]).t(),
                        acc).item() == 448.0 * 448.0


def test_e5m2_operands_and_the_product_exponent_reading():
    acc = accumulator_from_name("h100_fp8_fast", operand_emin=-14)
    g = torch.Generator().manual_seed(3)
    a = bfp.quantize(torch.randn(3, 64, generator=g) * 100, E5M2)
    b = bfp.quantize(torch.randn(64, 2, generator=g) * 1e-3, E5M2)
    assert torch.equal(fused_matmul(a, b, acc), oracle(a, b, acc))
    own = replace(accumulator_from_name("h100_fp8_fast"), product_exponent="product")
    a, b = _e4m3(8, 256, kind="wide", seed=9), _e4m3(256, 8, kind="wide", seed=10)
    assert not torch.equal(fused_matmul(a, b, own), fused_matmul(a, b, accumulator_from_name("h100_fp8_fast")))


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="promote_every must be 0 .* multiple of terms 32, got 100"):
        FusedAccumulator(promote_every=100)
    with pytest.raises(ValueError, match="terms must be a positive integer"):
        FusedAccumulator(terms=0)
    with pytest.raises(ValueError, match="accumulator 'h200' unknown; allowed: h100_fp8_fast, h100_fp8, ada_fp8"):
        accumulator_from_name("h200")


def test_a_layer_accumulates_every_gemm_through_the_tensor_core_with_its_operands_formats():
    import torch.nn as nn
    from bfp.conversion import convert
    torch.manual_seed(0)
    model = convert(nn.Sequential(nn.Linear(8, 8), nn.Linear(64, 16), nn.Linear(16, 4)), "any_fp8_h100")
    layer = model[1]
    acc = layer.precision.accumulator
    assert acc == accumulator_from_name("h100_fp8_fast")
    x = torch.randn(5, 64, requires_grad=True)
    y = layer(x)
    xq, wq = bfp.quantize(x.detach(), E4M3), bfp.quantize(layer.weight.detach(), E4M3)
    want = fused_matmul(xq, wq.t(), replace(acc, operand_emin=(-6, -6))) + layer.bias
    assert torch.equal(y, want)
    g = torch.randn(5, 16)
    y.backward(g)
    gq = bfp.quantize(g, E5M2)  # the input gradient: e5m2 gradients (emin -14) times e4m3 weights (-6)
    assert torch.equal(x.grad, fused_matmul(gq, wq, replace(acc, operand_emin=(-14, -6))))
    assert torch.equal(layer.weight.grad, fused_matmul(gq.t(), xq, replace(acc, operand_emin=(-14, -6))))


def test_the_promoted_preset_and_a_conv_train():
    import torch.nn as nn
    from bfp.conversion import convert
    torch.manual_seed(0)
    model = convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 3)),
                    "any_fp8_h100_promoted")
    assert model[1].precision.accumulator == accumulator_from_name("h100_fp8")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    from bfp.precision import accumulator_from_dict
    assert accumulator_from_dict(model[1].precision.accumulator.to_dict()) == accumulator_from_name("h100_fp8")


WIDE_PRESETS = {  # name: (terms, align_bits, align_emin, operand_emin), Khattak & Mikaitis's models
    "v100_fp16": (4, 23, -1024, -14), "a100_fp16": (8, 24, -132, -14), "a100_bf16": (8, 24, -132, -126),
    "a100_tf32": (4, 24, -132, -126), "h100_fp16": (16, 25, -133, -14), "h100_bf16": (16, 25, -133, -126),
    "h100_tf32": (8, 25, -133, -126)}


@pytest.mark.parametrize("name", sorted(WIDE_PRESETS))
def test_the_fp16_bf16_tf32_presets_hold_the_published_models_parameters(name):
    acc = accumulator_from_name(name)
    assert (acc.terms, acc.align_bits, acc.align_emin, acc.operand_emin) == WIDE_PRESETS[name]
    assert (acc.sum_bits, acc.sum_emin, acc.align_rounding, acc.sum_rounding) == (23, -126, "truncate", "truncate")
    assert acc.accumulator_in_alignment and acc.product_exponent == "operands" and acc.promote_every == 0


def test_the_extra_alignment_bits_tell_v100_a100_and_h100_apart():
    """1 and four products of 1.5 * 2**-24 (fp16 operands 1.5 * 2**-12 and 2**-12), aligned to 2**0:
    V100 keeps 23 fraction bits (each small product cut to 0; and its 4-term steps put the first three
    with the 1 and the fourth alone with the accumulator: 1.0); A100 keeps 24 (each 2**-24: 1 + 2**-22);
    H100 keeps 25 (each 3 * 2**-25: 1 + 3 * 2**-23, here the exact sum)."""
    a = torch.tensor([[1.0] + [1.5 * 2 ** -12] * 4])
    b = torch.tensor([[1.0]] + [[2.0 ** -12]] * 4)
    want = {"v100_fp16": 1.0, "a100_fp16": 1 + 2 ** -22, "h100_fp16": 1 + 3 * 2 ** -23}
    for name, value in want.items():
        acc = accumulator_from_name(name)
        for backend in ("kernel", "reference"):
            assert fused_matmul(a, b, acc, backend=backend).item() == value, (name, backend)
        assert oracle(a, b, acc).item() == value
