"""Cost of accumulator emulation relative to a plain float32 GEMM, measured in one run.

    python benchmarks/accumulate.py                     # 1024^3, fp16 accumulator
    python benchmarks/accumulate.py --size 512 --json out.json

Prints a table and a JSON record. Each configuration is timed ``--repeats``
times interleaved with the plain float32 GEMM (after one warm-up, which also
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
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(base_fn, fn, repeats: int) -> tuple[list[float], list[float]]:
    """Times of ``base_fn`` and ``fn``, alternating, after one warm-up of each."""
    base_fn(), fn()
    pairs = [(_seconds(base_fn), _seconds(fn)) for _ in range(repeats)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="M = N = K of the GEMM")
    ap.add_argument("--fmt", default="float16", help="accumulator format name (bfp.format_names)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the record here")
    ap.add_argument("--numba-threading-layer", choices=["default", "omp", "tbb", "workqueue"],
                    default="default")
    args = ap.parse_args(argv)
    if args.numba_threading_layer != "default":
        if "numba" in sys.modules:
            raise ValueError("--numba-threading-layer must be set before Numba is imported")
        os.environ["NUMBA_THREADING_LAYER"] = args.numba_threading_layer
    from bfp.accumulate import Accumulator, accumulate_matmul
    from bfp.formats import format_from_name

    gen = torch.Generator().manual_seed(0)
    n = args.size
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    fmt = format_from_name(args.fmt)
    plain = lambda: a @ b  # noqa: E731
    rows = []
    for chunk, kahan in [(c, False) for c in args.chunks] + [(32, True)]:
        acc = Accumulator(fmt, chunk=chunk, kahan=kahan)
        reps = 1 if chunk == 1 else args.repeats  # chunk 1 is K sequential steps: slow by design
        base, t = _interleaved(plain, lambda: accumulate_matmul(a, b, acc), reps)
        rows.append({"chunk": chunk, "kahan": kahan, "seconds_min": min(t),
                     "seconds_median": statistics.median(t), "fp32_seconds_min": min(base),
                     "ratio": min(t) / min(base), "ratio_median": statistics.median(t) / statistics.median(base)})

    record = {"size": n, "fmt": args.fmt, "rows": rows, "repeats": args.repeats,
              "numba_threading_layer": os.environ.get("NUMBA_THREADING_LAYER", "default"),
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.machine(), "cpus": os.cpu_count()}
    print(f"accumulate_matmul {n}x{n}x{n}, accumulator {args.fmt}, {torch.get_num_threads()} threads, "
          f"numba threading layer {record['numba_threading_layer']}")
    print(f"{'chunk':>6} {'kahan':>6} {'ms (min)':>10} {'fp32 ms':>9} {'ratio':>7} {'ratio(med)':>11}")
    for r in rows:
        print(f"{r['chunk']:>6} {str(r['kahan']):>6} {r['seconds_min'] * 1e3:10.1f} "
              f"{r['fp32_seconds_min'] * 1e3:9.1f} {r['ratio']:7.2f} {r['ratio_median']:11.2f}")
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
