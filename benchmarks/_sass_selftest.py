"""Kernels built to cost a known number of instructions, for ``sass_count.py --selftest``: the
counter must find exactly that many (``tests/kernels/test_sass.py``).

``_chain`` squares each element ``N`` times (fusion off: one FMUL a square, nothing to fold), so
its count per element grows by exactly ``N`` FP32 instructions and nothing else when ``N`` grows;
``_loop`` does the same inside a runtime loop of ``trips`` iterations, so its count grows by the
loop body times the trips the counter is given.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import _sass

BLOCK = 512


@triton.jit
def _chain(x_ptr, o_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(N):
        x = x * x
    tl.store(o_ptr + offs, x)


@triton.jit
def _loop(x_ptr, o_ptr, trips, N: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(trips):
        for _ in tl.static_range(N):
            x = x * x
    tl.store(o_ptr + offs, x)


def _per_element(fn, args: tuple, trips: int = 1, **kw) -> dict:
    x = torch.empty(BLOCK * 8, device="meta")
    with _sass.captured() as calls:
        fn[(8,)](x, torch.empty_like(x), *args, BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False, **kw)
    k = _sass.compile_launch(calls[0])
    c = _sass.count(_sass.disassemble(k.asm["cubin"]), trips)
    return {p: c[p] * 32 * k.metadata.num_warps / BLOCK for p in ("all", "fp32", "alu", "imad")}


def selftest() -> dict:
    """Measured and expected growth of the per-element counts."""
    base = _per_element(_chain, (), N=0)
    chain = _per_element(_chain, (), N=24)
    one = _per_element(_loop, (5,), trips=1, N=16)
    many = _per_element(_loop, (5,), trips=7, N=16)
    return {"chain_fp32": [chain["fp32"] - base["fp32"], 24], "chain_other": [chain["all"] - chain["fp32"]
                                                                             - base["all"] + base["fp32"], 0],
            "loop_fp32": [many["fp32"] - one["fp32"], 6 * 16]}
