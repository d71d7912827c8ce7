"""The rounded all-reduce's traffic, time and memory against DDP's float32 all-reduce.

    python benchmarks/allreduce_traffic.py                 # 2, 4, 8 gloo processes, then the memory run
    python benchmarks/allreduce.py --traffic               # the same, from the step benchmark
    python benchmarks/allreduce_traffic.py --procs 2 4 --numel 4000000 --steps 7 --json out.json
    python benchmarks/allreduce_traffic.py --memory-only   # --emulate-node 32 on ResNet-50's parameters

Traffic and time: W gloo processes on this machine (W = 2, 4, 8; more processes than
cores time-share them) each hold a gradient of ``--numel`` float32 values in ResNet-like
parameter shapes, and time, alternated, per step: ``torch.distributed.all_reduce``
(float32, DDP's reduction), the rounded ring (``bfp.distributed.ring``, e4m3 with APS) and
the rounded gather (all-gather, then every rank reduces all W gradients: the
``sequential`` order's path). The ring's bytes sent per rank are counted by the ring
itself; the table compares them with ``2 (W-1)/W`` of the gradient's bytes, a ring's
ideal. The gather's volume is what each rank receives, ``(W-1)`` gradients.

Memory: one process emulating 32 workers (``--emulate-node 32``) on ResNet-50's parameter
shapes (25.6M values): the 32 workers' gradients are allocated, then reduced by the ring
in e4m3 with APS; the peak resident set size above the process before the gradients
existed (and after the kernels were compiled), in gradient copies, against the target
``N_local + 2 = 34``.
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from _harness import emit_json, machine, print_table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bfp.distributed.hook import reduce_flat  # noqa: E402
from bfp.distributed.reduce import RoundedReduce  # noqa: E402
from bfp.distributed.ring import ring_allreduce, ring_reduce_workers  # noqa: E402
from bfp.formats import format_from_name  # noqa: E402


def shapes_of(numel: int) -> list[torch.Size]:
    """ResNet-like parameter shapes (conv weights, biases) adding up to about ``numel``."""
    out, total, c = [], 0, 64
    while total < numel:
        for s in ((c, c, 3, 3), (c,), (c,)):
            out.append(torch.Size(s))
            total += torch.Size(s).numel()
        c = min(c * 2, 512)
    return out


def worker(numel: int, steps: int, out: Path) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    shapes = shapes_of(numel)
    n = sum(s.numel() for s in shapes)
    g = torch.Generator().manual_seed(rank)
    grad = torch.randn(n, generator=g) * 1e-3
    red = RoundedReduce(format_from_name("e4m3"), order="ring", aps=True)
    seq = RoundedReduce(format_from_name("e4m3"), order="sequential", aps=True)
    sent = {}

    def plain():
        b = grad.clone()
        dist.all_reduce(b)

    def ring():
        sent["ring"] = ring_allreduce(red, grad.clone(), shapes)

    def gather():
        parts = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(parts, grad)
        reduce_flat(seq, torch.stack(parts), shapes, torch.empty_like(grad))

    fns = {"float32 all_reduce": plain, "rounded ring": ring, "rounded gather": gather}
    times = {k: [] for k in fns}
    for r in range(steps + 1):
        for name in (fns if r % 2 else reversed(list(fns))):
            dist.barrier()
            t0 = time.perf_counter()
            fns[name]()
            dist.barrier()
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        torch.save({"median_s": med, "ring_bytes": sent["ring"], "numel": n}, out)
    dist.destroy_process_group()


def run_world(world: int, numel: int, steps: int, tmp: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp / f"w{world}.pt"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(numel), str(steps), str(out)],
                              env=dict(env, RANK=str(r)), cwd=ROOT) for r in range(world)]
    for p in procs:
        if p.wait(timeout=1800):
            raise SystemExit(f"a rank of the {world}-process run failed")
    return torch.load(out)


def memory_run() -> dict:
    import torchvision
    with torch.device("meta"):
        shapes = [p.shape for p in torchvision.models.resnet50().parameters()]
    n = sum(s.numel() for s in shapes)
    local = 32
    red = RoundedReduce(format_from_name("e4m3"), order="ring", aps=True)
    # compile the kernels first: Numba's compiler takes ~100 MB once per process, not per gradient
    ring_reduce_workers(red, torch.randn(4, 64 * 9), [torch.Size((64, 9))])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    g = torch.Generator().manual_seed(0)
    rows = torch.empty(local, n)
    for w in range(local):
        rows[w].normal_(generator=g).mul_(1e-3)
    with_rows = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    ring_reduce_workers(red, rows, shapes)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    copy = n * 4
    return {"numel": n, "workers": local, "gradient_bytes": copy, "rows_copies": (with_rows - base) / copy,
            "peak_copies": (peak - base) / copy, "target_copies": local + 2, "seconds": dt}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--numel", type=int, default=2_000_000, help="gradient values per process")
    ap.add_argument("--steps", type=int, default=5, help="timed rounds")
    ap.add_argument("--memory-only", action="store_true", help="only the --emulate-node 32 memory run")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(int(args.worker[0]), int(args.worker[1]), Path(args.worker[2]))
        return 0
    rows = []
    if not args.memory_only:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            for w in args.procs:
                r = run_world(w, args.numel, args.steps, Path(tmp))
                med, grad_bytes = r["median_s"], r["numel"] * 4
                ideal = 2 * (w - 1) / w * grad_bytes
                rows.append({"processes": w, "numel": r["numel"], "ring_bytes_per_rank": r["ring_bytes"],
                             "ring_bytes_vs_ideal": r["ring_bytes"] / ideal,
                             "gather_bytes_received_per_rank": (w - 1) * grad_bytes,
                             **{f"{k} ms": 1e3 * v for k, v in med.items()},
                             "ring_vs_float32": med["rounded ring"] / med["float32 all_reduce"],
                             "gather_vs_float32": med["rounded gather"] / med["float32 all_reduce"]})
        print_table([("processes", "d"), ("ring MB/rank", ".2f"), ("x ideal", ".3f"), ("gather MB in", ".1f"),
                     ("fp32 ms", ".1f"), ("ring ms", ".1f"), ("gather ms", ".1f"), ("ring x fp32", ".2f"),
                     ("gather x fp32", ".2f")],
                    [(r["processes"], r["ring_bytes_per_rank"] / 1e6, r["ring_bytes_vs_ideal"],
                      r["gather_bytes_received_per_rank"] / 1e6, r["float32 all_reduce ms"], r["rounded ring ms"],
                      r["rounded gather ms"], r["ring_vs_float32"], r["gather_vs_float32"]) for r in rows])
    mem = memory_run()
    print(f"--emulate-node {mem['workers']} on ResNet-50's {mem['numel']:,} parameters: the workers' gradients "
          f"{mem['rows_copies']:.2f} copies, peak {mem['peak_copies']:.2f} copies of the gradient above the "
          f"process before them (target <= {mem['target_copies']}), ring reduction {mem['seconds']:.1f} s")
    emit_json({"meta": machine(cpus=os.cpu_count()), "worlds": rows, "memory": mem}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
