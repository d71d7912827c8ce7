"""FP8 current scaling (bfp.Scaled) bit-exact against an oracle written from torchao's dynamic
scaling rule: NumPy float32 for amax, scale, x * scale and q / scale, ml_dtypes for the FP8 cast;
per tensor and per row, with and without power-of-two scales; zeros, subnormals, NaN/Inf, amax
at float32's ends."""
import ml_dtypes
import numpy as np
import pytest
import torch

from bfp import Scaled, format_from_name, quantize
from bfp.config.specs import parse_format
from bfp.formats import format_from_dict
from test_kernels import BACKENDS, assert_same_bits

F32 = np.float32
DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def oracle(x: np.ndarray, el: str, rows: bool, pow2: bool) -> np.ndarray:
    top = F32(float(ml_dtypes.finfo(DTYPES[el]).max))
    a = np.where(np.isfinite(x), np.abs(x), F32(0)).astype(F32)
    amax = a.max(axis=-1, keepdims=True) if rows else np.full((1, 1), a.max(), F32)
    with np.errstate(over="ignore"):  # top / a subnormal amax overflows to inf, then float32's max
        scale = np.where(amax > 0, top / np.maximum(amax, F32(np.finfo(F32).tiny)), F32(1)).astype(F32)
    scale = np.minimum(scale, F32(np.finfo(F32).max))
    if pow2:
        scale = np.exp2(np.floor(np.log2(scale.astype(np.float64)))).astype(F32)
    y = np.clip((x * scale).astype(F32), -top, top)
    q = y.astype(DTYPES[el]).astype(F32)
    return (q / scale).astype(F32)


def _cases():
    g = torch.Generator().manual_seed(4)
    rand = torch.randn(12, 40, generator=g) * torch.exp2(torch.randint(-30, 30, (12, 40), generator=g).float())
    edge = torch.tensor([[1.0, -448.0, 449.0, 1e-3, 0.0, -0.0, 3e-9, 2.0 ** -20],
                         [0.0] * 8,
                         [1e-40, -3e-41, 2e-45, 0.0, 7e-39, 1e-42, 0.0, 1e-44],
                         [3e38, -1e38, 1.0, 0.0, 2.0, 5.0, 7.0, 9.0],
                         [1.0, float("nan"), 5.0, 0.5, -2.0, 0.25, 3.0, 1.5]])
    return [rand, edge, torch.zeros(2, 4)]


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("el", ["e4m3", "e5m2"])
def test_current_scaling_matches_the_rule(el, rows, pow2):
    fmt = Scaled(format_from_name(el), "row" if rows else "tensor", -1, pow2)
    for x in _cases():
        want = torch.from_numpy(oracle(x.numpy(), el, rows, pow2))
        for backend in BACKENDS:
            assert_same_bits(quantize(x, fmt, backend=backend), want)


def test_inf_saturates_nan_stays_and_the_scale_uses_finite_values_only():
    x = torch.tensor([[float("inf"), 1.0, float("nan"), -float("inf")]])
    out = quantize(x, Scaled(format_from_name("e4m3")))
    assert out[0, 0] == 1.0 and out[0, 1] == 1.0 and torch.isnan(out[0, 2]) and out[0, 3] == -1.0


def test_power_of_two_scales_make_the_scaling_exact():
    """With pow2 only the FP8 rounding remains: values already on the FP8 grid come back unchanged."""
    x = torch.tensor([[1.5, 0.75, -3.0, 0.0625]])
    assert torch.equal(quantize(x, Scaled(format_from_name("e4m3"), pow2=True)), x)


def test_names_dicts_configs_and_bad_values():
    f = format_from_name("fp8_e4m3_rowwise_pow2")
    assert f == Scaled(format_from_name("e4m3"), "row", -1, True) and format_from_dict(f.to_dict()) == f
    assert parse_format({"scaled": "e5m2", "granularity": "row"}) == format_from_name("fp8_e5m2_rowwise")
    assert parse_format({"name": "fp8_e4m3_tensorwise", "rounding": "stochastic"}).rounding.value == "stochastic"
    with pytest.raises(ValueError, match="Scaled granularity 'block' unknown; allowed: tensor, row"):
        Scaled(format_from_name("e4m3"), "block")
    with pytest.raises(ValueError, match="Scaled needs a Float format"):
        Scaled(format_from_name("fb16"))
    with pytest.raises(ValueError, match="Scaled axis 3 is out of range"):
        quantize(torch.ones(2, 2), Scaled(format_from_name("e4m3"), "row", 3))


def test_delayed_scaling_uses_the_history_of_earlier_roundings_and_saturates_above_it(monkeypatch):
    import bfp.kernels as bk
    from bfp import LayerPrecision
    from bfp.layers import QLinear
    layer = QLinear(6, 2, bias=False, precision=LayerPrecision(fi=Scaled(format_from_name("e4m3"), history=3)))
    got, real = [], bk.delayed  # the layer's forward calls bfp.quantize with the point's history as state
    monkeypatch.setattr(bk, "delayed", lambda *a: got.append(real(*a)) or got[-1])
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 6, generator=g) * s for s in (1.0, 50.0, 0.5, 3.0, 0.1)]
    amaxes = []
    for x in xs:
        layer(x)
        prev = max(amaxes[-3:]) if amaxes else F32(0)  # the scale comes from the earlier roundings only
        scale = F32(448) / prev if prev > 0 else F32(1)
        y = np.clip((x.numpy() * scale).astype(F32), F32(-448), F32(448))
        want = (y.astype(ml_dtypes.float8_e4m3fn).astype(F32) / scale).astype(F32)
        assert_same_bits(got[-1], torch.from_numpy(want))
        amaxes.append(np.abs(x.numpy()).max())
    assert layer.amax_history_fi.tolist() == amaxes[::-1][:3]
    assert float(got[1].abs().max()) < float(xs[1].abs().max())  # 50x after a 1x history: saturated
    layer.eval()  # evaluation reads the history, never moves it
    before = layer.amax_history_fi.clone()
    layer(xs[0] * 1000)
    assert torch.equal(layer.amax_history_fi, before)


def test_delayed_scaling_needs_a_layer_and_is_per_tensor():
    with pytest.raises(ValueError, match="delayed scaling: its amax history is state of a quantized layer"):
        quantize(torch.ones(3), format_from_name("fp8_e4m3_delayed"))
    with pytest.raises(ValueError, match=r"pass state= a float32 tensor of length 16 \(got \(3,\)\)"):
        quantize(torch.ones(3), format_from_name("fp8_e4m3_delayed"), state=torch.zeros(3))
    hist = torch.tensor([2.0] + [0.0] * 15)  # a history given by hand: scale 448 / 2, then x's amax enters
    out = quantize(torch.tensor([1.0, -4.0]), format_from_name("fp8_e4m3_delayed"), state=hist, update_state=True)
    assert out.tolist() == [1.0, -2.0] and hist[:2].tolist() == [4.0, 2.0]
    with pytest.raises(ValueError, match="delayed scaling\\) is per tensor"):
        Scaled(format_from_name("e4m3"), "row", history=4)
    f = format_from_name("fp8_e5m2_delayed")
    assert f.history == 16 and format_from_dict(f.to_dict()) == f


def test_delayed_scaling_histories_are_checkpointed_and_a_resume_is_bit_exact(tiny_args, tmp_path):
    import shutil
    from bfp.cli import cifar as main
    from bfp.engine import checkpoint as ckpt
    args = tiny_args("--training-epochs", "2", "--save", "True", "--save-interval", "1", "--bfp", "any_fp8_delayed",
                     "--run-name", "a")
    assert main(args) == 0
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    shutil.copytree(a, b)
    (b / "checkpoints" / "last.pt").unlink()
    assert main([*tiny_args(), "--resume", str(b / "checkpoints" / "epoch_001.pt")]) == 0
    straight, resumed = (ckpt.load(d / "checkpoints" / "last.pt")["model"] for d in (a, b))
    hist = [k for k in straight if "amax_history_" in k]
    assert hist and any(straight[k].abs().sum() > 0 for k in hist)
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    first = ckpt.load(a / "checkpoints" / "epoch_001.pt")["model"]
    assert any(not torch.equal(first[k], straight[k]) for k in hist)  # epoch 2 moved the histories


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("pow2", [False, True])
def test_fused_cpu_tensorwise_kernel_equals_the_pytorch_steps(rounding, pow2):
    """The CPU path (amax and scale-round-unscale fused in Numba) against the PyTorch steps
    (backend="reference"), stochastic draws included; NaN, Inf and zeros in the tensor."""
    from bfp import Float, Scaled
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 700, generator=g) * torch.exp2(torch.randint(-30, 30, (300, 700), generator=g).float())
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    fmt = Scaled(Float(4, 3, rounding=rounding, encoding="fn"), pow2=pow2)
    ref = quantize(x, fmt, generator=torch.Generator().manual_seed(5), backend="reference")
    cpu = quantize(x, fmt, generator=torch.Generator().manual_seed(5), backend="cpu")
    assert_same_bits(cpu, ref)
