"""Every Triton kernel compiles for sm_90 (H100/H200) ahead of time, without a GPU: the interpreter
CI runs the kernels under accepts some code the compiler refuses (a reassigned ``constexpr`` in an
unrolled loop did), so the real compiler sees each kernel here. ``benchmarks/sass_count.py``
compiles them with triton's bundled ptxas and counts their SASS."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_triton_kernel_compiles_for_sm90_and_counts_its_instructions(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.json"
    r = subprocess.run([sys.executable, "benchmarks/sass_count.py", "--json", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    kernels = {r["kernel"].split()[0].rstrip(",") for r in rows}
    assert {"_elementwise", "_tiles", "_amax", "_quantize", "_scaled", "_rows", "_long_rows"} <= kernels
    assert {"hadamard", "hadamard+nvfp4", "nvfp4_te", "fp8 rowwise", "accumulator h100_fp8", "float16 s += t"} \
        <= {r["format"] for r in rows}
    assert all(r["sass"] > 0 and r["registers"] > 0 for r in rows)
