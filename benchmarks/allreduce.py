"""Training-step time with the rounded gradient all-reduce hook against DDP's plain all-reduce.

    python benchmarks/allreduce.py                                 # 2 gloo processes on the CPU, ResNet18
    python benchmarks/allreduce.py --width 16 --batch 16 --steps 4 # a quick look
    python benchmarks/allreduce.py --device cuda --world 2         # NCCL, one GPU per process
    python benchmarks/allreduce.py --traffic                       # ring bytes, collective time, memory
                                                                   # (benchmarks/allreduce_traffic.py)

Started without RANK in the environment it launches ``--world`` copies of
itself (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun would). Every
rank builds the same model twice: one DistributedDataParallel with DDP's own
float32 all-reduce, one with ``bfp.distributed``'s rounded hook (``--grad-format``,
ring order, optionally APS); a step is forward, backward (the all-reduce runs
inside it) and an SGD update on ``--batch`` images per rank. The variants are
timed in alternating rounds (``_harness.alternate``), every rank in the same
order so their collectives pair up; rank 0 prints the table and the JSON.
Aim (issue 10): the hook adds at most 30% to a ResNet18 step on the CPU.
"""
from __future__ import annotations

import argparse
import copy
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import bfp
import bfp.models
from bfp.distributed import RoundedHookState, RoundedReduce, rounded_allreduce_hook

from _harness import alternate, emit_json, machine, print_table, sgd_step


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ResNet18")
    ap.add_argument("--width", type=int, default=None, help="model width option (ResNet: layer1 channels)")
    ap.add_argument("--batch", type=int, default=32, help="images per rank and step")
    ap.add_argument("--steps", type=int, default=6, help="timed rounds (each times every variant once)")
    ap.add_argument("--world", type=int, default=2, help="processes to launch")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, cuda:RANK)")
    ap.add_argument("--grad-format", default="e4m3", help="format of the rounded all-reduce")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    return ap.parse_args(argv)


def launch(args: argparse.Namespace) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.world))
    procs = [subprocess.Popen([sys.executable, *sys.argv], env=dict(env, RANK=str(r))) for r in range(args.world)]
    return max(p.wait() for p in procs)


def run(args: argparse.Namespace) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device.startswith("cuda")
    dev = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    opts = {} if args.width is None else {"width": args.width}
    base = bfp.models.create(args.model, num_classes=10, **opts).to(dev)
    fmt = bfp.format_from_name(args.grad_format)
    hooks = {"plain all-reduce": None, f"rounded {args.grad_format} ring": RoundedReduce(fmt),
             f"rounded {args.grad_format} ring + APS": RoundedReduce(fmt, aps=True)}
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g).to(dev)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(dev)

    def training_step(reduce):
        model = DistributedDataParallel(copy.deepcopy(base), device_ids=[dev] if cuda else None)
        if reduce is not None:
            model.register_comm_hook(RoundedHookState(reduce), rounded_allreduce_hook)
        return sgd_step(model, x, y)

    t = alternate({name: training_step(r) for name, r in hooks.items()}, args.steps, sync=sync)
    dist.barrier()
    if rank == 0:
        base_name = "plain all-reduce"
        rows = [(name, 1000 * t.median(name), t.median(name) / t.median(base_name)) for name in hooks]
        print_table([("variant", "s"), ("step ms", ".1f"), ("x plain", ".2f")], rows)
        emit_json(machine(benchmark="allreduce", model=args.model, width=args.width, batch_per_rank=args.batch,
                          world=world, backend="nccl" if cuda else "gloo", steps=args.steps,
                          step_ms={n: 1000 * t.median(n) for n in hooks},
                          ratio={n: t.median(n) / t.median(base_name) for n in hooks}), args.json)
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--traffic" in argv:  # bytes per rank, collective time and memory: benchmarks/allreduce_traffic.py
        import allreduce_traffic
        return allreduce_traffic.main([a for a in argv if a != "--traffic"])
    args = parse(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch")
    return run(args) if "RANK" in os.environ else launch(args)


if __name__ == "__main__":
    sys.exit(main())
