"""Speed evidence without a GPU: every Triton quantize kernel compiled for sm_90 (H100/H200) exactly as
a launch compiles it, its SASS counted by pipe on the shapes a ResNet18 on CIFAR really quantizes.

    python benchmarks/sass_count.py [--json out.json] [--shapes resnet18|SHAPE,...] [--formats a,b]

Each row is one launch that bfp's own launch functions make (``_sass.captured``: meta tensors,
nothing runs), compiled with the launch's pointer dtypes, alignment and divisibility
specialisation, constexprs and options (``_sass.compile_launch``), disassembled, and counted on
its executed path (``_sass.count``: subroutine slow paths apart, loops times their trips).
Thread-instructions per element = executed instructions x threads a program / elements a
program (the tensor's elements over the grid). A kernel moving 8 bytes an element (a float32 in,
one out; 12 for a two-pass format) can run at copy speed on an H200 if its issue slots stay under
about 56 an element and each pipe under its share (ALU and IMAD half rate: 28; conversions 7):
``x copy`` is that budget over the busiest pipe (at most 1), an estimate a GPU must confirm
(``benchmarks/gpu_check.py``).

Shapes: ``resnet18`` (the default) is every distinct tensor ResNet18-CIFAR quantizes at batch 128:
each conv/linear weight, each layer's input activation and each output gradient, from the model
itself; ``64x128x32x32`` etc. name shapes directly.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("sass_count compiles kernels: unset TRITON_INTERPRET")

import torch  # noqa: E402
import triton  # noqa: E402

import _sass  # noqa: E402
from _harness import check_args, emit_json  # noqa: E402
from bfp import MX, format_from_name, format_names  # noqa: E402
from bfp.formats import Rounding  # noqa: E402
from bfp.kernels.plan import canonical_4d, rule_for, tile_for  # noqa: E402
from bfp.kernels.triton_cuda import element as E  # noqa: E402

SHAPE = (64, 128, 32, 32)
FORMATS = ("fb12", "fb16", "fb24", "fb16:nearest", "fb16:stochastic", "float8_e4m3fn", "float8_e4m3fn:stochastic",
           "float8_e5m2", "bfloat16", "float16", "float4_e2m1fn", "mxfp8_e4m3", "mxfp8_e4m3:stochastic", "mxfp6_e2m3",
           "mxfp4_e2m1", "mxint8", "p3109_k8p3se", "nvfp4", "nvfp4_sr", "nvfp4_te", "fp8_e4m3_tensorwise",
           "fp8_e4m3_rowwise")
ROUNDINGS = {r.value: r for r in Rounding}
META = "meta"


def resnet18_shapes(batch: int = 128) -> list[tuple[str, tuple, int]]:
    """(role, shape, how many) of every distinct tensor ResNet18-CIFAR quantizes in a training step:
    weights (w), layer inputs (a) and output gradients (g) of each conv and linear layer, from the
    model run on a meta batch; a shape's role is the first it was seen in."""
    from bfp.models import create
    model = create("ResNet18").to(META)
    seen: dict[tuple, list] = {}

    def hook(mod, inp, out):
        for role, shape in (("w", mod.weight.shape), ("a", inp[0].shape), ("g", out.shape)):
            seen.setdefault(tuple(shape), [role, 0])[1] += 1
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.empty(batch, 3, 32, 32, device=META))
    return [(role, shape, n) for shape, (role, n) in seen.items()]


def step_row(rows: list[dict]) -> dict:
    """A format's ResNet18 step as one figure: the fraction of copy speed of all its tensors together,
    each weighted by the bytes it moves (time at copy speed over estimated time)."""
    moved = sum(r["count"] * math.prod(r["shape"]) * r["bytes"] for r in rows)
    took = sum(r["count"] * math.prod(r["shape"]) * r["bytes"] / max(r["x_copy"], 1e-9) for r in rows)
    elems = sum(r["count"] * math.prod(r["shape"]) for r in rows)
    per = {k: round(sum(r["count"] * math.prod(r["shape"]) * r[k] for r in rows) / elems, 1)
           for k in ("all", *_sass.PIPES, "slow")}
    return {**rows[0], **per, "role": "step", "shape": ["resnet18"], "x_copy": round(moved / took, 2),
            "kernels": "element-weighted over the step's tensors"}


def _x(shape, dtype=torch.float32):
    return torch.empty(shape, device=META, dtype=dtype)


def _keys(fmt_rounding) -> torch.Tensor | None:
    return torch.empty(2, dtype=torch.int64, device=META) if fmt_rounding is Rounding.STOCHASTIC else None


def parse_format(name: str):
    """A preset name, optionally ``:truncate``/``:nearest``/``:stochastic`` for another rounding."""
    base, _, rounding = name.partition(":")
    fmt = format_from_name(base)
    if not rounding:
        return fmt
    if isinstance(fmt, MX):
        return dataclasses.replace(fmt, element=dataclasses.replace(fmt.element, rounding=ROUNDINGS[rounding]))
    return dataclasses.replace(fmt, rounding=ROUNDINGS[rounding])


def launches(fmt, shape, stats: bool = False, dtype=torch.float32) -> list:
    """The launches ``quantize(x, fmt, backend="triton")`` makes on a tensor of ``shape`` (``dtype``:
    bfloat16 and float16 reach the element-rule kernels as they are, other families as float32)."""
    from bfp.formats.nvfp4 import NVFP4
    from bfp.formats.scaled import Scaled
    from bfp.kernels import nvfp4 as nv
    from bfp.kernels.triton_cuda import scaled as sc
    with _sass.captured() as calls:
        x = _x(shape, dtype if dtype in E.IO and not isinstance(fmt, (NVFP4, Scaled)) else torch.float32)
        if isinstance(fmt, NVFP4):
            nv.quantize(x, fmt, _keys(fmt.rounding), "triton")
        elif isinstance(fmt, Scaled):  # as kernels/dispatch.py's _scaled calls the fused kernels
            args = (fmt.fmt.max, fmt.pow2, rule_for(fmt.fmt), _keys(fmt.fmt.rounding))
            if fmt.delayed:  # the history's amax given; the training step's amax taken by the same pass
                sc.tensorwise(x, *args, given_amax=torch.zeros((), device=x.device), seen=True)
            elif fmt.granularity == "tensor":
                sc.tensorwise(x, *args)
            else:
                sc.rowwise(x, fmt.axis % x.dim(), *args)
        else:
            rule = rule_for(fmt)
            tile = tile_for(fmt, shape)
            shape4, tile4 = canonical_4d(shape, tile) if tile else (None, None)
            E.launch(x, torch.empty_like(x), rule, shape4, tile4,
                     _keys(Rounding.STOCHASTIC if rule.mode == 2 else None), stats)
    return calls


def other_launches(shape) -> list[tuple[str, list, int]]:
    """(label, launches, elements) of the kernels no format preset reaches alone: the Hadamard
    transform, alone and fused into NVFP4 (blocks of 16 rows), the accumulators' in-place
    ``s = float16(s + t)``, and the tensor-core accumulator (per product of a 128x1024 @ 1024x128)."""
    from bfp.kernels.triton_cuda import fused, hadamard, inplace
    from bfp.tensorcore import FUSED_PRESETS, _chains
    out = []
    factor = torch.empty(16, device=META)
    with _sass.captured() as calls:
        hadamard.transform_rows(_x(shape), factor)
    out.append(("hadamard", calls, math.prod(shape)))
    with _sass.captured() as calls:
        hadamard.quantize_rows(_x(shape), factor, format_from_name("nvfp4"), None)
    out.append(("hadamard+nvfp4", calls, math.prod(shape)))
    with _sass.captured() as calls:
        inplace.add_round(_x(shape), _x(shape), rule_for(format_from_name("float16")), None)
    out.append(("float16 s += t", calls, math.prod(shape)))
    for name in ("h100_fp8", "h100_bf16"):
        acc = FUSED_PRESETS[name]
        a, b = torch.empty(1, 128, 1024, device=META), torch.empty(1, 1024, 128, device=META)
        with _sass.captured() as calls:
            fused.fused_bmm(a, b, acc, _chains(1024, acc))
        kw = calls[0].kwargs  # one step of the K loop a program: BM x BN outputs x T terms (static count)
        out.append((f"accumulator {name} (per product, one step)", calls,
                    math.prod(calls[0].grid) * kw["BM"] * kw["BN"] * kw["T"]))
    return out


def _trips(launch) -> int:
    kw, name = launch.kwargs, launch.fn.__name__
    if name == "_big_tiles":
        return -(-kw["SIZE"] // kw["CH"])
    if name == "_long_rows":
        return -(-launch.args[3] // kw["CHUNK"])
    return 1


_COMPILED: dict = {}


def measure(launch, numel: int) -> dict:
    """Per-element executed thread-instructions by pipe of one launch over ``numel`` elements."""
    key = (launch.fn, repr({k: v for k, v in launch.kwargs.items()}),
           tuple(str(a.dtype) if isinstance(a, torch.Tensor) else (a % 16 == 0, a == 1) if isinstance(a, int) else a
                 for a in launch.args))
    if key not in _COMPILED:
        k = _sass.compile_launch(launch)
        _COMPILED[key] = (_sass.disassemble(k.asm["cubin"]), k.metadata.num_warps, _sass.resources(k.asm["cubin"]))
    sass, warps, (regs, spill) = _COMPILED[key]
    c = _sass.count(sass, _trips(launch))
    per = 32 * warps * math.prod(launch.grid) / max(numel, 1)
    row = {k: round(v * per, 1) for k, v in c.items() if k not in ("static",)}
    row.update(kernel=launch.fn.__name__, warps=warps, grid=list(launch.grid), static=c["static"], registers=regs,
               spill_bytes=spill)
    return row


def family_row(name: str, shape, role: str = "", stats: bool = False, dtype=torch.float32) -> dict:
    """One format on one shape: each launch's counts and their sum, against the budget at the
    bytes the launches move (8 an element, 4 more for each extra pass over the tensor)."""
    fmt = parse_format(name) if isinstance(name, str) else name
    calls = launches(fmt, shape, stats, dtype)
    es = calls[-1].args[0].element_size() if calls else 4
    return _row(str(name) + ("" if es == 4 else f" ({str(dtype)[6:]})"), calls, math.prod(shape), shape, role,
                stats, es)


def _row(name: str, calls: list, numel: int, shape, role: str = "", stats: bool = False, es: int = 4) -> dict:
    parts = [measure(la, numel) for la in calls]
    total = {k: round(sum(p[k] for p in parts), 1) for k in ("all", *_sass.PIPES, "slow", "cond")}
    nbytes = 2 * es + 4 * (len(parts) - 1)
    return {"format": name, "shape": list(shape), "role": role, "stats": stats, "bytes": nbytes,
            "kernels": " + ".join(p["kernel"] for p in parts), "launches": parts, **total,
            **_sass.pressure(total, nbytes)}


def _summary(rows: list[dict]) -> list[dict]:
    """Per format: the row of the 64x128x32x32 tensor, the worst of the others (by x copy) and the
    ResNet18 step's element-weighted row."""
    out = []
    for name in dict.fromkeys(r["format"] + ("+stats" if r["stats"] else "") for r in rows):
        mine = [r for r in rows if r["format"] + ("+stats" if r["stats"] else "") == name]
        base = [r for r in mine if tuple(r["shape"]) == SHAPE and not r["role"]] or mine[:1]
        shapes = [r for r in mine if r["role"] != "step"]
        worst = min(shapes, key=lambda r: (r["x_copy"], -r["all"]))
        out += base + ([worst] if worst is not base[0] else []) + [r for r in mine if r["role"] == "step"]
    return out


def _parse_shapes(p, text: str):
    if text == "resnet18":
        return resnet18_shapes() + [("", SHAPE, 0)]
    out = []
    for part in text.split(","):
        try:
            shape = tuple(int(v) for v in part.lower().split("x"))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            p.error(f"--shapes {part!r}: not a shape; allowed 'resnet18' or shapes like 64x128x32x32, comma-separated")
        out.append(("", shape, 1))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--shapes", default="resnet18")
    p.add_argument("--rows", action="store_true", help="print every shape's row (default: 64x128x32x32 and the "
                   "worst shape of each format; the JSON always holds every row)")
    p.add_argument("--selftest", action="store_true",
                   help="count kernels built to cost a known number of instructions; print measured vs expected")
    args = p.parse_args(argv)
    if args.selftest:
        from _sass_selftest import selftest
        result = selftest()
        emit_json(result, args.json)
        return 0 if all(m == e for m, e in result.values()) else 1
    check_args(p, json_path=args.json)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f.partition(":")[0] not in format_names()
           or f.partition(":")[2] not in ("", *ROUNDINGS)] or ([] if formats else [args.formats])
    if bad:  # refused before anything is compiled
        p.error(f"--formats {', '.join(map(repr, bad))}: not a format name; allowed a comma-separated list of "
                f"{', '.join(FORMATS)} or any bfp.format_names() entry, with :truncate, :nearest or :stochastic")
    shapes = _parse_shapes(p, args.shapes)
    rows = []
    for n in formats:
        mine = [dict(family_row(n, s, role), count=k) for role, s, k in shapes]
        rows += mine + ([step_row([r for r in mine if r["count"]])] if args.shapes == "resnet18" else [])
    rows += [family_row("fb16", SHAPE, stats=True)]
    rows += [family_row(n, SHAPE, dtype=torch.bfloat16) for n in ("float8_e4m3fn", "mxfp8_e4m3", "fb16")]
    rows += [_row(label, calls, numel, SHAPE) for label, calls, numel in other_launches(SHAPE)]
    print(f"triton {triton.__version__}, sm_90 as a launch compiles it; executed thread-instructions per element "
          f"by pipe; budget {_sass.issue_slots(8):.0f} issue slots (ALU/IMAD {_sass.issue_slots(8) / 2:.0f}) at 8 "
          f"bytes an element")
    print(f"{'format':24} {'shape':>16} {'all':>6} {'alu':>6} {'imad':>6} {'fp32':>5} {'xu':>5} {'lsu':>5} "
          f"{'slow':>5} {'x copy':>6}  kernels")
    shown = rows if args.rows else _summary(rows)
    for r in shown:
        print(f"{r['format'] + (' +stats' if r['stats'] else ''):24} {r['role'] + ' ' + 'x'.join(map(str, r['shape'])):>16} {r['all']:6.1f} "
              f"{r['alu']:6.1f} {r['imad']:6.1f} {r['fp32']:5.1f} {r['xu']:5.1f} {r['lsu']:5.1f} {r['slow']:5.1f} "
              f"{r['x_copy']:6.2f}  {r['kernels']}")
    emit_json({"triton": triton.__version__, "target": "sm_90", "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
