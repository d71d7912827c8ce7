"""``--mode generate-config``: an original-form network config listing every convertible layer."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..conversion import conversion_report
from ..conversion import generate_config as config_of
from ..engine.checkpoint import atomic_file
from .flags import UsageError
from .run import convert, make_model
from .spec import RunSpec


def generate_config(spec: RunSpec, stream=None) -> Path:
    task, args = spec.task, spec.args
    model = make_model(task, args, task.classes(args.dataset), args.in_channels)
    if args.network_config:  # the config as converted: the report shows which layers stay FP32
        model = convert(model, args.network_config, "--bfp")
        print(conversion_report(model), file=stream or sys.stdout)
    cfg = config_of(model)
    out = Path(args.config_out or Path("conf_net") / f"{args.model}_generated.json")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite True to replace it or --config-out PATH")
    if out.is_dir():
        raise UsageError(f"--config-out {out} is a directory; give a file path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(cfg, indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"--config-out {out}: cannot write ({e.strerror or e})") from None
    print(f"wrote {out}: {len(cfg) - 1} layers of {args.model}", file=stream or sys.stdout)
    return out
