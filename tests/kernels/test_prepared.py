"""The prepared launches (``dispatch._fast``, issue 54's host path): after a format's first call on
a kind of tensor, ``bfp.quantize`` goes straight to the Triton launch prepared for it (rule, tile,
plan and view looked up once). Checked under ``TRITON_INTERPRET=1``: the second call takes that
path, and every call, prepared or not, gives the reference's bits (stochastic draws included)."""
import pytest
import torch

import bfp
from bfp.formats import NVFP4, Float, Rounding
from bfp.kernels import dispatch, nvfp4, runtime

pytestmark = pytest.mark.skipif(not __import__("bfp.kernels.triton_cuda", fromlist=["x"]).interpreted(),
                                reason="the Triton kernels run CPU tensors only under TRITON_INTERPRET=1")

FORMATS = {
    "fb16": bfp.format_from_name("fb16"),
    "e4m3": bfp.format_from_name("float8_e4m3fn"),
    "e4m3_sr": Float(4, 3, Rounding.STOCHASTIC),
    "mxfp8": bfp.format_from_name("mxfp8_e4m3"),
    "nvfp4": bfp.format_from_name("nvfp4"),
    "nvfp4_sr": bfp.format_from_name("nvfp4_sr"),
    "nvfp4_te": bfp.format_from_name("nvfp4_te"),
    "nvfp4_2d": NVFP4(block=(16, 16)),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32)


def _calls(monkeypatch) -> list:
    """Names of the slow path's steps as they run: the element rule's rule lookup, NVFP4's quantize."""
    seen = []
    rule_for, quantize = dispatch.rule_for, nvfp4.quantize
    monkeypatch.setattr(dispatch, "rule_for", lambda *a: seen.append("rule_for") or rule_for(*a))
    monkeypatch.setattr(nvfp4, "quantize", lambda *a: seen.append("nvfp4") or quantize(*a))
    return seen


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("stats", [False, True])
def test_the_second_call_takes_the_prepared_launch_and_equals_the_reference(name, stats, monkeypatch):
    fmt = FORMATS[name]
    x = torch.randn(8, 32, 4, 16) * torch.logspace(-3, 3, 16)
    x[0, 0, 0, :3] = torch.tensor([0.0, float("inf"), float("nan")])
    seen = _calls(monkeypatch)
    runs = []
    for _ in range(3):
        g = torch.Generator().manual_seed(11)
        runs.append(dispatch.quantize_stats(x, fmt, generator=g, backend="triton", stats=stats))
    assert len(seen) == 1  # the first call alone took the slow path
    ref, ref_counts = dispatch.quantize_stats(x, fmt, generator=torch.Generator().manual_seed(11),
                                              backend="reference", stats=stats)
    for out, counts in runs:
        assert torch.equal(_bits(out), _bits(ref))
        assert (counts is None) == (not stats)
        if stats:
            assert counts.tolist() == ref_counts.tolist()
    if "sr" in name:  # another draw, other bits: the keys are drawn on every prepared call
        other = bfp.quantize(x, fmt, generator=torch.Generator().manual_seed(12), backend="triton")
        assert not torch.equal(_bits(other), _bits(ref))


def test_tensors_the_launch_was_not_prepared_for_take_the_slow_path(monkeypatch):
    fmt = FORMATS["fb16"]
    x = torch.randn(4, 24, 6, 6)
    bfp.quantize(x, fmt, backend="triton")
    cases = {
        "transposed": (x.transpose(2, 3), fmt),                      # not contiguous
        "bfloat16": (x.bfloat16(), fmt),                             # another dtype
        "meta": (torch.empty(x.shape, device="meta"), fmt),          # shapes only
        "equal format": (torch.randn(x.shape), bfp.format_from_dict(fmt.to_dict())),  # equal, not the same object
    }
    refs = {what: bfp.quantize(t, f, backend="reference") for what, (t, f) in cases.items() if what != "meta"}
    seen = _calls(monkeypatch)
    for what, (t, f) in cases.items():
        out = bfp.quantize(t, f, backend="triton")
        assert out.shape == t.shape and out.dtype == t.dtype and out.device == t.device
        if what != "meta":
            assert torch.equal(_bits(out), _bits(refs[what])), what
    assert seen.count("rule_for") == 4  # each of them went the slow way


def test_a_tensor_that_requires_grad_keeps_its_straight_through_gradient():
    fmt = FORMATS["e4m3"]
    x = torch.randn(64, 16, requires_grad=True)
    bfp.quantize(x.detach(), fmt, backend="triton")  # prepared
    y = bfp.quantize(x, fmt, backend="triton")
    assert y.requires_grad and torch.equal(y.detach(), bfp.quantize(x.detach(), fmt, backend="reference"))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_registering_a_kernel_forgets_the_prepared_launches():
    fmt = FORMATS["e4m3"]
    bfp.quantize(torch.randn(33), fmt, backend="triton")
    assert any(v[0] is fmt for v in runtime.PREPARED.values())
    runtime.register("rule", "triton", runtime.KERNELS[("rule", "triton")])
    assert not runtime.PREPARED
