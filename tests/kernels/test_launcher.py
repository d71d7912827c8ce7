"""``triton_cuda/launcher.py``: a plan's compiled kernel is cached after its first launch and later
launches skip ``JITFunction.run``, with the specialisation the JIT would pick (a misaligned tensor
is never cached: the JIT compiles it without the 16-byte assumption). Triton runs compiled here with a
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
other = torch.randn(4096)
element.launch(other, torch.empty_like(other), rule_for(format_from_name("float16")), None, None, None, False)
element.launch(other, torch.empty_like(other), rule_for(format_from_name("float16")), None, None, None, False)
print(len(jit_calls), len(launcher._CACHE))
'''


def test_the_compiled_kernel_is_cached_per_plan_and_alignment():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    first, then = r.stdout.strip().splitlines()[-2:]
    assert first == "3 1"  # aligned: one JIT launch, two from the cache; misaligned: the JIT each time
    assert then == "4 2"  # another plan: its own entry


