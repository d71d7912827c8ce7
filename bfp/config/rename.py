"""Configs written for one model's layer names applied to a model that names them otherwise.

The seed's presets name the CIFAR ResNet's layers (``net.layer2.0.shortcut.0``,
``net.linear``); torchvision's ResNet has the same layers as
``layer2.0.downsample.0`` and ``fc``. ``adapt_names(config, renames, layers)``
rewrites each exact or glob rule that matches none of ``layers`` as written
by replacing whole name parts (``shortcut`` -> ``downsample``),
and keeps the rewrite only where it then matches a layer. Rules that match as
written, regex rules and ``@first``/``@last`` are never touched, so a config
written for the model itself means what it says; a rule that matches nothing
either way is left for ``NetConfig.assign`` to report with the model's layers.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from .rules import NetConfig


def _rename(pattern: str, renames: Iterable[tuple[str, str]]) -> str:
    """Replace each ``old`` that is a whole name part (between dots, glob characters
    or the ends; ``linear_1`` is left alone) by ``new``."""
    for old, new in renames:
        pattern = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])", new, pattern)
    return pattern


def adapt_names(config: NetConfig, renames: Iterable[tuple[str, str]], layers: Mapping[str, str]) -> NetConfig:
    """``config`` with rules renamed where that makes them match ``layers`` (name -> type name)."""
    renames = tuple(renames)
    order = tuple(layers)
    rules = []
    for rule in config.rules:
        if rule.kind in ("exact", "glob") and not any(rule.matches(n, t, order) for n, t in layers.items()):
            new = _rename(rule.match, renames)
            if new != rule.match:
                candidate = dataclasses.replace(rule, match=new, where=f"{rule.where or repr(rule.match)} "
                                                                       f"(as {new!r})")
                if any(candidate.matches(n, t, order) for n, t in layers.items()):
                    rule = candidate
        rules.append(rule)
    return dataclasses.replace(config, rules=tuple(rules))
