"""NVFP4's stochastic rounding of E2M1 in float32 lanes (``bfp.kernels.numba_cpu.nvfp4_cpu._e2m1_stochastic``)
against the integer element rule it replaces (``scalar._quant_elem``, mode 2), input by input.

The rule rounds up iff ``F + r >= 2**32`` (``F``: the dropped part of ``|v|`` in units of 2**-32 of
the step, cut to an integer). For each input the test takes the random numbers on both sides of
that threshold, computed here independently in float64 (``|v|`` times a power of two and its
fraction are exact there), plus 0, 2**32 - 1 and random ones. The inputs are every float32
exponent field from the subnormals to E2M1's top binade with the halfway, all-ones, one-bit and
random mantissas, both signs, and every float32 of [1/4, 1/2) (the last binade where ``F`` is a
multiple of 2**8) and of [1/8, 1/4) (the first where it is not).
"""
import numpy as np
from numba import njit

from bfp.kernels.numba_cpu import nvfp4_cpu, rule_cpu
from bfp.kernels.nvfp4_codes import E2M1
from bfp.kernels.plan import rule_for
from bfp.formats import Rounding

R = rule_for(E2M1[Rounding.STOCHASTIC])
QT, P2Q, HI, LO = rule_cpu._tile_consts(0, R.kind, 0, 0, R.qoff, R.lim, R.emin, R.man, R.maxkept, R.emaxq)


@njit
def _compare(vs, rs):
    """Indices where the float32 lanes and the integer rule disagree (v = vs[i] with r = rs[i])."""
    bad = []
    for i in range(vs.size):
        vb = np.int64(vs[i])
        a = rule_cpu._elem(vb, R.kind, 2, QT, P2Q, HI, LO, R.man, R.ftz, R.ovf_inf, R.inf_nan, rs[i])
        b = nvfp4_cpu._e2m1_stochastic(np.int32(vs[i]).view(np.float32), rs[i])
        if np.int32(a) != np.float32(b).view(np.int32):
            bad.append(i)
    return bad


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    mants = [0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF, 0x400001, 0x200000, 0x600000]
    mants += [1 << k for k in range(23)] + list(rng.integers(0, 1 << 23, 48))
    exps = np.arange(0, 130, dtype=np.int64)  # float32 exponent fields up to [4, 8)
    bits = (exps[:, None] << 23 | np.array(mants, np.int64)[None, :]).reshape(-1)
    binades = np.arange(0x3E000000, 0x3F000000, dtype=np.int64)  # every float32 of [1/8, 1/2)
    bits = np.concatenate([bits, binades])
    bits = bits[bits.astype(np.uint32).view(np.float32) <= 6.0]
    return bits


def _thresholds(bits: np.ndarray) -> np.ndarray:
    """The smallest r that rounds up: 2**32 - floor(frac(|v| / u) * 2**32), in float64."""
    a = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    u = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    t = a / u
    return 2 ** 32 - np.floor((t - np.floor(t)) * 2.0 ** 32).astype(np.int64)


def test_float32_lanes_equal_the_integer_rule_at_every_threshold():
    rng = np.random.default_rng(1)
    mags = _values()
    thr = _thresholds(mags)
    cases = [(mags, np.minimum(thr, 2 ** 32 - 1)), (mags, thr - 1), (mags, np.zeros_like(mags)),
             (mags, np.full_like(mags, 2 ** 32 - 1)), (mags, rng.integers(0, 2 ** 32, mags.size))]
    sign = np.int64(1) << 31
    for m, r in cases:
        for b in (m, m | sign):
            vs = b.astype(np.uint32).view(np.int32)
            bad = _compare(vs, r.astype(np.int64))
            assert not bad, (f"{len(bad)} of {vs.size} differ, first v bits "
                             f"{int(b[bad[0]]) & 0xFFFFFFFF:#010x} with r {int(r[bad[0]])}")
    # the thresholds really decide: some inputs round up at thr and not at thr - 1
    assert (thr < 2 ** 32).sum() > mags.size // 2


def test_the_thresholds_cross_both_ways():
    """``thr - 1`` rounds down and ``thr`` up (where ``thr < 2**32``), by the integer rule itself:
    the cases above test the decision at its edge, not two values on one side of it."""
    mags = _values()[::97]
    thr = _thresholds(mags)
    keep = thr < 2 ** 32
    mags, thr = mags[keep], thr[keep]
    down = [rule_cpu._elem(int(b), R.kind, 2, QT, P2Q, HI, LO, R.man, R.ftz, R.ovf_inf, R.inf_nan, int(t) - 1)
            for b, t in zip(mags, thr)]
    up = [rule_cpu._elem(int(b), R.kind, 2, QT, P2Q, HI, LO, R.man, R.ftz, R.ovf_inf, R.inf_nan, int(t))
          for b, t in zip(mags, thr)]
    assert all(u > d for u, d in zip(up, down))


@njit
def _both(k0, k1, idx):
    out = np.empty((2, idx.size), np.int64)
    for j in range(idx.size):
        out[0, j] = rule_cpu._rand32(k0, k1, idx[j])
        out[1, j] = rule_cpu._rand32_64(k0, k1, idx[j])
    return out


def test_random_numbers_in_32_bit_lanes_equal_the_rule_hash():
    """``rule_cpu._rand32`` (LLVM 32-bit operations) against the rule's own hash compiled by Numba
    and against ``scalar._rand32`` in plain Python, over indices below and above 2**32 and keys
    at both ends of their range."""
    from bfp.kernels import scalar
    idx = np.concatenate([np.arange(4096), 2 ** 32 - 2048 + np.arange(4096), 2 ** 40 + np.arange(512) * 977,
                          np.random.default_rng(2).integers(0, 2 ** 46, 4096)]).astype(np.int64)
    for k0, k1 in ((0, 0), (12345, 678), (2 ** 32 - 1, 2 ** 32 - 1), (2 ** 31, 1)):
        a, b = _both(np.int64(k0), np.int64(k1), idx)
        assert np.array_equal(a, b), (k0, k1)
        assert [scalar._rand32(k0, k1, int(i)) for i in idx[::61]] == a[::61].tolist()
        assert a.min() >= 0 and a.max() < 2 ** 32


@njit
def _narrow(k0, k1, i):
    return rule_cpu._rand32(k0, k1, i)


def test_random_numbers_take_any_integer_type():
    """Keys and index of other integer types are widened to int64 first, as in the rule's hash."""
    from bfp.kernels import scalar
    assert _narrow(np.uint32(7), np.int32(9), np.int32(123456)) == scalar._rand32(7, 9, 123456)
    assert _narrow(np.uint64(2 ** 32 - 1), np.int64(1), np.uint64(2 ** 33 + 5)) == scalar._rand32(2 ** 32 - 1, 1,
                                                                                                 2 ** 33 + 5)
