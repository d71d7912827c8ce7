"""Image-classification networks for 32x32 inputs, built by name.

>>> net = bfp.models.create("ResNet18", num_classes=100)
>>> bfp.models.names()

Module names follow kuangliu/pytorch-cifar: network configs in ``conf_net/``
address layers by them (``net.layer2.0.shortcut.0``), so they are an interface.
"""
from __future__ import annotations

import difflib
import inspect
import math
from typing import Callable

import torch.nn as nn

from . import alexnet, densenet, mixer, mobilenet, resnet, vgg, vit

_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "ResNet10": resnet.ResNet10,
    "ResNet18": resnet.ResNet18,
    "ResNet34": resnet.ResNet34,
    "ResNet50": resnet.ResNet50,
    "ResNet101": resnet.ResNet101,
    "ResNet152": resnet.ResNet152,
    "VGG11": vgg.VGG11,
    "VGG13": vgg.VGG13,
    "VGG16": vgg.VGG16,
    "VGG19": vgg.VGG19,
    "DenseNet121": densenet.DenseNet121,
    "DenseNet161": densenet.DenseNet161,
    "DenseNet169": densenet.DenseNet169,
    "DenseNet201": densenet.DenseNet201,
    "DenseNetCifar": densenet.DenseNetCifar,
    "MobileNet": mobilenet.MobileNet,
    "MobileNetV2": mobilenet.MobileNetV2,
    "AlexNet": alexnet.AlexNet,
    "MLPMixer": mixer.MLPMixer,
    "ViT": vit.ViT,
}
# Spellings of the original simulator and of kuangliu/pytorch-cifar.
_ALIASES = {"densenet_cifar": "DenseNetCifar", "mlp-mixer": "MLPMixer", "mixer": "MLPMixer",
            "mobilenetv1": "MobileNet"}


def names() -> list[str]:
    """Every model name ``create`` accepts (canonical spelling)."""
    return list(_REGISTRY)


def canonical_name(name: str) -> str:
    """``name`` in its canonical spelling (lookup ignores case); ValueError if unknown."""
    by_lower = {n.lower(): n for n in _REGISTRY}
    by_lower.update({a.lower(): n for a, n in _ALIASES.items()})
    key = str(name).lower()
    if key in by_lower:
        return by_lower[key]
    close = difflib.get_close_matches(str(name), names(), n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown model {name!r}{hint}; allowed: {', '.join(names())}")


def create(name: str, num_classes: int = 10, in_channels: int = 3, **kwargs) -> nn.Module:
    """A freshly initialised ``name`` for ``in_channels`` x 32 x 32 inputs and
    ``num_classes`` outputs. ``kwargs`` go to the constructor (``width=`` for
    ResNets, ``dim=``/``depth=`` for MLPMixer ...)."""
    factory = _REGISTRY[canonical_name(name)]
    for what, v in (("num_classes", num_classes), ("in_channels", in_channels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    allowed = _options(name)
    bad = sorted(set(kwargs) - set(allowed))
    if bad:
        raise ValueError(f"model {name!r} does not take {bad}; its options: "
                         f"{', '.join(allowed) or 'none'}")
    for k, v in kwargs.items():  # sizes are positive integers, rates numbers, as their defaults
        default = allowed[k].default
        if isinstance(default, bool):
            continue
        if isinstance(default, int) and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"model {name!r} option {k} must be a positive integer, got {v!r}")
        if isinstance(default, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                           or not math.isfinite(v)):
            raise ValueError(f"model {name!r} option {k} must be a number, got {v!r}")
    return factory(num_classes=num_classes, in_channels=in_channels, **kwargs)


def options(name: str) -> list[str]:
    """Constructor options of ``name`` beyond ``num_classes`` and ``in_channels``."""
    return list(_options(name))


def _options(name: str) -> dict[str, inspect.Parameter]:
    factory = _REGISTRY[canonical_name(name)]
    target = getattr(factory, "builds", factory)
    fixed = set(getattr(factory, "fixed", ())) | {"self", "num_classes", "in_channels"}
    return {p.name: p for p in inspect.signature(target).parameters.values()
            if p.name not in fixed and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


__all__ = ["create", "names", "options", "canonical_name"]
