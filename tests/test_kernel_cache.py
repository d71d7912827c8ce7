"""The compiled CPU kernels are served from Numba's disk cache in a new process.

Two fresh processes share one fresh ``NUMBA_CACHE_DIR``: the first compiles
(cache misses), the second must load every kernel it runs (cache hits only) and
write nothing. The tiled kernel (BlockFloat, MX) once missed in every process,
because its closure held a dispatcher whose pickle carries a random uuid.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, torch, bfp
    from bfp.kernels.numba_cpu import cpu
    from bfp.kernels.plan import rule_for
    x = torch.randn(2, 24, 3, 5)
    report = {}
    for name in ["fb16"]:  # the tiled kernel (the element-wise one compiles in the same way)
        fmt = bfp.format_from_name(name)
        bfp.quantize(x, fmt)
        rule = rule_for(fmt)
        elementwise, tiled = cpu.kernels(rule.kind, rule.mode)
        kernel = tiled if rule.scale else elementwise
        report[name] = {"hits": sum(kernel.stats.cache_hits.values()),
                        "misses": sum(kernel.stats.cache_misses.values())}
    from bfp.kernels.numba_cpu import nvfp4_cpu, scaled_cpu, hadamard_cpu
    def stats(kernels):
        return {"hits": sum(sum(k.stats.cache_hits.values()) for k in kernels),
                "misses": sum(sum(k.stats.cache_misses.values()) for k in kernels)}
    y = torch.randn(64, 48)
    for name in ["nvfp4", "nvfp4_sr"]:  # nearest and stochastic; blocks along rows and along columns
        fmt = bfp.format_from_name(name)
        bfp.quantize(y, fmt)
        bfp.quantize(y, bfp.NVFP4(axis=0, rounding=fmt.rounding))
        report[name] = stats(nvfp4_cpu.kernels(nvfp4_cpu.MODE[fmt.rounding], fmt.block))
    scaled = bfp.Scaled(bfp.format_from_name("fp8_e4m3"))
    bfp.quantize(y, scaled)
    report["scaled"] = stats([scaled_cpu.amax_bits, scaled_cpu._kernel(scaled_cpu.MODE[scaled.fmt.rounding])])
    print(json.dumps(report))
""")


def _run(cache: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _files(cache: Path) -> dict:
    return {str(p.relative_to(cache)): p.stat().st_size for p in cache.rglob("*") if p.is_file()}


def test_second_process_loads_kernels_from_disk_cache(tmp_path):
    first = _run(tmp_path)
    assert first["fb16"] == {"hits": 0, "misses": 1}
    for name in ("nvfp4", "nvfp4_sr", "scaled"):  # every kernel that ran compiled once
        assert first[name]["hits"] == 0 and first[name]["misses"] >= 2, first
    written = _files(tmp_path)
    assert any(name.endswith(".nbc") for name in written), written
    second = _run(tmp_path)
    assert second == {name: {"hits": v["misses"], "misses": 0} for name, v in first.items()}  # compiles nothing
    assert _files(tmp_path) == written  # nothing recompiled, no index entry appended
