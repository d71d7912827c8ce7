"""NVFP4 in TransformerEngine's convention (nvfp4_te) against a transcription, written here, of
TE's reference (reference_nvfp4.py: _quantize_blockwise_reference, cast_to_fp4x2): torch's own
float8_e4m3fn cast and TE's E2M1 threshold table, independent of bfpsim's element rule."""
import pytest
import torch

import bfp

FLT_MAX = torch.tensor(torch.finfo(torch.float32).max)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def te_e2m1(x):
    """TE's cast_to_fp4x2 then cast_from_fp4x2, as values (its thresholds, ties to even)."""
    a = x.abs()
    code = torch.zeros_like(x, dtype=torch.long)
    for lo, hi, c, lo_in, hi_in in [(0.25, 0.75, 1, False, False), (0.75, 1.25, 2, True, True),
                                    (1.25, 1.75, 3, False, False), (1.75, 2.5, 4, True, True),
                                    (2.5, 3.5, 5, False, False), (3.5, 5.0, 6, True, True)]:
        above = a >= lo if lo_in else a > lo
        below = a <= hi if hi_in else a < hi
        code[above & below] = c
    code[a > 5.0] = 7
    return torch.where(x < 0, -E2M1[code], E2M1[code])


def te_reference(x):
    """x: (m, n) float32, blocks of 16 along the rows; the dequantized values q * sb * S_dec."""
    m, n = x.shape
    amax = x.abs().amax()
    s_enc = torch.min(torch.tensor(448.0 * 6.0) / amax, FLT_MAX)
    s_enc = torch.tensor(1.0) if s_enc == 0 else s_enc
    s_dec = torch.tensor(1.0) / s_enc
    xb = x.view(m, n // 16, 16)
    vec_max = xb.abs().amax(-1, keepdim=True)
    sb = torch.min(vec_max * (s_enc * torch.reciprocal(torch.tensor(6.0))), FLT_MAX)
    sb = sb.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    enc = torch.min(torch.tensor(1.0) / (sb * s_dec), FLT_MAX)
    q = te_e2m1((xb * enc).clamp(-6.0, 6.0))
    return (q * sb * s_dec).reshape(m, n)


def _cases():
    g = torch.Generator().manual_seed(0)
    out = {"random": torch.randn(64, 128, generator=g)}
    spike = torch.randn(64, 128, generator=g)
    spike[3, 5] = 1e5  # most blocks get tiny block scales: subnormal and zero E4M3 scales occur
    out["outlier"] = spike
    out["zeros"] = torch.zeros(8, 32)
    out["tiny"] = torch.randn(8, 32, generator=g) * 1e-38  # S_enc capped at FLT_MAX
    out["huge"] = torch.randn(8, 32, generator=g) * 1e37
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4).reshape(1, 32) * torch.ones(4, 1)
    ties[:, :16] *= -1
    out["e2m1 ties"] = ties
    return out


@pytest.mark.parametrize("name", list(_cases()))
def test_equals_transformer_engines_reference(name):
    x = _cases()[name]
    got = bfp.quantize(x, bfp.format_from_name("nvfp4_te"))
    want = te_reference(x)
    assert torch.equal(got, want), f"{(got != want).sum()} of {x.numel()} differ"


def test_the_outlier_tensor_has_block_scales_below_e4m3s_normal_range_and_differs_from_nvfp4():
    x = _cases()["outlier"]
    blocks = x.view(64, 8, 16)
    s_enc = 448.0 * 6.0 / 1e5
    sb = (blocks.abs().amax(-1) * s_enc / 6).clamp(max=448).to(torch.float8_e4m3fn).float()
    assert (sb < 2 ** -6).any()  # below E4M3's smallest normal: nvfp4 (bfpsim's) would clamp these up
    te = bfp.quantize(x, bfp.format_from_name("nvfp4_te"))
    ours = bfp.quantize(x, bfp.format_from_name("nvfp4"))
    assert not torch.equal(te, ours)


def test_along_another_axis_and_stochastic_rounding():
    x = _cases()["random"]
    got = bfp.quantize(x, bfp.NVFP4(axis=0, convention="te"))
    assert torch.equal(got, te_reference(x.t().contiguous()).t())
    fmt = bfp.format_from_name("nvfp4_te_sr")
    draws = torch.stack([bfp.quantize(x, fmt, generator=torch.Generator().manual_seed(s)) for s in range(64)])
    near = te_reference(x)
    assert not torch.equal(draws[0], near)
    assert (draws.mean(0) - x).abs().mean() < (near - x).abs().mean()  # unbiased on average


def test_nan_stays_and_bad_settings_are_refused():
    x = _cases()["random"].clone()
    x[0, 0] = float("nan")
    got = bfp.quantize(x, bfp.format_from_name("nvfp4_te"))
    assert torch.isnan(got[0, 0]) and torch.isfinite(got.flatten()[1:]).all()
    with pytest.raises(ValueError, match="convention 'nvidia': allowed bfpsim, te"):
        bfp.NVFP4(convention="nvidia")
    with pytest.raises(ValueError, match="tensor_scale=False and block \\(8, 8\\) are not part of it"):
        bfp.NVFP4(block=(8, 8), convention="te")
    with pytest.raises(ValueError, match="tensor_scale=False and block 16 are not part of it"):
        bfp.NVFP4(tensor_scale=False, convention="te")


def te_reference_2d(x):
    """TE's quant_tile_shape (16, 16): x (m, n) float32, one block scale per 16 x 16 tile."""
    m, n = x.shape
    tiles = x.view(m // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(m // 16, n // 16, 256)
    amax = x.abs().amax()
    s_enc = torch.min(torch.tensor(448.0 * 6.0) / amax, FLT_MAX)
    s_enc = torch.tensor(1.0) if s_enc == 0 else s_enc
    s_dec = torch.tensor(1.0) / s_enc
    sb = torch.min(tiles.abs().amax(-1, keepdim=True) * (s_enc * torch.reciprocal(torch.tensor(6.0))), FLT_MAX)
    sb = sb.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    enc = torch.min(torch.tensor(1.0) / (sb * s_dec), FLT_MAX)
    q = te_e2m1((tiles * enc).clamp(-6.0, 6.0)) * sb * s_dec
    return q.reshape(m // 16, n // 16, 16, 16).permute(0, 2, 1, 3).reshape(m, n)


@pytest.mark.parametrize("name", ["random", "outlier", "huge"])
def test_16x16_tiles_equal_transformer_engines_2d_reference(name):
    x = _cases()["random"] * 1e37 if name == "huge" else _cases()[name]
    got = bfp.quantize(x, bfp.NVFP4(block=(16, 16), convention="te"))
    assert torch.equal(got, te_reference_2d(x)), f"{(got != te_reference_2d(x)).sum()} differ"
    assert not torch.equal(got, bfp.quantize(x, bfp.format_from_name("nvfp4_te")))  # 1 x 16 blocks differ


@pytest.mark.parametrize("fmt", [bfp.format_from_name("nvfp4_te"), bfp.format_from_name("nvfp4_te_sr"),
                                 bfp.NVFP4(block=(16, 16), convention="te", rounding="stochastic"),
                                 bfp.NVFP4(axis=0, convention="te")], ids=repr)
def test_the_cpu_kernels_round_as_the_reference_bit_for_bit(fmt):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(48, 40, generator=g) * torch.exp2(torch.randint(-20, 20, (48, 40), generator=g).float())
    x[3, 5], x[7, 1], x[0, 0] = float("nan"), float("inf"), 0.0
    x[16:32, 16:32] = 0.0  # a zero block scale
    out = {b: bfp.quantize(x, fmt, backend=b, generator=torch.Generator().manual_seed(9)) for b in ("reference", "cpu")}
    assert torch.equal(out["cpu"].view(torch.int32), out["reference"].view(torch.int32))


@pytest.mark.parametrize("shape", [(16, 16, 3, 3), (6, 40), (5, 16), (3, 7)], ids=str)
def test_the_per_block_row_path_equals_the_per_element_tile_path(shape):
    from bfp.kernels.nvfp4_te import quantize_te
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    x.view(-1)[::7], x.view(-1)[3], x.view(-1)[-1] = 0.0, float("nan"), float("inf")
    for name in ("nvfp4_te", "nvfp4_te_sr"):
        fmt = bfp.format_from_name(name)
        rows = quantize_te(x, fmt, (12345, 678))
        tiles = quantize_te(x, fmt, (12345, 678), (1,) * (x.dim() - 1) + (16,))
        assert torch.equal(rows.view(torch.int32), tiles.view(torch.int32)), name
        cpu = bfp.quantize(x, fmt, backend="cpu", generator=torch.Generator().manual_seed(5))  # nvfp4_te_cpu
        ref = bfp.quantize(x, fmt, backend="reference", generator=torch.Generator().manual_seed(5))
        assert torch.equal(cpu.view(torch.int32), ref.view(torch.int32)), name


@pytest.mark.parametrize("shape,axis,block", [((20, 24, 3, 3), 0, 16), ((20, 24, 3, 3), 1, 16),
                                              ((20, 24, 3, 3), 3, 16), ((7, 33, 5), 1, 16), ((40, 3), 0, 16),
                                              ((2, 17, 2048), 1, 16), ((40, 20, 3, 3), 1, (16, 16)),
                                              ((33, 40), 1, (16, 16)), ((3, 20, 18, 5), 2, (16, 16)),
                                              ((20, 24, 16), 1, 16), ((20, 24, 15), 1, (16, 16))], ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_the_cpu_kernels_keep_the_layout_on_every_axis(shape, axis, block, rounding):
    """Blocks along an axis that is not the last (a convolution's input channels and batch, the
    weight-gradient operands) and TE's 16 x 16 weight tiles run in place, with the reference's bits
    and draws: tails shorter than 16, NaN and Inf inside blocks, a zero block, an infinite amax."""
    g = torch.Generator().manual_seed(sum(shape) + axis)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    x.view(-1)[5], x.view(-1)[11] = float("nan"), float("-inf")
    x.select(axis, 0).zero_()
    fmt = bfp.NVFP4(block, axis=axis, convention="te", rounding=rounding)
    for t in (x, torch.nan_to_num(x, posinf=0.0, neginf=0.0), torch.zeros(shape)):
        out = {b: bfp.quantize(t, fmt, backend=b, generator=torch.Generator().manual_seed(3))
               for b in ("reference", "cpu")}
        assert torch.equal(out["cpu"].view(torch.int32), out["reference"].view(torch.int32))
