"""Compare the nccl-ring / nccl-tree orders (bfp.distributed.orders) with a real NCCL all-reduce.

    python benchmarks/nccl_check.py                    # every visible GPU, 1 and 2 channels
    python benchmarks/nccl_check.py --sizes 48 1000 3000000 --json out.json

Spawns one process per GPU (at least 2), runs ``all_reduce(SUM)`` of float16 and bfloat16
tensors with ``NCCL_ALGO=Ring`` or ``Tree``, ``NCCL_PROTO=Simple`` and ``NCCL_MIN_NCHANNELS =
NCCL_MAX_NCHANNELS = C``, and counts the elements where NCCL differs from ``RoundedReduce(...,
order="nccl-ring"/"nccl-tree", nccl=NcclOptions(channels=C))`` on the same [W, n] stack. Prints
a table and JSON. Without two GPUs it says so and exits 0 (nothing here needs one). The ring order
per channel is taken as 0..W-1; give ``--rings`` from ``NCCL_DEBUG=INFO``'s "Channel 00 : 0 1 2 3"
lines when NCCL chose others. NCCL's channel split and chunk size come from its tuner, which this
model simplifies (see the module docstring of bfp.distributed.orders): a mismatch at large sizes
may be that split, not the add order.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bfp.distributed.orders import NcclOptions  # noqa: E402
from bfp.distributed.reduce import RoundedReduce  # noqa: E402
from bfp.formats import Float  # noqa: E402
from _harness import emit_json, machine, print_table  # noqa: E402

FMT = {torch.float16: Float(5, 10, overflow="inf"), torch.bfloat16: Float(8, 7, overflow="inf")}


def stack(world: int, n: int) -> torch.Tensor:
    return torch.randn(world, n, generator=torch.Generator().manual_seed(n * 31 + world))


def worker(rank: int, world: int, store: str, algo: str, channels: int, sizes: list[int], out: str) -> None:
    os.environ.update(NCCL_ALGO=algo, NCCL_PROTO="Simple", NCCL_MIN_NCHANNELS=str(channels),
                      NCCL_MAX_NCHANNELS=str(channels))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    got = {}
    for n in sizes:
        for dtype in FMT:
            t = stack(world, n)[rank].to(dtype).cuda()
            dist.all_reduce(t)
            got[(n, str(dtype))] = t.float().cpu()
    if rank == 0:
        torch.save(got, out)
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[48, 1000, 100_000, 3_000_000])
    ap.add_argument("--channels", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world < 2:
        print(f"nccl_check: needs at least 2 CUDA GPUs, found {world}; nothing compared")
        return 0
    rows = []
    for algo, order in (("Ring", "nccl-ring"), ("Tree", "nccl-tree")):
        for c in args.channels:
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "got.pt")
                mp.spawn(worker, (world, str(Path(tmp) / "store"), algo, c, args.sizes, out), nprocs=world)
                got = torch.load(out)
            for (n, dtype), real in got.items():
                x = stack(world, n).to(getattr(torch, dtype.split(".")[1])).float()
                want = RoundedReduce(FMT[getattr(torch, dtype.split(".")[1])], order=order, average=False,
                                     nccl=NcclOptions(channels=c))(x)
                rows.append({"algo": algo, "channels": c, "n": n, "dtype": dtype,
                             "differ": int((want != real).sum()), "of": n})
    print(f"{world} GPUs ({torch.cuda.get_device_name(0)})")
    print_table([("algo", "s"), ("channels", "d"), ("n", "d"), ("dtype", "s"), ("differ", "d")],
                [(r["algo"], r["channels"], r["n"], r["dtype"], r["differ"]) for r in rows])
    emit_json({"meta": machine(gpus=world), "results": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
