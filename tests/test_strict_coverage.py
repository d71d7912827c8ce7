"""``strict`` sees every matrix product a forward executes (recurrent modules, linalg and in-place
forms, dot products), the report shows FP32 GEMMs even without a convertible layer, converted
attention keeps nn.MultiheadAttention's public attributes, and TorchScript is refused (issue 47,
items 2 and 3)."""
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bfp import convert
from bfp.config import ConfigError
from bfp.conversion import COVERAGE, conversion_report

ROOT = Path(__file__).resolve().parents[1]
# any_nvfp4 on every layer (its @first/@last rules dropped): a float4 config that promises every GEMM
CFG = json.loads((ROOT / "conf_net" / "any_nvfp4.json").read_text())
CFG["rules"] = [r for r in CFG["rules"] if r["match"] not in ("@first", "@last")]


class Op(nn.Module):
    """One product computed by ``fn`` in the model's own forward, beside a Linear."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.lin = fn, nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + self.fn(x)


OPS = {
    "linalg.matmul": lambda x: torch.linalg.matmul(x, x.t())[:, :8],
    "addmm": lambda x: x.clone().addmm_(x, x.t()[:, :8] if x.shape[0] >= 8 else torch.eye(8)[: x.shape[1]]),
    "conv_tbc": lambda x: F.conv_tbc(x[:, None, :], torch.ones(1, 8, 8), torch.zeros(8))[:, 0, :],
    "dot": lambda x: torch.dot(x[0], x[1]).expand_as(x),
    "vdot": lambda x: torch.vdot(x[0], x[1]).expand_as(x),
    "inner": lambda x: torch.inner(x, x)[:, :1].expand_as(x),
    "linalg.vecdot": lambda x: torch.linalg.vecdot(x, x)[:, None].expand_as(x),
    "matrix_power": lambda x: torch.linalg.matrix_power(x, 3),  # issue 53, item 10
    "sparse.mm": lambda x: torch.sparse.mm(x.to_sparse(), x),
    "matrix_exp": lambda x: torch.linalg.matrix_exp(x * 0.01),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_strict_refuses_each_product_it_cannot_quantize(op):
    x = torch.randn(8, 8)
    with pytest.raises(ConfigError, match=rf"strict coverage: 1 GEMM\(s\) .*{op} in \(model\): {op} has no "):
        convert(Op(OPS[op]), CFG, example_input=x, strict=True)
    with pytest.warns(UserWarning, match="promises every GEMM, but 1 stay FP32"):
        model = convert(Op(OPS[op]), CFG, example_input=x)
    rep = conversion_report(model)
    assert "1 of 2 GEMMs quantized" in rep and f"FP32: {op} in (model)" in rep


@pytest.mark.parametrize("make", [lambda: nn.LSTM(8, 8), lambda: nn.GRU(8, 8), lambda: nn.RNN(8, 8),
                                  lambda: nn.LSTMCell(8, 8)])
def test_strict_refuses_recurrent_modules_naming_them(make):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = make(), nn.Linear(8, 2)

        def forward(self, x):
            out = self.rnn(x)
            out = out[0] if isinstance(out, tuple) else out
            return self.head(out)
    x = torch.randn(5, 8)
    name = type(make()).__name__
    with pytest.raises(ConfigError, match=rf"{name} in rnn: {name}'s GEMMs run inside one fused recurrent op"):
        convert(Net(), CFG, example_input=x, strict=True)
    with pytest.warns(UserWarning):
        model = convert(Net(), CFG, example_input=x)
    assert "1 of 2 GEMMs quantized" in conversion_report(model)


def test_a_model_without_convertible_layers_still_reports_its_fp32_gemms():
    class OnlyEinsum(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return torch.einsum("ij,jk->ik", x, self.w)
    with pytest.warns(UserWarning):
        model = convert(OnlyEinsum(), CFG, example_input=torch.randn(2, 4))
    rep = conversion_report(model)
    assert rep.startswith("no convertible layers") and "0 of 1 GEMMs quantized" in rep
    assert "FP32: einsum in (model)" in rep and model.__dict__[COVERAGE].quantized == 0


def test_a_converted_transformer_encoder_runs_quantized_in_eval():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(3, 5, 16)
    enc.eval()
    with torch.no_grad():
        fp32 = enc(x)
    for example in (None, x):
        model = convert(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), CFG, example_input=example)
        model.eval()
        attn = model.layers[0].self_attn
        assert attn.in_proj_weight is attn.qkv.weight and attn.in_proj_bias is attn.qkv.bias
        assert attn.out_proj is attn.proj and attn.num_heads == 2 and attn.embed_dim == 16 and attn.batch_first
        with torch.no_grad():
            out = model(x)  # torch's fused fast path would compute it in FP32 from in_proj_weight
        assert out.shape == fp32.shape and not torch.equal(out, fp32)
        assert (out - fp32).abs().max() < 1.0


def test_a_converted_encoder_takes_a_padding_mask_in_eval():
    """Issue 53, item 14: torch's encoder (enable_nested_tensor by default) packed a padded batch into
    a nested tensor in eval, which the replaced attention cannot take; now the batch stays one tensor."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    x, mask = torch.randn(3, 5, 16), torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3:] = mask[1, 4:] = True
    ref = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        fp32 = ref(x, src_key_padding_mask=mask)
    for example in (None, x):
        model = convert(nn.TransformerEncoder(layer, 2), CFG, example_input=example).eval()
        with torch.no_grad():
            out = model(x, src_key_padding_mask=mask)
        keep = ~mask
        assert not model.use_nested_tensor and out.shape == fp32.shape
        assert not torch.equal(out[keep], fp32[keep]) and (out[keep] - fp32[keep]).abs().max() < 1.0


def test_torchscript_submodules_are_refused_with_a_bfp_message():
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match=r"convert cannot convert TorchScript modules \(1: torch.jit.script"):
        convert(model, CFG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(model[1], torch.jit.ScriptModule)  # nothing was swapped


@pytest.mark.parametrize("op", [lambda a, b: torch.outer(a, b), lambda a, b: a.outer(b), lambda a, b: torch.ger(a, b),
                                lambda a, b: torch.addr(torch.zeros(a.numel(), b.numel()), a, b)])
def test_strict_refuses_an_outer_product(op):
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return op(self.fc(x)[0], x[0])
    x = torch.randn(2, 4)
    with pytest.raises(ConfigError, match=r"strict coverage: 1 GEMM\(s\) .*(outer|ger|addr) in \(model\): .* has no "
                                          r"quantized twin"):
        convert(Outer(), CFG, example_input=x, strict=True)
    with pytest.warns(UserWarning):
        model = convert(Outer(), CFG, example_input=x)
    assert "1 of 2 GEMMs quantized" in conversion_report(model)
