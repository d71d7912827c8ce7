"""The fused-adder kernel (bfp.kernels.numba_cpu.fused on the CPU; CUDA tensors take the reference)
equal the float64 torch reference of bfp.tensorcore bit for bit, for every setting of the adder:
truncation and rounding to nearest, product exponents from the operands or the product, the
accumulator in or out of the alignment, promotion, split K, zeros, subnormal operands, Inf/NaN.
(tests/test_tensorcore.py checks the reference against an exact Fraction oracle.)"""
from dataclasses import replace

import pytest
import torch

import bfp
from bfp.tensorcore import FUSED_PRESETS, fused_bmm, fused_matmul

E4M3 = bfp.format_from_name("float8_e4m3fn")
BASE = FUSED_PRESETS["h100_fp8_fast"]
SETTINGS = {
    "h100_fp8_fast": BASE, "h100_fp8": FUSED_PRESETS["h100_fp8"], "ada_fp8": FUSED_PRESETS["ada_fp8"],
    "nearest": replace(BASE, align_rounding="nearest", sum_rounding="nearest"),
    "product-exponent": replace(BASE, product_exponent="product"),
    "acc-outside": replace(BASE, accumulator_in_alignment=False),
    "narrow": replace(BASE, terms=4, align_bits=3, sum_bits=4, align_emin=-20, sum_emin=-18),
    "split-k": replace(BASE, split_k=3, promote_every=64),
}


def operands(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    def one(*shape):
        x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-12, 9, shape, generator=g).float())
        x[torch.rand(*shape, generator=g) < 0.1] = 0.0
        return bfp.quantize(x, E4M3)
    return one(m, k), one(k, n)


def bits(t):
    return t.view(torch.int32)


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("mkn", [(1, 1, 1), (4, 31, 5), (7, 200, 3), (3, 1000, 17)])
def test_cpu_kernel_equals_the_reference(name, mkn):
    a, b = operands(*mkn, seed=sum(mkn))
    acc = SETTINGS[name]
    assert torch.equal(bits(fused_matmul(a, b, acc)), bits(fused_matmul(a, b, acc, backend="reference")))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_batch_runs_in_one_call_and_equals_the_reference_matrix_by_matrix(name):
    """fused_bmm: every matrix of a batch, every chain of K (promotion spans inside split-K tiles,
    a last step with fewer terms than the adder's), equal to the reference run matrix by matrix."""
    acc = SETTINGS[name]
    for shape in [(3, 4, 300, 5), (2, 1, 37, 1), (4, 6, 129, 7)]:
        nb, m, k, n = shape
        pairs = [operands(m, k, n, seed=sum(shape) + q) for q in range(nb)]
        a, b = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        for p in (acc.promote_every, 64, 96) if name == "h100_fp8" else (acc.promote_every,):
            cut = replace(acc, promote_every=p)
            want = torch.stack([fused_matmul(x, y, cut, backend="reference") for x, y in pairs])
            assert torch.equal(bits(fused_bmm(a, b, cut)), bits(want)), (name, shape, p)
    # empty batch, empty K (zeros), and a batch one of whose matrices leaves float32's exact range
    assert fused_bmm(torch.zeros(0, 2, 3), torch.zeros(0, 3, 4), BASE).shape == (0, 2, 4)
    assert torch.equal(fused_bmm(torch.ones(2, 2, 0), torch.ones(2, 0, 3), BASE), torch.zeros(2, 2, 3))
    (a0, b0), (a1, b1) = operands(3, 70, 4, seed=1), operands(3, 70, 4, seed=2)
    a = torch.stack([a0, a1 * 2.0 ** 30])
    got = fused_bmm(a, torch.stack([b0, b1]), BASE)
    for q, (x, y) in enumerate([(a[0], b0), (a[1], b1)]):
        assert torch.equal(bits(got[q]), bits(fused_matmul(x, y, BASE, backend="reference")))
    with pytest.raises(ValueError, match=r"fused_bmm needs \(B, M, K\) @ \(B, K, N\) operands, got \[2, 3\]"):
        fused_bmm(torch.ones(2, 3), torch.ones(3, 2), BASE)


def test_float32_runs_only_where_it_is_exact_and_float64_elsewhere():
    from bfp.kernels.numba_cpu.fused import float32_exact
    a, b = operands(4, 100, 6, seed=3)
    assert float32_exact(a, b, BASE) and not float32_exact(a, b, SETTINGS["acc-outside"])
    assert not float32_exact(a, b, replace(BASE, align_bits=17))
    wide = a * 2.0 ** 30  # beyond FP8's range: products would leave float32's exact range
    assert not float32_exact(wide, b, BASE)
    for x in (wide, a * 2.0 ** -30):
        assert torch.equal(bits(fused_matmul(x, b, BASE)), bits(fused_matmul(x, b, BASE, backend="reference")))


def test_cpu_kernel_carries_inf_and_nan_as_the_reference():
    a, b = operands(3, 70, 4, seed=5)
    a[0, 3], a[1, 40], b[10, 2] = float("inf"), float("nan"), -float("inf")
    got, want = fused_matmul(a, b, BASE), fused_matmul(a, b, BASE, backend="reference")
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got).any()
    assert torch.equal(bits(got[~torch.isnan(got)]), bits(want[~torch.isnan(want)]))


def test_bad_backend_is_refused():
    with pytest.raises(ValueError, match="backend 'gpu': allowed 'kernel', 'reference'"):
        fused_matmul(torch.ones(1, 1), torch.ones(1, 1), BASE, backend="gpu")
