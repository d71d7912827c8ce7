"""Host time of one quantize call with the GPU launch stubbed out: what Python costs before a kernel
starts, measured without a GPU.

    TRITON_INTERPRET=1 python benchmarks/host_path.py [--json out.json]

Each format is quantized through the public ``bfp.quantize`` on a 64x64x3x3 float32 tensor with the
Triton backend, but the Triton kernels (``bfp.kernels.triton_cuda.element``) are replaced by stubs
that take the grid and the arguments and return at once: the time left is bfpsim's own host path
(format checks, the rule and tile lookups, the custom op's dispatch, the keys, the output
allocation), the part the issue's target (20 us or less) is about. Triton's own launcher is
extra: 14.7 us a launch measured on an H200 (shared/gpu/README.md). ``x.clone()`` on the same
tensor is timed in the same run as the yardstick (the machine is shared and noisy: compare the
ratio), and so is the same call through the custom op (``torch.ops.bfp.quantize_format``, the path
torch.compile's graphs take).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors reach the Triton path; the launch is stubbed

import torch  # noqa: E402

import bfp  # noqa: E402
from bfp.kernels.dispatch import format_json, quantize_format  # noqa: E402
from bfp.kernels.triton_cuda import element  # noqa: E402

from _harness import check_args, emit_json, host_us, machine  # noqa: E402

FORMATS = ("fb16", "fb12", "float8_e4m3fn", "mxfp8_e4m3", "bfloat16")
SHAPE = (64, 64, 3, 3)


class _Stub:
    """A Triton kernel that launches nothing: ``kernel[grid](*args, **kw)`` returns at once."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--reps", type=int, default=2000)
    args = p.parse_args(argv)
    check_args(p, at_least={"--reps": (args.reps, 1)}, json_path=args.json)
    torch.set_num_threads(1)
    for name in ("_elementwise", "_tiles", "_big_tiles"):
        setattr(element, name, _Stub())
    x = torch.randn(SHAPE)
    clone = host_us(lambda: x.clone(), args.reps)
    rows = []
    for name in FORMATS:
        fmt = bfp.format_from_name(name)
        call = host_us(lambda: bfp.quantize(x, fmt, backend="triton"), args.reps)
        text = format_json(fmt)
        op = host_us(lambda: quantize_format(x, text, None, False, "triton"), args.reps)
        rows.append({"format": name, "quantize_us": round(call, 2), "op_us": round(op, 2),
                     "over_clone": round(call / clone, 2)})
    meta = machine(shape=SHAPE)
    print(f"host path of bfp.quantize on a {'x'.join(map(str, SHAPE))} float32 tensor, Triton launch stubbed; "
          f"torch {torch.__version__}, 1 thread, load average {meta['load_average_1min']:.2f}")
    print(f"x.clone(): {clone:.2f} us")
    print(f"{'format':16} {'quantize us':>11} {'op alone us':>11} {'/ clone':>8}")
    for r in rows:
        print(f"{r['format']:16} {r['quantize_us']:11.2f} {r['op_us']:11.2f} {r['over_clone']:8.2f}")
    doc = {"meta": meta, "clone_us": round(clone, 2), "rows": rows}
    emit_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
