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
from ..distributed.fsdp import FSDPStep
from ..distributed.orders import NcclOptions
from ..distributed.reduce import RoundedReduce, check_grad_format
from ..engine.step import PlainStep
from ..formats import Float, Format, format_from_name
from ..kernels import needs_keys
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
        if isinstance(self.step, FSDPStep):
            text += ", FSDP2 (fully_shard per block and the root)" + (
                f", weights all-gathered in {self.step.param_fmt!r}" if self.step.param_fmt is not None else "")
        return text + (f"; {self.reduce.describe()}" if self.reduce is not None else "")


def param_comm_format(args: argparse.Namespace) -> Optional[Format]:
    """--param-comm-format's format (an element-wise one), or None."""
    if getattr(args, "param_comm_format", None) is None:
        return None
    try:
        fmt = format_from_name(args.param_comm_format)
    except ValueError as e:
        raise UsageError(f"--param-comm-format: {e}") from None
    if not fmt.elementwise:
        raise UsageError(f"--param-comm-format {args.param_comm_format}: FSDP gathers one flat buffer of every "
                         f"parameter's shard; give an element-wise format (e4m3, e5m2, bfloat16, float16 ...)")
    if needs_keys(fmt) or fmt.history_length:
        raise UsageError(f"--param-comm-format {args.param_comm_format}: each rank rounds its own shard before "
                         f"the all-gather, so the rounding must be deterministic (stochastic rounding would draw "
                         f"per shard, not per weight); give a round-to-nearest format (e4m3, e5m2, bfloat16, "
                         f"p3109_k8p4se ...)")
    return fmt


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


# Flags that may differ between ranks: where each reads its data, how it reports, how long it waits.
LOCAL_FLAGS = frozenset({"dataset_path", "progress", "num_workers", "dist_timeout"})


# What a parse records beside the flags: not a flag, never compared (each rank's command names its own).
_NOT_FLAGS = frozenset({"explicit"})


def run_fields(args: argparse.Namespace, plan: Any = None, flag=None) -> dict[str, str]:
    """A rank's run, flag by flag, in words every rank computes alike (the ``-tc`` plan included), keyed
    by the option a user types (``flag(dest)``, e.g. ``network_config`` -> ``--bfp``)."""
    flag = flag or (lambda k: "--" + k.replace("_", "-"))
    out = {flag(k): repr(v) for k, v in sorted(vars(args).items()) if k not in LOCAL_FLAGS | _NOT_FLAGS}
    if plan is not None:
        out["-tc plan"] = repr((dict(plan.precision), {e: dict(v) for e, v in plan.optimizer.items()}))
    return out


def check_same_run(fields: dict[str, str], world_size: int) -> None:
    """Every rank compares its run with rank 0's (one ``all_gather_object``) and all refuse, naming
    the flags that differ, before any model is built: ranks that disagree on a format, a seed or a
    learning rate would train apart while DDP averages their gradients as one model's."""
    import torch.distributed as dist
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, fields)
    ref, bad = gathered[0], []
    for rank, theirs in enumerate(gathered[1:], 1):
        for k in sorted(set(ref) | set(theirs)):
            if ref.get(k) != theirs.get(k):
                bad.append(f"rank {rank} has {k} {theirs.get(k)} where rank 0 has {ref.get(k)}")
    if bad:
        raise UsageError(f"the ranks were started with different runs: {'; '.join(bad[:8])}"
                         f"{f'; ... ({len(bad)} in all)' if len(bad) > 8 else ''}. Every rank must run the same "
                         f"command (torchrun and srun start one command on every rank); only "
                         f"{', '.join('--' + f.replace('_', '-') for f in sorted(LOCAL_FLAGS))} may differ")


def distributed_setup(args: argparse.Namespace, device: torch.device, plan: Any = None, flag=None) -> DistSetup:
    """Read the launcher's environment, join the process group, check that every rank runs the same
    flags (``check_same_run``) and choose the step strategy."""
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
    if e.distributed:
        check_same_run(run_fields(args, plan, flag), e.world_size)
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
    if args.nodes != 1 and (reduce is None or reduce.order != "nccl-tree"):
        raise UsageError(f"--nodes {args.nodes} places the workers on nodes for --grad-order nccl-tree only; this "
                         f"run adds in {'float32 (no rounded all-reduce)' if reduce is None else reduce.order + ' order'}"
                         f": drop --nodes or give --grad-order nccl-tree")
    if reduce is not None and reduce.order == "nccl-tree" and workers % args.nodes:
        raise UsageError(f"--nodes {args.nodes} does not divide the {workers} workers")
    if getattr(args, "fsdp", False) and not e.distributed:
        raise UsageError("--fsdp shards the model over processes: launch with torchrun (or srun), 2 or more")
    if getattr(args, "fsdp", False):
        step: Any = FSDPStep(reduce if rounded else None, param_comm_format(args))
    elif e.distributed and args.emulate_node == 1:
        step = DDPStep(reduce if rounded else None, device, bucket_cap_mb=args.bucket_cap_mb)
    elif reduce is not None:
        step = EmulatedStep(args.emulate_node, reduce, bucket_cap_mb=args.bucket_cap_mb)
    else:
        step = PlainStep()
    factory = functools.partial(lars, trust_coefficient=args.lars_trust) if args.use_lars else FACTORIES[args.optimizer]
    return DistSetup(e, device, step, factory, reduce)
