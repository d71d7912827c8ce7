"""Cost of accumulator emulation relative to a plain float32 GEMM, measured in one run.

    python benchmarks/accumulate.py                     # 1024^3, fp16 accumulator
    python benchmarks/accumulate.py --size 512 --json out.json
    python benchmarks/accumulate.py --tensorcore h100_fp8_fast   # 256 x 256 x 4096 E4M3 through the fused adder

Prints a table and a JSON record. Each configuration is timed ``--repeats``
times alternated with the plain float32 GEMM (after one warm-up, which also
triggers the kernels' JIT compilation), and the ratio is taken between the
fastest runs of each: on a shared machine the minimum is the figure least
disturbed by other processes (medians are recorded too). Ratios are only
meaningful within one run on one machine.

``--numba-threading-layer omp`` sets ``NUMBA_THREADING_LAYER`` before Numba
loads. Numba's default (TBB) pool and PyTorch's OpenMP pool alternate in the
add/round loop; on a busy 2-core machine that contention slowed the loop
several-fold, on a quiet one the default was faster, so measure both.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

import bfp  # loads Numba only at the first quantization, so the threading layer can still be set

from _harness import alternate, emit_json, machine, print_table


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="M = N = K of the GEMM")
    ap.add_argument("--fmt", default="float16", help="accumulator format name (bfp.format_names)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the record here")
    ap.add_argument("--tensorcore", default=None, metavar="PRESET",
                    help="time bfp.tensorcore.fused_matmul (PRESET: h100_fp8_fast, h100_fp8, ada_fp8) on a "
                         "256 x 256 x 4096 E4M3 GEMM against the float32 GEMM instead")
    ap.add_argument("--numba-threading-layer", choices=["default", "omp", "tbb", "workqueue"],
                    default="default")
    args = ap.parse_args(argv)
    if args.numba_threading_layer != "default":
        if "numba" in sys.modules:
            raise ValueError("--numba-threading-layer must be set before Numba is imported")
        os.environ["NUMBA_THREADING_LAYER"] = args.numba_threading_layer

    gen = torch.Generator().manual_seed(0)
    if args.tensorcore:
        return tensorcore(args, gen)
    n = args.size
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    fmt = bfp.format_from_name(args.fmt)
    rows = []
    for chunk, kahan in [(c, False) for c in args.chunks] + [(32, True)]:
        acc = bfp.Accumulator(fmt, chunk=chunk, kahan=kahan)
        reps = 1 if chunk == 1 else args.repeats  # chunk 1 is K sequential steps: slow by design
        t = alternate({"fp32": lambda: a @ b, "acc": lambda: bfp.accumulate_matmul(a, b, acc)}, reps)
        rows.append({"chunk": chunk, "kahan": kahan, "seconds_min": t.fastest("acc"),
                     "seconds_median": t.median("acc"), "fp32_seconds_min": t.fastest("fp32"),
                     "ratio": t.fastest("acc") / t.fastest("fp32"),
                     "ratio_median": t.median("acc") / t.median("fp32")})

    layer = os.environ.get("NUMBA_THREADING_LAYER", "default")
    record = machine(size=n, fmt=args.fmt, rows=rows, repeats=args.repeats, numba_threading_layer=layer,
                     threads=torch.get_num_threads())
    print(f"accumulate_matmul {n}x{n}x{n}, accumulator {args.fmt}, {torch.get_num_threads()} threads, "
          f"numba threading layer {layer}")
    print_table([("chunk", "d"), ("kahan", ""), ("ms (min)", ".1f"), ("fp32 ms", ".1f"), ("ratio", ".2f"),
                 ("ratio(med)", ".2f")],
                [(r["chunk"], r["kahan"], r["seconds_min"] * 1e3, r["fp32_seconds_min"] * 1e3, r["ratio"],
                  r["ratio_median"]) for r in rows])
    emit_json(record, args.json)
    return record


def tensorcore(args, gen) -> dict:
    from bfp.tensorcore import accumulator_from_name, fused_matmul
    acc = accumulator_from_name(args.tensorcore)
    e4m3 = bfp.format_from_name("float8_e4m3fn")
    a = bfp.quantize(torch.randn(256, 4096, generator=gen), e4m3)
    b = bfp.quantize(torch.randn(4096, 256, generator=gen), e4m3)
    t = alternate({"fp32": lambda: a @ b, "fused": lambda: fused_matmul(a, b, acc)}, args.repeats)
    row = {"preset": args.tensorcore, "seconds_min": t.fastest("fused"), "fp32_seconds_min": t.fastest("fp32"),
           "ratio": t.fastest("fused") / t.fastest("fp32"), "ratio_median": t.median("fused") / t.median("fp32")}
    print(f"fused_matmul 256x256x4096 E4M3, {args.tensorcore}, {torch.get_num_threads()} threads")
    print_table([("preset", "s"), ("ms (min)", ".1f"), ("fp32 ms", ".2f"), ("ratio", ".0f"), ("ratio(med)", ".0f")],
                [(row["preset"], row["seconds_min"] * 1e3, row["fp32_seconds_min"] * 1e3, row["ratio"],
                  row["ratio_median"])])
    record = machine(rows=[row], repeats=args.repeats, threads=torch.get_num_threads())
    emit_json(record, args.json)
    return record


if __name__ == "__main__":
    main()
