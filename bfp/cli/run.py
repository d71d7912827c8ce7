"""Run assembly: a run specification (``bfp.cli.spec``) -> data, model, Trainer and its collaborators
-> one training run."""
from __future__ import annotations

import argparse
import contextlib
import copy
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numba
import numpy as np
import torch

from ..conversion import precision_state, trace_model
from ..dynamic import DynamicPrecision
from ..data import DataError
from ..engine.compiled import deterministic
from ..engine.diagnose import DiagnoseCallback
from ..engine.graphed import GraphedStep, refusal
from ..engine.logs import RunLog, git_commit, package_version, timestamp
from ..engine.schedule import EpochPlan
from ..engine.skipped_images import report_callbacks
from ..engine.slack import SlackNotifier, SlackTokenError, read_token
from ..engine.trainer import Trainer, TrainConfig, convert_model
from .amp_flags import amp_callbacks, make_amp
from .dist_run import distributed_setup
from .flags import UsageError, build_parser, flag_name
from .resume import (check_counters, check_data, check_world, fit_schedule, load_state, remove_stale_temps,
                     resumed_run_dir)
from .spec import RunSpec
from .tasks import CIFAR, Task


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r}: not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name!r}: only cpu and cuda are supported")
    return dev


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def cpu_threads(n: int):
    """Run with ``n`` torch and numba threads (0: leave them), restoring them after."""
    if not n:
        yield
        return
    old_torch, old_numba = torch.get_num_threads(), numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old_torch)
        numba.set_num_threads(old_numba)


def make_model(task: Task, args: argparse.Namespace, num_classes: int, in_channels: int):
    try:
        model = task.hooks.make_model(args, num_classes, in_channels)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    # A model built for other inputs (MLPMixer's image_size) fails now with its
    # options named, not mid-training.
    example, words = task.hooks.example_input(args, in_channels)
    try:  # the trial forward is also the trace that finds every GEMM (bfp.trace)
        model = trace_model(model, example)
    except RuntimeError as e:
        opts = " ".join(f"--model-opt {k}={v}" for k, v in args.model_opt) or "(no --model-opt)"
        raise UsageError(f"--model {args.model} {opts} does not take {words}: {e}") from None
    return model.train()


def convert(model, config: Any, flag: str, strict: bool = False):
    try:
        return convert_model(model, config, strict=strict)
    except (ValueError, KeyError, FileNotFoundError) as e:  # ConfigError is a ValueError
        raise UsageError(f"{flag} {config if isinstance(config, str) else '(dict)'}: {e}") from None


def network_config_json(model, active: Any) -> Any:
    """What the run's layers compute with, for config.json."""
    if active is None:
        return None
    return {"config": active, "layers": precision_state(model)}


def run_name(spec: RunSpec, suffix: str = "") -> str:
    args = spec.args
    if args.run_name:
        return args.run_name + suffix
    cfg = Path(str(args.network_config)).stem if args.network_config else (
        "schedule" if spec.plan.precision else "fp32")
    return f"{args.model}_{args.dataset}_{cfg}_{timestamp()}{suffix}"


def train(spec: RunSpec, *, suffix: str = "", stream=None) -> dict[str, Any]:
    """One training run; returns a summary (metrics of the last epoch, best accuracy, time)."""
    with cpu_threads(spec.args.threads), deterministic(spec.args.deterministic):
        return _train(spec, suffix=suffix, stream=stream)


def _train(spec: RunSpec, *, suffix: str = "", stream=None) -> dict[str, Any]:
    task, args, plan, resumed = spec.task, spec.args, spec.plan, spec.resumed
    device = resolve_device(args.device)
    parser = build_parser(task)  # the ranks' differences named by the flags users type
    dist = distributed_setup(args, device, plan, lambda dest: flag_name(parser, dest))
    device = dist.device
    state = resumed.state if resumed is not None else None
    world_note = check_world(resumed.path, state, dist.env.world_size, args.emulate_node) \
        if resumed is not None else None
    seed_everything(args.seed)
    data = load_data(args, device, task, dist.shard)
    data_note = check_data(args, resumed.path, state, data) if resumed is not None else None
    config = train_config(args, plan, device)
    model = make_model(task, args, data.num_classes, data.in_channels)
    dist.check_model(model)
    # A resumed model is first converted as it was when saved; the checkpoint's
    # per-layer precision state then restores any dynamic changes.
    initial = spec.initial_config
    from_plan = resumed is None and args.network_config is None and 0 in plan.precision
    model = convert(model, initial, "checkpoint network config" if resumed is not None else
                    f"-tc {args.train_config_file}: bfp-layer-conf-dict[0]" if from_plan else "--bfp",
                    strict=args.strict_coverage)
    check_plan_configs(model, plan, initial, args.train_config_file)
    if hasattr(dist.step, "shard"):  # --fsdp: sharded before the optimizer takes the parameters
        model = dist.step.shard(model.to(device))

    writes = args.log or args.save
    run_dir = resumed_run_dir(args, resumed.path, state) if resumed is not None \
        else new_run_dir(spec, suffix) if writes else None
    try:
        token = read_token() if args.slackbot else None
    except SlackTokenError as e:
        raise UsageError(f"--slackbot: {e}") from None
    try:
        log = RunLog(run_dir if writes else None, tensorboard=args.log, stream=stream,
                     redact=(token,) if token else ())
    except OSError as e:
        raise UsageError(f"cannot write the run directory {str(run_dir)!r} (--run-dir {args.run_dir}): "
                         f"{e.strerror or e}") from None
    public_args = {k: v for k, v in vars(args).items() if k != "explicit"}
    amp = make_amp(args, config.compute_dtype, device.type)
    step = graphed_step(args, device, amp, dist) if args.cuda_graph else dist.step
    try:
        trainer = Trainer(model, data, config, device=device, log=log,
                          checkpoint_dir=(run_dir / "checkpoints") if (args.save and run_dir) else None,
                          callbacks=make_callbacks(args, model, token, run_dir, log) + report_callbacks(data)
                          + task.hooks.callbacks(args), plan=plan,
                          network_config=initial, name=args.model, optimizer_factory=dist.optimizer_factory,
                          amp=amp, step=step,
                          extra_state={"args": public_args, "plan": plan.to_json(),
                                       "run_dir": str(run_dir) if run_dir else None, "data": data.fingerprint,
                                       "world": {"processes": dist.env.world_size, "emulate_node": args.emulate_node,
                                                 "workers": dist.env.world_size * args.emulate_node}})
        if state is not None:
            remove_stale_temps(log.run_dir, log)
            for note in (world_note, data_note):
                if note:
                    log(note)
            check_counters(resumed.path, state, trainer.epochs)
            state = fit_schedule(resumed.path, state, trainer.schedule, len(trainer.data.train),
                                 args.resume_allow_data_change, log)
            load_state(trainer, state, resumed.path)
            log(f"{args.resume}: the run already finished its {trainer.epochs} epochs; nothing to do"
                if trainer.epoch >= trainer.epochs else
                f"resumed {args.resume} at epoch {trainer.epoch + 1}/{trainer.epochs}")
        if log.run_dir is not None:
            # a resume adds its own file: the interrupted run's config.json stays as it was
            log.write_json("config.json" if state is None else f"config.resumed-at-epoch{trainer.epoch}.json", {
                "args": public_args, "command": sys.argv, "epoch_plan": plan.to_json(),
                "network_config": network_config_json(trainer.model, trainer.network_config),
                "bfpsim_version": package_version(), "git_commit": git_commit(),
                "torch_version": torch.__version__, "device": str(device), "data": data.describe(),
                "resumed_at_epoch": trainer.epoch if state is not None else None})
        log(f"{trainer.describe()}; {data.describe()}; device {device}; {dist.describe()}"
            + (f"; run directory {run_dir}" if run_dir else ""))
        if state is None:
            trainer.log_precision()
        t0 = time.perf_counter()
        history = trainer.fit()
        total = time.perf_counter() - t0
    finally:
        log.close()
    return {"history": history, "last": history[-1] if history else {}, "best_acc": trainer.best_acc,
            "total_time_s": total, "run_dir": str(run_dir) if run_dir else None, "config": initial,
            "model": trainer.model}


def graphed_step(args: argparse.Namespace, device: torch.device, amp, dist) -> GraphedStep:
    """``--cuda-graph``'s step strategy, or the reason it cannot be honoured (bfp.engine.graphed)."""
    why = refusal(device=device, distributed=dist.env.world_size > 1, emulated=args.emulate_node > 1,
                  compile_mode=args.compile)
    if why is not None:
        raise UsageError(why)
    return GraphedStep(dist.step)


def load_data(args: argparse.Namespace, device: torch.device, task: Optional[Task] = None,
              shard: tuple[int, int, int] = (0, 1, 1)):
    """The run's data; ``shard`` = (rank, world, workers) of a distributed or emulated run."""
    try:
        return (task or CIFAR).hooks.load_data(args, device, shard)
    except (DataError, FileNotFoundError) as e:
        raise UsageError(str(e), every_rank=True) from None


def train_config(args: argparse.Namespace, plan: EpochPlan, device: torch.device) -> TrainConfig:
    if args.compute_dtype == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a GPU (float16 autocast on the CPU is slow and its loss "
                         "scaling untested); use --precision bf16 on the CPU")
    try:
        plan.check_epochs(args.training_epochs, args.train_config_file or "<flags>")
        return TrainConfig(epochs=args.training_epochs, lr=args.optim_lr, momentum=args.optim_momentum,
                           weight_decay=args.optim_weight_decay, warmup_epochs=args.warmup_epochs,
                           compute_dtype=args.compute_dtype, label_smoothing=args.label_smoothing,
                           save_interval=args.save_interval, histograms=args.histograms,
                           progress=args.progress, lr_schedule=getattr(args, "lr_schedule", "cosine"),
                           nonfinite_epochs=args.stop_nonfinite, max_steps=getattr(args, "max_steps", 0),
                           sample_unit=getattr(args, "sample_unit", "img"), compile=args.compile)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_plan_configs(model, plan: EpochPlan, initial: Any, source: Optional[str]) -> None:
    """Convert a copy with every scheduled config: a bad one fails now, not at epoch 20."""
    for epoch, cfg in sorted(plan.precision.items()):
        if cfg != initial:
            convert(copy.deepcopy(model), cfg, f"-tc {source}: bfp-layer-conf-dict[{epoch}]")


def new_run_dir(spec: RunSpec, suffix: str) -> Path:
    """``--run-dir/<name>``; never an existing directory (``-1``, ``-2`` ... appended)."""
    base = Path(spec.args.run_dir) / run_name(spec, suffix)
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    return run_dir


def make_callbacks(args: argparse.Namespace, model, token: Optional[str], run_dir: Optional[Path], log):
    callbacks = []
    if args.slackbot:
        if not token:
            log("slack: no token in ./slackbot.token or $BFP_SLACK_TOKEN; not posting")
        else:
            callbacks.append(SlackNotifier(token, args.slack_channel, run_name=run_dir.name if run_dir else "",
                                           base_url=args.slack_base_url, log=log))
    if args.do:
        try:
            callbacks.append(DynamicPrecision.from_args(model, spec=args.do, color=args.do_color,
                                                        every=args.do_every))
        except ValueError as e:
            raise UsageError(f"--do {args.do}: {e}") from None
    if args.diagnose:
        callbacks.append(DiagnoseCallback(args.diagnose, shadow=args.shadow))
    return callbacks + amp_callbacks(args)
