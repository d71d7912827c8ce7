"""Command line of cifar.py: flags, training configs (conf_train), run setup.

The flags of the original simulator keep their names and their
``--flag True`` booleans so documented commands work unchanged. Precedence:
flags given on the command line, then the ``-tc`` training config, then the
defaults below. ``--resume`` takes the interrupted run's flags from its
checkpoint; only the flags in ``RESUME_OVERRIDES`` may be given again.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from . import checkpoint as ckpt
from . import data as data_mod
from .checkpoint import CheckpointError
from .data import DataError
from .logs import RunLog, git_commit, package_version, timestamp
from .schedule import EpochPlan
from .trainer import PRECISIONS, Trainer, TrainConfig

DEFAULT_EPOCHS = {"digits": 4}           # everything else: 200 (the original's CIFAR schedule)
PLAN_KEYS = ("bfp-layer-conf-dict", "optimizer-dict")
# Flags a resumed run may change (where it runs and what it reports, not what it computes).
RESUME_OVERRIDES = {"num_workers", "device", "log", "save", "save_interval",
                    "slackbot", "slack_channel", "slack_base_url", "progress", "batch_size_test",
                    "histograms", "resume", "do_color", "dataset_path", "mode"}


class UsageError(Exception):
    """A bad flag value, file or combination; reported as one line, exit status 2."""


def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "t", "yes", "y", "1", "on"):
        return True
    if s in ("false", "f", "no", "n", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def do_every(v: Any) -> Any:
    if str(v).lower() == "epoch":
        return "epoch"
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a positive number of steps, got {v!r}")
    return n


def model_option(v: str) -> tuple[str, Any]:
    key, sep, val = str(v).partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. width=16), got {v!r}")
    for conv in (int, float):
        try:
            return key, conv(val)
        except ValueError:
            pass
    return key, val


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cifar.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a 32x32 image classifier in FP32, mixed precision or simulated low precision "
                    "(block floating point, small floats, MX) and log the run under runs/<name>/. "
                    "Booleans take True/False (`--log True`, as the original) or stand alone (`--log`).")
    b = dict(type=str2bool, nargs="?", const=True, metavar="BOOL")
    g = p.add_argument_group("what to run")
    g.add_argument("--mode", default="train", choices=["train", "generate-config"],
                   help="train: train and evaluate; generate-config: write a network config listing every "
                        "convertible layer of --model (to --config-out) and exit")
    g.add_argument("-m", "--model", default="ResNet18",
                   help="network: one of bfp.models.names() (ResNet10/18/34/50/101/152, VGG11/13/16/19, "
                        "DenseNet121/161/169/201, DenseNetCifar, MobileNet, MobileNetV2, AlexNet, MLPMixer)")
    g.add_argument("--model-opt", action="append", type=model_option, default=[], metavar="KEY=VALUE",
                   help="constructor option of the model, repeatable (e.g. width=16 for a narrow ResNet)")
    g.add_argument("-d", "--dataset", default="CIFAR10",
                   help=f"{', '.join(data_mod.DATASETS)}; digits is scikit-learn's 8x8 digits, built in "
                        f"and offline; CIFAR10 with -dp pointing at an image folder (the JPEG CIFAR-10) "
                        f"loads that folder")
    g.add_argument("-dp", "--dataset-path", default=None,
                   help="dataset directory (default data/cifar10 or data/cifar100; imagefolder: the "
                        "folder with train/ and test/)")
    g.add_argument("--in-channels", type=int, default=3, help="channels of digits images (1 or 3)")
    g.add_argument("--limit-train-images", type=int, default=0, metavar="N",
                   help="train on N training images spread evenly over the set (smoke tests; 0: all)")
    g.add_argument("--limit-test-images", type=int, default=0, metavar="N",
                   help="evaluate on N test images spread evenly over the set (0: all)")
    g.add_argument("--bfp", default=None, metavar="CONFIG",
                   help="network config: a preset name from conf_net/ (e.g. ResNet18_FB16), a JSON path; "
                        "omitted: FP32")
    g.add_argument("-tc", "--train-config-file", default=None, metavar="NAME",
                   help="training config: NAME in conf_train/ (NAME.json) or a path; presets flags and "
                        "schedules precision (bfp-layer-conf-dict) and optimizer (optimizer-dict) by epoch")
    g.add_argument("--compare", **b, default=False,
                   help="run the job twice, FP32 then with --bfp (or the -tc precision schedule), and print "
                        "accuracy, loss and time side by side")

    g = p.add_argument_group("optimization")
    g.add_argument("--training-epochs", type=int, default=None,
                   help="epochs to train (default: 4 for digits, 200 otherwise)")
    g.add_argument("--batch-size-train", type=int, default=128, help="images per training step")
    g.add_argument("--batch-size-test", type=int, default=256, help="images per evaluation batch")
    g.add_argument("--optim-lr", type=float, default=0.1, help="peak learning rate (SGD)")
    g.add_argument("--optim-momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--optim-weight-decay", type=float, default=5e-4, help="SGD weight decay (L2)")
    g.add_argument("--warmup-epochs", type=float, default=0.0,
                   help="linear learning-rate warm-up before the cosine decay (fractions allowed)")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy label smoothing")
    g.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="compute dtype: fp16 (autocast + GradScaler starting at 2^16) or bf16 (autocast); "
                        "weights stay float32. Independent of --bfp, which simulates formats")
    g.add_argument("--seed", type=int, default=0, help="seeds model init, data order and augmentation")

    g = p.add_argument_group("dynamic precision (bfp.dynamic)")
    g.add_argument("--do", default=None, metavar="SPEC",
                   help="dynamic precision control, e.g. Simple/0.6/0.8/0/1 (needs --bfp)")
    g.add_argument("--do-color", **b, default=False, help="colour console table of zero-setting errors")
    g.add_argument("--do-every", type=do_every, default="epoch",
                   help="decide every epoch or every N training steps")

    g = p.add_argument_group("hardware")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1 ...")
    g.add_argument("--num-workers", type=int, default=2, help="data-loader worker processes")
    g.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch and numba (0: their defaults); 1 is fastest for tiny models "
                        "on a busy machine")
    g.add_argument("--gpu-data", **b, default=False,
                   help="keep the whole dataset on --device and augment there (fast for small models)")

    g = p.add_argument_group("output")
    g.add_argument("--log", **b, default=False, help="write runs/<name>/: config.json, log.txt, TensorBoard")
    g.add_argument("--save", **b, default=False, help="write checkpoints (runs/<name>/checkpoints/)")
    g.add_argument("--save-interval", type=int, default=0,
                   help="also keep epoch_<n>.pt every n epochs (last.pt and best.pt are always kept)")
    g.add_argument("--run-dir", default="runs", help="directory holding run directories")
    g.add_argument("--run-name", default=None,
                   help="run directory name (default <model>_<dataset>_<config>_<time>)")
    g.add_argument("--resume", default=None, metavar="PATH",
                   help="continue an interrupted run: its run directory or a checkpoint file")
    g.add_argument("--histograms", **b, default=False, help="weight histograms in TensorBoard")
    g.add_argument("--progress", **b, default=True, help="tqdm progress bar")
    g.add_argument("--config-out", default=None,
                   help="generate-config: output path (default conf_net/<model>_generated.json)")
    g.add_argument("--overwrite", **b, default=False, help="generate-config: replace an existing file")

    g = p.add_argument_group("slack")
    g.add_argument("--slackbot", **b, default=False,
                   help="post progress to Slack; token from ./slackbot.token or $BFP_SLACK_TOKEN")
    g.add_argument("--slack-channel", default=os.environ.get("BFP_SLACK_CHANNEL", "#bfpsim"),
                   help="channel to post to (default from $BFP_SLACK_CHANNEL)")
    g.add_argument("--slack-base-url", default=None, help=argparse.SUPPRESS)  # tests: a local server
    return p


# ---- training configs ---------------------------------------------------------------

def find_train_config(name: str) -> Path:
    p = Path(name)
    if p.is_file():
        return p
    here = Path(__file__).resolve().parents[2] / "conf_train"
    for d in (Path("conf_train"), here):
        for cand in (d / name, d / f"{name}.json"):
            if cand.is_file():
                return cand
    avail = sorted({f.stem for d in (Path("conf_train"), here) if d.is_dir() for f in d.glob("*.json")})
    raise UsageError(f"-tc {name!r}: no such training config (looked for {name}, conf_train/{name}.json); "
                     f"available: {', '.join(avail) or 'none'}")


def load_train_config(path: Path, parser: argparse.ArgumentParser) -> tuple[dict[str, Any], dict]:
    """(flag defaults, plan entries) from a conf_train JSON file; unknown keys are errors."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"training config {str(path)!r} is not readable JSON: {e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"training config {str(path)!r} must hold a JSON object")
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help",)}
    settable = set(actions) - {"train_config_file", "resume", "slack_base_url"}
    flags, plan = {}, {}
    for key, value in raw.items():
        if key in PLAN_KEYS:
            if not isinstance(value, dict):
                raise UsageError(f"training config {str(path)!r}: {key!r} must be an object keyed by epoch")
            plan[key] = value
            continue
        dest = key.lstrip("-").replace("-", "_")
        if dest not in settable:
            allowed = sorted(PLAN_KEYS) + sorted(a.replace("_", "-") for a in settable)
            raise UsageError(f"training config {str(path)!r}: unknown key {key!r}; allowed: {', '.join(allowed)}")
        a = actions[dest]
        where = f"training config {str(path)!r}: {key!r}"
        if dest == "model_opt":
            if not isinstance(value, dict):
                raise UsageError(f'{where} must be an object like {{"width": 16}}, got {value!r}')
            value = [model_option(f"{k}={v}") for k, v in value.items()]
        elif isinstance(value, (list, dict)):
            raise UsageError(f"{where} must be a single value, got {value!r}")
        elif value is None:
            if a.default is not None:
                raise UsageError(f"{where} cannot be null (default: {a.default!r})")
        else:
            try:  # as argparse would convert the same text on the command line
                value = a.type(str(value)) if a.type is not None else str(value)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                raise UsageError(f"{where}: {e}") from None
        if a.choices is not None and value not in a.choices:
            raise UsageError(f"training config {str(path)!r}: {key!r} = {value!r}; allowed: "
                             f"{', '.join(map(str, a.choices))}")
        flags[dest] = value
    return flags, plan


def explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Dests of the flags actually present in ``argv``."""
    quiet = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for a in parser._actions:
        if a.option_strings and a.dest != "help":
            kw = dict(dest=a.dest, nargs=a.nargs, const=a.const) if a.nargs is not None else dict(dest=a.dest)
            if isinstance(a, argparse._AppendAction):
                kw = dict(dest=a.dest, action="append")
            quiet.add_argument(*a.option_strings, **kw)
    ns, _ = quiet.parse_known_args(list(argv))
    return set(vars(ns))


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple[argparse.Namespace, EpochPlan, Optional[Path]]:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    plan_raw, tc_path = {}, None
    if args.train_config_file:
        tc_path = find_train_config(args.train_config_file)
        flags, plan_raw = load_train_config(tc_path, parser)
        parser.set_defaults(**flags)
        args = parser.parse_args(argv)  # command-line flags win over the file
    args.explicit = sorted(explicit_flags(parser, argv))
    try:
        plan = EpochPlan.parse(plan_raw.get("bfp-layer-conf-dict"), plan_raw.get("optimizer-dict"),
                               str(tc_path) if tc_path else "<flags>")
    except ValueError as e:
        raise UsageError(str(e)) from None
    return args, plan, tc_path


# ---- running ------------------------------------------------------------------------

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


def check_args(args: argparse.Namespace) -> None:
    import bfp.models
    try:
        args.model = bfp.models.canonical_name(args.model)
        args.dataset = data_mod.canonical_name(args.dataset)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.training_epochs is None:
        args.training_epochs = DEFAULT_EPOCHS.get(args.dataset, 200)
    for flag in ("training_epochs", "batch_size_train", "batch_size_test"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("limit_train_images", "limit_test_images"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0 (0: all), got {getattr(args, flag)}")
    if args.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {args.threads}")
    if args.num_workers < 0:
        raise UsageError(f"--num-workers must be >= 0, got {args.num_workers}")
    if not -2 ** 63 <= args.seed < 2 ** 64:  # what torch.manual_seed accepts
        raise UsageError(f"--seed must be in [-2**63, 2**64), got {args.seed}")
    if args.do and not (args.bfp or args.plan_has_precision):
        raise UsageError(f"--do {args.do}: dynamic precision needs a converted model; give --bfp CONFIG")


def make_model(args: argparse.Namespace, num_classes: int, in_channels: int):
    import torch

    import bfp.models
    try:
        model = bfp.models.create(args.model, num_classes, in_channels, **dict(args.model_opt))
    except ValueError as e:
        raise UsageError(str(e)) from None
    # Every dataset here is 32x32: a model built for another size (MLPMixer's
    # image_size) fails now with its options named, not mid-training.
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(2, in_channels, 32, 32))
    except RuntimeError as e:
        opts = " ".join(f"--model-opt {k}={v}" for k, v in args.model_opt) or "(no --model-opt)"
        raise UsageError(f"--model {args.model} {opts} does not take 32x32 images: {e}") from None
    return model.train()


def convert(model, config: Any, flag: str):
    from .trainer import convert_model
    try:
        return convert_model(model, config)
    except (ValueError, KeyError, FileNotFoundError) as e:  # bfp.config.ConfigError is a ValueError
        raise UsageError(f"{flag} {config if isinstance(config, str) else '(dict)'}: {e}") from None


def network_config_json(model, active: Any) -> Any:
    """What the run's layers compute with, for config.json."""
    if active is None:
        return None
    import bfp
    return {"config": active, "layers": bfp.precision_state(model)}


def run_name(args: argparse.Namespace, suffix: str = "") -> str:
    if args.run_name:
        return args.run_name + suffix
    cfg = Path(str(args.bfp)).stem if args.bfp else ("schedule" if args.plan_has_precision else "fp32")
    return f"{args.model}_{args.dataset}_{cfg}_{timestamp()}{suffix}"


def train(args: argparse.Namespace, plan: EpochPlan, *, suffix: str = "", stream=None) -> dict[str, Any]:
    """One training run; returns a summary (metrics of the last epoch, best accuracy, time)."""
    with cpu_threads(args.threads):
        return _train(args, plan, suffix=suffix, stream=stream)


@contextlib.contextmanager
def cpu_threads(n: int):
    """Run with ``n`` torch and numba threads (0: leave them), restoring them after."""
    if not n:
        yield
        return
    old_torch = torch.get_num_threads()
    try:
        import numba
        old_numba = numba.get_num_threads()
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        numba = None
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old_torch)
        if numba is not None:
            numba.set_num_threads(old_numba)


def _train(args: argparse.Namespace, plan: EpochPlan, *, suffix: str = "", stream=None) -> dict[str, Any]:
    device = resolve_device(args.device)
    resume_path = ckpt.resolve(args.resume) if args.resume else None
    state = ckpt.load(resume_path, map_location="cpu") if resume_path else None
    seed_everything(args.seed)
    data = load_data(args, device)
    config = train_config(args, plan, device)
    model = make_model(args, data.num_classes, data.in_channels)
    # A resumed model is first converted as it was when saved; the checkpoint's
    # per-layer precision state then restores any dynamic changes.
    initial = state["active_precision"] if state is not None else initial_precision(args, plan)
    model = convert(model, initial, "--bfp" if state is None else "checkpoint network config")
    check_plan_configs(model, plan, initial, args.train_config_file)

    run_dir = resumed_run_dir(args, resume_path, state) if state is not None \
        else new_run_dir(args, suffix) if (args.log or args.save) else None
    token = read_slack_token() if args.slackbot else None
    try:
        log = RunLog(run_dir if (args.log or args.save) else None, tensorboard=args.log, stream=stream,
                     redact=(token,) if token else ())
    except OSError as e:
        raise UsageError(f"cannot write the run directory {str(run_dir)!r} (--run-dir {args.run_dir}): "
                         f"{e.strerror or e}") from None
    public_args = {k: v for k, v in vars(args).items() if k != "explicit"}
    try:
        trainer = Trainer(model, data, config, device=device, log=log,
                          checkpoint_dir=(run_dir / "checkpoints") if (args.save and run_dir) else None,
                          callbacks=make_callbacks(args, model, token, run_dir, log), plan=plan,
                          initial_precision=initial, name=args.model,
                          extra_state={"args": public_args, "plan": plan.to_json(),
                                       "run_dir": str(run_dir) if run_dir else None})
        if state is not None:
            trainer.load_state_dict(state)
            log(f"{args.resume}: the run already finished its {trainer.epochs} epochs; nothing to do"
                if trainer.epoch >= trainer.epochs else
                f"resumed {args.resume} at epoch {trainer.epoch + 1}/{trainer.epochs}")
        if log.run_dir is not None:
            # a resume adds its own file: the interrupted run's config.json stays as it was
            log.write_json("config.json" if state is None else f"config.resumed-at-epoch{trainer.epoch}.json", {
                "args": public_args, "command": sys.argv, "epoch_plan": plan.to_json(),
                "network_config": network_config_json(trainer.model, trainer.active_precision),
                "bfpsim_version": package_version(), "git_commit": git_commit(),
                "torch_version": torch.__version__, "device": str(device), "data": data.describe(),
                "resumed_at_epoch": trainer.epoch if state is not None else None})
        log(f"{trainer.describe()}; {data.describe()}; device {device}"
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


def load_data(args: argparse.Namespace, device: torch.device):
    try:
        return data_mod.load(args.dataset, args.dataset_path, batch_size_train=args.batch_size_train,
                             batch_size_test=args.batch_size_test, num_workers=args.num_workers,
                             device=device, gpu_data=args.gpu_data, seed=args.seed, channels=args.in_channels,
                             limit_train=args.limit_train_images, limit_test=args.limit_test_images)
    except (DataError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None


def train_config(args: argparse.Namespace, plan: EpochPlan, device: torch.device) -> TrainConfig:
    if args.precision == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a GPU (float16 autocast on the CPU is slow and its loss "
                         "scaling untested); use --precision bf16 on the CPU")
    try:
        plan.check_epochs(args.training_epochs, args.train_config_file or "<flags>")
        return TrainConfig(epochs=args.training_epochs, lr=args.optim_lr, momentum=args.optim_momentum,
                           weight_decay=args.optim_weight_decay, warmup_epochs=args.warmup_epochs,
                           precision=args.precision, label_smoothing=args.label_smoothing,
                           save_interval=args.save_interval, histograms=args.histograms,
                           progress=args.progress)
    except ValueError as e:
        raise UsageError(str(e)) from None


def initial_precision(args: argparse.Namespace, plan: EpochPlan) -> Any:
    """The network config of epoch 0; an explicit --bfp replaces the -tc file's epoch-0 entry."""
    if args.bfp is None:
        return plan.precision_at(0, None)
    if 0 in plan.precision:
        plan.precision[0] = args.bfp
    return args.bfp


def check_plan_configs(model, plan: EpochPlan, initial: Any, source: Optional[str]) -> None:
    """Convert a copy with every scheduled config: a bad one fails now, not at epoch 20."""
    import copy
    for epoch, cfg in sorted(plan.precision.items()):
        if cfg != initial:
            convert(copy.deepcopy(model), cfg, f"{source}: bfp-layer-conf-dict[{epoch}]")


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
        later = ckpt.load(last)["epoch"]
        if later > state["epoch"]:
            raise UsageError(
                f"--resume {path}: {run_dir} holds a later checkpoint ({last}, {later} epochs done) that "
                f"continuing after epoch {state['epoch']} would overwrite; to branch from there, copy "
                f"{run_dir} to a new directory, delete the copy's checkpoints/last.pt and resume the "
                f"copy's {path.name}")
    return run_dir


def read_slack_token() -> Optional[str]:
    from .slack import read_token
    return read_token()


def make_callbacks(args: argparse.Namespace, model, token: Optional[str], run_dir: Optional[Path], log):
    callbacks = []
    if args.slackbot:
        if not token:
            log("slack: no token in ./slackbot.token or $BFP_SLACK_TOKEN; not posting")
        else:
            from .slack import SlackNotifier
            callbacks.append(SlackNotifier(token, args.slack_channel, run_name=run_dir.name if run_dir else "",
                                           base_url=args.slack_base_url, log=log))
    if args.do:
        try:
            from bfp.dynamic import DynamicPrecision
        except ImportError as e:
            raise UsageError(f"--do {args.do}: dynamic precision control is not available ({e})") from None
        try:
            callbacks.append(DynamicPrecision.from_args(model, spec=args.do, color=args.do_color,
                                                        every=args.do_every))
        except ValueError as e:
            raise UsageError(f"--do {args.do}: {e}") from None
    return callbacks


def compare(args: argparse.Namespace, plan: EpochPlan, stream=None) -> list[dict[str, Any]]:
    if not (args.bfp or plan.precision):
        raise UsageError("--compare needs --bfp CONFIG (or a -tc config with bfp-layer-conf-dict) to "
                         "compare against FP32")
    if args.resume:
        raise UsageError("--compare cannot be combined with --resume")
    import copy
    fp32_args = copy.copy(args)
    fp32_args.bfp, fp32_args.do = None, None
    fp32_plan = EpochPlan(precision={}, optimizer=dict(plan.optimizer))
    out = stream or sys.stdout
    results = []
    for label, a, pl, sfx in (("FP32", fp32_args, fp32_plan, "_fp32"),
                              (args.bfp or "schedule", args, plan, "_bfp")):
        print(f"==> {label}", file=out, flush=True)
        r = train(a, copy.deepcopy(pl), suffix=sfx, stream=stream)
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


def generate_config(args: argparse.Namespace, stream=None) -> Path:
    import bfp.conversion as bc
    classes = 100 if args.dataset == "CIFAR100" else 10
    channels = args.in_channels
    model = make_model(args, classes, channels)
    if args.bfp:
        model = convert(model, args.bfp, "--bfp")
    cfg = bc.generate_config(model)
    out = Path(args.config_out or Path("conf_net") / f"{args.model}_generated.json")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite True to replace it or --config-out PATH")
    if out.is_dir():
        raise UsageError(f"--config-out {out} is a directory; give a file path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with ckpt.atomic_file(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(cfg, indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"--config-out {out}: cannot write ({e.strerror or e})") from None
    print(f"wrote {out}: {len(cfg) - 1} layers of {args.model}", file=stream or sys.stdout)
    return out


def apply_resume(args: argparse.Namespace, plan: EpochPlan) -> tuple[argparse.Namespace, EpochPlan]:
    """The interrupted run's flags and plan, with the few flags that may change taken from ``args``."""
    path = ckpt.resolve(args.resume)
    state = ckpt.load(path, map_location="cpu")
    if "args" not in state["extra"] or "plan" not in state["extra"]:
        raise UsageError(f"--resume {path}: this checkpoint holds no cifar.py flags (it was written by a "
                         f"Trainer used from Python); resume it with Trainer.load_state_dict")
    saved = dict(state["extra"]["args"])
    same = lambda x, y: json.dumps(x, default=str) == json.dumps(y, default=str)  # noqa: E731 (tuples == lists)
    changed = sorted(k for k in args.explicit if k not in RESUME_OVERRIDES
                     and not same(saved.get(k), getattr(args, k))
                     and not (k in ("model", "dataset") and str(saved.get(k)).lower() == str(getattr(args, k)).lower()))
    if changed:
        raise UsageError(f"--resume continues the saved run as it was; these flags differ from it: "
                         f"{', '.join('--' + k.replace('_', '-') for k in changed)} (only "
                         f"{', '.join(sorted('--' + k.replace('_', '-') for k in RESUME_OVERRIDES))} may change)")
    for k in args.explicit:
        if k in RESUME_OVERRIDES:
            saved[k] = getattr(args, k)
    saved["resume"] = args.resume
    # flags added to cifar.py after the checkpoint was written take their defaults
    new = argparse.Namespace(**{**vars(build_parser().parse_args([])), **saved})
    new.explicit = args.explicit
    new.model_opt = [tuple(x) for x in new.model_opt]
    p = state["extra"]["plan"]
    return new, EpochPlan.parse(p["bfp-layer-conf-dict"], p["optimizer-dict"], "<checkpoint>")


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args, plan, _ = parse_args(argv)
        if args.resume:
            args, plan = apply_resume(args, plan)
        args.plan_has_precision = bool(plan.precision)
        check_args(args)
        if args.mode == "generate-config":
            generate_config(args)
        elif args.compare:
            compare(args, plan)
        else:
            train(args, plan)
        return 0
    except (UsageError, CheckpointError) as e:
        print(f"cifar.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cifar.py: interrupted", file=sys.stderr)
        return 130
