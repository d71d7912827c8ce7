"""Library messages name parameters; the command line names flags. This is the one place that maps
the first to the second.

Below ``bfp.cli`` an error names the parameter a Python user passed, between
backticks: ``bfp.data.load(..., channels=2)`` says "`channels` must be 1 or 3,
got 2". A script reports the same error with the flag its user typed:
"--in-channels must be 1 or 3, got 2". ``as_flags`` rewrites every backticked
name it knows (``PARAM_DESTS``, or a flag's dest of the same name) and leaves
others as they are. tests/test_param_flags.py checks that every name the library's
messages use maps to a flag of every script that has it, and that no library
message names a flag itself.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

#: A library parameter, as messages write it between backticks -> the dest of its flag,
#: where the two names differ. A name that is already a flag's dest needs no entry.
PARAM_DESTS = {
    # bfp.data
    "channels": "in_channels", "path": "dataset_path", "name": "dataset",
    "limit_train": "limit_train_images", "limit_test": "limit_test_images",
    # bfp.amp (LossScaler)
    "init_scale": "loss_scale_init", "growth_factor": "loss_scale_growth",
    "backoff_factor": "loss_scale_backoff", "growth_interval": "loss_scale_interval",
    # bfp.engine (TrainConfig, GradHistogram)
    "epochs": "training_epochs", "lr": "optim_lr", "momentum": "optim_momentum",
    "weight_decay": "optim_weight_decay", "nonfinite_epochs": "stop_nonfinite",
    "GradHistogram.every": "grad_histogram",
    # bfp.dynamic (DynamicPrecision)
    "spec": "do", "every": "do_every", "color": "do_color",
    # bfp.distributed (EmulatedStep, init_process_group's wait)
    "n": "emulate_node", "timeout_s": "dist_timeout",
    # bfp.optim (LARS), bfp.models (torchvision)
    "trust_coefficient": "lars_trust", "arch": "model",
}

#: Flags not spelled ``--`` + dest with dashes (a task may prefer its own: ``TaskHooks.flag_spellings``).
SPELLINGS = {"compute_dtype": "--precision", "network_config": "--bfp", "dataset_path": "-dp/--dataset-path"}

_NAME = re.compile(r"`([A-Za-z_][\w.]*)`")


def flag_of(dest: str, spellings: Optional[Mapping[str, str]] = None) -> str:
    """The flag a user types for ``dest`` (``in_channels`` -> ``--in-channels``)."""
    return (spellings or {}).get(dest) or SPELLINGS.get(dest) or "--" + dest.replace("_", "-")


def as_flags(message: str, dests: set[str], spellings: Optional[Mapping[str, str]] = None) -> str:
    """``message`` with each backticked parameter whose flag is in ``dests`` (the script's flags'
    dests) replaced by that flag; any other backticked name stays as it is."""
    def flag(m: re.Match) -> str:
        dest = PARAM_DESTS.get(m[1], m[1])
        return flag_of(dest, spellings) if dest in dests else m[0]
    return _NAME.sub(flag, message)
