"""Models nobody here wrote: Hugging Face GPT-2, BERT and ViT, timm resnet18 and vit_tiny (configs,
random init, no downloads), converted by tracing one forward (bfp.trace, bfp.routes)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

from bfp.config import ConfigError
from bfp.conversion import conversion_report, convert
from bfp.layers import QMatmul, QTransposedLinear

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

FP32 = {"version": 1, "default": "full"}


def gpt2():
    cfg = transformers.GPT2Config(n_layer=3, n_head=2, n_embd=64, vocab_size=256, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg), torch.randint(0, 256, (2, 16))


def bert():
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=3)
    return transformers.BertForSequenceClassification(cfg), torch.randint(0, 128, (2, 12))


def hf_vit():
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, num_labels=10)
    return transformers.ViTForImageClassification(cfg), torch.randn(2, 3, 32, 32)


def timm_resnet():
    return timm.create_model("resnet18", pretrained=False, num_classes=10), torch.randn(2, 3, 32, 32)


def timm_vit():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=10), torch.randn(2, 3, 32, 32)


MODELS = {"gpt2": gpt2, "bert": bert, "hf_vit": hf_vit, "timm_resnet18": timm_resnet, "timm_vit_tiny": timm_vit}


def out_of(y):
    return y.logits if hasattr(y, "logits") else y


def made(name):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    return model.train(), x


@pytest.mark.parametrize("name", list(MODELS))
def test_every_gemm_is_quantized_but_the_first_and_last_executed(name):
    model, x = made(name)
    ref = copy.deepcopy(model).eval()
    model = convert(model, "any_fp8_e4m3", example_input=x)
    cov = model.bfp_coverage
    assert cov.uncovered == () and cov.quantized == len(cov.gemms) - 2
    fp32 = [g for g in cov.gemms if not g.quantized]
    assert [g.reason.split(":")[0] for g in fp32] == ["@first", "@last"]
    assert f"{cov.quantized} of {len(cov.gemms)} GEMMs quantized" in conversion_report(model)
    quantized = {n: m for n, m in model.named_modules() if getattr(m, "precision", None) is not None
                 and m.precision.enabled}
    ran = set()
    for n, m in quantized.items():
        m.register_forward_hook(lambda mod, a, o, n=n: ran.add(n))
    model.eval()
    with torch.no_grad():
        y = out_of(model(x))
        assert not torch.equal(y, out_of(ref(x)))
    assert ran == set(quantized) and len(quantized) == cov.quantized  # every quantized module runs in forward
    if name in ("gpt2", "bert", "hf_vit", "timm_vit_tiny"):  # every block's attention products
        blocks = {n.rpartition(".")[0] for n in quantized if n.endswith((".qk", ".pv"))}
        assert len(blocks) == (3 if name == "gpt2" else 2)


def test_gpt2_block_one_has_its_projections_and_both_products_quantized():
    model, x = made("gpt2")
    model = convert(model, "any_fp8_e4m3", example_input=x)
    block = model.transformer.h[1]
    q = [n for n, m in block.named_modules() if getattr(m, "precision", None) is not None and m.precision.enabled]
    assert sorted(q) == ["attn.c_attn", "attn.c_proj", "attn.pv", "attn.qk", "mlp.c_fc", "mlp.c_proj"]
    assert isinstance(block.attn.c_attn, QTransposedLinear) and isinstance(block.attn.qk, QMatmul)
    order = [g.layer for g in model.bfp_coverage.gemms]
    assert order[0] == "transformer.h.0.attn.c_attn" and order[-1] == "lm_head"  # execution order
    assert type(model.lm_head) is nn.Linear  # @last keeps FP32 (tied to the embedding)


@pytest.mark.parametrize("name", list(MODELS))
def test_quantization_off_is_bit_identical_gradients_included(name):
    model, x = made(name)
    model.eval()  # no dropout: both runs must see the same arithmetic
    ref = copy.deepcopy(model)
    model = convert(model, "any_fp8_e4m3", example_input=x)
    model = convert(model, FP32)  # Q-layers stay, quantization off
    assert any(isinstance(m, (QMatmul, QTransposedLinear)) for m in model.modules()) or name == "timm_resnet18"
    y, y_ref = out_of(model(x)), out_of(ref(x))
    assert torch.equal(y, y_ref)
    y.float().square().mean().backward()
    y_ref.float().square().mean().backward()
    for (n, p), (n2, p2) in zip(model.named_parameters(), ref.named_parameters()):
        assert n == n2 and (p.grad is None) == (p2.grad is None)
        assert p.grad is None or torch.equal(p.grad, p2.grad), n


@pytest.mark.parametrize("name", ["gpt2", "timm_vit_tiny"])
def test_three_training_steps_run(name):
    model, x = made(name)
    model = convert(model, "any_mxfp8", example_input=x)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        out_of(model(x)).float().square().mean().backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert sum(not torch.equal(a, b) for a, b in zip(before, model.parameters())) > 10


class Einsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        h = torch.einsum("ij,jk->ik", h, self.b.weight) @ h.t()  # an einsum and a matmul in this forward
        return self.c(h[:, :4])


def test_unsupported_ops_are_reported_and_strict_refuses_them():
    x = torch.randn(4, 4)
    with pytest.warns(UserWarning):
        model = convert(Einsum(), "any_fp8_e4m3", example_input=x)
    rep = conversion_report(model)
    assert "einsum in (model): einsum has no quantized twin" in rep
    # a and c are first and last, the matmul is quantized, the einsum is not; b never runs as a module
    assert "1 of 4 GEMMs quantized, 25.0% of the forward's 256 multiply-adds (traced forward of 4x4 float32)" in rep
    assert "einsum has no quantized twin (compute it with torch.matmul or a module to have it routed) (25.0% of the "\
           "multiply-adds)" in rep
    with pytest.raises(ConfigError, match=r"strict coverage: 1 GEMM\(s\) .*einsum in \(model\)"):
        convert(Einsum(), "any_fp8_e4m3", example_input=x, strict=True)
    with pytest.raises(ValueError, match="needs an example input"):
        convert(Einsum(), "any_fp8_e4m3", strict=True)


def test_a_preset_that_promises_every_gemm_warns_when_it_misses_one():
    with pytest.warns(UserWarning, match="promises every GEMM, but 1 stay FP32"):
        convert(Einsum(), "any_fp8_e4m3", example_input=torch.randn(4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), "any_fp8_e4m3", example_input=torch.randn(2, 4))


def test_module_filter_keeps_layers_in_fp32_and_says_so():
    model, x = made("gpt2")
    model = convert(model, "any_fp8_e4m3", example_input=x,
                    module_filter=lambda module, fqn: not fqn.endswith("mlp.c_fc"))
    assert all(not isinstance(b.mlp.c_fc, QTransposedLinear) for b in model.transformer.h)
    assert "module_filter returned False" in conversion_report(model)
    with pytest.raises(ValueError, match="module_filter must be a callable"):
        convert(nn.Linear(2, 2), "any_fp8_e4m3", module_filter="mlp")


def test_a_naive_block_format_rule_on_a_matmul_is_refused_naming_the_point():
    model, x = made("gpt2")
    with pytest.raises(ConfigError, match=r"point fw: MX blocks lie along axis -1, but this point's GEMM "
                                          r"contracts along axis -2"):
        convert(model, {"version": 1, "rules": [{"match": "*", "types": ["Matmul"],
                                                 "precision": "mxfp8_e4m3"}]}, example_input=x)
    assert not any(isinstance(m, QMatmul) for m in model.modules())  # refused before anything was swapped


def test_a_shared_module_called_twice_is_one_site():
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.ReLU(), lin, nn.Linear(4, 2))
    model = convert(model, "any_fp8_e4m3", example_input=torch.randn(2, 4))
    assert [g.layer for g in model.bfp_coverage.gemms] == ["0", "3"]
