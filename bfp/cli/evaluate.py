"""``imagenet.py -e``: evaluate a model on the validation set and exit, as the PyTorch example's ``-e``.

The weights come from ``--resume`` (a run directory or checkpoint: its
weights and every layer's precision, dynamic changes included) or
``--pretrained``; the model is converted with ``--bfp`` as a training run
would be. Prints the conversion report, then loss, top-1 and top-5.
"""
from __future__ import annotations

import sys

from ..conversion import load_precision_state
from ..engine.logs import RunLog
from ..engine.trainer import Trainer
from .run import convert, cpu_threads, load_data, make_model, resolve_device, seed_everything, train_config
from .spec import RunSpec


def saved_model(spec: RunSpec):
    """(model, data, device, network config, checkpoint path or None): the model of ``--resume``
    (its weights and every layer's precision, dynamic changes included; not the training
    state) or a fresh one converted with ``--bfp``, and the run's data."""
    task, args = spec.task, spec.args
    device = resolve_device(args.device)
    # loaded as a training resume loads it: a damaged file names the newest intact checkpoint beside it
    path, state = (spec.resumed.path, spec.resumed.state) if spec.resumed is not None else (None, None)
    seed_everything(args.seed)
    data = load_data(args, device, task)
    model = make_model(task, args, data.num_classes, data.in_channels)
    initial = spec.initial_config
    model = convert(model, initial, "--bfp" if state is None else "checkpoint network config")
    if state is not None:
        model.load_state_dict(state["model"])
        if state.get("precision_state") is not None:
            load_precision_state(model, state["precision_state"])
    return model.to(device), data, device, initial, path


def evaluate(spec: RunSpec, stream=None) -> dict[str, float]:
    out, args = stream or sys.stdout, spec.args
    with cpu_threads(args.threads):
        model, data, device, initial, _ = saved_model(spec)
        trainer = Trainer(model, data, train_config(args, spec.plan, device), device=device, log=RunLog(None, stream=out),
                          network_config=initial, name=args.model)
        report = trainer.precision_report()
        if report:
            print(report, file=out)
        m = trainer.evaluate()
    print(f"evaluate {args.model} on {data.describe()}: loss {m['test_loss']:.4f}, top-1 {m['test_acc1']:.2f}%, "
          f"top-5 {m['test_acc5']:.2f}%", file=out)
    return m
