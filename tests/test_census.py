"""The coverage report cannot miss a GEMM: every GEMM the dispatcher runs in the traced forward
(counted here by a dispatch mode of the test's own) is one of the report's entries, with its
multiply-adds; expert GEMMs of Hugging Face MoE models, whatever their experts_implementation,
and opaque custom ops are named, and strict refuses them."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import bfp
from bfp.census import GemmCensus
from bfp.config import ConfigError
from bfp.conversion import COVERAGE

transformers = pytest.importorskip("transformers")


class Count(TorchDispatchMode):
    """The test's own census: products of aten GEMM ops (an attention kernel is two)."""

    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "convolution"):
            self.products += 1
        elif "scaled_dot_product" in name:
            self.products += 2
        return func(*args, **(kwargs or {}))


def _census(fn, *args):
    c = GemmCensus(lambda op: op)
    with torch.no_grad(), c:
        fn(*args)
    return [(r.op, r.products, r.macs) for r in c.records]


def test_multiply_adds_from_the_shapes():
    a, b, w3 = torch.randn(6, 5), torch.randn(5, 7), torch.randn(3, 5, 7)
    assert _census(torch.mm, a, b) == [("aten.mm", 1, 6 * 5 * 7)]
    assert _census(lambda: torch.addmm(torch.zeros(7), a, b)) == [("aten.addmm", 1, 6 * 5 * 7)]
    assert _census(torch.bmm, torch.randn(3, 6, 5), w3) == [("aten.bmm", 1, 3 * 6 * 5 * 7)]
    assert _census(lambda: torch.einsum("bik,bkj->bij", torch.randn(3, 6, 5), w3)) == [("aten.bmm", 1, 3 * 6 * 5 * 7)]
    assert _census(lambda: F.conv2d(torch.randn(2, 4, 9, 9), torch.randn(8, 2, 3, 3), groups=2)) == \
        [("aten.convolution", 1, 2 * 8 * 7 * 7 * (2 * 3 * 3))]
    assert _census(lambda: F.conv_transpose2d(torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3))) == \
        [("aten.convolution", 1, 2 * 4 * 5 * 5 * (3 * 3 * 3))]
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    for v in (v, torch.randn(2, 3, 6, 8)):  # the math path's two bmm, or one fused kernel of two products
        got = _census(F.scaled_dot_product_attention, q, k, v)
        assert sum(p for _, p, _ in got) == 2 and sum(m for _, _, m in got) == 2 * 3 * 4 * 6 * (8 + v.shape[-1])
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # 2 tokens, none, 4 tokens (rows 16-byte aligned)
    assert _census(lambda: torch._grouped_mm(torch.randn(6, 8), torch.randn(3, 8, 4), offs=offs)) == \
        [("aten._grouped_mm", 1, 6 * 8 * 4)]


def _moe(impl):
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, max_position_embeddings=32, decoder_sparse_step=1)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    model.set_experts_implementation(impl)
    return model, torch.randint(0, 64, (2, 8))


@pytest.mark.parametrize("impl", ["grouped_mm", "eager", "batched_mm"])
def test_every_gemm_of_a_moe_model_is_in_the_report(impl):
    model, ids = _moe(impl)
    count = Count()
    with torch.no_grad(), count:
        model(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = bfp.convert(model, "any_fp8_e4m3", example_input=ids)
    cov = q.__dict__[COVERAGE]
    assert len(cov.gemms) == count.products  # one entry a product: none missed
    assert all(g.macs is not None and g.macs > 0 for g in cov.gemms)
    experts = [g for g in cov.gemms if ".mlp.experts" in g.what]
    if impl == "batched_mm":  # routed bmm: quantized
        assert len(experts) == 4 and all(g.quantized for g in experts)
    else:  # the expert GEMMs are named, uncovered, with their share of the work
        assert len(experts) == (4 if impl == "grouped_mm" else 16) and not any(g.quantized for g in experts)
        report = bfp.conversion_report(q)
        assert ("aten._grouped_mm in model.layers.0.mlp.experts: a grouped GEMM" in report) == (impl == "grouped_mm")
        share = sum(g.macs for g in experts) / cov.total_macs
        assert share > 0.35 and "% of the multiply-adds)" in report
        with pytest.raises(ConfigError, match="strict coverage"):
            bfp.convert(_moe(impl)[0], "any_fp8_e4m3", example_input=ids, strict=True)


def test_an_opaque_custom_op_is_named_never_counted_as_nothing():
    @torch.library.custom_op("bfptest::opaque_gemm", mutates_args=())
    def opaque_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3, self.w = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), \
                nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return self.fc3(opaque_gemm(self.fc2(self.fc1(x)), self.w))
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="promises every GEMM"):
        q = bfp.convert(Net(), "any_fp8_e4m3", example_input=x)
    report = bfp.conversion_report(q)
    assert "FP32: bfptest.opaque_gemm in (model): bfptest.opaque_gemm is an opaque custom op" in report
    assert "(opaque: its multiply-adds cannot be counted)" in report
    with pytest.raises(ConfigError, match="bfptest.opaque_gemm"):
        bfp.convert(Net(), "any_fp8_e4m3", example_input=x, strict=True)
