"""The flags every script on the engine shares, grouped as ``--help`` shows them.

The original simulator's flags keep their names and their ``--flag True``
booleans so documented commands work unchanged. Two flags are stored under
clearer names: ``--bfp`` (the network config of simulated formats) as
``args.network_config`` and ``--precision`` (the compute dtype) as
``args.compute_dtype``.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from ..amp import COMPUTE_DTYPES
from ..engine.compiled import COMPILE_MODES
from ..optim import OPTIMIZERS
from ..data import cifar as data_mod
from .amp_flags import add_amp_flags
from .helpformat import HelpFormatter
from .dist_flags import add_distributed_flags
from .tasks import Task


class UsageError(Exception):
    """A bad flag value, file or combination; reported as one line, exit status 2.
    ``every_rank``: every process of a launch on one machine meets the same error (the data it
    reads, the flags it was given): only rank 0 prints it."""

    def __init__(self, message: str, every_rank: bool = False):
        super().__init__(message)
        self.every_rank = every_rank


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


def flag_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """The long option a user types for ``dest`` (``network_config`` -> ``--bfp``)."""
    for a in parser._actions:
        if a.dest == dest and a.option_strings:
            return max(a.option_strings, key=len)
    return "--" + dest.replace("_", "-")


def build_parser(task: Task) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=task.prog, formatter_class=HelpFormatter,
        description=task.description + " Booleans take True/False (`--log True`, as the original) "
                                       "or stand alone (`--log`).")
    b = dict(type=str2bool, nargs="?", const=True, metavar="BOOL")
    g = p.add_argument_group("what to run")
    g.add_argument("--mode", default="train", choices=["train", "generate-config", "diagnose", "sweep"],
                   help="train: train and evaluate; generate-config: write a network config listing every "
                        "convertible layer of --model (to --config-out) and exit; diagnose: measure what "
                        "rounding does at every quantization point on one training batch (the model of "
                        "--resume RUN, or a fresh one with --bfp), print a table worst first and draw a "
                        "heat map (--diagnose-out); sweep: round that batch's tensors at every point to "
                        "2..16-bit members of --sweep-family and plot SQNR against bits")
    g.add_argument("-m", "--model", default=task.default_model,
                   help="network: one of bfp.models.names() (ResNet10/18/34/50/101/152, VGG11/13/16/19, "
                        "DenseNet121/161/169/201, DenseNetCifar, MobileNet, MobileNetV2, AlexNet, MLPMixer)")
    g.add_argument("--model-opt", action="append", type=model_option, default=[], metavar="KEY=VALUE",
                   help="constructor option of the model, repeatable (e.g. width=16 for a narrow ResNet)")
    g.add_argument("-d", "--dataset", default=task.default_dataset,
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
    g.add_argument("--strict-images", **b, default=False, help="image folders: decode every file first and refuse "
                   "unreadable ones (default: skip and report them; bfp.data.images)")
    g.add_argument("--bfp", dest="network_config", default=None, metavar="CONFIG",
                   help="network config: a preset name from conf_net/ (e.g. ResNet18_FB16), a JSON path; "
                        "omitted: FP32")
    g.add_argument("--strict-coverage", **b, default=False,
                   help="refuse a --bfp config that leaves a GEMM of the model's forward in FP32 without a "
                        "rule saying so (an unsupported op, a layer only the default covers)")
    g.add_argument("-tc", "--train-config-file", default=None, metavar="NAME",
                   help="training config: NAME in conf_train/ (NAME.json) or a path; presets flags and "
                        "schedules precision (bfp-layer-conf-dict) and optimizer (optimizer-dict) by epoch")
    g.add_argument("--compare", **b, default=False,
                   help="run the job twice, FP32 then with --bfp (or the -tc precision schedule), and print "
                        "accuracy, loss and time side by side")

    g = p.add_argument_group("optimization")
    by_dataset = ", ".join(f"{n} for {d}" for d, n in task.epochs_by_dataset.items())
    g.add_argument("--training-epochs", type=int, default=None,
                   help=f"epochs to train (default: {by_dataset + ', ' if by_dataset else ''}"
                        f"{task.default_epochs} otherwise)")
    g.add_argument("--batch-size-train", type=int, default=128, help="images per training step")
    g.add_argument("--batch-size-test", type=int, default=256, help="images per evaluation batch")
    g.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="sgd: SGD with momentum and L2 weight decay (the original's); adamw: AdamW, "
                        "--optim-momentum as beta1, decoupled weight decay (bfp.optim)")
    g.add_argument("--optim-lr", type=float, default=0.1, help="peak learning rate")
    g.add_argument("--optim-momentum", type=float, default=0.9, help="SGD momentum; AdamW's beta1")
    g.add_argument("--optim-weight-decay", type=float, default=5e-4,
                   help="weight decay (SGD: L2 in the gradient; AdamW: decoupled)")
    g.add_argument("--warmup-epochs", type=float, default=0.0,
                   help="linear learning-rate warm-up before the cosine decay (fractions allowed)")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy label smoothing")
    g.add_argument("--precision", dest="compute_dtype", default="fp32", choices=COMPUTE_DTYPES,
                   help="compute dtype: fp16 (autocast; dynamic loss scaling unless --loss-scale says otherwise) "
                        "or bf16 (autocast); weights stay float32. Independent of --bfp, which simulates formats")
    g.add_argument("--seed", type=int, default=0, help="seeds model init, data order and augmentation")
    g.add_argument("--stop-nonfinite", type=int, default=1, metavar="N",
                   help="stop (exit status 3) after N epochs in a row whose weights, or loss without loss "
                        "scaling, are NaN/Inf; such epochs are never saved, so checkpoints/last.pt keeps the "
                        "last finite one (0: never stop)")
    add_amp_flags(p)

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
    g.add_argument("--compile", default="none", choices=COMPILE_MODES,
                   help="torch.compile the model, forward and backward, fullgraph (bfp.engine.compiled): default; "
                        "reduce-overhead (CUDA graphs through Inductor on a GPU); max-autotune (slow first "
                        "compile). Not bit-identical to eager: Inductor may reorder the FP32 work between "
                        "quantization points")
    g.add_argument("--cuda-graph", **b, default=False,
                   help="capture the whole training step (forward, backward, optimizer) as one CUDA graph and "
                        "replay it (bfp.engine.graphed): needs a GPU; an epoch's last, smaller batch and measured "
                        "steps (--do, --diagnose) run eagerly; loss scaling decides on the device; refuses what it "
                        "cannot capture (several workers, --compile), saying why")
    g.add_argument("--deterministic", **b, default=False,
                   help="deterministic algorithms (cuDNN, cuBLAS, torch.use_deterministic_algorithms): GPU runs "
                        "repeat bit for bit, at some cost in speed; CPU runs repeat without it")

    add_distributed_flags(p, b)

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
    g.add_argument("--diagnose", type=int, default=0, metavar="N",
                   help="every N training steps, measure SQNR, relative error, flushed and saturated shares "
                        "at every quantization point (diagnostics.csv in the run directory, TensorBoard "
                        "diagnostics/...); 0: off")
    g.add_argument("--shadow", **b, default=False,
                   help="with --diagnose N: at each measured step also run an unquantized FP32 copy of the model "
                        "on the same batch and record, per layer, the cosine similarity and relative error of "
                        "activations, output gradients and weight gradients (shadow.csv, TensorBoard shadow/...)")
    g.add_argument("--sweep-family", default="bfp,float,mx", metavar="LIST",
                   help="--mode sweep: comma-separated families: bfp (groups of 16 channels), float "
                        "(e4m3 at 8 bits, e5m10 at 16), mx (those floats, blocks of 32)")
    g.add_argument("--diagnose-out", default=None, metavar="PNG",
                   help="--mode diagnose/sweep: the PNG's path (default: diagnose.png or sweep.png in the "
                        "--resume run directory, else in the current directory)")
    g.add_argument("--progress", **b, default=True, help="a tqdm bar on a terminal; without one (a pipe, a log file, nohup) a line a minute with "
                        "the speed and the time left; on both, once, an estimate of the run's length")
    g.add_argument("--config-out", default=None,
                   help="generate-config: output path (default conf_net/<model>_generated.json)")
    g.add_argument("--overwrite", **b, default=False,
                   help="generate-config, diagnose, sweep: replace an existing file (the config or the plot)")

    g = p.add_argument_group("slack")
    g.add_argument("--slackbot", **b, default=False,
                   help="post progress to Slack; token from ./slackbot.token or $BFP_SLACK_TOKEN")
    g.add_argument("--slack-channel", default=os.environ.get("BFP_SLACK_CHANNEL", "#bfpsim"),
                   help="channel to post to (default from $BFP_SLACK_CHANNEL)")
    g.add_argument("--slack-base-url", default=None, help=argparse.SUPPRESS)  # tests: a local server
    g = p.add_argument_group("resume")
    g.add_argument("--resume-allow-data-change", **b, default=False,
                   help="let --resume continue on a dataset whose fingerprint (classes, image counts, "
                        "sizes) differs from the one the checkpoint recorded; the class count must "
                        "still match")
    helps = task.hooks.help_overrides()  # what the shared flags mean for this script (or hidden)
    for a in p._actions:
        if a.dest in helps and a.option_strings:
            a.help = helps[a.dest]
    task.hooks.add_flags(p)  # e.g. imagenet.py: the PyTorch ImageNet example's flags
    return p
