"""The accumulator emulation's in-place roundings (``bfp.kernels.inplace``) in Triton, for CUDA
tensors: ``round_inplace`` is the element-wise quantize kernel with its output the input (each
element read and written by the same thread), ``add_round`` one pass of ``s = fmt(s + t)``: the
float32 addition is the device's IEEE addition (torch's ``s + t`` on the same device runs the
same instruction, so NaN payloads agree too), then the integer element rule. Stochastic draws hash
the flat offset with the keys, as ``quantize`` does. No sum tensor is made."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher
from .element import ELEMS, launch, rule_kwargs
from .rule import quant_const, rand32


@triton.jit
def _add_round(s_ptr, t_ptr, keys_ptr, n, QT: tl.constexpr, P2Q: tl.constexpr, HI: tl.constexpr, LO: tl.constexpr,
               KIND: tl.constexpr, MODE: tl.constexpr, MAN: tl.constexpr, FTZ: tl.constexpr, OVF_INF: tl.constexpr,
               INF_NAN: tl.constexpr, BLOCK: tl.constexpr, IDX64: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK) if IDX64 else pid * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n
    v = tl.load(s_ptr + offs, mask=msk, other=0.0) + tl.load(t_ptr + offs, mask=msk, other=0.0)
    r = tl.zeros(offs.shape, tl.uint32)
    if MODE == 2:
        r = rand32(tl.load(keys_ptr).to(tl.uint32), tl.load(keys_ptr + 1).to(tl.uint32), offs, IDX64)
    o = quant_const(v.to(tl.int32, bitcast=True), r, QT, P2Q, HI, LO, KIND, MODE, MAN, FTZ, OVF_INF, INF_NAN)
    tl.store(s_ptr + offs, o.to(tl.float32, bitcast=True), mask=msk)


def round_inplace(x: torch.Tensor, rule, keys) -> torch.Tensor:
    """Round contiguous float32 ``x`` to the element-wise ``rule`` in place (``keys``: an int64
    device tensor, stochastic, or None)."""
    launch(x, x, rule, None, None, keys, False)
    return x


def add_round(s: torch.Tensor, t: torch.Tensor, rule, keys) -> torch.Tensor:
    """``s = rule(s + t)`` in place, contiguous float32 tensors of one shape."""
    n = s.numel()
    launcher.run(_add_round, (-(-n // ELEMS),), (s, t, s if keys is None else keys), (n,),
                 dict(**rule_kwargs(rule), BLOCK=ELEMS, IDX64=n + 2 * ELEMS >= 2 ** 31, enable_fp_fusion=False),
                 ("add_round", n, rule, keys is None))
    return s
