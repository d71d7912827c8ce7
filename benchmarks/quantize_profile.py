"""Where a CPU quantize's time goes: page faults, copy, the kernel per element, the call.

    python benchmarks/quantize_profile.py                    # 64x128x32x32, all threads
    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/quantize_profile.py

Times, as medians of alternated rounds (``--repeat``): ``torch.clone``; a copy
into a pre-faulted buffer; the fresh output's page faults on 4 KiB and on 2 MiB
pages (``torch.empty`` + ``fill_``, minus a pre-faulted ``fill_``); and for each
format the kernel alone into a pre-faulted buffer (ns per element) and
``bfp.quantize`` on a tiny tensor (the per-call Python and dispatch cost).
"""
from __future__ import annotations

import argparse

import torch

import bfp
from bfp.kernels.numba_cpu import cpu, pages
from bfp.kernels.plan import canonical_4d, rule_for, tile_for

from _harness import alternate, emit_json, machine, print_table
from quantize import parse_format


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs="+", default=[64, 128, 32, 32])
    ap.add_argument("--formats", nargs="+", default=["fb12", "bfp8[1,24,3,3]-nearest", "float8_e4m3fn",
                                                     "mxfp8_e4m3"])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    x = torch.randn(args.shape)
    n = x.numel()
    pre = torch.zeros_like(x)

    def fresh(huge: bool):
        def f():
            o = torch.empty_like(x)
            if huge:
                pages.advise(o)
            return o.fill_(0)
        return f

    t = alternate({"clone": x.clone, "copy_prefaulted": lambda: pre.copy_(x), "fill_prefaulted": lambda: pre.fill_(0),
                   "fill_fresh_4k": fresh(False), "fill_fresh_2m": fresh(True)}, args.repeat, warmup=2)
    ms = {k: t.median(k) * 1e3 for k in t.wall}
    rows = [("clone", ms["clone"], ""), ("copy, pre-faulted output", ms["copy_prefaulted"], ""),
            ("page faults, 4 KiB pages", ms["fill_fresh_4k"] - ms["fill_prefaulted"], ""),
            ("page faults, 2 MiB pages", ms["fill_fresh_2m"] - ms["fill_prefaulted"], "")]
    tiny = torch.randn(64)
    record = {"ms": ms, "formats": {}}
    for spec in args.formats:
        fmt = parse_format(spec)
        rule, tile = rule_for(fmt), tile_for(fmt, tuple(x.shape))
        shape4, tile4 = canonical_4d(tuple(x.shape), tile) if tile else (None, None)
        xb, ob = x.view(torch.int32).numpy().reshape(-1), pre.view(torch.int32).numpy().reshape(-1)
        k = alternate({"kernel": lambda: cpu.run(xb, ob, rule, shape4, tile4, (0, 0), False),
                       "tiny": lambda: bfp.quantize(tiny, fmt)}, args.repeat, warmup=2)
        kernel_ms, tiny_us = k.median("kernel") * 1e3, k.median("tiny") * 1e6
        record["formats"][spec] = {"kernel_ms": kernel_ms, "ns_per_element": kernel_ms * 1e6 / n,
                                   "tiny_call_us": tiny_us}
        rows.append((f"{spec}: kernel, pre-faulted", kernel_ms,
                     f"{kernel_ms * 1e6 / n:.2f} ns/element; a 64-element call {tiny_us:.0f} us"))
    print_table([("what", "s"), ("ms", ".2f"), ("", "s")], rows)
    emit_json(machine(shape=list(x.shape), repeat=args.repeat, **record))
    return record


if __name__ == "__main__":
    main()
