"""One conformance suite over every backend: each format family and preset, each rounding, shapes
whose tiles do and do not divide, 1-D and 2-D blocks, one element, zero, subnormal, Inf and NaN
tiles and both signs of zero: bit-exact against the PyTorch reference, with the same counts.

The Triton backend runs on CUDA tensors where a GPU is present and otherwise under Triton's
interpreter on CPU tensors (``tests/conftest.py`` sets ``TRITON_INTERPRET=1``): its kernels are
integer-only (or, the accumulators, exact float64), so the interpreter computes the bits a GPU
does. Every family, the Hadamard transform, the tensor-core accumulators and the in-place roundings
have Triton kernels; ``test_triton_runs_these_without_the_reference`` and the Hadamard test show
they never reach the PyTorch reference.
"""
import dataclasses

import pytest
import torch

from bfp import BlockFloat, Float, MX, format_from_name, format_names
from bfp.formats import Rounding
from bfp.formats.nvfp4 import NVFP4
from bfp.kernels import quantize_stats
from bfp.kernels.dispatch import BACKENDS

DEVICE = {"reference": "cpu", "cpu": "cpu", "triton": "cuda" if torch.cuda.is_available() else "cpu"}
FAST = [b for b in BACKENDS if b != "reference"]


def _edge_rows(width: int) -> torch.Tensor:
    """Rows that make whole tiles of one kind: zeros, ±0, subnormals, Inf, NaN, a max, ties."""
    rows = [[0.0] * width, [-0.0, 0.0] * (width // 2), [1e-40, -3e-41, 2e-45, 0.0] * (width // 4),
            [float("inf"), 1.0, -2.0, 0.5] * (width // 4), [float("nan"), 3.0, -0.0, 7.0] * (width // 4),
            [3.4e38, -3.0e38, 1.0, 0.0] * (width // 4), [0.375, 0.75, 1.5, 2.5] * (width // 4),
            [float("-inf")] * width]
    return torch.tensor(rows, dtype=torch.float32)


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    return [torch.tensor(-3.3), torch.tensor([1.75]), torch.tensor(-0.0).reshape(1), rand(7, 33), rand(4, 12, 3, 3), rand(2, 5, 17),
            rand(3, 70), rand(32, 48), _edge_rows(32), _edge_rows(64).reshape(2, 16, 16)]


INPUTS = _inputs()


def _variants(fmt):
    """The format with each rounding it can take (and MX's four scale modes)."""
    out = [fmt]
    for r in Rounding:
        try:
            if isinstance(fmt, MX):
                out.append(dataclasses.replace(fmt, element=dataclasses.replace(fmt.element, rounding=r)))
            elif hasattr(fmt, "rounding"):
                out.append(dataclasses.replace(fmt, rounding=r))
        except (TypeError, ValueError):
            pass
    if isinstance(fmt, MX):
        out += [dataclasses.replace(fmt, scale_mode=m) for m in ("ceil", "even", "rceil")]
    return list(dict.fromkeys(out))


EXTRA = [BlockFloat(5, (2, 3), "nearest"), BlockFloat(6, (1, 4, 2, 3), "stochastic"), BlockFloat(8, (64,), "nearest"),
         BlockFloat(4, (1, 4096), "truncate"), Float(4, 3, "stochastic", encoding="fn"), Float(3, 0),
         MX("float6_e3m2fn", block=8, axis=1), MX("float8_e4m3fn", block=(4, 3), axis=-1, scale_mode="rceil"),
         MX(Float(3, 0, encoding="finite"), block=8), MX("int8", block=4, scale_mode="even"),
         NVFP4(block=(16, 16)), NVFP4(axis=0), NVFP4(block=8, tensor_scale=False),
         NVFP4(block=(4, 8), axis=1, rounding="stochastic"), NVFP4(axis=0, convention="te"),
         NVFP4(block=(16, 16), axis=1, convention="te", rounding="stochastic")]
PRESETS = [n for n in format_names() if "delayed" not in n]


def _same(fmt, backend: str, fails: list) -> None:
    for x in INPUTS:
        try:
            want = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(9), backend="reference")
        except ValueError:  # a shape the format cannot tile (an NVFP4 axis it lacks): refused alike
            with pytest.raises(ValueError):
                quantize_stats(x.to(DEVICE[backend]), fmt, backend=backend)
            continue
        got = quantize_stats(x.to(DEVICE[backend]), fmt, generator=torch.Generator().manual_seed(9), backend=backend)
        if not (torch.equal(want[0].view(torch.int32), got[0].cpu().view(torch.int32))
                and torch.equal(want[1], got[1].cpu())):
            fails.append(f"{fmt!r} on {tuple(x.shape)}: counts {want[1].tolist()} vs {got[1].tolist()}")


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_and_rounding_is_bit_exact_with_the_reference(name, backend):
    fails: list = []
    for fmt in _variants(format_from_name(name)):
        _same(fmt, backend, fails)
    assert not fails, "\n".join(fails[:10])


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("fmt", EXTRA, ids=repr)
def test_other_tiles_blocks_and_elements_are_bit_exact_with_the_reference(fmt, backend):
    fails: list = []
    _same(fmt, backend, fails)
    assert not fails, "\n".join(fails[:10])


def test_the_suite_covers_every_registered_family_and_backend():
    from bfp.formats.base import kernel_families
    families = {type(format_from_name(n)) for n in PRESETS} | {type(f) for f in EXTRA}
    assert set(kernel_families()) <= families | {type(format_from_name("fp8_e4m3_delayed"))}
    assert set(FAST) == {"cpu", "triton"}


@pytest.mark.parametrize("backend", FAST)
def test_an_empty_tensor_and_a_meta_tensor_are_handled_alike(backend):
    fmt = format_from_name("fb16")
    out, counts = quantize_stats(torch.empty(0, 4, device=DEVICE[backend]), fmt, backend=backend)
    assert out.shape == (0, 4) and counts.tolist() == [0, 0]
    out, counts = quantize_stats(torch.empty(2, 4, device="meta"), fmt, backend=backend)
    assert out.device.type == "meta" and out.shape == (2, 4)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_delayed_scaling_on_the_triton_backend_equals_the_reference_and_moves_the_history_alike(rounding):
    from bfp.kernels.dispatch import delayed
    fmt = dataclasses.replace(format_from_name("fp8_e4m3_delayed"),
                              fmt=dataclasses.replace(format_from_name("float8_e4m3fn"), rounding=rounding))
    for x in (INPUTS[2] * 1e3, INPUTS[6], INPUTS[8], torch.randn(5000) * 1e3):  # -0; random; Inf/NaN rows; many programs
        hist = {b: torch.tensor([0.0] + [37.5] * (fmt.history_length - 1)) for b in ("cpu", "triton")}
        for step in range(3):
            xs = x * (step + 1)
            outs = {b: delayed(xs.to(DEVICE[b]), fmt, hist[b], torch.Generator().manual_seed(step), True,
                               backend=b).cpu() for b in hist}
            assert torch.equal(outs["cpu"].view(torch.int32), outs["triton"].view(torch.int32))
            assert torch.equal(hist["cpu"], hist["triton"].cpu())
            finite = xs[torch.isfinite(xs)].abs()  # the entry the step adds: the largest finite magnitude
            assert hist["triton"][0].item() == (finite.max().item() if finite.numel() else 0.0)
        before = hist["triton"].clone()
        delayed(x.to(DEVICE["triton"]), fmt, hist["triton"], None, False, backend="triton")
        assert torch.equal(hist["triton"], before)  # evaluation reads the history only


@pytest.mark.parametrize("name", ["fp8_e4m3_rowwise", "fp8_e5m2_rowwise_pow2"])
def test_rowwise_scaling_in_one_triton_pass_equals_the_reference_on_every_axis_and_row_length(name):
    fmt = format_from_name(name)
    fails: list = []
    for f in (fmt, dataclasses.replace(fmt, fmt=dataclasses.replace(fmt.fmt, rounding="stochastic"))):
        for x in (torch.randn(3, 4, 100) * 1e3, torch.randn(2, 5000), INPUTS[8]):  # fused; a long row; edge rows
            _check(f, x, fails)
        for axis in (0, 1):  # lines along an axis that is not the last: strided, short and long
            for x in (torch.randn(3, 40, 5) * 1e3, torch.randn(2, 4500, 3)):
                _check(dataclasses.replace(f, axis=axis), x, fails)
    assert not fails, fails


def _check(f, x, fails):
    want = quantize_stats(x, f, generator=torch.Generator().manual_seed(2), backend="reference")
    got = quantize_stats(x.to(DEVICE["triton"]), f, generator=torch.Generator().manual_seed(2), backend="triton")
    if not (torch.equal(want[0].view(torch.int32), got[0].cpu().view(torch.int32))
            and torch.equal(want[1], got[1].cpu())):
        fails.append(f"{f!r} {tuple(x.shape)}")


def test_triton_runs_these_without_the_reference(monkeypatch):
    """NVFP4 (both conventions, 1-D and 2-D blocks) and Scaled (tensorwise, rowwise on any axis) run
    the Triton kernels: the PyTorch references they would fall back on are made to raise."""
    import bfp.kernels.nvfp4 as nv
    import bfp.kernels.scaled as sc

    def refuse(*a, **k):
        raise AssertionError("the reference ran")
    for mod, name in ((nv, "reference"), (nv, "quantize_te"), (sc, "prepare"), (sc, "tensorwise")):
        monkeypatch.setattr(mod, name, refuse)
    x = torch.randn(4, 32, 48).to(DEVICE["triton"])
    for fmt in (NVFP4(), NVFP4(block=(16, 16)), NVFP4(convention="te"), NVFP4(block=(16, 16), convention="te"),
                NVFP4(axis=0, rounding="stochastic"), format_from_name("fp8_e4m3_tensorwise"),
                dataclasses.replace(format_from_name("fp8_e4m3_rowwise"), axis=1)):
        quantize_stats(x, fmt, generator=torch.Generator().manual_seed(1), backend="triton")


@pytest.mark.parametrize("block", [4, 16])
def test_the_hadamard_transform_alone_and_fused_into_nvfp4_on_triton_equals_the_reference(block, monkeypatch):
    """``transform_rows`` and ``transform_quantize`` (NVFP4 along the rows, nearest and stochastic) on
    the Triton backend: bit for bit the PyTorch steps, on rows that do and do not fill whole blocks,
    with Inf, NaN, zero and subnormal values, and never through the reference."""
    from bfp import hadamard as H
    from bfp.precision import Hadamard
    rht = Hadamard(block, 3)
    edge = _edge_rows(16).t().contiguous()  # each column one kind of row: zeros, Inf, NaN, subnormal ...
    cases = [INPUTS[3], INPUTS[5] * 3, edge, torch.randn(2, 40, 33) * 100, torch.zeros(20, 3)]
    fails = []
    for x in cases:
        want = H.reference_rows(x, rht)
        got = H.transform_rows(x.to(DEVICE["triton"]), rht, backend="triton").cpu()
        if not torch.equal(want.view(torch.int32), got.view(torch.int32)):
            fails.append(f"rows {tuple(x.shape)}")
        for rounding in ("nearest", "stochastic"):
            fmt = NVFP4(block=block, axis=-2, rounding=rounding)
            ref = quantize_stats(want, fmt, generator=torch.Generator().manual_seed(4), backend="reference")[0]
            with monkeypatch.context() as m:
                m.setattr(H, "reference_rows", lambda *a: (_ for _ in ()).throw(AssertionError("reference ran")))
                out = H.transform_quantize(x.to(DEVICE["triton"]), rht, fmt, torch.Generator().manual_seed(4),
                                           backend="triton").cpu()
            if not torch.equal(ref.view(torch.int32), out.view(torch.int32)):
                fails.append(f"nvfp4 {rounding} {tuple(x.shape)}")
    assert not fails, fails


def test_the_tensor_core_accumulators_on_triton_equal_the_reference():
    """Every accumulator preset (FP8, FP16, BF16, TF32; truncating and, as a variant, rounding to
    nearest with product exponents and the accumulator outside the alignment) on the Triton
    backend, bit for bit the float64 reference: K that does and does not fill whole steps, K = 0,
    promotion every 128, an all-zero row, Inf and NaN operands."""
    from bfp.tensorcore import FUSED_PRESETS, fused_bmm
    g = torch.Generator().manual_seed(0)
    fails = []
    for name, acc in FUSED_PRESETS.items():
        cast = torch.float8_e4m3fn if "fp8" in name else torch.float16
        for B, M, K, N in ((2, 3, 40, 5), (1, 5, 300, 3), (1, 4, 0, 3)):
            a = (torch.randn(B, M, K, generator=g) * 4).to(cast).float()
            b = torch.randn(B, K, N, generator=g).to(cast).float()
            if K:
                a[0, 0] = 0.0
                a[0, -1, 3], b[0, 2, 0] = float("inf"), float("nan")
            for v in (acc, dataclasses.replace(acc, align_rounding="nearest", sum_rounding="nearest",
                                               product_exponent="product", accumulator_in_alignment=False)):
                want = fused_bmm(a, b, v, backend="reference")
                got = fused_bmm(a.to(DEVICE["triton"]), b.to(DEVICE["triton"]), v, backend="triton").cpu()
                if not torch.equal(want.view(torch.int32), got.view(torch.int32)):
                    fails.append(f"{name} {(B, M, K, N)} {v is acc}")
    assert not fails, fails


def test_an_all_zero_step_of_a_v100_accumulator_is_zero_not_nan():
    """v100_fp16 aligns no lower than 2**-1024: a step of zeros once scaled by 2**1047, infinite in
    float64, and 0 * inf made the output NaN (a ReLU's zero row). Every backend gives +0 now."""
    from bfp.tensorcore import FUSED_PRESETS, fused_bmm
    a, b = torch.zeros(1, 2, 8), torch.ones(1, 8, 3)
    a[0, 0, 0] = 1.0
    for backend in ("reference", "kernel", "triton"):
        out = fused_bmm(a, b, FUSED_PRESETS["v100_fp16"], backend=backend)
        assert out.tolist() == [[[1.0] * 3, [0.0] * 3]], backend


@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "truncate"])
def test_the_in_place_roundings_on_triton_equal_their_expressions(rounding):
    """``quantize_`` and ``add_quantize_`` (the accumulators' running sums) on the Triton backend:
    ``x.copy_(quantize(x))`` and ``s.copy_(quantize(s + t))`` bit for bit, Inf and NaN included."""
    from bfp.kernels.inplace import add_quantize_, quantize_
    fmt = Float(5, 10, rounding) if rounding != "stochastic" else Float(4, 3, "stochastic", encoding="fn")
    s0, t0 = INPUTS[7].clone(), INPUTS[7].flip(0) * 0.37
    s0[0, :3] = torch.tensor([float("inf"), float("nan"), -0.0])
    t0[0, :3] = torch.tensor([float("-inf"), 1.0, 0.0])
    dev = DEVICE["triton"]
    x = s0.clone().to(dev)
    quantize_(x, fmt, generator=torch.Generator().manual_seed(3), backend="triton")
    want = quantize_stats(s0, fmt, generator=torch.Generator().manual_seed(3), backend="reference")[0]
    assert torch.equal(x.cpu().view(torch.int32), want.view(torch.int32))
    s, t = s0.clone().to(dev), t0.clone().to(dev)
    add_quantize_(s, t, fmt, generator=torch.Generator().manual_seed(4), backend="triton")
    want = quantize_stats(s0 + t0, fmt, generator=torch.Generator().manual_seed(4), backend="reference")[0]
    assert torch.equal(s.cpu().view(torch.int32), want.view(torch.int32))
