"""Host cost of what issue 53 and 55 put on every CPU quantize call: the argument checks
(``bfp.kernels.op_args``) and the DLPack view that replaced ``Tensor.numpy()`` (``bfp.kernels.arrays``),
each against the call it sits in (``bfp.quantize`` of a 64x64x3x3 float32 tensor, one thread).

    python benchmarks/host_checks.py [--json FILE]

Timed in alternating rounds (``_harness.alternate``), medians of microseconds a call; the ratio of a
check to the whole call is what matters (the machine is shared)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bfp  # noqa: E402
from bfp.kernels import op_args  # noqa: E402
from bfp.kernels.arrays import as_numpy  # noqa: E402

from _harness import alternate, count_args, emit_json, machine, print_table  # noqa: E402


def main(argv=None) -> int:
    args = count_args(__doc__, argv, "--rounds", 15)
    x = torch.randn(64, 64, 3, 3)
    reps = 2000

    def many(fn):
        return lambda: [fn() for _ in range(reps)]
    fns = {"tensor check": many(lambda: op_args.tensor(x, "x")), "generator check": many(lambda: op_args.generator(None)),
           "as_numpy (versioned capsule)": many(lambda: as_numpy(x)),
           "np.from_dlpack (public path)": many(lambda: np.from_dlpack(x)), "Tensor.numpy()": many(lambda: x.numpy())}
    for name in ("fb16", "float8_e4m3fn"):
        f = bfp.format_from_name(name)
        fns[f"bfp.quantize {name}"] = many(lambda f=f: bfp.quantize(x, f))
    t = alternate(fns, args.rounds, warmup=1)
    rows = [{"what": k, "us": round(1e6 * t.median(k) / reps, 3)} for k in fns]
    meta = machine(shape=list(x.shape))
    print(f"host microseconds a call, 64x64x3x3 float32, 1 thread, load average {meta['load_average_1min']:.2f}")
    print_table([("what", "s"), ("us a call", ".3f")], [(r["what"], r["us"]) for r in rows])
    emit_json({"meta": meta, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
