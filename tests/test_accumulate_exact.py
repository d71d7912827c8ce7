"""Per-product accumulators (separate multiply/add formats, FMA, exact products and sums) and
``bfp.kernels.exact``, checked value for value against exact rational arithmetic."""
from fractions import Fraction as Q

import pytest
import torch

from bfp import Float
from bfp.accumulate import Accumulator, accumulate_matmul, accumulate_matmul_reference, accumulator_from_dict
from bfp.kernels.exact import nearest32, round_exact, round_to_odd32, two_sum

F32 = Float(8, 23, overflow="inf")  # float32 arithmetic: nearest-even, subnormals, overflow to Inf
FP16, BF16, E4M3 = Float(5, 10), Float(8, 7), Float(4, 3)


def ilog2(a: Q) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Q(2) ** e > a:
        e -= 1
    while Q(2) ** (e + 1) <= a:
        e += 1
    return e


def round_q(x: Q, fmt: Float) -> Q:
    """``x`` rounded by ``fmt``'s rule (nearest-even or toward zero; finite results only)."""
    if x == 0:
        return x
    a = abs(x)
    ulp = Q(2) ** (max(ilog2(a), fmt.emin) - fmt.man)
    v = a / ulp
    k = v.numerator // v.denominator
    f = v - k
    if fmt.rounding.value == "nearest" and (f > Q(1, 2) or (f == Q(1, 2) and k % 2)):
        k += 1
    r = k * ulp
    if r > Q(fmt.max):
        assert fmt.overflow.value == "saturate", "the tests keep inf-overflow formats in range"
        r = Q(fmt.max)
    if not fmt.subnormals and r < Q(2) ** fmt.emin:
        r = Q(0)
    return r if x > 0 else -r


def oracle(a, b, acc: Accumulator) -> list[list[Q]]:
    """The per-product accumulator's sum, element by element, in exact arithmetic."""
    def r(x, fmt):
        return round_q(x if acc.exact else round_q(x, F32), fmt)

    out = []
    for row in a.tolist():
        line = []
        for col in b.t().tolist():
            s = c = None
            for x, y in zip(row, col):
                p = Q(x) * Q(y)
                term = p if acc.fma else r(p, acc.mul or acc.fmt)
                if s is None:
                    s, c = r(term, acc.fmt), Q(0)
                elif acc.kahan:
                    yy = r(term - c, acc.fmt)
                    t = r(s + yy, acc.fmt)
                    c = r(r(t - s, acc.fmt) - yy, acc.fmt)
                    s = t
                else:
                    s = r(s + term, acc.fmt)
            line.append(s)
        out.append(line)
    return out


def operands(m, k, n, seed, bits=15, spread=6, ties=None):
    """float32 matrices whose products need up to ``2 * (bits + 1)`` bits (float32 rounds them).

    ``ties=t``: significands from ``1 + 2**-(t+1) - 2**-23``, ``1 + 2**-23``, ``1 + 2**-(t+1)``
    and ``1 - 2**-24``: the first two multiply to ``1 + 2**-(t+1) + 2**-(t+24) - 2**-46``,
    just above a midpoint of ``t`` mantissa bits, which float32 rounds onto the midpoint
    (double rounding then goes the wrong way); sums of such products hit the same edges.
    """
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        if ties is not None:
            pick = torch.tensor([1 + 2.0 ** -(ties + 1) - 2.0 ** -23, 1 + 2.0 ** -23, 1 + 2.0 ** -(ties + 1),
                                 1 - 2.0 ** -24], dtype=torch.float64)
            sig = pick[torch.randint(0, 4, shape, generator=g)]
        else:
            sig = 1 + torch.randint(0, 2 ** bits, shape, generator=g).double() / 2 ** bits
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
        return (sign * sig * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g).double())).float()
    return draw(m, k), draw(k, n)


def tie_bits(acc: Accumulator) -> int:
    """The mantissa width whose midpoints the tie operands aim at: the first rounding's."""
    return min((acc.product_format or acc.fmt).man, 21)


def assert_equals_oracle(got: torch.Tensor, want: list[list[Q]]):
    for i, line in enumerate(want):
        for j, v in enumerate(line):
            assert Q(got[i, j].item()) == v, (i, j, got[i, j].item(), float(v))


def test_the_issue_example_exact_product_rounds_up():
    x = torch.tensor([[1 + 2 ** -12]])
    assert accumulate_matmul(x, x, Accumulator(FP16, chunk=1)).item() == 1.0  # float32 product: a tie
    for kw in ({"exact": True}, {"fma": True, "exact": True}, {"mul": FP16, "exact": True}):
        assert accumulate_matmul(x, x, Accumulator(FP16, chunk=1, **kw)).item() == 1.0009765625
    assert accumulate_matmul(x, x, Accumulator(FP16, chunk=1, fma=True)).item() == 1.0  # fmaf, as mptorch


# (seed, exponent spread) of the tie operands; spread 8 also adds products 2**-32 below the
# running sum, which float32 drops and exact truncation does not.
TIE_SETS = ((2, 2), (3, 0), (4, 8))
CASES = [
    dict(fmt=FP16, exact=True),
    dict(fmt=FP16, mul=E4M3),
    dict(fmt=FP16, mul=E4M3, exact=True),
    dict(fmt=FP16, fma=True),
    dict(fmt=FP16, fma=True, exact=True),
    dict(fmt=BF16, fma=True, exact=True, kahan=True),
    dict(fmt=FP16, mul=BF16, exact=True, kahan=True),
    dict(fmt=Float(5, 10, subnormals=False), mul=Float(3, 4), exact=True),
    dict(fmt=Float(6, 9, rounding="truncate"), exact=True),
    dict(fmt=Float(8, 21), fma=True, exact=True),
    dict(fmt=Float(8, 23), mul=Float(8, 12), exact=True),
    dict(fmt=Float(8, 23), fma=True, exact=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: repr(Accumulator(chunk=1, **c))[12:-1])
def test_per_product_accumulators_equal_exact_arithmetic(case):
    acc = Accumulator(chunk=1, **case)
    for seed, spread, ties in ((0, 3, None), (1, 12, None)) + tuple((s, sp, tie_bits(acc)) for s, sp in TIE_SETS):
        a, b = operands(3, 24, 4, seed, spread=spread, ties=ties)
        want = oracle(a, b, acc)
        assert_equals_oracle(accumulate_matmul(a, b, acc), want)
        assert_equals_oracle(accumulate_matmul_reference(a, b, acc), want)


# fma into float32 itself: fmaf is the exact rounding already, nothing can differ.
EXACT_CASES = [c for c in CASES if c.get("exact") and not (c.get("fma") and c["fmt"].man == 23)]


@pytest.mark.parametrize("case", EXACT_CASES, ids=lambda c: repr(Accumulator(chunk=1, **c))[12:-1])
def test_exact_and_float32_arithmetic_differ_on_the_tie_operands(case):
    """The tie data does tell exact from float32 arithmetic (else the oracle tests could not fail)."""
    plain = dict(case, exact=False)
    differ = 0
    for seed, spread in TIE_SETS:
        a, b = operands(3, 24, 4, seed, spread=spread, ties=tie_bits(Accumulator(chunk=1, **case)))
        differ += int((accumulate_matmul(a, b, Accumulator(chunk=1, **case))
                       != accumulate_matmul(a, b, Accumulator(chunk=1, **plain))).sum())
    assert differ > 0


@pytest.mark.parametrize("kahan", [False, True])
def test_mul_equal_to_fmt_is_the_plain_chunk_one_accumulator(kahan):
    """Two code paths, one rule: ``mul=fmt`` without ``exact`` is the existing chunk=1 reference."""
    a, b = operands(5, 40, 6, 3, spread=8)
    old = accumulate_matmul_reference(a, b, Accumulator(BF16, chunk=1, kahan=kahan))
    new = accumulate_matmul(a, b, Accumulator(BF16, chunk=1, kahan=kahan, mul=BF16))
    assert torch.equal(old.view(torch.int32), new.view(torch.int32))


def test_round_exact_on_ties_sticky_bits_and_float32_subnormals():
    """hi on a format midpoint (or exactly representable), lo pushing it a hair either way."""
    cases = []
    for fmt in (FP16, BF16, E4M3, Float(8, 10), Float(8, 21), Float(8, 23)):
        for e in (0, 5, fmt.emin - 1, fmt.emin - fmt.man + 1, -140):
            base = Q(2) ** e * (1 + Q(2) ** -min(fmt.man, 21))
            ulp = Q(2) ** (max(e, fmt.emin) - fmt.man)
            for hi in (base, base + ulp / 2, base + ulp / 4 * 3, -(base + ulp / 2)):
                for lo in (0.0, 2.0 ** -200, -(2.0 ** -200), float(ulp) * 2 ** -40):
                    if abs(hi) < Q(fmt.max):
                        cases.append((fmt, float(hi), lo))
    for fmt, hi, lo in cases:
        assert Q(hi) + Q(lo) != 0
        got = round_exact(torch.tensor([hi], dtype=torch.float64), torch.tensor([lo], dtype=torch.float64), fmt)
        assert Q(got.item()) == round_q(Q(hi) + Q(lo), fmt), (fmt, hi, lo)


def test_round_to_odd_keeps_sticky_bits_and_overflow():
    hi = torch.tensor([1 + 2 ** -30, 1.0, 1.0, 3.5e38, -1e39, 1e-50, float("nan"), float("inf")],
                      dtype=torch.float64)
    lo = torch.tensor([0, 2 ** -60, -(2 ** -60), 0, 0, 0, 0, 0], dtype=torch.float64)
    got = round_to_odd32(hi, lo).tolist()
    assert got[:3] == [1 + 2 ** -23, 1 + 2 ** -23, 1 - 2 ** -24]
    big = float(torch.finfo(torch.float32).max)
    assert got[3:6] == [big, -big, 2.0 ** -149]
    assert got[6] != got[6] and got[7] == float("inf")
    assert nearest32(torch.tensor([1 + 2 ** -24], dtype=torch.float64),
                     torch.tensor([2 ** -70], dtype=torch.float64)).item() == 1 + 2 ** -23


def test_two_sum_is_exact():
    a = torch.tensor([1e16, 2.0 ** 100, 0.1], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0 ** -100, 0.2], dtype=torch.float64)
    s, e = two_sum(a, b)
    for i in range(3):
        assert Q(s[i].item()) + Q(e[i].item()) == Q(a[i].item()) + Q(b[i].item())


@pytest.mark.parametrize("kwargs,match", [
    (dict(fmt=FP16, mul=FP16), "need chunk=1"),
    (dict(fmt=FP16, chunk=1, fma=True, mul=FP16), "mul must be None"),
    (dict(fmt=FP16, chunk=1, mul="fp16"), "mul must be a Float"),
    (dict(fmt=FP16, chunk=1, fma=1), "fma must be True or False"),
    (dict(fmt=Float(8, 22), chunk=1, exact=True), "man <= 21"),
    (dict(fmt=Float(5, 23), chunk=1, exact=True), "exp=5, man=23"),
    (dict(fmt=FP16, chunk=1, mul=Float(8, 23, rounding="stochastic"), exact=True), "rounding=stochastic"),
])
def test_per_product_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Accumulator(**kwargs)


def test_per_product_dict_round_trip_and_old_dicts_unchanged():
    acc = Accumulator(FP16, chunk=1, mul=E4M3, exact=True, kahan=True)
    assert accumulator_from_dict(acc.to_dict()) == acc
    assert set(Accumulator(FP16).to_dict()) == {"fmt", "chunk", "kahan", "gemms"}
    assert "mul=e4m3" in repr(acc) and "exact=True" in repr(acc)


def test_stochastic_exact_accumulator_is_reproducible():
    a, b = operands(4, 16, 3, 5)
    acc = Accumulator(Float(5, 10, rounding="stochastic"), chunk=1, mul=E4M3, exact=True)
    one = accumulate_matmul(a, b, acc, generator=torch.Generator().manual_seed(7))
    two = accumulate_matmul(a, b, acc, generator=torch.Generator().manual_seed(7))
    other = accumulate_matmul(a, b, acc, generator=torch.Generator().manual_seed(8))
    assert torch.equal(one, two)
    assert not torch.equal(one, other)  # the rounding does draw from the generator


def test_configs_name_the_multiply_format():
    from bfp.config import parse_accumulator
    from bfp.formats import format_from_name
    acc = parse_accumulator({"fmt": "fp16", "chunk": 1, "mul": "fp8_e4m3", "exact": True})
    assert acc == Accumulator(format_from_name("fp16"), chunk=1, mul=format_from_name("fp8_e4m3"), exact=True)
    with pytest.raises(ValueError, match="need chunk=1"):
        parse_accumulator({"fmt": "fp16", "mul": "fp8_e4m3"})
