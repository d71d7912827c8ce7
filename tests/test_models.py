"""bfp.models: every registered network builds for any class/channel count,
and ResNet keeps the kuangliu/pytorch-cifar module names that conf_net/ uses."""
import pytest
import torch
import torch.nn as nn

import bfp.models


@pytest.mark.parametrize("name", bfp.models.names())
def test_every_model_runs_on_32x32(name):
    torch.manual_seed(0)
    net = bfp.models.create(name, num_classes=7, in_channels=1)
    net.eval()
    with torch.no_grad():
        out = net(torch.randn(2, 1, 32, 32))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def _gemm_names(net):
    return [n for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def test_resnet18_module_names_are_the_classic_layout():
    names = _gemm_names(bfp.models.create("ResNet18", 100))
    assert names[0] == "conv1" and names[-1] == "linear"
    assert len(names) == 21  # 1 + 8 blocks x 2 + 3 shortcut convs + linear
    for stage in (2, 3, 4):
        assert f"layer{stage}.0.shortcut.0" in names
        assert f"layer{stage}.1.shortcut.0" not in names
    assert "layer1.0.shortcut.0" not in names
    assert "layer1.1.conv2" in names
    mods = dict(bfp.models.create("ResNet18").named_modules())
    assert isinstance(mods["layer2.0.shortcut.1"], nn.BatchNorm2d)
    assert isinstance(mods["layer1.0.shortcut"], nn.Sequential) and len(mods["layer1.0.shortcut"]) == 0


def test_resnet50_bottleneck_names():
    names = _gemm_names(bfp.models.create("ResNet50"))
    assert {"layer1.0.conv3", "layer1.0.shortcut.0", "layer4.2.conv3", "linear"} <= set(names)
    assert len(names) == 1 + 16 * 3 + 4 + 1


def test_lookup_ignores_case_and_accepts_original_spellings():
    assert bfp.models.canonical_name("resnet18") == "ResNet18"
    assert bfp.models.canonical_name("densenet_cifar") == "DenseNetCifar"


def test_unknown_model_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown model 'ResNet19'.*allowed: .*ResNet18"):
        bfp.models.create("ResNet19")


def test_unknown_option_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"does not take \['depth'\]; its options: width"):
        bfp.models.create("ResNet18", depth=3)
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        bfp.models.create("ResNet18", num_classes=0)


def test_width_option_shrinks_resnet_for_fast_tests():
    net = bfp.models.create("ResNet10", 10, width=4)
    assert net.conv1.out_channels == 4 and net.linear.in_features == 32


@pytest.mark.parametrize("name, option, message", [
    ("ResNet10", {"width": 0}, "option width must be a positive integer, got 0"),
    ("ResNet10", {"width": "abc"}, "option width must be a positive integer, got 'abc'"),
    ("ResNet10", {"width": 2.5}, "option width must be a positive integer, got 2.5"),
    ("MLPMixer", {"patch_size": 0}, "option patch_size must be a positive integer"),
    ("DenseNetCifar", {"reduction": 0}, r"reduction must be in \(0, 1\], got 0"),
    ("DenseNetCifar", {"reduction": "half"}, "option reduction must be a number, got 'half'"),
])
def test_bad_option_values_are_named(name, option, message):
    with pytest.raises(ValueError, match=message):
        bfp.models.create(name, **option)
