"""Host time of one quantize call with Triton's real launch path and only the driver stubbed: what
Python costs before a kernel starts, measured without a GPU.

    python benchmarks/host_path.py [--json out.json] [--reps N]

Triton runs compiled (not interpreted): ``JITFunction.run``'s binder, specialisation and cache
key, the compile on the first call (sm_90, triton's ptxas) and ``CompiledKernel.run`` all run as
on a GPU; only the driver is a stand-in (``_FakeDriver``: device 0, stream 0, the module load and
the C launcher's ``cuLaunchKernel`` a no-op), so the figures leave out the launcher's argument
packing in C and the driver call (a few microseconds on a GPU, measured by ``gpu_check.py``).
Columns, per format on a 64x64x3x3 float32 tensor, each the median of 7 rounds in the same run:

* ``quantize``: the public ``bfp.quantize(x, fmt, backend="triton")``, launches through
  ``triton_cuda/launcher.py``'s per-plan cache of the compiled kernel;
* ``launch``: the Triton launch alone (``element.launch``), cached; ``launch, JIT``: the same
  through ``kernel[grid](...)`` every call (``JITFunction.run``'s binder and key, what the cache
  skips);
* ``x.clone()``, the yardstick (the machine is shared and noisy: compare ratios).
"""
from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("host_path runs Triton's compiled launch path: unset TRITON_INTERPRET")

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from _harness import count_args, emit_json, host_us, machine  # noqa: E402

FORMATS = ("fb16", "fb12", "float8_e4m3fn", "mxfp8_e4m3", "bfloat16", "nvfp4")
SHAPE = (64, 64, 3, 3)


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132}

    def unload_module(self, module):
        pass


class _FakeDriver:
    """An H100/H200 as Triton's driver interface sees it, with nothing behind it."""

    utils = _Utils()

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def launcher_cls(self, src, metadata):
        return lambda *args: None  # the C launcher: packs the arguments, calls cuLaunchKernel

    def get_active_torch_device(self):
        return torch.device("cpu")


def main(argv=None) -> int:
    args = count_args(__doc__, argv, "--reps", 2000)
    driver.set_active(_FakeDriver())
    import bfp
    import bfp.kernels.triton_cuda as tc
    from bfp.kernels.plan import canonical_4d, rule_for, tile_for
    from bfp.kernels.triton_cuda import element
    tc._INTERPRETED = True  # let CPU tensors through bfp's device check; Triton itself runs compiled
    x = torch.randn(SHAPE)
    out = torch.empty_like(x)
    clone = host_us(lambda: x.clone(), args.reps)
    rows = []
    for name in FORMATS:
        fmt = bfp.format_from_name(name)
        call = host_us(lambda: bfp.quantize(x, fmt, backend="triton"), args.reps)
        row = {"format": name, "quantize_us": round(call, 2)}
        if name != "nvfp4":  # the element rule's launch alone, cached and through the JIT every call
            rule, tile = rule_for(fmt), tile_for(fmt, SHAPE)
            s4, t4 = canonical_4d(SHAPE, tile) if tile else (None, None)
            row["launch_us"] = round(host_us(lambda: element.launch(x, out, rule, s4, t4, None, False), args.reps), 2)
            kernel, grid, extra, kw = element._plan(rule, x.numel(), s4, t4, False)
            jit = host_us(lambda: kernel[grid](x, out, x, x, *extra, **kw), args.reps)
            row["launch_jit_us"] = round(jit, 2)
        row["over_clone"] = round(call / clone, 2)
        rows.append(row)
    meta = machine(shape=SHAPE)
    print(f"host path of bfp.quantize on a {'x'.join(map(str, SHAPE))} float32 tensor, Triton compiled, driver "
          f"stubbed; torch {torch.__version__}, 1 thread, load average {meta['load_average_1min']:.2f}")
    print(f"x.clone(): {clone:.2f} us")
    print(f"{'format':16} {'quantize us':>11} {'launch us':>10} {'launch, JIT':>12} {'/ clone':>8}")
    for r in rows:
        print(f"{r['format']:16} {r['quantize_us']:11.2f} {r.get('launch_us', float('nan')):10.2f} "
              f"{r.get('launch_jit_us', float('nan')):12.2f} {r['over_clone']:8.2f}")
    emit_json({"meta": meta, "clone_us": round(clone, 2), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
