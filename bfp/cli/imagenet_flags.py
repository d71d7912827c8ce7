"""``imagenet.py``'s flags: the PyTorch ImageNet example's, on the shared flags.

The example's flags are aliases writing the shared flags' values
(``-a/--arch`` is ``--model``, ``-b`` is ``--batch-size-train``, ``--lr`` is
``--optim-lr`` ...), so checkpoints, ``-tc`` files and ``--resume`` treat them
as one flag. Its defaults replace the shared ones: 90 epochs, batch 256,
4 workers, weight decay 1e-4, the learning rate 10x lower at each third
(``--lr-schedule thirds``) and dynamic precision deciding every 500 steps
unless the ``--do`` spec or ``--do-every`` says otherwise, as the original
simulator ran ImageNet. Booleans stand alone as in the
example (``--multiprocessing-distributed``) or take True/False as cifar.py's.
"""
from __future__ import annotations

import argparse

from .dist_launch import BACKENDS

ALIASES = {  # the example's option strings -> the shared flag's dest
    ("-a", "--arch"): "model", ("-j", "--workers"): "num_workers", ("-b",): "batch_size_train",
    ("--epochs",): "training_epochs", ("--lr", "--learning-rate"): "optim_lr",
    ("--momentum",): "optim_momentum", ("--wd", "--weight-decay"): "optim_weight_decay",
    ("--data",): "dataset_path"}
METAVARS = {"model": "ARCH", "optim_lr": "LR", "optim_momentum": "M", "optim_weight_decay": "W",
            "dataset_path": "DIR"}
DEFAULTS = dict(training_epochs=None, batch_size_train=256, num_workers=4, optim_weight_decay=1e-4,
                dataset="imagenet", model="resnet18")
DO_EVERY = 500  # steps between --do decisions when neither the spec nor --do-every gives them


def _gpu(v: str) -> str:
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a GPU index (0, 1, ...), got {v!r}")
    return f"cuda:{n}"


def _types(parser: argparse.ArgumentParser) -> dict:
    return {a.dest: a.type for a in parser._actions}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the example's aliases and flags to the shared parser (``build_parser``)."""
    types = _types(parser)
    b = dict(type=types["log"], nargs="?", const=True, default=False, metavar="BOOL")  # the shared booleans
    g = parser.add_argument_group(
        "PyTorch ImageNet example flags (aliases of the flags above, and more)",
        f"--do decides every {DO_EVERY} steps here unless its spec or --do-every gives the interval")
    g.add_argument("dataset_path", nargs="?", default=argparse.SUPPRESS, metavar="DIR",
                   help="dataset directory with train/ and val/ class folders (same as --data / -dp)")
    for options, dest in ALIASES.items():
        g.add_argument(*options, dest=dest, type=types.get(dest), default=argparse.SUPPRESS,
                       metavar=METAVARS.get(dest, "N"), help=f"same as --{dest.replace('_', '-')}")
    g.add_argument("-p", "--print-freq", type=int, default=0, metavar="N",
                   help="log the step, learning rate and speed every N training steps (0: off; the tqdm "
                        "bar shows progress)")
    g.add_argument("-e", "--evaluate", **b,
                   help="evaluate on val/ and exit: the --resume checkpoint's or --pretrained weights")
    g.add_argument("--pretrained", nargs="?", const="default", default=None, metavar="PATH",
                   help="start from weights on disk: a state_dict file, or alone torchvision's default "
                        "weights file in the torch hub cache (never downloaded)")
    g.add_argument("--gpu", dest="device", type=_gpu, default=argparse.SUPPRESS, metavar="N",
                   help="GPU index to use (same as --device cuda:N)")
    g.add_argument("--image-size", type=int, default=224, metavar="PX",
                   help="training crop and validation centre-crop size (64 for quick runs)")
    g.add_argument("--lr-schedule", default="thirds", choices=("thirds", "cosine"),
                   help="thirds: the learning rate drops 10x at each third of --epochs (the original); "
                        "cosine: as cifar.py")
    g = parser.add_argument_group("distributed (the example's flags; bfp.cli.dist_launch)")
    g.add_argument("--world-size", type=int, default=None,
                   help="number of nodes (with --multiprocessing-distributed) or of processes")
    g.add_argument("--rank", type=int, default=None,
                   help="node rank (with --multiprocessing-distributed) or process rank")
    g.add_argument("--dist-url", default="env://",
                   help="tcp://HOST:PORT of rank 0, or env:// (MASTER_ADDR/MASTER_PORT, default "
                        "127.0.0.1:29500)")
    g.add_argument("--dist-backend", default=None, choices=BACKENDS,
                   help="torch.distributed backend (default: the engine's choice for the device)")
    g.add_argument("--multiprocessing-distributed", **b,
                   help="start one worker process per GPU (or --nprocs) on this node")
    g.add_argument("--nprocs", type=int, default=0, metavar="N",
                   help="workers per node with --multiprocessing-distributed (0: one per visible GPU)")
    parser.set_defaults(**DEFAULTS)

