"""``--compare``: the same job in FP32 and with the network config, side by side."""
from __future__ import annotations

import sys
from typing import Any

from ..engine.schedule import EpochPlan
from .flags import UsageError
from .run import train
from .spec import RunSpec


def compare(spec: RunSpec, stream=None) -> list[dict[str, Any]]:
    args, plan = spec.args, spec.plan
    if not (args.network_config or plan.precision):
        raise UsageError("--compare needs --bfp CONFIG (or a -tc config with bfp-layer-conf-dict) to "
                         "compare against FP32")
    if args.resume:
        raise UsageError("--compare cannot be combined with --resume")
    fp32 = spec.replace(EpochPlan(precision={}, optimizer=dict(plan.optimizer)), network_config=None, do=None)
    out = stream or sys.stdout
    results = []
    for label, run, sfx in (("FP32", fp32, "_fp32"), (args.network_config or "schedule", spec, "_bfp")):
        print(f"==> {label}", file=out, flush=True)
        r = train(run, suffix=sfx, stream=stream)
        r["label"] = label
        results.append(r)
    print(comparison_table(results), file=out, flush=True)
    return results


def comparison_table(results: list[dict[str, Any]]) -> str:
    rows = [("test top-1 (last)", lambda r: f"{r['last']['test_acc1']:.2f}%"),
            ("test top-1 (best)", lambda r: f"{r['best_acc']:.2f}%"),
            ("test top-5", lambda r: f"{r['last']['test_acc5']:.2f}%"),
            ("test loss", lambda r: f"{r['last']['test_loss']:.4f}"),
            ("train loss", lambda r: f"{r['last']['train_loss']:.4f}"),
            ("train images/s", lambda r: f"{r['last']['images_per_s']:.0f}"),
            ("total time", lambda r: f"{r['total_time_s']:.1f} s")]
    head = [""] + [r["label"] for r in results]
    if len(results) == 2:
        head.append("ratio")
    table = [head]
    for name, f in rows:
        line = [name] + [f(r) for r in results]
        if len(results) == 2:
            line.append(f"{results[1]['total_time_s'] / max(results[0]['total_time_s'], 1e-9):.2f}x"
                        if name == "total time" else "")
        table.append(line)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in table)
