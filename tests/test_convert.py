"""Model conversion: shipped presets on the models they target, in-place
re-conversion, reports, precision state and generated configs."""
import copy
import json

import pytest
import torch
import torch.nn as nn

import bfp
import bfp.models
from bfp.config import ConfigError, load_config, preset_names
from bfp.conversion import (conversion_report, convert, convertible_layers, generate_config,
                         load_precision_state, precision_state)
from bfp.formats import BlockFloat, format_from_name
from bfp.formats.mx import MX
from bfp.layers import Matmul, QConv1d, QConv2d, QLinear, QMatmul
from bfp.precision import LayerPrecision

FB = {12: BlockFloat(4, (1, 24, 3, 3)), 16: BlockFloat(8, (1, 12, 3, 3)), 24: BlockFloat(16, (1, 6, 3, 3))}
RESNET18_PRESETS = {"FB12": (12, 12), "FB16": (16, 16), "FB24": (24, 24),
                    "FB12LG16": (12, 16), "FB12LG24": (12, 24), "FB16LG24": (16, 24)}
RESNET18_FP32 = ["conv1", "layer2.0.shortcut.0", "layer3.0.shortcut.0", "layer4.0.shortcut.0", "linear"]


def model(name="ResNet18"):
    torch.manual_seed(0)
    return bfp.models.create(name, num_classes=10)


def formats(m, name):
    return m.get_submodule(name).precision


@pytest.mark.parametrize("preset", list(RESNET18_PRESETS))
def test_resnet18_presets_exact_formats(preset):
    fwd, bwd = (FB[b] for b in RESNET18_PRESETS[preset])
    m = convert(model(), f"ResNet18_{preset}")
    for name, t in convertible_layers(m).items():
        mod = m.get_submodule(name)
        if name in RESNET18_FP32:
            assert type(mod) in (nn.Conv2d, nn.Linear), name
            continue
        p = mod.precision
        assert isinstance(mod, QConv2d)
        assert (p.fw, p.fi, p.bwo, p.bwi) == (fwd,) * 4, name
        assert (p.bio, p.biw) == (bwd,) * 2, name
        assert p.fo is p.bwg is p.big is None and p.accumulator is None
    assert sum(isinstance(x, QConv2d) for x in m.modules()) == 16


def test_fb12lg16_named_layers():
    m = convert(model(), "ResNet18_FB12LG16")
    p = formats(m, "layer1.0.conv1")
    assert p.fw == BlockFloat(4, (1, 24, 3, 3)) and p.bio == BlockFloat(8, (1, 12, 3, 3))
    assert p.fw.rounding.value == "truncate"
    assert type(m.conv1) is nn.Conv2d and type(m.linear) is nn.Linear
    assert type(m.layer2[0].shortcut[0]) is nn.Conv2d


@pytest.mark.parametrize("preset,arch,fp32,quantized", [
    ("ResNet34_FB16", "ResNet34", ["conv1", "layer4.0.shortcut.0", "linear"], "layer1.2.conv2"),
    ("ResNet50_FB16", "ResNet50", ["conv1", "layer1.0.shortcut.0", "linear"], "layer1.0.conv3"),
    ("VGG16_FB16", "VGG16", ["features.0", "classifier"], "features.3"),
    ("any_FB16", "VGG16", ["features.0", "classifier"], "features.40"),
    ("any_FB16", "MobileNetV2", ["conv1", "linear", "layers.0.shortcut.0"], "layers.0.conv2"),
    ("any_FB12", "MLPMixer", ["stem", "head"], "blocks.0.token_mlp.fc1"),
])
def test_other_presets_on_their_models(preset, arch, fp32, quantized):
    m = convert(model(arch), preset)
    for name in fp32:
        assert not hasattr(m.get_submodule(name), "precision"), name
    bits = {"FB12": 4, "FB16": 8, "FB24": 16}[preset.split("_")[-1]]
    assert formats(m, quantized).fw.bits == bits


def test_generic_fb_presets_equal_the_resnet18_ones():
    for n in (12, 16, 24):
        a, b = convert(model(), f"any_FB{n}"), convert(model(), f"ResNet18_FB{n}")
        assert precision_state(a) == precision_state(b)


def test_float8_and_mx_presets():
    m = convert(model(), "any_mxfp8")
    p = formats(m, "layer1.0.conv1")
    e4m3, e5m2 = format_from_name("float8_e4m3fn"), format_from_name("float8_e5m2")
    assert (p.fw, p.fi, p.biw) == (MX(e4m3, 32, 1), MX(e4m3, 32, 1), MX(e4m3, 32, 0))
    assert (p.bio, p.bwo, p.bwi) == (MX(e5m2, 32, 1), MX(e5m2, 32, 0), MX(e4m3, 32, 0))
    assert not hasattr(m.conv1, "precision") and not hasattr(m.linear, "precision")
    mixer = convert(model("MLPMixer"), "any_mxfp4")
    q = formats(mixer, "blocks.0.channel_mlp.fc1")
    assert q.fi == MX(format_from_name("float4_e2m1fn"), 32, -1) and q.bwo.axis == -2
    f8 = convert(model(), "any_fp8_e4m3")
    assert formats(f8, "layer4.1.conv2").bio == e4m3
    hy = convert(model(), "any_fp8_hybrid")
    assert formats(hy, "layer4.1.conv2").bio == e5m2 and formats(hy, "layer4.1.conv2").fw == e4m3


def test_every_preset_loads_and_resolves():
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.rules or cfg.default is not None, name
        arch = name.split("_")[0]  # the model a preset is written for; "any" fits ResNet18
        m = convert(model("ResNet18" if arch == "any" else arch), cfg)
        assert any(isinstance(x, LayerPrecision) and x.enabled
                   for x in (getattr(mod, "precision", None) for mod in m.modules())), name


def test_convert_keeps_parameters_and_state_dict():
    m = model()
    ref = copy.deepcopy(m.state_dict())
    params = {n: p for n, p in m.named_parameters()}
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = convert(m, "ResNet18_FB12")
    assert out is m
    assert {n: p for n, p in m.named_parameters()}.keys() == params.keys()
    assert all(p is params[n] for n, p in m.named_parameters())
    assert all(any(p is q for q in m.parameters()) for p in opt.param_groups[0]["params"])
    sd = m.state_dict()
    assert sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)


def test_reconvert_updates_precision_in_place():
    m = convert(model(), "ResNet18_FB16")
    q = m.layer1[0].conv1
    w = q.weight
    convert(m, "ResNet18_FB12LG16")
    assert m.layer1[0].conv1 is q and q.weight is w
    assert q.precision.fw == FB[12] and q.precision.bio == FB[16]
    # a layer the new config leaves in full precision keeps its class, all points off
    convert(m, {"default": {"fw_bit": 4}, "net.layer1.0.conv1": {"type": "default"},
                "net.conv1": {"type": "default"}, "net.linear": {"type": "default"}})
    assert m.layer1[0].conv1 is q and q.precision == LayerPrecision()
    assert m.layer1[0].conv2.precision.fw.bits == 4
    assert type(m.layer2[0].shortcut[0]) is QConv2d  # converted by this default
    convert(m, {"version": 1})  # everything off, nothing swapped back
    assert all(mod.precision == LayerPrecision() for mod in m.modules() if isinstance(mod, QConv2d))


def test_full_precision_q_layers_compute_like_the_float_model():
    ref = model().eval()
    m = convert(copy.deepcopy(ref), "ResNet18_FB16")
    convert(m, {"version": 1, "default": "full"})
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(m(x), ref(x))


def test_unknown_layer_names_suggest_real_ones():
    msg = str(pytest.raises(ConfigError, convert, model(), {"default": {}, "net.layer1.0.conv3": {}}).value)
    assert "'net.layer1.0.conv3': matches no convertible layer" in msg and "layer1.0.conv" in msg
    msg = str(pytest.raises(ConfigError, convert, model(), {"net.layer1.0.bn1": {}}).value)
    assert "is a BatchNorm2d, which cannot be converted" in msg
    msg = str(pytest.raises(ConfigError, convert, model("VGG16"), "ResNet18_FB12").value)
    assert "ResNet18_FB12.json" in msg and "another model" in msg
    m = model()
    with pytest.raises(ConfigError):
        convert(m, {"default": {}, "net.linearr": {}})
    assert not any(isinstance(x, QConv2d) for x in m.modules())  # checked before anything is swapped


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 8)
        self.seq = nn.Conv1d(8, 8, 3)
        self.qk = Matmul()
        self.head = self.emb  # the same module under two names

    def forward(self, x):
        return self.head(self.qk(x, x.transpose(-1, -2)))


def test_types_shared_modules_matmul_conv1d_and_root():
    m = convert(_Toy(), {"version": 1, "default": "fb16"})
    assert isinstance(m.emb, QLinear) and m.head is m.emb
    assert isinstance(m.seq, QConv1d) and isinstance(m.qk, QMatmul)
    assert convertible_layers(m) == {"emb": "Linear", "seq": "Conv1d", "qk": "Matmul", "head": "Linear"}
    m2 = convert(_Toy(), {"version": 1, "rules": [{"match": "*", "types": ["Matmul"], "precision": "fb12"}]})
    assert isinstance(m2.qk, QMatmul) and type(m2.emb) is nn.Linear
    lin = nn.Linear(4, 4)
    q = convert(lin, {"version": 1, "default": "fb16"})
    assert isinstance(q, QLinear) and q.weight is lin.weight
    with pytest.raises(ValueError, match="needs an nn.Module"):
        convert("ResNet18", "ResNet18_FB12")


def test_a_shared_module_takes_its_first_names_precision():
    first_full = {"version": 1, "rules": [{"match": "emb", "precision": "full"},
                                          {"match": "head", "precision": "fb16"}]}
    m = convert(_Toy(), first_full)
    assert type(m.emb) is nn.Linear and m.head is m.emb  # not split into a float and a Q twin
    m = convert(_Toy(), {"version": 1, "rules": [{"match": "emb", "precision": "fb12"},
                                                 {"match": "head", "precision": "fb16"}]})
    assert m.head is m.emb and m.emb.precision.fw == FB[12]
    convert(m, {"version": 1, "rules": [{"match": "emb", "precision": "fb24"},
                                        {"match": "head", "precision": "fb16"}]})
    assert m.head is m.emb and m.emb.precision.fw == FB[24]  # re-conversion too


def test_bfp_convert_stays_the_function_after_importing_the_module():
    import bfp.conversion  # noqa: F401  (a submodule import must not shadow bfp.convert)
    m = bfp.convert(model(), "ResNet18_FB16")
    assert isinstance(m.layer1[0].conv1, QConv2d)
    from bfp import convert as c
    assert c is convert and bfp.conversion_report is conversion_report


def test_conversion_report_table():
    m = convert(model(), "ResNet18_FB12LG16")
    rep = conversion_report(m)
    lines = rep.splitlines()
    assert lines[0].split() == ["layer", "type", "weight", "fw", "fi", "fo", "bwo", "bwi", "bwg", "bio", "biw", "big"]
    row = next(line.split() for line in lines if line.startswith("layer1.0.conv1 "))
    assert row == ["layer1.0.conv1", "QConv2d", "64x64x3x3", "fb12", "fb12", "-", "fb12", "fb12", "-",
                   "fb16", "fb16", "-"]
    assert next(line for line in lines if line.startswith("linear ")).split()[1:3] == ["Linear", "10x512"]
    assert lines[-2].startswith("16 of 21 convertible layers quantized") and "not traced" in lines[-1]
    acc = convert(model(), {"version": 1, "backward_source": "quantized",
                            "accumulator": {"fmt": "bfloat16"},
                            "default": {"operands": {"bfp": 6, "group": [1, 16, 1, 1], "rounding": "nearest"}}})
    rep = conversion_report(acc)
    assert "bwd_src" in rep and "accumulator" in rep and "bfp6[1,16,1,1]/rn" in rep
    assert "no convertible layers" in conversion_report(nn.ReLU())


def test_precision_state_round_trip():
    m = convert(model(), "any_mxfp8")
    state = json.loads(json.dumps(precision_state(m)))
    assert set(state) == {n for n, x in m.named_modules() if hasattr(x, "precision")}
    fresh = load_precision_state(model(), state)
    assert precision_state(fresh) == state
    other = convert(model(), "ResNet18_FB16")  # already converted: updated in place
    load_precision_state(other, state)
    assert precision_state(other) == state
    msg = str(pytest.raises(ConfigError, load_precision_state, model(), {"layer1.0.conv3": {}}).value)
    assert "closest: layer1.0.conv" in msg
    with pytest.raises(ConfigError, match="'conv1'.*unknown LayerPrecision keys"):
        load_precision_state(model(), {"conv1": {"fx": None}})
    with pytest.raises(ConfigError, match="must be a dict"):
        load_precision_state(model(), [])


def test_generate_config_round_trip():
    gen = json.loads(json.dumps(generate_config(model())))  # a float model: a template
    assert set(gen) == {"default"} | {f"net.{n}" for n in convertible_layers(model())}
    assert gen["net.linear"]["type"] == "Linear" and len(gen["net.conv1"]) == 28
    m = convert(model(), gen)
    assert generate_config(m) == gen
    assert formats(m, "linear").fw == BlockFloat(8, (16, 1)) and formats(m, "conv1").fi.group == (4, 1, 3, 3)
    # a converted model as it stands: float layers {"type": "default"}
    src = convert(model(), "ResNet18_FB12LG16")
    gen2 = json.loads(json.dumps(generate_config(src)))
    assert gen2["net.conv1"] == {"type": "default"} and gen2["net.layer1.0.conv1"]["bio_bit"] == 8
    again = convert(model(), gen2)
    assert precision_state(again) == precision_state(src)
    assert type(again.conv1) is nn.Conv2d
    convert(src, {"version": 1, "rules": [{"match": "layer1.0.conv1", "precision": "fb16"}]})
    assert generate_config(src)["net.layer1.0.conv2"] == {"type": "default"}
    with pytest.raises(ConfigError, match="precision_state"):
        generate_config(convert(model(), "any_mxfp8"))
