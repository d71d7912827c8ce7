"""Run assembly: parsed flags -> data, model, Trainer and its collaborators -> one training run."""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numba
import numpy as np
import torch

from ..conversion import precision_state
from ..dynamic import DynamicPrecision
from ..engine import checkpoint as ckpt
from ..data import DataError
from ..engine.diagnose import DiagnoseCallback
from ..engine.logs import RunLog, git_commit, package_version, timestamp
from ..engine.schedule import EpochPlan
from ..engine.skipped_images import report_callbacks
from ..engine.slack import SlackNotifier, SlackTokenError, read_token
from ..engine.trainer import Trainer, TrainConfig, convert_model
from ..optim import check_hyperparam
from .amp_flags import amp_callbacks, make_amp
from .dist_run import distributed_setup
from .flags import UsageError
from .resume_checks import check_data, check_world, load_state, remove_stale_temps
from .tasks import CIFAR, Task
from .train_config import resume_checkpoint


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


def max_threads() -> int:
    """The most ``--threads`` a run may ask for: numba's thread pool size (this machine's cores
    unless ``NUMBA_NUM_THREADS`` says otherwise); torch would start more threads but not faster."""
    return int(numba.config.NUMBA_NUM_THREADS)


def check_args(task: Task, args: argparse.Namespace) -> None:
    hooks = task.hooks
    try:
        args.model = hooks.canonical_model(args.model)
        args.dataset = hooks.canonical_dataset(args.dataset)
        hooks.check_args(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.training_epochs is None:
        args.training_epochs = task.epochs(args.dataset)
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
    if not (math.isfinite(args.lars_trust) and args.lars_trust >= 0):
        raise UsageError(f"--lars-trust must be a finite number >= 0, got {args.lars_trust}")
    if args.diagnose < 0:
        raise UsageError(f"--diagnose must be >= 0 (0: off; N: measure one training step in every N), "
                         f"got {args.diagnose}")
    if args.shadow and not args.diagnose:
        raise UsageError("--shadow compares the model with an FP32 copy at the measured steps: give --diagnose N")
    if args.num_workers < 0:
        raise UsageError(f"--num-workers must be >= 0, got {args.num_workers}")
    if not -2 ** 63 <= args.seed < 2 ** 64:  # what torch.manual_seed accepts
        raise UsageError(f"--seed must be in [-2**63, 2**64), got {args.seed}")
    if args.do is not None and not args.do.strip():
        raise UsageError("--do '': an empty dynamic-precision spec; give one such as Simple/0.6/0.8/0/1, "
                         "or leave --do out for no dynamic precision")
    if args.do and not (args.network_config or args.plan_has_precision):
        raise UsageError(f"--do {args.do}: dynamic precision needs a converted model; give --bfp CONFIG")


def make_model(task: Task, args: argparse.Namespace, num_classes: int, in_channels: int):
    try:
        model = task.hooks.make_model(args, num_classes, in_channels)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    # A model built for other inputs (MLPMixer's image_size) fails now with its
    # options named, not mid-training.
    example, words = task.hooks.example_input(args, in_channels)
    try:
        with torch.no_grad():
            model.eval()(example)
    except RuntimeError as e:
        opts = " ".join(f"--model-opt {k}={v}" for k, v in args.model_opt) or "(no --model-opt)"
        raise UsageError(f"--model {args.model} {opts} does not take {words}: {e}") from None
    return model.train()


def convert(model, config: Any, flag: str):
    try:
        return convert_model(model, config)
    except (ValueError, KeyError, FileNotFoundError) as e:  # ConfigError is a ValueError
        raise UsageError(f"{flag} {config if isinstance(config, str) else '(dict)'}: {e}") from None


def network_config_json(model, active: Any) -> Any:
    """What the run's layers compute with, for config.json."""
    if active is None:
        return None
    return {"config": active, "layers": precision_state(model)}


def run_name(args: argparse.Namespace, suffix: str = "") -> str:
    if args.run_name:
        return args.run_name + suffix
    cfg = Path(str(args.network_config)).stem if args.network_config else (
        "schedule" if args.plan_has_precision else "fp32")
    return f"{args.model}_{args.dataset}_{cfg}_{timestamp()}{suffix}"


def train(task: Task, args: argparse.Namespace, plan: EpochPlan, *, suffix: str = "",
          stream=None) -> dict[str, Any]:
    """One training run; returns a summary (metrics of the last epoch, best accuracy, time)."""
    with cpu_threads(args.threads):
        return _train(task, args, plan, suffix=suffix, stream=stream)


def _train(task: Task, args: argparse.Namespace, plan: EpochPlan, *, suffix: str = "",
           stream=None) -> dict[str, Any]:
    device = resolve_device(args.device)
    dist = distributed_setup(args, device)  # process group, device, step strategy, optimizer
    device = dist.device
    resume_path, state = resume_checkpoint(args)
    world_note = check_world(resume_path, state, dist.env.world_size, args.emulate_node) \
        if state is not None else None
    seed_everything(args.seed)
    data = load_data(args, device, task, dist.shard)
    data_note = check_data(args, resume_path, state, data) if state is not None else None
    config = train_config(args, plan, device)
    model = make_model(task, args, data.num_classes, data.in_channels)
    dist.check_model(model)
    # A resumed model is first converted as it was when saved; the checkpoint's
    # per-layer precision state then restores any dynamic changes.
    initial = state["network_config"] if state is not None else initial_network_config(args, plan)
    from_plan = state is None and args.network_config is None and 0 in plan.precision
    model = convert(model, initial, "checkpoint network config" if state is not None else
                    f"-tc {args.train_config_file}: bfp-layer-conf-dict[0]" if from_plan else "--bfp")
    check_plan_configs(model, plan, initial, args.train_config_file)

    writes = args.log or args.save
    run_dir = resumed_run_dir(args, resume_path, state) if state is not None \
        else new_run_dir(args, suffix) if writes else None
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
    try:
        trainer = Trainer(model, data, config, device=device, log=log,
                          checkpoint_dir=(run_dir / "checkpoints") if (args.save and run_dir) else None,
                          callbacks=make_callbacks(args, model, token, run_dir, log) + report_callbacks(data)
                          + task.hooks.callbacks(args), plan=plan,
                          network_config=initial, name=args.model, optimizer_factory=dist.optimizer_factory,
                          amp=make_amp(args, config.compute_dtype, device.type), step=dist.step,
                          extra_state={"args": public_args, "plan": plan.to_json(),
                                       "run_dir": str(run_dir) if run_dir else None, "data": data.fingerprint,
                                       "world": {"processes": dist.env.world_size, "emulate_node": args.emulate_node,
                                                 "workers": dist.env.world_size * args.emulate_node}})
        if state is not None:
            remove_stale_temps(log.run_dir, log)
            for note in (world_note, data_note):
                if note:
                    log(note)
            load_state(trainer, state, resume_path)
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


def load_data(args: argparse.Namespace, device: torch.device, task: Optional[Task] = None,
              shard: tuple[int, int, int] = (0, 1, 1)):
    """The run's data; ``shard`` = (rank, world, workers) of a distributed or emulated run."""
    try:
        return (task or CIFAR).hooks.load_data(args, device, shard)
    except (DataError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None


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
                           nonfinite_epochs=args.stop_nonfinite)
    except ValueError as e:
        raise UsageError(str(e)) from None


def initial_network_config(args: argparse.Namespace, plan: EpochPlan) -> Any:
    """The network config of epoch 0; an explicit --bfp replaces the -tc file's epoch-0 entry."""
    if args.network_config is None:
        return plan.precision_at(0, None)
    if 0 in plan.precision:
        plan.precision[0] = args.network_config
    return args.network_config


def check_plan_configs(model, plan: EpochPlan, initial: Any, source: Optional[str]) -> None:
    """Convert a copy with every scheduled config: a bad one fails now, not at epoch 20."""
    for epoch, cfg in sorted(plan.precision.items()):
        if cfg != initial:
            convert(copy.deepcopy(model), cfg, f"-tc {source}: bfp-layer-conf-dict[{epoch}]")


def new_run_dir(args: argparse.Namespace, suffix: str) -> Path:
    """``--run-dir/<name>``; never an existing directory (``-1``, ``-2`` ... appended)."""
    base = Path(args.run_dir) / run_name(args, suffix)
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    return run_dir


def resumed_run_dir(args: argparse.Namespace, path: Path, state: dict) -> Optional[Path]:
    """The run directory a resume writes to: the one holding ``path`` (a copied run
    continues in its copy), else the one recorded in the checkpoint. Refuses when it
    holds a later ``last.pt``, which continuing from an earlier epoch would overwrite."""
    saved = state["extra"].get("run_dir")
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else Path(saved) if saved else None
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if (args.log or args.save) and last is not None and last.is_file() and last.resolve() != path.resolve():
        try:
            later = ckpt.load(last)["epoch"]
        except ckpt.CheckpointError:
            later = -1  # a corrupt last.pt holds nothing to keep: resuming replaces it
        if later > state["epoch"]:
            raise UsageError(
                f"--resume {path}: {run_dir} holds a later checkpoint ({last}, {later} epochs done) that "
                f"continuing after epoch {state['epoch']} would overwrite; to branch from there, copy "
                f"{run_dir} to a new directory, delete the copy's checkpoints/last.pt and resume the "
                f"copy's {path.name}")
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
