"""Flags of distributed training and the low-precision gradient all-reduce.

The original CPD scripts' spellings are kept as aliases (``--grad_exp``,
``--grad_man``, ``--use_APS``, ``--use_kahan``, ``--use_lars``,
``--emulate_node``), so its documented commands work; the process layout
comes from the launcher (torchrun or srun), not from flags.
"""
from __future__ import annotations

import argparse

from ..distributed.env import DEFAULT_TIMEOUT_S
from ..distributed.reduce import DIVIDE, ORDER_ALIASES, ORDERS
from ..optim.lars import DEFAULT_TRUST


def add_distributed_flags(p: argparse.ArgumentParser, boolean: dict) -> None:
    """The 'distributed' group; ``boolean`` is build_parser's keyword set for True/False flags."""
    g = p.add_argument_group(
        "distributed (torchrun / srun; bfp.distributed)",
        "Launch with torchrun or srun for data-parallel training; --batch-size-train stays the global "
        "batch. A gradient format (--grad-exp/--grad-man or --grad-format) rounds every worker's "
        "gradient and every partial sum of the all-reduce; see docs/distributed.md.")
    g.add_argument("--grad-exp", "--grad_exp", dest="grad_exp", type=int, default=None, metavar="E",
                   help="exponent bits of the gradient all-reduce format (with --grad-man)")
    g.add_argument("--grad-man", "--grad_man", dest="grad_man", type=int, default=None, metavar="M",
                   help="mantissa bits of the gradient all-reduce format (with --grad-exp)")
    g.add_argument("--grad-format", default=None, metavar="NAME",
                   help="gradient all-reduce format by preset name (e4m3, e5m2, bfloat16, mxfp8_e4m3, "
                        "fb16 ...), instead of --grad-exp/--grad-man")
    g.add_argument("--grad-order", default="auto", choices=("auto",) + ORDERS + tuple(ORDER_ALIASES),
                   help="order of the rounded sums: auto (default: the order the run's backend adds in, gloo on "
                        "CPU, nccl-ring on CUDA; param-ring for a block gradient format, whose tiles a flat cut "
                        "would split), gloo (gloo's ring over the flat bucket, 1 MiB segments: what "
                        "ProcessGroupGloo adds, bit for bit), nccl-ring / nccl-tree (NCCL's ring and double binary "
                        "tree, from its source: --nccl-channels, --nccl-proto, --nodes), param-ring (bfpsim's "
                        "per-parameter ring, formerly 'ring': each parameter's first axis in W chunks; no library "
                        "adds so for W >= 3) or sequential (CPD: gather, add in rank order)")
    g.add_argument("--bucket-cap-mb", type=float, default=None, metavar="MIB",
                   help="DDP's bucket_cap_mb, for DDP and for --emulate-node's buckets (default: DDP's, 25 MiB "
                        "with a first bucket of 1 MiB); the library orders cut each bucket's flat buffer")
    g.add_argument("--nccl-channels", type=int, default=1, metavar="C",
                   help="--grad-order nccl-ring/nccl-tree: channels the buffer is split over (NCCL_MIN/MAX_NCHANNELS)")
    g.add_argument("--nccl-proto", default="simple", choices=("simple", "ll", "ll128"),
                   help="--grad-order nccl-ring: the protocol, whose chunk sets the ring's blocks (Simple 2 MiB, "
                        "LL 32 KiB, LL128 576,000 B)")
    g.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="--grad-order nccl-tree: nodes the workers lie on (a chain inside each node, a double "
                        "binary tree between them); must divide the worker count")
    g.add_argument("--grad-reduce", default="mean", choices=("mean", "sum"),
                   help="average the workers' gradients (as DDP) or sum them")
    g.add_argument("--grad-divide", default="before", choices=DIVIDE,
                   help="mean only: divide by the worker count before rounding (no overflow), after the "
                        "sum, cast-first: round, divide, round again (PyTorch's fp16_compress_hook exactly), or "
                        "nccl-avg: NCCL's ncclAvg, each value rounded times the rounded 1/N, rounded")
    g.add_argument("--use-aps", "--use_APS", "--use-APS", dest="use_aps", **boolean, default=False,
                   help="auto precision scaling: per gradient tensor, shift by a power of two so the "
                        "largest sum lands at the top of the format, reduce, shift back")
    g.add_argument("--use-kahan", "--use_kahan", dest="use_kahan", **boolean, default=False,
                   help="Kahan-compensated sums inside the gradient reduction")
    g.add_argument("--use-lars", "--use_lars", dest="use_lars", **boolean, default=False,
                   help="LARS optimizer (layer-wise adaptive rate scaling) instead of SGD")
    g.add_argument("--lars-trust", type=float, default=DEFAULT_TRUST, metavar="ETA",
                   help="LARS trust coefficient")
    g.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="how long a process waits to join the process group, and for any collective, "
                        "before it stops with an error naming the address (a dead or frozen peer)")
    g.add_argument("--fsdp", **boolean, default=False,
                   help="under torchrun: shard the model with PyTorch's FSDP2 (fully_shard per block, then the "
                        "root) instead of DDP; the gradient flags round its reduce-scatter (docs/distributed.md). "
                        "It saves checkpoints of the whole model and resumes them (--resume); -tc precision "
                        "changes, --do, --diagnose, --shadow, --grad-histogram, --compile, --cuda-graph, "
                        "--emulate-node and --bucket-cap-mb do not combine with it yet")
    g.add_argument("--param-comm-format", default=None, metavar="NAME",
                   help="--fsdp: round each rank's weight shards to this element-wise format (e4m3, bfloat16 ...) "
                        "before FSDP all-gathers them; the layers compute on the gathered values")
    g.add_argument("--emulate-node", "--emulate_node", dest="emulate_node", type=int, default=1, metavar="N",
                   help="emulate N workers per process: each batch is cut into N micro-batches whose "
                        "gradients go through the same rounded reduction")
