"""The Numba CPU backend: parallel kernels for CPU tensors, compiled on first use and cached on disk.

``cpu.py`` (the element rule's element-wise and tiled kernels) with ``rule_cpu.py`` (the rule of
``kernels/scalar.py`` compiled for the CPU, its float32 shortcuts), ``nvfp4_cpu.py`` and
``nvfp4_te_cpu.py`` (NVFP4 in both conventions), ``scaled_cpu.py`` (per-tensor scaled FP8 in one
pass), ``inplace_cpu.py`` (rounded running sums), ``hadamard_cpu.py`` and ``nvfp4_rht.py`` (the
blocked Hadamard transform, alone and fused into NVFP4), ``fused.py`` (tensor-core chains) and
``pages.py`` (huge pages for large fresh outputs). Callers reach them through
``bfp.kernels.runtime.kernel(entry, "cpu")``, never by name.
"""
from .compile_notice import install as _install_notice

_install_notice()  # one line on stderr when a kernel compiles (not when it loads from the cache)

