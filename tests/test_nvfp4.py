"""NVFP4 bit-exact against an oracle written here from the published two-level rule: NumPy float32
arithmetic for the scales and quotients, ml_dtypes for the E4M3 and E2M1 casts (independent of
bfpsim's integer rule); on zeros, subnormals, block maxima at and just above powers of two,
NaN/Inf in a block, block tails, equal values, an all-zero tensor and tensors at float32's ends.
Stochastic rounding: the CPU kernel equals the reference, and it is unbiased."""
import ml_dtypes
import numpy as np
import pytest
import torch

from bfp import format_from_name, quantize
from bfp.config.specs import parse_format
from bfp.formats import format_from_dict
from bfp.kernels import quantize_stats
from bfp.formats.nvfp4 import NVFP4
from test_kernels import BACKENDS, assert_same_bits

F32 = np.float32


def oracle(x: np.ndarray, block: int, tensor_scale: bool = True) -> np.ndarray:
    """Blocks along the last axis of a float32 2-D array."""
    fin = np.isfinite(x)
    a = np.abs(np.where(fin, x, F32(0))).astype(F32)
    out = np.where(fin, x, F32(np.nan)).astype(F32)  # Inf -> NaN, NaN stays
    amax_t = a.max()
    if amax_t == 0:
        return out
    pts = max(F32(amax_t) / F32(448 * 6), F32(2.0 ** -149)) if tensor_scale else F32(1)
    for i in range(x.shape[0]):
        for b in range(0, x.shape[1], block):
            sb = F32(a[i, b:b + block].max()) / F32(6)
            sbs = F32(min(max(F32(sb / pts), F32(2.0 ** -6)), F32(448)))
            sb8 = F32(np.array(sbs, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32))
            ts = F32(pts * sb8)
            v = np.clip((x[i, b:b + block] / ts).astype(F32), F32(-6), F32(6))
            q = v.astype(ml_dtypes.float4_e2m1fn).astype(F32)
            out[i, b:b + block] = np.where(fin[i, b:b + block], (q * ts).astype(F32), out[i, b:b + block])
    return out


def _edges() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    rows = []
    for p in (-60, -3, 0, 8, 40):
        for m in (1.0, 1.0 + 2 ** -23, 1.5, 1.75 + 2 ** -20, 2 - 2 ** -23):
            a = m * 2.0 ** p
            rows.append([a, -a / 3, a / 7, 0.0, -a, a / 1024, a * 0.9, a / 2 ** 12, a, 1.0, 0.5, -0.25, 0.1, 3.0,
                         -a / 6, a / 5, 2.0, 7.0, 1e-3])
    rows.append([0.0] * 19)
    rows.append([1e-40, -3e-41, 2e-45, 0.0, 7e-39] + [0.0] * 14)
    rows.append([3.0] * 19)
    rows.append([1.0, float("nan"), 480.0, float("inf"), -2.0, 0.0, 1e-3, 3.0, float("-inf")] + [0.5] * 10)
    edge = torch.tensor(rows, dtype=torch.float32)
    rand = torch.randn(24, 80, generator=g) * torch.exp2(torch.randint(-20, 20, (24, 80), generator=g).float())
    return [edge, rand, _ties(), torch.zeros(3, 16), torch.full((2, 16), 3e38), torch.full((2, 16), 1e-43),
            torch.tensor([[float("inf"), 0.0, float("nan"), -0.0]])]


def _ties() -> torch.Tensor:
    """Rows of 16 hitting the roundings' ties (for tensor_scale=False, block 16): block maxima
    at 6 x an E4M3 midpoint (or a float32 ulp either side), so the block scale is a tie; and
    blocks of scale s (max 6 s) holding s x each E2M1 midpoint, a ulp either side, and -0."""
    rows = []
    up, down = 1 + 2 ** -23, 1 - 2 ** -24
    for e in (-6, -2, 0, 3, 7, 8):
        for k in range(8, 16):
            mid = (k + 0.5) / 8 * 2.0 ** e
            for amax in (6 * mid, 6 * mid * up, 6 * mid * down):  # one block each: its maximum
                rows.append([amax] + [mid * f for f in (1, 2, 3, 0.5, -4, 5.9, -0.3)] + [0.0] * 8)
            s = k / 8 * 2.0 ** e
            if 6 * s <= 448 * 6:
                ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
                rows.append([6 * s] + [s * v * f for v in ties[:5] for f in (1, up, -down)][:14] + [-0.0])
                rows.append([-6 * s] + [s * v * f for v in ties[3:] for f in (1, down, -up)] + [s * 0.24] * 3)
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("tensor_scale", [True, False])
@pytest.mark.parametrize("block", [16, 8])
def test_nvfp4_matches_the_two_level_rule_on_every_edge(block, tensor_scale):
    fmt = NVFP4(block=block, tensor_scale=tensor_scale)
    for x in _edges():
        want = torch.from_numpy(oracle(x.numpy(), block, tensor_scale))
        for backend in BACKENDS:
            assert_same_bits(quantize(x, fmt, backend=backend), want)


def test_nvfp4_along_another_axis_and_rank():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 40, 3, generator=g) * 10
    want = oracle(x.permute(0, 2, 1).reshape(-1, 40).numpy(), 16)
    want = torch.from_numpy(want).reshape(4, 3, 40).permute(0, 2, 1)
    for backend in BACKENDS:
        assert_same_bits(quantize(x, NVFP4(axis=1), backend=backend), want)


def test_nvfp4_stochastic_cpu_equals_reference_and_is_unbiased():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 48, generator=g)
    fmt = NVFP4(rounding="stochastic")
    r, rc = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(9), backend="reference")
    c, cc = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(9), backend="cpu")
    assert_same_bits(c, r)
    assert torch.equal(rc, cc)
    # unbiased: the mean of many draws of one row approaches the row (nearest is biased there)
    row = torch.linspace(0.3, 5.7, 16).repeat(20000, 1)
    row[:, 0] = 6.0  # fixes every block's scale: the same grid for every draw
    sr = quantize(row, fmt, generator=torch.Generator().manual_seed(2)).mean(0)
    rn = quantize(row, NVFP4())[0]
    assert (sr - row[0]).abs().max() < 0.03 < (rn - row[0]).abs().max()  # 0.03: over 4 sigma


def test_nvfp4_by_name_dict_config_and_bad_values():
    assert format_from_name("nvfp4") == NVFP4()
    assert format_from_name("nvfp4_sr") == NVFP4(rounding="stochastic")
    f = NVFP4(block=32, axis=0, rounding="stochastic", tensor_scale=False)
    assert format_from_dict(f.to_dict()) == f
    assert parse_format({"name": "nvfp4", "rounding": "stochastic"}) == NVFP4(rounding="stochastic")
    assert repr(NVFP4(rounding="stochastic")) == "NVFP4(block=16, axis=-1, rounding=stochastic)"
    with pytest.raises(ValueError, match="NVFP4 rounding 'truncate': allowed nearest, stochastic"):
        NVFP4(rounding="truncate")
    with pytest.raises(ValueError, match="NVFP4 block"):
        NVFP4(block=0)
    with pytest.raises(ValueError, match="NVFP4 axis 2 is out of range for a tensor of shape \\(3, 4\\)"):
        quantize(torch.ones(3, 4), NVFP4(axis=2))


def test_nvfp4_2d_blocks_match_the_rule_per_tile_and_a_weight_and_its_transpose_round_alike():
    g = torch.Generator().manual_seed(8)
    w = torch.randn(40, 36, generator=g) * torch.exp2(torch.randint(-6, 6, (40, 36), generator=g).float())
    fmt = NVFP4(block=(16, 16), axis=-1)
    got = quantize(w, fmt)
    # the oracle per 16x16 tile (tails smaller), with the tensor's scale from the whole weight
    x = w.numpy()
    want = np.empty_like(x)
    for i in range(0, 40, 16):
        for j in range(0, 36, 16):
            want[i:i + 16, j:j + 16] = _tile_oracle(x[i:i + 16, j:j + 16], np.abs(x).max())
    assert_same_bits(got, torch.from_numpy(want))
    assert_same_bits(quantize(w.t(), NVFP4(block=(16, 16), axis=-1)).t(), got)
    assert repr(fmt) == "NVFP4(block=16x16, axis=-1)" and format_from_dict(fmt.to_dict()) == fmt


def _tile_oracle(t: np.ndarray, amax_t: float) -> np.ndarray:
    pts = max(F32(amax_t) / F32(448 * 6), F32(2.0 ** -149))
    sb = F32(np.abs(t).max()) / F32(6)
    sb8 = F32(np.array(min(max(F32(sb / pts), F32(2.0 ** -6)), F32(448)), F32)
              .astype(ml_dtypes.float8_e4m3fn).astype(F32))
    ts = F32(pts * sb8)
    q = np.clip((t / ts).astype(F32), F32(-6), F32(6)).astype(ml_dtypes.float4_e2m1fn).astype(F32)
    return (q * ts).astype(F32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_on_cuda_tensors_equals_the_reference(rounding):
    x = torch.randn(3, 50, 7, 33, device="cuda") * 10
    x.view(-1)[::13] = 0.0
    fmt = NVFP4(rounding=rounding)
    ref = quantize(x, fmt, generator=torch.Generator("cuda").manual_seed(1), backend="reference")
    out = quantize(x, fmt, generator=torch.Generator("cuda").manual_seed(1))
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("axis", [0, -2, 1])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_cpu_column_kernels_equal_the_reference_without_a_copy(axis, rounding):
    """Blocks along a non-last axis (the CPU column kernels: no transposing copy), with a tail
    block, NaN/Inf and zeros; stochastic draws indexed as the reference's (axis moved last)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(37, 5, 2100, generator=g) * torch.exp2(torch.randint(-8, 8, (37, 5, 2100), generator=g).float())
    x[3, 1, 7], x[20, 4, 2000], x[0, 0, :40] = float("nan"), float("-inf"), 0.0
    fmt = NVFP4(axis=axis, rounding=rounding)
    ref = quantize(x, fmt, generator=torch.Generator().manual_seed(4), backend="reference")
    cpu = quantize(x, fmt, generator=torch.Generator().manual_seed(4), backend="cpu")
    assert_same_bits(cpu, ref)


@pytest.mark.parametrize("shape,axis", [((37, 50, 3), 1), ((70, 15), 0), ((4, 33, 2, 5), 1)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_cpu_column_kernels_with_few_columns(shape, axis, rounding):
    """Fewer than ``nvfp4_cpu.FLAT`` columns after the block axis: the column kernels run along
    a block's rows as one contiguous run; tail blocks, NaN/Inf, the reference's draws."""
    from bfp.kernels.numba_cpu import nvfp4_cpu
    assert 1 < int(np.prod(shape[axis + 1:])) < nvfp4_cpu.FLAT
    g = torch.Generator().manual_seed(6)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g).float())
    x.view(-1)[4], x.view(-1)[60] = float("nan"), float("-inf")
    fmt = NVFP4(axis=axis, rounding=rounding)
    ref = quantize(x, fmt, generator=torch.Generator().manual_seed(5), backend="reference")
    cpu = quantize(x, fmt, generator=torch.Generator().manual_seed(5), backend="cpu")
    assert_same_bits(cpu, ref)


@pytest.mark.parametrize("shape,axis", [((40, 37, 3, 3), 1), ((33, 50), -1), ((3, 20, 18), 2), ((20, 40, 16), 1)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_2d_blocks_cpu_kernels_equal_the_reference(shape, axis, rounding):
    """16x16 tiles over (axis - 1, axis) with tails on both, trailing axes (a conv weight's
    kh x kw), NaN/Inf; stochastic draws indexed by the position in the tensor as it is."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())
    x.view(-1)[5], x.view(-1)[77] = float("nan"), float("inf")
    fmt = NVFP4(block=(16, 16), axis=axis, rounding=rounding)
    ref = quantize(x, fmt, generator=torch.Generator().manual_seed(2), backend="reference")
    cpu = quantize(x, fmt, generator=torch.Generator().manual_seed(2), backend="cpu")
    assert_same_bits(cpu, ref)
