"""``--mode diagnose``: what rounding does at every quantization point, on one training batch.

The model is the one ``--resume RUN`` saved (its weights and every layer's precision), or a
fresh one converted with ``--bfp``. One forward and backward pass on the first training
batch is measured (``bfp.diagnostics``; no optimizer step). Prints the table worst first and
draws the heat map (layers down, points across, SQNR as colour).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..conversion import load_precision_state
from ..diagnostics import heatmap, measure_step, table
from ..engine.schedule import EpochPlan
from .flags import UsageError
from .run import convert, cpu_threads, initial_network_config, load_data, make_model, resolve_device, seed_everything
from .tasks import Task
from .train_config import resume_checkpoint


def diagnose(task: Task, args: argparse.Namespace, plan: EpochPlan, stream=None) -> list[dict]:
    out = stream or sys.stdout
    with cpu_threads(args.threads):
        device = resolve_device(args.device)
        path, state = resume_checkpoint(args)
        seed_everything(args.seed)
        data = load_data(args, device, task)
        model = make_model(task, args, data.num_classes, data.in_channels)
        initial = state["network_config"] if state is not None else initial_network_config(args, plan)
        if initial is None:
            raise UsageError("--mode diagnose needs quantized layers: give --bfp CONFIG or --resume a run "
                             "trained with one")
        model = convert(model, initial, "--bfp" if state is None else "checkpoint network config")
        if state is not None:
            model.load_state_dict(state["model"])
            if state.get("precision_state") is not None:
                load_precision_state(model, state["precision_state"])
        model.to(device)
        x, y = next(iter(data.train))
        rows = measure_step(model, x.to(device), y.to(device))
    if not rows:
        raise UsageError("no quantization point is active in this model's config")
    where = f"{args.model}, {initial if isinstance(initial, str) else 'network config'}" + \
        (f", {path}" if path else ", fresh weights")
    print(f"diagnose {where}: one training batch of {len(x)}, worst first", file=out)
    print(table(rows), file=out)
    default = (Path(path).parent.parent if Path(path).parent.name == "checkpoints" else Path(path).parent) \
        if path else Path(".")
    png = Path(args.diagnose_out) if args.diagnose_out else default / "diagnose.png"
    try:
        heatmap(rows, png, title=f"SQNR (dB) per layer and point: {where}")
    except OSError as e:
        raise UsageError(f"--diagnose-out {png}: cannot write ({e.strerror or e})") from None
    print(f"wrote {png}", file=out)
    return rows
