"""The run specification: a run's flags after the command line, ``-tc`` and ``--resume`` are merged,
completed, checked and frozen.

``build_spec(task, argv)`` makes it once, in this order: parse the flags and the
``-tc`` file (``bfp.cli.train_config``); replace them by the checkpoint's on
``--resume`` (``bfp.cli.resume``); derive what follows from them (canonical
model and dataset names, the dataset's epoch count, the task's derived values,
``--bfp`` as the plan's epoch-0 network config); refuse bad values; freeze.
Everything downstream (training, ``--compare``, evaluation, diagnosis, config
generation) reads the ``RunSpec`` and cannot change it: ``RunArgs`` refuses
assignments, the plan's schedules are read-only mappings, and a variant (the
FP32 twin of ``--compare``) is a new spec made by ``RunSpec.replace``.
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional, Sequence

import numba

from ..engine.schedule import EpochPlan
from ..optim import check_hyperparam
from .dist_run import param_comm_format
from .flags import UsageError
from .resume import Checkpoint, apply_resume
from .tasks import Task
from .train_config import parse_args


class RunArgs(argparse.Namespace):
    """A run's flags by ``dest``, read-only (``args.optim_lr``); ``replace`` makes a changed copy."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the run specification is frozen: {name} cannot change after the flags, -tc "
                             f"and --resume are merged (make a variant with RunArgs.replace)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def replace(self, **changes: Any) -> "RunArgs":
        unknown = sorted(set(changes) - set(vars(self)))
        if unknown:
            raise KeyError(f"not flags of this run: {', '.join(unknown)}")
        return RunArgs({**vars(self), **changes})


def frozen_plan(plan: EpochPlan) -> EpochPlan:
    """``plan`` with read-only schedules (a variant is a new plan: ``RunSpec.replace``)."""
    return EpochPlan(precision=MappingProxyType(dict(plan.precision)),
                     optimizer=MappingProxyType({e: MappingProxyType(dict(v)) for e, v in plan.optimizer.items()}))


@dataclass(frozen=True)
class RunSpec:
    """One run, fully specified: what ``cifar.py ARGS`` (or any task's script) asks for."""

    task: Task
    args: RunArgs
    plan: EpochPlan                      # epoch-keyed network configs and optimizer settings, read-only
    resumed: Optional[Checkpoint] = None  # the checkpoint of --resume, read once
    argv: tuple[str, ...] = field(default=())

    @property
    def initial_config(self) -> Any:
        """The network config the model is converted with first: the checkpoint's on resume (its
        per-layer precision state then restores dynamic changes), else epoch 0's."""
        if self.resumed is not None:
            return self.resumed.state["network_config"]
        return self.plan.precision_at(0, self.args.network_config)

    def replace(self, plan: Optional[EpochPlan] = None, **flags: Any) -> "RunSpec":
        """A variant of this run: other flag values and/or another plan (frozen too)."""
        return RunSpec(self.task, self.args.replace(**flags), frozen_plan(plan) if plan is not None else self.plan,
                       self.resumed, self.argv)


def build_spec(task: Task, argv: Sequence[str]) -> RunSpec:
    """The ``RunSpec`` of ``argv`` for ``task``; a ``UsageError`` names any bad flag or file."""
    args, plan, _ = parse_args(task, argv)
    resumed = None
    if args.resume:
        args, plan, resumed = apply_resume(task, args)
    derive(task, args, plan)
    check_args(task, args, plan)
    return RunSpec(task, RunArgs(vars(args)), frozen_plan(plan), resumed, tuple(argv))


def derive(task: Task, args: argparse.Namespace, plan: EpochPlan) -> None:
    """Complete ``args`` and ``plan`` before they are frozen: canonical names, defaults that
    depend on other flags, the task's derived values; an explicit ``--bfp`` replaces the
    ``-tc`` plan's epoch-0 network config."""
    hooks = task.hooks
    try:
        args.model = hooks.canonical_model(args.model)
        args.dataset = hooks.canonical_dataset(args.dataset)
        for k, v in hooks.derived(args).items():
            setattr(args, k, v)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.training_epochs is None:
        args.training_epochs = task.epochs(args.dataset)
    if args.network_config is not None and 0 in plan.precision:
        plan.precision[0] = args.network_config


def max_threads() -> int:
    """The most ``--threads`` a run may ask for: numba's thread pool size (this machine's cores
    unless ``NUMBA_NUM_THREADS`` says otherwise); torch would start more threads but not faster."""
    return int(numba.config.NUMBA_NUM_THREADS)


# What --fsdp does not combine with yet: each would need a sharded model's hooks.
_NOT_WITH_FSDP = {"do": "dynamic precision", "diagnose": "diagnostics", "shadow": "the FP32 shadow",
                  "grad_histogram": "gradient histograms", "cuda_graph": "CUDA graphs"}


def check_fsdp(args: argparse.Namespace, plan: EpochPlan) -> None:
    """--fsdp's combinations (and --param-comm-format's need of it), refused with the reason."""
    fsdp, pcf = getattr(args, "fsdp", False), getattr(args, "param_comm_format", None)
    if pcf is not None and not fsdp:
        raise UsageError(f"--param-comm-format {pcf} rounds FSDP's weight all-gather: add --fsdp")
    if not fsdp:
        return
    param_comm_format(args)  # a format the rounded all-gather takes, refused here with the reason
    given = [k for k in _NOT_WITH_FSDP if getattr(args, k, None)]
    if args.compile != "none":
        given.append("compile")
    if given:
        k = given[0]
        raise UsageError(f"--fsdp does not combine with --{k.replace('_', '-')} yet "
                         f"({_NOT_WITH_FSDP.get(k, 'torch.compile of a sharded model')}); leave one out")
    if args.emulate_node != 1:
        raise UsageError(f"--fsdp shards over processes, one worker each; --emulate-node {args.emulate_node} "
                         f"emulates workers inside one process: leave one out")
    if getattr(args, "bucket_cap_mb", None) is not None:
        raise UsageError(f"--bucket-cap-mb {args.bucket_cap_mb} sizes DDP's gradient buckets; --fsdp reduce-scatters "
                         f"each block's gradients as one, which it does not change: leave one out")
    if [e for e in plan.precision if e != 0]:
        raise UsageError("--fsdp: the -tc plan changes the network config during the run; a sharded model is "
                         "converted once, before fully_shard: use one config (--bfp)")


def check_args(task: Task, args: argparse.Namespace, plan: EpochPlan) -> None:
    """Refuse a bad flag value or combination, naming it: the task's checks, then the shared ones."""
    try:
        task.hooks.check_args(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for flag in ("training_epochs", "batch_size_train", "batch_size_test"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("limit_train_images", "limit_test_images"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0 (0: all), got {getattr(args, flag)}")
    name = args.run_name
    if name is not None and (name in ("", ".", "..") or any(c in name for c in "/\\\0") or name != name.strip()):
        raise UsageError(f"--run-name {name!r} must be one plain directory name (no '/', '\\', '..', "
                         f"surrounding spaces): the run directory is --run-dir/NAME; put other folders in "
                         f"--run-dir")
    if not 0 <= args.threads <= max_threads():
        raise UsageError(f"--threads must be in [0, {max_threads()}] (0: torch's and numba's defaults; at most "
                         f"NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}, which the environment variable "
                         f"of that name raises), got {args.threads}")
    for name, flag, value in (("lr", "--optim-lr", args.optim_lr), ("momentum", "--optim-momentum",
                              args.optim_momentum), ("weight_decay", "--optim-weight-decay", args.optim_weight_decay)):
        try:
            check_hyperparam(name, value, flag)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.optimizer == "adamw":  # momentum is AdamW's beta1: 1 would divide by 1 - beta1**t = 0
        moments = [("--optim-momentum", args.optim_momentum)] + [
            (f"-tc {args.train_config_file}: optimizer-dict[{e!r}]['momentum']", v["momentum"])
            for e, v in sorted(plan.optimizer.items()) if "momentum" in v]
        for where, v in moments:
            if not 0 <= v < 1:
                raise UsageError(f"{where} is AdamW's beta1 under --optimizer adamw and must be in [0, 1), "
                                 f"got {v!r}")
    if args.use_lars and args.optimizer != "sgd":
        raise UsageError(f"--use-lars scales SGD's steps layer by layer; it does not combine with --optimizer "
                         f"{args.optimizer}: leave one out")
    if not (math.isfinite(args.lars_trust) and args.lars_trust >= 0):
        raise UsageError(f"--lars-trust must be a finite number >= 0, got {args.lars_trust}")
    if args.diagnose < 0:
        raise UsageError(f"--diagnose must be >= 0 (0: off; N: measure one training step in every N), "
                         f"got {args.diagnose}")
    check_fsdp(args, plan)
    if args.mode != "train":  # a given training-engine flag would be ignored: say so (a resumed run's own are fine)
        given = [f for f in ("cuda_graph", "compile") if f in getattr(args, "explicit", ())]
        if given:
            flags = " and ".join(f"--{f.replace('_', '-')}" for f in given)
            raise UsageError(f"{flags} {'sets' if len(given) == 1 else 'set'} how training steps run; --mode {args.mode} trains no step: leave "
                             f"{flags} out")
    if args.diagnose and not args.log and args.mode == "train":
        raise UsageError(f"--diagnose {args.diagnose} writes what it measures to the run directory's log and "
                         f"TensorBoard: add --log True (without it every measurement would be discarded)")
    if args.diagnose_out:
        out = Path(args.diagnose_out)
        if out.suffix.lower() not in (".png", ".pdf", ".svg"):
            raise UsageError(f"--diagnose-out {args.diagnose_out}: the plot's file must end in .png, .pdf or .svg "
                             f"(matplotlib writes the format its name says)")
        parent = out.parent if str(out.parent) else Path(".")
        if out.is_dir() or (parent.exists() and not os.access(parent, os.W_OK)) or \
                (parent.exists() and not parent.is_dir()):
            raise UsageError(f"--diagnose-out {args.diagnose_out}: cannot write there (a folder, or a folder "
                             f"that is not writable)")
    if args.shadow and not args.diagnose:
        raise UsageError("--shadow compares the model with an FP32 copy at the measured steps: give --diagnose N")
    if args.num_workers < 0:
        raise UsageError(f"--num-workers must be >= 0, got {args.num_workers}")
    if not -2 ** 63 <= args.seed < 2 ** 64:  # what torch.manual_seed accepts
        raise UsageError(f"--seed must be in [-2**63, 2**64), got {args.seed}")
    if args.do is not None and not args.do.strip():
        raise UsageError("--do '': an empty dynamic-precision spec; give one such as Simple/0.6/0.8/0/1, "
                         "or leave --do out for no dynamic precision")
    if args.do and not (args.network_config or plan.precision):
        raise UsageError(f"--do {args.do}: dynamic precision needs a converted model; give --bfp CONFIG")
