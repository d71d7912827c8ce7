"""Speed evidence without a GPU: the Triton quantize kernels compiled for sm_90 (H100/H200) ahead of
time with triton's bundled ptxas (no GPU needed), and their SASS counted per format.

    python benchmarks/sass_count.py [--json out.json]

For each format it compiles the kernel a 64x128x32x32 tensor takes (``bfp.kernels.triton_cuda``:
``_elementwise`` for element-wise formats, ``_tiles`` for tiled ones) with the format's constants,
disassembles it (``cuobjdump -sass``) and prints thread-instructions per element (the kernels are
straight-line: every thread runs each instruction once, so per element = instructions x threads
per program / elements per program), registers and spill bytes. An H200 moves a float32 element in
and out at copy speed (about 4.2 TB/s, 8 bytes an element) in the time its SMs issue about 60
thread-instructions per element (132 SMs x 4 schedulers x 1.98 GHz / 525 G elements/s), so a
kernel under that budget can reach copy bandwidth; one over it is bound by its arithmetic. The
counts are the evidence the issue asks for until a GPU measures the kernels (benchmarks/gpu_check.py).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("sass_count compiles kernels: unset TRITON_INTERPRET")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bfp import format_from_name, format_names  # noqa: E402
from bfp.kernels.plan import canonical_4d, rule_for, tile_for  # noqa: E402
from bfp.kernels.triton_cuda import element as E  # noqa: E402

from _harness import check_args, emit_json  # noqa: E402

SHAPE = (64, 128, 32, 32)
FORMATS = ("fb12", "fb16", "fb24", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float4_e2m1fn",
           "mxfp8_e4m3", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8", "p3109_k8p3se")
BUDGET = 60
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _sass(kernel) -> tuple[int, int, int]:
    """(SASS instructions, registers, spill bytes) of a compiled kernel."""
    tool = os.path.join(TOOLS, "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    ins = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    spill = sum(int(v) for v in re.findall(r"(?:STACK|LOCAL):(\d+)", res))
    return ins, regs, spill


def _compile(fn, sig: dict, consts: dict, warps: int = 4):
    sig = {**sig, **{k: "constexpr" for k in consts}}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps})


PTRS = {"x_ptr": "*i32", "o_ptr": "*i32", "keys_ptr": "*i64", "part_ptr": "*i64"}


def count(name: str, stats: bool = False, warps=None) -> dict:
    """The row of ``name`` (a format preset) on ``SHAPE``."""
    fmt = format_from_name(name)
    rule = rule_for(fmt)
    tile = tile_for(fmt, SHAPE)
    if tile is None:
        consts = dict(**E.rule_kwargs(rule), STATS=stats, BLOCK=E.ELEMS, IDX64=False)
        warps = 4 if warps is None else warps
        k = _compile(E._elementwise, {**PTRS, "n": "i64"}, consts, warps)
        per_program, kernel = E.ELEMS, "_elementwise"
    else:
        shape4, tile4 = canonical_4d(SHAPE, tile)
        cfg = E.tile_config(shape4, tile4)
        if cfg["big"]:
            raise ValueError(f"{name}: tiles of {tile4} take _big_tiles (a loop), not counted here")
        consts = dict(**cfg["consts"], **E._rule_consts(rule), STATS=stats, IDX64=False)
        sig = {**PTRS, **{k: "i32" for k in ("D0", "D1", "D2", "D3", "n1", "n2", "n3", "n_tiles")}}
        warps = cfg["warps"] if warps is None else warps
        k = _compile(E._tiles, sig, consts, warps)
        size = tile4[0] * tile4[1] * tile4[2] * tile4[3]
        per_program = cfg["TPP"] * size
        kernel = (f"_tiles {'x'.join(map(str, tile4))} in {cfg['consts']['PT']} slots, {cfg['TPP']} a program"
                  + (", runs" if cfg["consts"]["RUNS"] else ""))
    ins, regs, spill = _sass(k)
    return {"format": name, "kernel": kernel, "stats": stats, "warps": warps, "sass": ins, "registers": regs,
            "spill_bytes": spill,
            "per_element": round(ins * 32 * warps / per_program, 1)}


def count_nvfp4(block=16, stochastic: bool = False, te: bool = False, warps: int = 4) -> list[dict]:
    """Rows for NVFP4's two kernels (``triton_cuda/nvfp4.py``): the amax pass and the quantize pass
    (``block`` an int: 1-D blocks along the last axis; a pair: 2-D tiles; ``te``: TE's convention)."""
    from bfp.formats import Rounding
    from bfp.kernels.nvfp4_codes import E2M1, E4M3
    from bfp.kernels.triton_cuda import nvfp4 as N
    k = _compile(N._amax, {"x_ptr": "*fp32", "part_ptr": "*i32", "n": "i32"},
                 dict(BLOCK=N.ELEMS, IDX64=False, WITH_INF=te), warps)
    ins, regs, spill = _sass(k)
    rows = [{"format": "nvfp4 amax" + (" +Inf" if te else ""), "kernel": "_amax", "stats": False, "warps": warps, "sass": ins, "registers": regs,
             "spill_bytes": spill, "per_element": round(ins * 32 * warps / N.ELEMS, 1)}]
    br, bc = block if isinstance(block, tuple) else (1, block)
    e2 = rule_for(E2M1[Rounding.STOCHASTIC if stochastic else Rounding.NEAREST])
    tpp = N.ELEMS // (br * bc)
    consts = dict(BR=br, BC=bc, PR=br, PC=bc, TPP=tpp, TILE2D=br > 1, TENSOR_SCALE=True, TE=te,
                  E4=N._consts(rule_for(E4M3)), E2=N._consts(e2), MODE=e2.mode, IDX64=False)
    sig = {"x_ptr": "*fp32", "o_ptr": "*fp32", "keys_ptr": "*i64", "amax_ptr": "*i32", "B": "i32", "R": "i32",
           "C": "i32", "Z": "i32", "n_tile_rows": "i32", "n_tile_cols": "i32"}
    sig.update({k: "constexpr" for k in consts})
    k = triton.compile(ASTSource(fn=N._quantize, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "enable_fp_fusion": False})
    ins, regs, spill = _sass(k)
    name = "nvfp4" + ("_te" if te else "") + (" sr" if stochastic else "")
    rows.append({"format": name, "kernel": f"_quantize {br}x{bc} blocks, {tpp} a program",
                 "stats": False, "warps": warps, "sass": ins, "registers": regs, "spill_bytes": spill,
                 "per_element": round(ins * 32 * warps / (tpp * br * bc), 1)})
    return rows


def count_scaled(warps: int = 4) -> list[dict]:
    """Rows for scaled FP8's kernels (``triton_cuda/scaled.py``, float8_e4m3fn, nearest): per tensor,
    rowwise along the last axis (rows of 1024, 2 a program), along another axis (strided), and long rows."""
    from bfp.kernels.triton_cuda import scaled as S
    fmt = format_from_name("float8_e4m3fn")
    rule = rule_for(fmt)
    rc = dict(FMAX=fmt.max, POW2=False, **E.rule_kwargs(rule), IDX64=False)
    ptrs = {"x_ptr": "*fp32", "o_ptr": "*fp32", "keys_ptr": "*i64"}
    cases = [("fp8 tensorwise", "_scaled", S._scaled, {**ptrs, "amax_ptr": "*fp32", "n": "i32"},
              dict(BLOCK=S.ELEMS), S.ELEMS)]
    for strided in (False, True):
        cases.append(("fp8 rowwise", f"_rows 1024 a row, 2 a program{', strided' if strided else ''}", S._rows,
                      {**ptrs, "R": "i32", "C": "i32", "Z": "i32"}, dict(PT=1024, TPP=2, STRIDED=strided), 2048))
    cases.append(("fp8 rowwise", f"_long_rows, chunks of {S.ELEMS} (read twice)", S._long_rows,
                  {**ptrs, "C": "i32", "Z": "i32"}, dict(CHUNK=S.ELEMS), None))
    rows = []
    for fmt_name, kernel, fn, sig, consts, per_program in cases:
        sig = {**sig, **{k: "constexpr" for k in {**consts, **rc}}}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs={**consts, **rc}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "enable_fp_fusion": False})
        ins, regs, spill = _sass(k)
        # the looping kernel: its static count over the two loops' chunks (an element is visited twice)
        per = round(ins * 32 * warps / (per_program or S.ELEMS), 1)
        rows.append({"format": fmt_name, "kernel": kernel, "stats": False, "warps": warps, "sass": ins,
                     "registers": regs, "spill_bytes": spill, "per_element": per})
    return rows


def count_hadamard(block: int = 16, warps: int = 4) -> list[dict]:
    """Rows for the Hadamard kernels (``triton_cuda/hadamard.py``): the transform alone, and the amax
    and quantize passes of its fusion into NVFP4 (each transforms its block of ``block`` rows)."""
    from bfp.formats import Rounding
    from bfp.kernels.nvfp4_codes import E2M1, E4M3
    from bfp.kernels.triton_cuda import hadamard as Hd, nvfp4 as N
    e2 = rule_for(E2M1[Rounding.NEAREST])
    base = dict(B=block, LOG2B=block.bit_length() - 1, WC=Hd.W, IDX64=False)
    ptrs = {"x_ptr": "*fp32", "f_ptr": "*fp32"}
    dims = {"Rin": "i32", "C": "i32", "nb": "i32", "ncol": "i32"}
    cases = [("hadamard", "_rows", Hd._rows, {**ptrs, "o_ptr": "*fp32", **dims}, base),
             ("hadamard+nvfp4 amax", "_amax", Hd._amax, {**ptrs, "part_ptr": "*i32", **dims}, base),
             ("hadamard+nvfp4", "_quantize", Hd._quantize,
              {**ptrs, "o_ptr": "*fp32", "keys_ptr": "*i64", "amax_ptr": "*i32", **dims},
              {**base, "TENSOR_SCALE": True, "E4": N._consts(rule_for(E4M3)), "E2": N._consts(e2), "MODE": e2.mode})]
    rows = []
    for fmt_name, kernel, fn, sig, consts in cases:
        k = triton.compile(ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "enable_fp_fusion": False})
        ins, regs, spill = _sass(k)
        rows.append({"format": fmt_name, "kernel": f"{kernel} {block}x{Hd.W} a program", "stats": False, "warps": warps,
                     "sass": ins, "registers": regs, "spill_bytes": spill,
                     "per_element": round(ins * 32 * warps / (block * Hd.W), 1)})
    return rows


def count_fused(name: str = "h100_fp8", warps: int = 4) -> list[dict]:
    """The tensor-core accumulator's kernel (``triton_cuda/fused.py``) for a preset: instructions per
    product (an output tile's step of ``terms`` products is one loop iteration; counted once, so
    per product = the loop body's share, an upper bound as the count includes the prologue)."""
    from bfp.kernels.triton_cuda import fused as Fu
    from bfp.tensorcore import FUSED_PRESETS
    acc = FUSED_PRESETS[name]
    bm = bn = 16 if acc.terms <= 16 else 8
    consts = dict(T=acc.terms, BM=bm, BN=bn, ALIGN_EMIN=acc.align_emin, ALIGN_BITS=acc.align_bits,
                  ALIGN_NEAREST=acc.align_rounding == "nearest", SUM_BITS=acc.sum_bits, SUM_EMIN=acc.sum_emin,
                  SUM_NEAREST=acc.sum_rounding == "nearest", ACC_IN_ALIGN=bool(acc.accumulator_in_alignment),
                  OPERAND_EXP=acc.product_exponent == "operands")
    sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "ea_ptr": "*i32", "eb_ptr": "*i32", "o_ptr": "*fp32",
           "bounds_ptr": "*i32", "n_chains": "i32", "M": "i32", "N": "i32", "K": "i32"}
    k = triton.compile(ASTSource(fn=Fu._fused, signature={**sig, **{c: "constexpr" for c in consts}},
                                 constexprs=consts),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "enable_fp_fusion": False})
    ins, regs, spill = _sass(k)
    return [{"format": f"accumulator {name}", "kernel": f"_fused {bm}x{bn} outputs x {acc.terms} terms a step",
             "stats": False, "warps": warps, "sass": ins, "registers": regs, "spill_bytes": spill,
             "per_element": round(ins * 32 * warps / (bm * bn * acc.terms), 1)}]


def count_inplace(warps: int = 4) -> list[dict]:
    """The accumulators' fused ``s = fmt(s + t)`` (``triton_cuda/inplace.py``), float16 nearest."""
    from bfp.kernels.triton_cuda import inplace as Ip
    rule = rule_for(format_from_name("float16"))
    consts = dict(**E.rule_kwargs(rule), BLOCK=E.ELEMS, IDX64=False)
    k = _compile(Ip._add_round, {"s_ptr": "*i32", "t_ptr": "*i32", "keys_ptr": "*i64", "n": "i32"}, consts, warps)
    ins, regs, spill = _sass(k)
    return [{"format": "float16 s += t", "kernel": "_add_round", "stats": False, "warps": warps, "sass": ins,
             "registers": regs, "spill_bytes": spill, "per_element": round(ins * 32 * warps / E.ELEMS, 1)}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--formats", default=",".join(FORMATS))
    args = p.parse_args(argv)
    check_args(p, json_path=args.json)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in format_names()] or ([] if formats else [args.formats])
    if bad:  # refused before anything is compiled
        p.error(f"--formats {', '.join(map(repr, bad))}: not a format name; allowed a comma-separated list of "
                f"{', '.join(FORMATS)} or any bfp.format_names() entry")
    rows = [count(n) for n in formats] + [count("fb16", stats=True)] + count_nvfp4() \
        + count_nvfp4(stochastic=True)[1:] + count_nvfp4((16, 16))[1:] + count_nvfp4(te=True) \
        + count_nvfp4((16, 16), te=True)[1:] + count_scaled() + count_hadamard() + count_fused() \
        + count_fused("h100_bf16") + count_inplace()
    print(f"triton {triton.__version__}, sm_90, tensor {'x'.join(map(str, SHAPE))}; budget ~{BUDGET} "
          f"thread-instructions per element at H200 copy bandwidth")
    print(f"{'format':16} {'per elem':>8} {'regs':>5} {'spill':>5} {'warps':>5}  kernel")
    for r in rows:
        # the accumulator's count is per product (arithmetic, float64): the copy budget does not apply
        flag = "" if r["per_element"] <= BUDGET or r["format"].startswith("accumulator") else "  (over budget)"
        print(f"{r['format'] + (' +stats' if r['stats'] else ''):16} {r['per_element']:8.1f} {r['registers']:5d} "
              f"{r['spill_bytes']:5d} {r['warps']:5d}  {r['kernel']}{flag}")
    doc = {"triton": triton.__version__, "target": "sm_90", "shape": SHAPE, "budget": BUDGET, "rows": rows}
    emit_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
