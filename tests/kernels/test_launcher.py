"""``triton_cuda/launcher.py``: a plan's compiled kernel is cached after its first launch and later
launches skip ``JITFunction.run``, with the specialisation the JIT would pick (a misaligned tensor
gets its own kernel, compiled without the 16-byte assumption). Triton runs compiled here with a
stand-in driver (``benchmarks/host_path.py``'s): nothing reaches a GPU, everything else is real."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import sys
sys.path.insert(0, "benchmarks")
import torch
from triton.runtime.driver import driver
from host_path import _FakeDriver
driver.set_active(_FakeDriver())
import bfp.kernels.triton_cuda as tc
tc._INTERPRETED = True
from bfp import format_from_name
from bfp.kernels.plan import rule_for
from bfp.kernels.triton_cuda import element, launcher
from triton.runtime.jit import JITFunction

jit_calls = []
real = JITFunction.run
def counted(self, *a, **k):
    jit_calls.append(self.__name__)
    return real(self, *a, **k)
JITFunction.run = counted
rule = rule_for(format_from_name("float8_e4m3fn"))
aligned = torch.randn(4096)
misaligned = torch.randn(4097)[1:]
assert misaligned.data_ptr() % 16 != 0
for x in (aligned, aligned, aligned, misaligned, misaligned):
    element.launch(x, torch.empty_like(x), rule, None, None, None, False)
print(len(jit_calls), len(launcher._CACHE))
attrs = sorted(str(c.src.attrs.get((0,))) for c, _ in launcher._CACHE.values())
print("|".join(attrs))
'''


def test_the_compiled_kernel_is_cached_per_plan_and_alignment():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    counts, attrs = r.stdout.strip().splitlines()[-2:]
    assert counts == "2 2"  # one JIT launch per specialisation; the other three calls took the cache
    assert attrs == "[['tt.divisibility', 16]]|[]"  # x_ptr: 16-byte aligned, and not


def test_the_key_holds_each_tensor_dtype_and_alignment():
    from bfp.kernels.triton_cuda import launcher
    import torch
    x = torch.randn(4097)
    assert launcher._spec(x) == (torch.float32, True) and launcher._spec(x[1:]) == (torch.float32, False)
    assert launcher._spec(7) is None
