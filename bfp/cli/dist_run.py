"""Flags and launcher environment -> the process group, the device, the step strategy and the optimizer.

One call from ``run.py`` (``distributed_setup``) keeps the run assembly
small. The strategy:

* one process, no gradient format, no emulated workers: ``PlainStep`` (as before);
* several processes, one worker each: ``DDPStep`` (the rounded hook when a
  gradient format, APS or Kahan is asked for, DDP's float32 mean otherwise);
* otherwise ``EmulatedStep`` (``--emulate-node`` workers per process; also a
  single worker whose gradient is rounded to the gradient format).
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..distributed import env as dist_env
from ..distributed.buckets import bucket_limits
from ..distributed.ddp import DDPStep
from ..distributed.emulated import EmulatedStep
from ..distributed.orders import NcclOptions
from ..distributed.reduce import RoundedReduce, check_grad_format
from ..engine.step import PlainStep
from ..formats import Float, Format, format_from_name
from ..optim import FACTORIES, OptimizerFactory, lars
from .flags import UsageError


def backend_order(fmt: Optional[Format], device: torch.device) -> str:
    """``--grad-order auto``: the order the run's own backend adds in (gloo on CPU, NCCL's ring on
    CUDA); ``param-ring`` for a block gradient format (a library's flat cuts would split its tiles)."""
    if fmt is not None and fmt.transport_bytes() is None:
        return "param-ring"
    return "nccl-ring" if device.type == "cuda" else "gloo"


@dataclass
class DistSetup:
    env: dist_env.DistEnv
    device: torch.device
    step: Any
    optimizer_factory: OptimizerFactory
    reduce: Optional[RoundedReduce]

    @property
    def shard(self) -> tuple[int, int, int]:
        """(rank, processes, workers): this process's slice of each global batch and the worker count."""
        return self.env.rank, self.env.world_size, self.env.world_size * getattr(self.step, "n", 1)

    def check_model(self, model: torch.nn.Module) -> None:
        """Every parameter's gradient can be rounded to the gradient format (or a usage error)."""
        if self.reduce is not None:
            try:
                check_grad_format(self.reduce.fmt, [p.shape for p in model.parameters()])
            except ValueError as e:
                raise UsageError(str(e)) from None

    def describe(self) -> str:
        workers = self.shard[2]
        where = (f"rank {self.env.rank} of {self.env.world_size} ({self.env.source})" if self.env.distributed
                 else "one process")
        text = f"{where}, {workers} worker(s), {torch.get_num_threads()} CPU thread(s)"  # --threads, or the cores
        return text + (f"; {self.reduce.describe()}" if self.reduce is not None else "")


def grad_format(args: argparse.Namespace) -> Optional[Format]:
    """The gradient format the flags name, or None (float32)."""
    exp, man, name = args.grad_exp, args.grad_man, args.grad_format
    if name is not None and (exp is not None or man is not None):
        raise UsageError("give either --grad-format or --grad-exp/--grad-man, not both")
    if (exp is None) != (man is None):
        raise UsageError(f"--grad-exp and --grad-man go together; got --grad-exp {exp} --grad-man {man}")
    try:
        fmt = format_from_name(name) if name is not None else Float(exp, man) if exp is not None else None
        check_grad_format(fmt)
    except ValueError as e:
        flag = f"--grad-format {name}" if name is not None else f"--grad-exp {exp} --grad-man {man}"
        raise UsageError(f"{flag}: {e}") from None
    return fmt


def distributed_setup(args: argparse.Namespace, device: torch.device) -> DistSetup:
    """Read the launcher's environment, join the process group and choose the step strategy."""
    try:
        e = dist_env.read_env()
    except dist_env.DistEnvError as err:
        raise UsageError(str(err)) from None
    if args.emulate_node < 1:
        raise UsageError(f"--emulate-node must be >= 1 (workers emulated per process), got {args.emulate_node}")
    workers = e.world_size * args.emulate_node
    if args.batch_size_train % workers:
        raise UsageError(f"--batch-size-train {args.batch_size_train} (the global batch) is not divisible by "
                         f"{workers} workers ({e.world_size} process(es) x --emulate-node {args.emulate_node})")
    fmt = grad_format(args)
    device = dist_env.device_for(e, device)
    if not (math.isfinite(args.dist_timeout) and args.dist_timeout > 0):
        raise UsageError(f"--dist-timeout must be a number of seconds > 0, got {args.dist_timeout}")
    try:
        dist_env.init(e, device, args.dist_timeout)
    except dist_env.DistEnvError as err:
        raise UsageError(str(err)) from None
    if fmt is not None and getattr(fmt, "rounding", None) is not None and fmt.rounding.value == "truncate":
        print(f"warning: the gradient format {fmt!r} truncates: every partial sum of the all-reduce is cut "
              f"toward zero, a bias that grows with the worker count (about -2.5% over 8 workers for fb16); "
              f"give a round-to-nearest format unless that bias is what you study", file=sys.stderr)
    if args.use_aps and fmt is None:
        print("warning: --use-aps scales the gradients into a gradient format, but none is given "
              "(--grad-format or --grad-exp/--grad-man): it changes nothing in a float32 all-reduce",
              file=sys.stderr)
    rounded = fmt is not None or args.use_aps or args.use_kahan
    order = backend_order(fmt, device) if args.grad_order == "auto" else args.grad_order
    try:
        bucket_limits(args.bucket_cap_mb)
    except ValueError as err:
        raise UsageError(f"--bucket-cap-mb: {err}") from None
    try:
        reduce = RoundedReduce(fmt, order=order, aps=args.use_aps, kahan=args.use_kahan,
                               average=args.grad_reduce == "mean", divide=args.grad_divide,
                               nccl=NcclOptions(args.nccl_channels, args.nccl_proto, args.nodes)) \
            if rounded or args.emulate_node > 1 else None
    except ValueError as err:
        raise UsageError(str(err)) from None
    if reduce is not None and reduce.order == "nccl-tree" and workers % args.nodes:
        raise UsageError(f"--nodes {args.nodes} does not divide the {workers} workers")
    if e.distributed and args.emulate_node == 1:
        step: Any = DDPStep(reduce if rounded else None, device, bucket_cap_mb=args.bucket_cap_mb)
    elif reduce is not None:
        step = EmulatedStep(args.emulate_node, reduce, bucket_cap_mb=args.bucket_cap_mb)
    else:
        step = PlainStep()
    factory = functools.partial(lars, trust_coefficient=args.lars_trust) if args.use_lars else FACTORIES[args.optimizer]
    return DistSetup(e, device, step, factory, reduce)
