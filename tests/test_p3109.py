"""IEEE P3109 formats against an independent implementation, gfloat (graphcore-research), bit for bit:
every code, every midpoint between neighbours and one float32 ulp either side, the overflow edges,
zeros, infinities and NaN, for every width 3..8 and precision, signed and unsigned, both domains,
each rounding and saturation mode, on the reference and the Numba CPU kernel."""
import math

import numpy as np
import pytest
import torch

import bfp
from bfp.config import parse_format
from bfp.formats import P3109, format_from_dict, format_from_name
from bfp.kernels import quantize_stats
from bfp.kernels.dispatch import _keys
from bfp.kernels.reference import rand32

gfloat = pytest.importorskip("gfloat")
from gfloat import Domain, RoundMode, Signedness  # noqa: E402
from gfloat.formats import format_info_p3109  # noqa: E402

ALL = [(k, p, signed, domain) for k in range(3, 9) for signed in (True, False)
       for p in range(1, k if signed else k + 1) for domain in ("extended", "finite")]
GF_ROUND = {"nearest": RoundMode.TiesToEven, "truncate": RoundMode.TowardZero}


def info(f: P3109):
    return format_info_p3109(f.k, f.p, Signedness.Signed if f.signed else Signedness.Unsigned,
                             Domain.Extended if f.domain == "extended" else Domain.Finite)


def probes(fi) -> np.ndarray:
    """Every finite value of the format, the midpoints of neighbours and one float32 ulp either side,
    the tie above max (toward the next binade's value) and beyond, zeros, ±Inf, NaN."""
    vals = sorted({v for v in (gfloat.decode_float(fi, c).fval for c in range(2 ** fi.k)) if math.isfinite(v)})
    pos = [v for v in vals if v >= 0]
    mids = [(a + b) / 2 for a, b in zip(pos, pos[1:])]
    top, prev = pos[-1], pos[-2]
    edges = [top + (top - prev) / 2, top * 1.5, top * 2, 3.0e38, pos[1] / 2, pos[1] / 4, 1e-30]
    x = np.array(pos + mids + edges, dtype=np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(0))])
    x = np.concatenate([x, -x, np.array([np.inf, -np.inf, np.nan, -0.0], np.float32)])
    return x


def gfloat_round(fi, f: P3109, x: np.ndarray, srbits=None) -> np.ndarray:
    out = np.empty(len(x), np.float64)
    for i, v in enumerate(x.tolist()):
        sat = f.saturation == "satfinite" or (f.saturation == "satpropagate" and math.isfinite(v))
        if not f.signed and (v < 0 or (v == 0 and math.copysign(1, v) < 0)):
            out[i] = np.nan  # gfloat leaves negatives of unsigned formats undefined: checked by hand below
        elif f.rounding.value == "stochastic":
            out[i] = gfloat.round_float(fi, v, RoundMode.StochasticFastest, sat, int(srbits[i]), 32)
        else:
            out[i] = gfloat.round_float(fi, v, GF_ROUND[f.rounding.value], sat)
    return out.astype(np.float32)


def same(ours: torch.Tensor, theirs: np.ndarray, mask) -> None:
    o = ours.numpy()[mask]
    t = theirs[mask]
    both_nan = np.isnan(o) & np.isnan(t)
    bits_equal = o.view(np.int32) == t.view(np.int32)  # +0 only: P3109 has no negative zero
    bad = ~(both_nan | bits_equal)
    assert not bad.any(), f"{np.count_nonzero(bad)} differ, e.g. x->ours/gfloat: " \
                          f"{list(zip(o[bad][:5].tolist(), t[bad][:5].tolist()))}"


@pytest.mark.parametrize("k,p,signed,domain", ALL, ids=lambda v: str(v))
def test_every_code_midpoint_and_edge_rounds_as_gfloat(k, p, signed, domain):
    for rounding in ("nearest", "truncate"):
        for saturation in ("satfinite", "satpropagate", "ovfinf"):
            f = P3109(k, p, signed, domain, rounding, saturation)
            fi = info(f)
            assert f.max == fi.max and f.min_subnormal == fi.smallest_subnormal and f.name == fi.name
            x = probes(fi)
            want = gfloat_round(fi, f, x)
            mask = ~np.isnan(x) & ((x >= 0) | signed) & ~((x == 0) & np.signbit(x) & (not signed))
            for backend in ("reference", "cpu"):
                got, _ = quantize_stats(torch.from_numpy(x), f, backend=backend)
                same(got, want, mask)
                assert torch.isnan(got[torch.from_numpy(np.isnan(x))]).all()


@pytest.mark.parametrize("name", ["p3109_k8p4se", "p3109_k8p3sf", "p3109_k6p2ue", "p3109_k8p1se"])
def test_stochastic_rounding_is_gfloats_with_the_same_32_random_bits(name):
    f = format_from_name(name + "_sr")
    fi = info(f)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(4000, generator=g) * torch.exp2(torch.randint(-12, 12, (4000,), generator=g).float()))
    if not f.signed:
        x = x.abs()
    k0, k1 = _keys(torch.Generator().manual_seed(3))
    r = rand32(k0, k1, x.numel(), "cpu").numpy()
    want = gfloat_round(fi, f, x.numpy(), r)
    for backend in ("reference", "cpu"):
        got, _ = quantize_stats(x, f, generator=torch.Generator().manual_seed(3), backend=backend)
        same(got, want, np.ones(len(x), bool))


def test_unsigned_negatives_and_the_one_zero():
    x = torch.tensor([-3.0, -1e-9, -0.0, -float("inf"), 3.0, float("nan")])
    sat = format_from_name("p3109_k8p4ue")
    assert sat.short_name() == "k8p4ue"
    assert quantize_stats(x, sat, backend="cpu")[0].tolist()[:5] == [0.0, 0.0, 0.0, 0.0, 3.0]
    ovf = format_from_name("p3109_k8p4ue_ovfinf")
    got = quantize_stats(x, ovf, backend="cpu")[0]
    assert torch.isnan(got[[0, 3, 5]]).all() and got[[1, 2, 4]].tolist() == [0.0, 0.0, 3.0]
    signed = quantize_stats(torch.tensor([-0.0, -1e-30]), format_from_name("p3109_k8p4se"), backend="cpu")[0]
    assert not torch.signbit(signed).any()  # no negative zero


def test_names_dicts_specs_and_errors():
    f = format_from_name("P3109_K8P3SF_RZ_OVFINF")
    assert f == P3109(8, 3, True, "finite", "truncate", "ovfinf") == format_from_dict(f.to_dict())
    assert parse_format({"p3109": "k8p4se", "saturation": "satpropagate"}) == \
        P3109(8, 4, saturation="satpropagate")
    assert parse_format({"p3109": [6, 3], "signed": False}) == P3109(6, 3, False)
    assert parse_format("p3109_k8p4se", "stochastic").rounding.value == "stochastic"
    assert f.transport_bytes() == 1 and f.aps_top() == f.emax and f.overflow_limit() == f.max
    assert f.elementwise and f.chunkable and f.normal_emin() == f.emin == -15  # bias 2**(8-3-1) = 16
    for bad, needle in [(lambda: P3109(9, 4), "k \\(width in bits\\) must be an integer in 3..8"),
                        (lambda: P3109(8, 8), "precision\\) of a signed k=8 format must be an integer in 1..7"),
                        (lambda: P3109(8, 4, domain="open"), "domain 'open' unknown; allowed: extended, finite"),
                        (lambda: P3109(8, 4, saturation="clamp"), "saturation 'clamp' unknown"),
                        (lambda: format_from_name("p3109_k8p4sx"), "p3109_k<K>p<P><s\\|u><e\\|f>")]:
        with pytest.raises(ValueError, match=needle):
            bad()


def test_p3109_trains_in_a_layer_and_reduces_gradients():
    from bfp.distributed.reduce import RoundedReduce
    f = format_from_name("p3109_k8p4se")
    layer = bfp.QLinear(8, 4, precision=bfp.LayerPrecision(fw=f, fi=f, bwo=f, bio=f))
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    x = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    out = RoundedReduce(f, order="gloo", aps=False, average=False)(x)
    assert torch.equal(bfp.quantize(out, f), out) and (out != 0).all()  # every partial sum rounded to k8p4se
    # inside e4m3's range and above both formats' smallest normals the two grids are the same
    assert torch.equal(out, RoundedReduce(bfp.format_from_name("e4m3"), order="gloo", aps=False, average=False)(x))
    aps = RoundedReduce(f, order="gloo", aps=True)(x)
    assert torch.isfinite(aps).all() and (aps != 0).any()
