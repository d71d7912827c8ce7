"""The Triton rule's float32 rounding (``triton_cuda/rule.py``: ``(|x| + c) - c``) against the PyTorch
reference on bit patterns drawn from the whole float32 range: every exponent from subnormals to
the largest finite, ties, Inf and NaN, in tiles whose grids pass 2**104 (where the kernel works 64
binades down) and tiles of tiny values (grid below 2**-149), for every rounding the adds serve
(stochastic with the same draws as the reference)."""
import dataclasses

import pytest
import torch

from bfp import BlockFloat, Float, MX, format_from_name
from bfp.kernels import quantize_stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bits(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-2 ** 31, 2 ** 31, shape, generator=g, dtype=torch.int64).to(torch.int32)
    x = raw.view(torch.float32).clone()
    flat = x.view(-1)
    # ties of every grid: significands ending in one set bit after a few kept ones
    k = flat.numel() // 8
    flat[:k] = torch.ldexp(torch.tensor(1.0) + torch.randint(0, 64, (k,), generator=g) / 64 + 1 / 128,
                           torch.randint(-140, 127, (k,), generator=g))
    flat[k:k + 4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38])
    # a tile of tiny values and a tile of huge ones
    flat[-64:-32] = torch.ldexp(torch.ones(32), torch.randint(-149, -120, (32,), generator=g))
    flat[-32:] = torch.ldexp(torch.rand(32, generator=g) + 1, torch.randint(100, 127, (32,), generator=g))
    return x


FORMATS = [format_from_name(n) for n in ("float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float4_e2m1fn",
                                         "float6_e2m3fn", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp4_e2m1", "mxint8",
                                         "fb12", "fb16", "fb24")] \
    + [BlockFloat(23, (1, 32), "nearest"), BlockFloat(1, (4, 8), "nearest"), Float(5, 21, "nearest"),
       MX("float8_e5m2", block=32, scale_mode="rceil"), Float(3, 0, "stochastic"), Float(7, 2, "stochastic")]


def _roundings(fmt):
    out = []
    for r in ("nearest", "truncate", "stochastic"):
        try:
            if isinstance(fmt, MX):
                out.append(dataclasses.replace(fmt, element=dataclasses.replace(fmt.element, rounding=r)))
            else:
                out.append(dataclasses.replace(fmt, rounding=r))
        except (TypeError, ValueError):
            pass
    return out or [fmt]


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_float_rounding_equals_the_reference_bit_for_bit_over_the_whole_float32_range(fmt):
    x = _bits((6, 8, 64), seed=11)
    for f in _roundings(fmt):
        want, wc = quantize_stats(x, f, backend="reference", generator=torch.Generator().manual_seed(3))
        got, gc = quantize_stats(x.to(DEVICE), f, backend="triton", generator=torch.Generator().manual_seed(3))
        bad = (want.view(torch.int32) != got.cpu().view(torch.int32)).nonzero()
        assert not len(bad), f"{f!r}: {len(bad)} elements differ, first at {bad[0].tolist()}: " \
                             f"{x[tuple(bad[0])].item()!r} -> {got.cpu()[tuple(bad[0])].item()!r}, " \
                             f"reference {want[tuple(bad[0])].item()!r}"
        assert torch.equal(wc, gc.cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float16", "bfloat16", "mxfp8_e4m3", "fb16", "fb12:nearest",
                                  "float8_e5m2:stochastic", "mxint8", "float4_e2m1fn"])
def test_bfloat16_and_float16_tensors_are_loaded_and_stored_as_they_are_with_the_references_bits(name, dtype):
    """The Triton kernels read bfloat16/float16 and write the result in that dtype (no float32 copy
    either side): the bits of the reference's float32 result converted with ``Tensor.to``, and its
    counts; a NaN compared as a NaN (a GPU writes the canonical NaN)."""
    base, _, rounding = name.partition(":")
    fmt = format_from_name(base)
    if rounding:
        fmt = dataclasses.replace(fmt, rounding=rounding)
    x = _bits((6, 8, 64), seed=5).clamp(-6e4, 6e4).to(dtype)  # finite in both dtypes, subnormals kept
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    want, wc = quantize_stats(x, fmt, backend="reference", generator=torch.Generator().manual_seed(3))
    got, gc = quantize_stats(x.to(DEVICE), fmt, backend="triton", generator=torch.Generator().manual_seed(3))
    got = got.cpu()
    assert got.dtype == dtype == want.dtype
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert same.all(), f"{int((~same).sum())} elements differ"
    assert torch.equal(wc, gc.cpu())


@pytest.mark.parametrize("name", ["fb12", "fb16", "fb24", "fb16:nearest", "fb16:stochastic"])
@pytest.mark.parametrize("shape", [(3, 20, 8, 8), (2, 13, 7, 10), (1, 12, 32, 32), (2, 30, 4, 4)], ids=str)
def test_strided_tiles_by_bands_equal_the_reference(name, shape):
    """BlockFloat's channel x 3x3 tiles over NCHW maps whose width the tiles cut (``bands.py``): ragged
    channel groups, tile rows and columns, every rounding, with counts; float32 and bfloat16."""
    base, _, rounding = name.partition(":")
    fmt = format_from_name(base)
    if rounding:
        fmt = dataclasses.replace(fmt, rounding=rounding)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(shape, generator=torch.Generator().manual_seed(7))
             * torch.exp2(torch.randint(-20, 20, shape, generator=torch.Generator().manual_seed(8)).float()))
        x.view(-1)[::97] = float("nan")
        x = x.to(dtype)
        want, wc = quantize_stats(x, fmt, backend="reference", generator=torch.Generator().manual_seed(3))
        got, gc = quantize_stats(x.to(DEVICE), fmt, backend="triton", generator=torch.Generator().manual_seed(3))
        got = got.cpu()
        view = torch.int32 if dtype == torch.float32 else torch.int16
        same = (got.view(view) == want.view(view)) | (got.isnan() & want.isnan())
        assert same.all(), f"{dtype}: {int((~same).sum())} elements differ"
        assert torch.equal(wc, gc.cpu())
