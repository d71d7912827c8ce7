"""Network configs: which layers of a model quantize, and to which formats.

Two JSON forms load into the same typed objects (``docs/configs.md`` has every
key, the shorthands and examples):

* the original simulator's form (``conf_net/ResNet18_FB12.json``): a
  ``"default"`` entry plus entries keyed by module name (``"net.conv1"``), each
  with the nine ``<point>``/``<point>_bit``/``<point>_dim`` keys or
  ``{"type": "default"}`` for full precision;
* the rule form (``{"version": 1, "rules": [...]}``): per point a format name or
  spec, rounding, backward source, accumulator, and ordered rules matched on
  module names (exact, glob or ``re:`` regex), first match wins.

Modules, each using only those listed before it:

``errors``   ``ConfigError`` and its messages (closest spellings)
``specs``    the rule form's format and precision specs
``rules``    ``Rule``, ``NetConfig`` (the typed result) and the rule-form parser
``legacy``   the original form: its defaults, shorthands, parser and writer
``presets``  where ``conf_net/NAME.json`` and ``conf_train/NAME.json`` are found
``load``     ``config_from_dict`` and ``load_config``: any source to a ``NetConfig``
``rename``   ``adapt_names``: CIFAR preset layer names on torchvision models
"""
from .errors import ConfigError
from .legacy import (LEGACY_BIT_FROM, LEGACY_DIM_FROM, LEGACY_FULL_TYPES, LEGACY_KEYS, LEGACY_LAYER_TYPES,
                     LEGACY_ON, SHORTHANDS, legacy_dict, legacy_entry, legacy_group)
from .load import ConfigLike, config_from_dict, load_config
from .presets import (find_preset, find_train_config, preset_dirs, preset_names, train_config_dirs,
                      train_config_names)
from .rename import adapt_names
from .rules import CONVERTIBLE_TYPES, LEGACY_PREFIX, MATCH_KINDS, NEW_KEYS, RULE_KEYS, NetConfig, Rule
from .specs import (format_spec_keys, FULL, INHERITED_KEYS, OPERANDS, SPEC_KEYS, parse_accumulator, parse_format,
                    parse_precision, precision_spec, with_rounding)

__all__ = [
    "ConfigError", "adapt_names",
    "LEGACY_BIT_FROM", "LEGACY_DIM_FROM", "LEGACY_FULL_TYPES", "LEGACY_KEYS", "LEGACY_LAYER_TYPES", "LEGACY_ON",
    "SHORTHANDS", "legacy_dict", "legacy_entry", "legacy_group",
    "ConfigLike", "config_from_dict", "load_config",
    "find_preset", "find_train_config", "preset_dirs", "preset_names", "train_config_dirs", "train_config_names",
    "CONVERTIBLE_TYPES", "LEGACY_PREFIX", "MATCH_KINDS", "NEW_KEYS", "RULE_KEYS", "NetConfig", "Rule",
    "format_spec_keys", "FULL", "INHERITED_KEYS", "OPERANDS", "SPEC_KEYS", "parse_accumulator", "parse_format",
    "parse_precision", "precision_spec", "with_rounding",
]
