"""Every Triton kernel compiles for sm_90 (H100/H200) ahead of time, without a GPU, exactly as a
launch compiles it: the interpreter CI runs the kernels under accepts some code the compiler
refuses (a reassigned ``constexpr`` in an unrolled loop did), so the real compiler sees each
kernel here. ``benchmarks/sass_count.py`` compiles them with triton's bundled ptxas and counts
their SASS by pipe; its self-test kernels cost a known number of instructions, and it must find
exactly that many."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
sys.path.insert(0, str(ROOT / "benchmarks"))


def _run(tmp_path, *args):
    pytest.importorskip("triton")
    out = tmp_path / "sass.json"
    r = subprocess.run([sys.executable, "benchmarks/sass_count.py", "--json", str(out), *args], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_kernel_built_to_cost_n_instructions_counts_n(tmp_path):
    result = _run(tmp_path, "--selftest")
    assert result == {"chain_fp32": [24.0, 24], "chain_other": [0.0, 0], "loop_fp32": [96.0, 96]}


def test_the_counter_weighs_loops_skips_slow_paths_and_names_pipes():
    import _sass
    sass = [(0x00, "", "IMAD.MOV.U32", ""), (0x10, "", "LOP3.LUT", ""), (0x20, "", "FADD", ""),
            (0x30, "@P0", "BRA", "0x10"),                                       # a loop over 0x10-0x30
            (0x40, "@!P1", "BRA", "0x60"), (0x50, "", "MUFU.RCP", ""),          # a one-sided range: counted
            (0x60, "@P2", "BRA", "0x80"), (0x70, "", "CALL.REL.NOINC", "0x130"),  # the slow path's call: not
            (0x80, "@P3", "BRA", "0xb0"), (0x90, "", "I2F", ""), (0xa0, "", "BRA", "0xe0"),  # if: 2 ...
            (0xb0, "", "FMUL", ""), (0xc0, "", "FMUL", ""), (0xd0, "", "FMUL", ""),  # ... else: 3, counted
            (0xe0, "", "STG.E.128", ""), (0xf0, "", "EXIT", ""),
            (0x130, "", "FFMA", ""), (0x140, "", "RET.REL", ""), (0x150, "", "BRA", "0x150")]
    c = _sass.count(sass, trips=5)
    assert (c["alu"], c["imad"], c["fp32"], c["xu"], c["lsu"]) == (5, 1, 5 + 3, 1, 1)
    assert (c["slow"], c["cond"], c["static"]) == (2, 1 + 1 + 2, 19)
    assert c["all"] == 1 + 5 * 3 + 1 + 1 + 1 + 1 + 3 + 1 + 1  # + the branches that run: 0x40, 0x60, 0x80
    assert [_sass.pipe(op) for op in ("VIADD", "SEL", "IMAD.WIDE", "FMUL", "I2F.U32", "LDG.E", "ULDC", "BAR.SYNC")] \
        == ["alu", "alu", "imad", "fp32", "xu", "lsu", "uniform", "ctrl"]


def test_every_triton_kernel_compiles_as_launched_and_the_common_formats_fit_the_pipe_budgets(tmp_path):
    doc = _run(tmp_path, "--shapes", "64x128x32x32,128x64x3x3")
    rows = doc["rows"]
    kernels = {la["kernel"] for r in rows for la in r["launches"]}
    assert {"_elementwise", "_tiles", "_amax", "_quantize", "_scaled", "_rows", "_add_round", "_fused"} <= kernels
    assert {"hadamard", "hadamard+nvfp4", "nvfp4_te", "fp8_e4m3_rowwise", "float16 s += t"} \
        <= {r["format"] for r in rows}
    assert all(la["static"] > 0 for r in rows for la in r["launches"])
    by = {(r["format"], tuple(r["shape"])): r for r in rows}
    for name in ("float8_e4m3fn", "float16", "bfloat16", "float8_e5m2", "float4_e2m1fn"):  # the element rule
        r = by[(name, (64, 128, 32, 32))]
        assert r["alu"] <= 28 and r["imad"] <= 28 and r["all"] <= 56, r
    for name in ("mxfp8_e4m3", "mxfp4_e2m1"):  # MX on contiguous 1x32 blocks
        r = by[(name, (64, 128, 32, 32))]
        assert r["alu"] <= 28 and r["all"] <= 56, r
