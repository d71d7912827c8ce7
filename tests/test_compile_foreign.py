"""torch.compile(fullgraph=True) of converted models nobody here wrote: Hugging Face
GPT-2, BERT and Llama, timm ViT and ResNet (configs, random init, no downloads), forward and
backward. AOTAutograd with eager kernels (``aot_eager``) runs the very graphs Inductor would be given,
so its outputs and gradients must equal eager bit for bit; one model also runs under Inductor
(within float32 reordering). Each model is shown quantized: its outputs differ from the FP32 model's."""
import pytest
import torch

from bfp.conversion import convert
from test_hf_models import MODELS, out_of

transformers = pytest.importorskip("transformers")


def llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg), torch.randint(0, 128, (2, 12))


FOREIGN = {"gpt2": MODELS["gpt2"], "bert": MODELS["bert"], "llama": llama, "timm_vit_tiny": MODELS["timm_vit_tiny"],
           "timm_resnet18": MODELS["timm_resnet18"]}


def _model(name, preset):
    torch.manual_seed(0)
    model, x = FOREIGN[name]()
    model.train()
    for m in model.modules():  # dropout draws differ between eager and a graph: off, to compare bits
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return (model if preset is None else convert(model, preset, example_input=x)), x


def _run(model, x, runner=None):
    model.zero_grad(set_to_none=True)
    y = out_of((model if runner is None else runner)(x)).float()
    (y.square().mean()).backward()
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset", ["any_fp8_e4m3", "any_mxfp8", "any_nvfp4"])
@pytest.mark.parametrize("name", list(FOREIGN))
def test_converted_foreign_models_compile_fullgraph_forward_and_backward_equal_to_eager(name, preset):
    if name == "timm_resnet18" and preset != "any_fp8_e4m3":
        pytest.skip("ResNet's convolutions: one preset is enough")
    model, x = _model(name, preset)
    y_eager, g_eager = _run(model, x)
    torch._dynamo.reset()
    y_comp, g_comp = _run(model, x, torch.compile(model, backend="aot_eager", fullgraph=True))
    assert torch.equal(y_comp, y_eager)
    assert g_comp.keys() == g_eager.keys() and all(torch.equal(g_comp[k], g_eager[k]) for k in g_eager)
    fp32, _ = _model(name, None)
    assert not torch.equal(out_of(fp32(x)).float().detach(), y_eager)  # quantization is on in the graph


def test_gpt2_converted_compiles_under_inductor_within_float_reordering():
    model, x = _model("gpt2", "any_fp8_e4m3")
    y_eager, g_eager = _run(model, x)
    torch._dynamo.reset()
    y_comp, g_comp = _run(model, x, torch.compile(model, fullgraph=True))
    assert torch.allclose(y_comp, y_eager, rtol=0.05, atol=0.05)
    assert g_comp.keys() == g_eager.keys()


def _copies(model, tmp_path):
    """What users compile besides the converted model itself: a deep copy (an EMA or teacher model,
    timm's ``ModelEmaV3``), and the whole model saved with ``torch.save`` and loaded again."""
    timm = pytest.importorskip("timm")
    torch.save(model, tmp_path / "model.pt")
    return {"deepcopy": __import__("copy").deepcopy(model),
            "ema": timm.utils.ModelEmaV3(model, decay=0.5).module,
            "reloaded": torch.load(tmp_path / "model.pt", weights_only=False)}


@pytest.mark.parametrize("name", ["gpt2", "timm_vit_tiny"])
def test_copies_of_a_converted_model_compile_and_compute_as_the_original(name, tmp_path):
    model, x = _model(name, "any_fp8_e4m3")
    y_eager, g_eager = _run(model, x)
    for how, other in _copies(model, tmp_path).items():
        assert other is not model
        torch._dynamo.reset()
        y_comp, g_comp = _run(other, x, torch.compile(other, backend="aot_eager", fullgraph=True))
        assert torch.equal(y_comp, y_eager), how
        assert g_comp.keys() == g_eager.keys() and all(torch.equal(g_comp[k], g_eager[k]) for k in g_eager), how
        y_copy, _ = _run(other, x)  # eager: the copy's products go through its own layers, not the original's
        assert torch.equal(y_copy, y_eager), how
        from bfp.routes import ROUTED
        assert not any(getattr(m, ROUTED, None) for m in model.modules())  # the original's routes never entered
