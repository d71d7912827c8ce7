"""torchvision's ImageNet classifiers for ``imagenet.py``, and the preset names they answer to.

``create(arch, num_classes)`` builds ``torchvision.models.<arch>`` untrained;
``pretrained_file`` finds weights already on disk (never a download) and
``apply_pretrained`` fills a model from them (read by ``bfp.engine.checkpoint.read_weights``).

The seed's network configs (``conf_net/ResNet18_FB12LG24.json``) name the
CIFAR ResNet's layers: ``net.conv1``, ``net.layer2.0.shortcut.0``,
``net.linear``. torchvision calls the same layers ``conv1``,
``layer2.0.downsample.0`` and ``fc``. A model built here carries
``bfp_config_renames`` (CIFAR name part -> torchvision name part), which
``bfp.convert`` applies to a config's rules that match no layer as written, so
``--bfp ResNet18_FB12LG24`` on ``-a resnet18`` keeps the same layers in FP32.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn as nn

# Name parts of the CIFAR models (kuangliu/pytorch-cifar) -> torchvision's, by family prefix.
RENAMES = {"resnet": (("shortcut", "downsample"), ("linear", "fc")),
           "resnext": (("shortcut", "downsample"), ("linear", "fc")),
           "wide_resnet": (("shortcut", "downsample"), ("linear", "fc"))}


def names() -> list[str]:
    """torchvision's classification architectures (``resnet18``, ``vgg16``, ``vit_b_16`` ...)."""
    import torchvision
    return sorted(torchvision.models.list_models(module=torchvision.models))


def canonical_name(arch: str) -> str:
    """``arch`` as torchvision spells it (case ignored); ``ValueError`` listing the allowed names."""
    all_names = names()
    by_lower = {n.lower(): n for n in all_names}
    if str(arch).lower() in by_lower:
        return by_lower[str(arch).lower()]
    close = difflib.get_close_matches(str(arch).lower(), all_names, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"`arch` {arch!r}: not a torchvision model{hint}; allowed: {', '.join(all_names)}")


def renames_for(arch: str) -> tuple[tuple[str, str], ...]:
    for family in sorted(RENAMES, key=len, reverse=True):
        if arch.startswith(family):
            return RENAMES[family]
    return ()


def create(arch: str, num_classes: int = 1000) -> nn.Module:
    """An untrained ``torchvision.models.<arch>`` with ``num_classes`` outputs."""
    import torchvision
    arch = canonical_name(arch)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    renames = renames_for(arch)
    if renames:
        model.bfp_config_renames = renames
    return model


def default_weights_file(arch: str) -> Optional[Path]:
    """Where ``torch.hub`` keeps ``arch``'s default torchvision weights (it may not be there)."""
    import torchvision
    try:
        weights = torchvision.models.get_model_weights(canonical_name(arch)).DEFAULT
    except (ValueError, AttributeError):
        return None
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def pretrained_file(arch: str, path: Optional[str] = None) -> Path:
    """The weights file of ``--pretrained``: ``path``, or ``default_weights_file(arch)``.

    Never downloads: a missing file is a ``FileNotFoundError`` saying where to put
    it; a directory is named as one."""
    file = Path(path) if path else default_weights_file(arch)
    if file is None:
        raise FileNotFoundError(f"`pretrained`: torchvision has no default weights for {arch}; "
                                f"give `pretrained` PATH to a state_dict file")
    if file.is_dir():
        raise FileNotFoundError(f"`pretrained` {file}: is a directory; give the weights file (a .pth/.pt "
                                f"state_dict) inside it")
    if not file.is_file():
        raise FileNotFoundError(f"`pretrained`: {file} is not on disk and is never downloaded here; copy "
                                f"the weights file there (or give `pretrained` PATH)")
    return file


def apply_pretrained(model: nn.Module, arch: str, state: Any, file: Path) -> str:
    """Copy the tensors of ``state`` (a state_dict, or a bfpsim checkpoint's, read from ``file``)
    into ``model``. Tensors whose shape differs (a classifier for another class count) keep
    their initialisation. Returns a one-line summary of what was loaded."""
    if isinstance(state, dict) and isinstance(state.get("model"), dict):  # a bfpsim checkpoint
        state = state["model"]
    own = model.state_dict()
    if not isinstance(state, dict):
        raise ValueError(f"`pretrained` {file}: holds a {type(state).__name__}, not a state_dict")
    unknown = sorted(k for k in state if k not in own)
    if unknown:
        raise ValueError(f"`pretrained` {file}: not weights of {arch}; unknown keys: {unknown[:5]}")
    fits = {k: v for k, v in state.items() if own[k].shape == v.shape}
    kept = sorted(set(own) - set(fits))
    model.load_state_dict(fits, strict=False)
    return (f"pretrained: {len(fits)} tensors from {file}"
            + (f"; kept initialised (shape differs or absent): {', '.join(kept)}" if kept else ""))
