"""Loading a network config from any source: a preset name, a JSON file, a
dict in either form, or a ``NetConfig`` as it stands."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Union

from .errors import ConfigError, _fail
from .legacy import _parse_legacy_form
from .presets import find_preset
from .rules import NetConfig, _parse_rules_form


def config_from_dict(d: Any, source: str = "<dict>") -> NetConfig:
    """A ``NetConfig`` from either JSON form (the rule form has ``version`` or ``rules``)."""
    if not isinstance(d, dict):
        raise _fail(source, "", f"a network config must be a JSON object, got {type(d).__name__}")
    if "version" in d or "rules" in d:
        return _parse_rules_form(d, source)
    return _parse_legacy_form(d, source)


ConfigLike = Union[str, "os.PathLike[str]", dict, NetConfig]


def load_config(config: ConfigLike) -> NetConfig:
    """A ``NetConfig`` from a preset name, a JSON file path, a dict or a ``NetConfig``."""
    if isinstance(config, NetConfig):
        return config
    if isinstance(config, dict):
        return config_from_dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a preset name, a path, a dict or a NetConfig, got {config!r}")
    path = Path(config)
    if not path.is_file():
        path = find_preset(str(config))
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise ConfigError(f"{path}: JSON nested too deeply to read (Python's limit is about "
                          f"{sys.getrecursionlimit()} levels; a network config needs fewer than 10)") from None
    return config_from_dict(d, str(path))
