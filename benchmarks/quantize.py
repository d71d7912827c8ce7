"""Quantization throughput per format, as a ratio to ``torch.clone`` in the same run.

    python benchmarks/quantize.py                       # CPU, 64x128x32x32
    python benchmarks/quantize.py --device cuda         # GPU (when one is there)
    python benchmarks/quantize.py --json out.json --shape 64 128 32 32 --repeat 30
    python benchmarks/quantize.py --formats nvfp4 rht16+nvfp4   # rhtB+F: Hadamard over B rows, then F
    python benchmarks/quantize.py --shape 32 128 32 32 --formats mxfp8_e4m3@1   # F@A: blocks along axis A

Throughput counts bytes read plus bytes written (2 x 4 bytes per element).
Both quantize and clone allocate their output, as users see them. Timings
alternate between the two so that machine noise hits both alike; the ratio is
of medians. On a CPU a third callable, quantize with the output on 4 KiB pages
(``bfp.kernels.numba_cpu.pages.off()``), is timed in the same rounds: "x clone 4K". Targets: >= 0.7x clone on a CPU for fb12 and float8_e4m3fn;
>= 0.8x of device copy bandwidth on a GPU.
"""
from __future__ import annotations

import argparse
import re

import numba
import torch

import bfp
from bfp.hadamard import transform_quantize
from bfp.precision import Hadamard
from bfp.kernels.numba_cpu import pages

from _harness import alternate, emit_json, machine, print_table

DEFAULT_FORMATS = ["fb12", "bfp8[1,24,3,3]-nearest", "fb16", "fb24", "float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                   "float4_e2m1fn", "bfloat16", "mxfp8_e4m3", "mxfp4_e2m1", "mxint8",
                   "fb16-nearest", "fb16-stochastic", "float8_e4m3fn-stochastic",
                   "mxfp8_e4m3_rceil", "nvfp4", "nvfp4_sr", "rht16+nvfp4", "fp8_e4m3_tensorwise", "fp8_e4m3_rowwise"]
TARGETS = {"fb12": 0.7, "bfp8[1,24,3,3]-nearest": 0.7, "float8_e4m3fn": 0.7, "nvfp4": 0.5, "rht16+nvfp4": 0.5}


def parse_format(spec: str):
    """A preset name or ``bfpBITS[g0,g1,...]`` (a BlockFloat), optionally with
    ``-nearest``/``-stochastic``/``-truncate``, and for a blocked format with an axis
    (MX, NVFP4) ``@AXIS`` (e.g. ``mxfp8_e4m3@1``: blocks across a convolution's channels)."""
    spec, _, axis = spec.partition("@")
    fmt = _parse(spec)
    if axis:
        if not hasattr(fmt, "axis"):
            raise SystemExit(f"{spec!r} has no block axis to set (@{axis})")
        fmt = type(fmt)(**{**fmt.__dict__, "axis": int(axis)})
    return fmt


def _parse(spec: str):
    name, _, rounding = spec.partition("-")
    block = re.fullmatch(r"bfp(\d+)\[([\d,]+)\]", name)
    if block:
        fmt = bfp.BlockFloat(int(block[1]), [int(g) for g in block[2].split(",")])
    else:
        fmt = bfp.format_from_name(name)
    if rounding:
        if isinstance(fmt, (bfp.MX, bfp.NVFP4, bfp.Scaled)):
            raise SystemExit(f"rounding suffix not supported on preset {spec!r} (use its _sr name)")
        fmt = type(fmt)(**{**fmt.__dict__, "rounding": rounding})
    return fmt


def rounding_fn(spec: str, x: torch.Tensor, gen: torch.Generator):
    """What one timed call does: ``quantize(x, fmt)``, or for ``rhtB+FORMAT`` the NVFP4
    recipe's weight-gradient operand: x as rows x columns (its last axis the columns), the
    random Hadamard transform over blocks of B rows, then FORMAT along the rows (axis -2)."""
    rht = re.fullmatch(r"rht(\d+)\+(.+)", spec)
    if not rht:
        fmt = parse_format(spec)
        return lambda: bfp.quantize(x, fmt, generator=gen)
    h = Hadamard(int(rht[1]))
    fmt = parse_format(rht[2])
    fmt = type(fmt)(**{**fmt.__dict__, "axis": -2})
    x2 = x.reshape(-1, x.shape[-1])
    return lambda: transform_quantize(x2, h, fmt, generator=gen)  # as the backward pass calls it


def bench(x: torch.Tensor, spec: str, repeat: int, sync) -> tuple[float, float, float | None]:
    """Median seconds of the rounding (``rounding_fn``), clone and (CPU) the rounding without
    huge pages, alternated, after 3 warm-ups (JIT, allocator)."""
    gen = torch.Generator(x.device).manual_seed(0)
    fn = rounding_fn(spec, x, gen)

    def small_pages():
        with pages.off():
            return fn()

    fns = {"quantize": fn, "clone": x.clone}
    if x.device.type == "cpu":
        fns["quantize_4k"] = small_pages
    t = alternate(fns, repeat, warmup=3, sync=sync)
    return t.median("quantize"), t.median("clone"), t.median("quantize_4k") if "quantize_4k" in fns else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    ap.add_argument("--shape", type=int, nargs="+", default=[64, 128, 32, 32])
    ap.add_argument("--formats", nargs="+", default=DEFAULT_FORMATS,
                    help="preset names, optionally suffixed -nearest/-stochastic/-truncate")
    ap.add_argument("--repeat", type=int, default=20, help="timed repetitions per format")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch")
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    x = torch.randn(args.shape, device=args.device)
    nbytes = 2 * x.numel() * x.element_size()
    rows = []
    for spec in args.formats:
        tq, tc, t4 = bench(x, spec, args.repeat, sync)
        rows.append({"format": spec, "ms": tq * 1e3, "clone_ms": tc * 1e3, "gbps": nbytes / tq / 1e9,
                     "clone_gbps": nbytes / tc / 1e9, "ratio_to_clone": tc / tq,
                     "ratio_to_clone_4k_pages": tc / t4 if t4 else None, "target": TARGETS.get(spec)})
    meta = machine(device=str(x.device), shape=list(x.shape), threads=numba.get_num_threads(),
                   repeat=args.repeat)

    def target(r) -> str:
        if r["target"] is None:
            return ""
        return f">= {r['target']:.1f} {'ok' if r['ratio_to_clone'] >= r['target'] else 'MISSED'}"

    print_table([("format", "s"), ("ms", ".2f"), ("GB/s", ".2f"), ("clone ms", ".2f"), ("x clone", ".2f"),
                 ("x clone 4K", "s"), ("target", "s")],
                [(r["format"], r["ms"], r["gbps"], r["clone_ms"], r["ratio_to_clone"],
                  "" if r["ratio_to_clone_4k_pages"] is None else f"{r['ratio_to_clone_4k_pages']:.2f}", target(r))
                 for r in rows])
    emit_json({"meta": meta, "results": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
