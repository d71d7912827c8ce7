"""benchmarks/gpu_check.py, the one-command GPU check, runs end to end under Triton's interpreter on
a small size (on a GPU it runs in full: conformance, bandwidth, host time, step overhead)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_small_under_the_interpreter(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--small", "--json", str(out)], cwd=ROOT,
                       env={**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert {row["format"] for row in doc["bandwidth"]} == {"fb12", "fb16", "float8_e4m3fn", "mxfp8_e4m3", "nvfp4"}
    assert all(row["quantize_ms"] > 0 and row["copy_ms"] > 0 for row in doc["bandwidth"])
    assert set(doc["host_us"]) == {"clone", "fb12", "fb16", "float8_e4m3fn", "mxfp8_e4m3", "nvfp4"}
