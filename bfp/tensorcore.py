"""Tensor-core accumulation: a multi-term fused adder, as NVIDIA's tensor cores compute a dot product.

Published hardware studies (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
cores", PeerJ Computer Science 7:e330, 2021, and later work on Hopper by the same group) describe
the adder: products are exact; a group of ``terms`` products and the running accumulator are
aligned to the largest exponent among them; each term is cut to a fixed number of bits below it;
the terms are summed exactly and the result is cut to a fixed width. ``FusedAccumulator`` holds
those parameters; ``fused_matmul(a, b, acc)`` computes ``a @ b`` with them (a Numba kernel on CPU
tensors, ``bfp.kernels.numba_cpu.fused``; a Triton kernel on CUDA tensors,
``bfp.kernels.triton_cuda.fused``; this module's float64 torch code is the reference both equal
bit for bit, ``backend="reference"``).

One step, for each output element, with ``c`` the running sum (float32, starting at +0):

1. the ``terms`` products ``p_i = a_i b_i`` of this step, exact (K zero-padded to a multiple of
   ``terms``); a zero product takes no part in the alignment;
2. ``E = max(e_i, e_c)`` clamped below at ``align_emin``, where a product's exponent ``e_i`` is
   the *sum of its operands' exponents* ``floor(log2|a_i|) + floor(log2|b_i|)`` (an operand below
   the input format's smallest normal counts as ``operand_emin``: -6 for E4M3, -14 for E5M2) when
   ``product_exponent="operands"``, or ``floor(log2|p_i|)`` for ``"product"``; and
   ``e_c = floor(log2|c|)`` when ``accumulator_in_alignment`` and ``c != 0``;
3. every term (products, and ``c`` when it is in the alignment) is cut to ``align_bits`` fraction
   bits below ``2**E``: ``trunc(t * 2**(align_bits - E)) * 2**(E - align_bits)`` (``align_rounding
   ="nearest"``: to nearest, ties to even, instead of toward zero); a ``c`` outside the alignment
   is added as it is;
4. the terms are added exactly; the step's result ``s`` is cut to ``sum_bits`` fraction bits
   relative to its own exponent ``max(floor(log2|s|), sum_emin)`` (toward zero, or to nearest);
   a zero result is +0. That is the new ``c``.

``promote_every`` (``N_c``, DeepSeek-V3's fix, and cuBLAS's default for FP8): the chain restarts
every ``N_c`` elements of K and each chain's result is added to a float32 sum with round to
nearest, in order; 0 runs one chain over all of K (cuBLAS's "fast accumulation",
``use_fast_accum=True``). ``split_k`` > 1 cuts K into that many contiguous tiles, each reduced as
above, added in order in float32 with round to nearest. Overflow: E4M3/E5M2 products summed over
any practical K stay far below float32's range; a sum beyond it becomes +-inf in the final float32
adds. NaN/Inf inputs give NaN/Inf (float64 arithmetic carries them).

Presets (``accumulator_from_name``), each from the measurements its docstring entry cites:

* ``h100_fp8_fast``: cuBLAS FP8 (E4M3/E5M2) GEMM on H100 with fast accumulation: 32 terms, the
  accumulator in the alignment, ``align_emin`` -132, 13 fraction bits kept below ``2**E``
  (truncated), the result truncated to 13 fraction bits (14 significant), ``sum_emin`` -126,
  product exponents from the operands. (Hardware measurements quoted in bfpsim issue 30; the
  sm_90 ``mma.sync`` instruction behaves otherwise.)
* ``h100_fp8``: the same with ``promote_every=128`` (cuBLAS's default, slow accumulation).
* ``ada_fp8``: Ada (sm_89) FP8 ``mma.sync``: as ``h100_fp8_fast`` with 16 terms per step.
* FP16, BF16 and TF32 inputs with float32 accumulation, from the bit-accurate models of F. A. Khattak
  and M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores" (ACM TACO; arXiv 2512.07004), whose
  parameters are those of their published toolbox (github.com/north-numerical-computing/
  MATLAB-tensor-core, ``models/V100TC.m``, ``A100TC.m``, ``H100TC.m``, with ``tools/
  Generic_BFMA_TC.m``): ``fma`` products per step with the accumulator in the alignment
  (``global_alignment``), ``23 + neab`` fraction bits kept below ``2**E`` (truncated), the sum
  truncated to float32's 23 (``frmode = 'rz'``), ``E`` clamped below at ``min_exp_limit``, product
  exponents from the operands (an FP16 subnormal operand counts as -14):

  ==============  =====  ===========  ===========  ============================================
  preset          terms  align_bits   align_emin   source
  ==============  =====  ===========  ===========  ============================================
  ``v100_fp16``   4      23 (neab 0)  none (-1024)  V100TC.m; Fasi et al. 2021 (4 terms, RZ,
                                                   no extra alignment bits)
  ``a100_fp16``   8      24 (neab 1)  -132         A100TC.m (FP16 and BF16 alike)
  ``a100_bf16``   8      24           -132         A100TC.m
  ``a100_tf32``   4      24           -132         A100TC.m (``fma = 4`` for TF32)
  ``h100_fp16``   16     25 (neab 2)  -133         H100TC.m
  ``h100_bf16``   16     25           -133         H100TC.m
  ``h100_tf32``   8      25           -133         H100TC.m (``fma = 8`` for TF32)
  ==============  =====  ===========  ===========  ============================================

  ``benchmarks/tensorcore_validation.py`` runs them on the toolbox's published hardware vectors
  (``model_validation/``: inputs and the GPUs' outputs, ``D = A B + C``); results in
  ``docs/accumulate.md``. One difference from the toolbox: an accumulator below ``2**-126`` takes
  its own exponent here, -126 there (its float32 exponent field); they agree unless every product
  and the accumulator lie below ``2**-126``.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Optional
from .kernels.arrays import as_numpy

import numpy as np
import torch

from .kernels import op_args
from .kernels.runtime import kernel
from .precision import FusedAccumulator, accumulator_from_dict

__all__ = ["FusedAccumulator", "fused_matmul", "fused_bmm", "accumulator_from_name", "FUSED_PRESETS"]

SCALE_CAP = 1000  # the largest power of two a cut scales by (``_cut``: all-zero steps)


def _cut(x: torch.Tensor, e: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    """``x`` to ``bits`` fraction bits below ``2**e`` (float64, exact scalings by powers of two).
    The scaling is capped at ``2**SCALE_CAP``: only a step whose terms are all zero aligns that
    low (``align_emin`` -1024 of ``v100_fp16``), and an uncapped ``2**1047`` is infinite in
    float64, which made ``0 * inf`` a NaN; every nonzero term's scale is far below the cap."""
    scale = torch.ldexp(torch.ones_like(x), (bits - e).clamp(max=SCALE_CAP).to(torch.int32))
    y = x * scale
    y = torch.trunc(y) if rounding == "truncate" else torch.round(y)  # torch.round: ties to even
    return y / scale


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) of nonzero finite float64 values (as float64; zero gives -inf)."""
    _, e = torch.frexp(x)
    return torch.where(x == 0, torch.full_like(x, -torch.inf), (e - 1).to(x.dtype))


def _chain(a: torch.Tensor, b: torch.Tensor, acc: FusedAccumulator, c0: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One accumulation chain over all of a's K (a: (M, K), b: (K, N), float64; K a multiple of terms),
    starting from the accumulator ``c0`` ((M, N) float32 values in float64; default +0), as
    ``D = A B + C`` on the hardware."""
    m, k = a.shape
    n = b.shape[1]
    emin_a, emin_b = acc.emins()
    ea = torch.clamp(_exponent(a), min=emin_a)
    eb = torch.clamp(_exponent(b), min=emin_b)
    ea = torch.where(a == 0, torch.full_like(ea, -torch.inf), ea)
    eb = torch.where(b == 0, torch.full_like(eb, -torch.inf), eb)
    c = torch.zeros(m, n, dtype=torch.float64, device=a.device) if c0 is None else c0.double()
    for g in range(0, k, acc.terms):
        p = a[:, g:g + acc.terms, None] * b[None, g:g + acc.terms, :]          # (M, T, N), exact
        if acc.product_exponent == "operands":
            e = ea[:, g:g + acc.terms, None] + eb[None, g:g + acc.terms, :]
        else:
            e = _exponent(p)
        e = torch.where(p == 0, torch.full_like(e, -torch.inf), e)
        top = e.amax(1)
        if acc.accumulator_in_alignment:
            top = torch.maximum(top, _exponent(c))
        top = torch.clamp(top, min=acc.align_emin)
        terms = _cut(p, top[:, None, :], acc.align_bits, acc.align_rounding).sum(1)  # exact in float64
        cc = _cut(c, top, acc.align_bits, acc.align_rounding) if acc.accumulator_in_alignment else c
        s = terms + cc
        es = torch.clamp(_exponent(s), min=acc.sum_emin)
        s = _cut(s, torch.where(s == 0, torch.zeros_like(es), es), acc.sum_bits, acc.sum_rounding)
        c = torch.where(s == 0, torch.zeros_like(s), s)  # +0, never -0
    return c


def _chains(k: int, acc: FusedAccumulator) -> list[tuple[int, int]]:
    """The accumulation chains over K, in order: ``promote_every`` spans within each of ``split_k``
    contiguous tiles (one chain ``(0, 0)`` when K is 0)."""
    tiles = [t for t in torch.tensor_split(torch.arange(k), acc.split_k) if len(t)] or [torch.arange(0)]
    out = []
    for tile in tiles:
        lo, hi = (int(tile[0]), int(tile[-1]) + 1) if len(tile) else (0, 0)
        span = acc.promote_every or max(hi - lo, 1)
        out += [(s, min(s + span, hi)) for s in range(lo, max(hi, lo + 1), span)]
    return out


def _params(acc: FusedAccumulator) -> tuple:
    return (acc.terms, acc.align_emin, acc.align_bits, acc.align_rounding == "nearest", acc.sum_bits, acc.sum_emin,
            acc.sum_rounding == "nearest")


def _gemm32(a: torch.Tensor, b: torch.Tensor, acc: FusedAccumulator, chains: list[tuple[int, int]]) -> torch.Tensor:
    """A batch (B, M, K) @ (B, K, N) where ``float32_exact`` holds, every chain in one call of
    ``fused_gemm32``; operand exponents from their bits (``exponents32``)."""
    F, threads_for = kernel("fused_accumulator", "cpu"), kernel("threads", "cpu")
    a, b = a.float().contiguous(), b.float().contiguous()
    (nb, m, k), n = a.shape, b.shape[2]
    ea, eb = torch.empty(a.shape, dtype=torch.int32), torch.empty(b.shape, dtype=torch.int32)
    for x, emin, e in zip((a, b), acc.emins(), (ea, eb)):
        with threads_for(x.numel()):
            rows = (x.shape[0] * x.shape[1], x.shape[2])
            F.exponents32(as_numpy(x.view(rows)), emin, as_numpy(e.view(rows)))
    out = torch.empty(nb, m, n, dtype=torch.float32)
    bounds = np.array([chains[0][0]] + [e for _, e in chains], dtype=np.int64)
    with threads_for(nb * m * n * k, F.SERIAL_PRODUCTS):
        F.fused_gemm32(as_numpy(a), as_numpy(b), as_numpy(ea), as_numpy(eb), as_numpy(out), bounds, *_params(acc))
    return out


class _Kernel:
    """The float64 Numba kernel's chains (``bfp.kernels.numba_cpu.fused.fused_chain``, CPU tensors), with what
    every span shares computed once: the operands in float64 and their exponents."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, acc: FusedAccumulator):
        self.F = kernel("fused_accumulator", "cpu")
        self.a, self.b = a.double(), b.double()
        emin_a, emin_b = acc.emins()
        self.ea, self.eb = self.F.operand_exponents(self.a, emin_a), self.F.operand_exponents(self.b, emin_b)
        # a zero operand's products are skipped unless b holds Inf/NaN (0 * inf is NaN)
        self.skip = bool(torch.isfinite(self.b).all())
        self.params = (*_params(acc), bool(acc.accumulator_in_alignment), acc.product_exponent == "operands")

    def chain(self, s: int, e: int, width: int) -> torch.Tensor:
        """One chain over K elements ``s:e``, zero-padded to ``width``; float32 result."""
        m, n = self.a.shape[0], self.b.shape[1]
        if width == e - s:  # whole steps: the kernels read the operands in place
            pa, pb, pea, peb = self.a[:, s:e], self.b[s:e], self.ea[:, s:e], self.eb[s:e]
        else:  # zero padding to whole steps
            pa, pb = self.a.new_zeros(m, width), self.b.new_zeros(width, n)
            pea, peb = self.ea.new_full((m, width), self.F.ZERO_EXP), self.eb.new_full((width, n), self.F.ZERO_EXP)
            pa[:, :e - s], pb[:e - s], pea[:, :e - s], peb[:e - s] = (self.a[:, s:e], self.b[s:e],
                                                                      self.ea[:, s:e], self.eb[s:e])
        out = pa.new_empty(m, n)
        self.F.fused_chain(as_numpy(pa), as_numpy(pb), as_numpy(pea), as_numpy(peb), as_numpy(out), *self.params,
                           self.skip, SCALE_CAP)
        return out.float()  # a chain's result fits float32


def _one(a: torch.Tensor, b: torch.Tensor, acc: FusedAccumulator, backend: str,
         chains: list[tuple[int, int]]) -> torch.Tensor:
    """One (M, K) @ (K, N) chain by chain, the chains' results added in order in float32: the float64
    kernel (``backend="kernel"``, CPU tensors) or the torch reference (CUDA tensors too)."""
    kernel = _Kernel(a, b, acc) if backend == "kernel" and not a.is_cuda else None
    a64, b64 = (a.double(), b.double()) if kernel is None else (None, None)
    out32 = None
    for s, e in chains:
        width = -(-(e - s) // acc.terms) * acc.terms or acc.terms
        if kernel is not None:
            part = kernel.chain(s, e, width)
        else:
            pa = torch.zeros(a.shape[0], width, dtype=torch.float64, device=a.device)
            pb = torch.zeros(width, b.shape[1], dtype=torch.float64, device=b.device)
            pa[:, :e - s], pb[:e - s] = a64[:, s:e], b64[s:e]  # zero padding to whole steps
            rows = max(1, (1 << 22) // (acc.terms * max(b.shape[1], 1)))  # (rows, terms, N) float64 slabs
            part = torch.cat([_chain(pa[r:r + rows], pb, acc) for r in range(0, pa.shape[0], rows)]
                             or [pa.new_zeros(0, b.shape[1])]).float()  # a chain's result fits float32
        out32 = part if out32 is None else out32 + part  # float32 adds, round to nearest, in order
    return out32


def fused_bmm(a: torch.Tensor, b: torch.Tensor, acc: "FusedAccumulator", backend: str = "kernel") -> torch.Tensor:
    """A batch of ``fused_matmul``: ``a`` (B, M, K) @ ``b`` (B, K, N), float32 (B, M, N). ``backend``
    "kernel": the tensor's device's kernel (CPU: Numba, where float32 holds the arithmetic exactly,
    ``float32_exact``, the whole batch and every chain of K in one call, ``fused_gemm32``, otherwise
    matrix by matrix; CUDA: the Triton kernel, ``triton_cuda/fused``, the whole batch in one
    launch); "triton": that kernel on any tensor (CPU tensors under its interpreter); "reference":
    the float64 torch steps. While torch.compile traces (or for a tensor subclass) it is one op,
    ``torch.ops.bfp.fused_bmm``."""
    if backend not in ("kernel", "reference", "triton"):
        raise ValueError(f"backend {backend!r}: allowed 'kernel', 'reference', 'triton'")
    if type(a) is not torch.Tensor or torch.compiler.is_compiling():
        return fused_bmm_op(a, b, _accumulator_json(acc), backend)
    return _fused_bmm(a, b, acc, backend)


@torch.compiler.assume_constant_result  # a constant of the (frozen) accumulator: not traced (json.dumps)
def _accumulator_json(acc: "FusedAccumulator") -> str:
    return json.dumps(acc.to_dict(), sort_keys=True)


def _fused_bmm(a: torch.Tensor, b: torch.Tensor, acc: "FusedAccumulator", backend: str) -> torch.Tensor:
    _check_operands(a, b, backend)
    a, b = op_args.values(a), op_args.values(b)
    if a.dtype != torch.float32:  # float16/bfloat16 values: float32 holds them exactly
        a, b = a.float(), b.float()
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"fused_bmm needs (B, M, K) @ (B, K, N) operands, got {list(a.shape)} and {list(b.shape)}")
    chains = _chains(a.shape[2], acc)
    if backend == "triton" or (backend == "kernel" and a.is_cuda):
        return kernel("fused_accumulator", "triton")(a, b, acc, chains)
    if backend == "kernel" and not a.is_cuda and kernel("fused_accumulator", "cpu").float32_exact(a, b, acc):
        return _gemm32(a, b, acc, chains)
    if a.shape[0] == 0:
        return a.new_zeros(0, a.shape[1], b.shape[2], dtype=torch.float32)
    return torch.stack([_one(x, y, acc, backend, chains) for x, y in zip(a, b)])


@torch.library.custom_op("bfp::fused_bmm", mutates_args=())
def fused_bmm_op(a: torch.Tensor, b: torch.Tensor, acc: str, backend: str) -> torch.Tensor:
    """``fused_bmm`` as an op: ``acc`` the accumulator's ``to_dict`` as JSON."""
    return _fused_bmm(a, b, op_args.parsed(acc, "acc", _accumulator, "json.dumps(acc.to_dict())"), backend)


if torch.distributed.is_available():  # tensor parallelism: one accumulation chain over all of K, whole tensors
    from .kernels.sharding import replicate_all
    replicate_all(torch.ops.bfp.fused_bmm.default)


@fused_bmm_op.register_fake
def _(a, b, acc, backend):
    _check_operands(a, b, backend)
    op_args.parsed(acc, "acc", _accumulator, "json.dumps(acc.to_dict())")
    return a.new_empty(a.shape[0], a.shape[1], b.shape[2], dtype=torch.float32)


_OPERAND_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_operands(a, b, backend: str) -> None:
    """Dense float32/float16/bfloat16 operands of one dtype, a known backend."""
    op_args.tensor(a, "fused_bmm's a", _OPERAND_DTYPES)
    op_args.tensor(b, "fused_bmm's b", _OPERAND_DTYPES)
    if a.dtype != b.dtype:
        raise TypeError(f"fused_bmm's operands must have one dtype, got {a.dtype} and {b.dtype}")
    op_args.choice(backend, "backend", ("kernel", "reference", "triton"))


@functools.lru_cache(maxsize=64)
def _accumulator(text: str) -> FusedAccumulator:
    return accumulator_from_dict(json.loads(text))


def fused_matmul(a: torch.Tensor, b: torch.Tensor, acc: "FusedAccumulator", backend: str = "kernel") -> torch.Tensor:
    """``a @ b`` (2-D float tensors whose values the products take exactly in float64: FP8/FP16/BF16
    values) through ``acc`` (module docstring); float32 result. ``backend`` as ``fused_bmm``'s
    (``"kernel"``, ``"triton"`` or ``"reference"``), all equal bit for bit."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"fused_matmul needs (M, K) @ (K, N) operands, got {list(a.shape)} and {list(b.shape)}")
    return fused_bmm(a[None], b[None], acc, backend)[0]


def _wide(name: str, terms: int, extra: int, align_emin: int, operand_emin: int) -> FusedAccumulator:
    """A float32-output tensor core of Khattak & Mikaitis's models: ``terms`` products (``fma``), 23 +
    ``extra`` (``neab``) fraction bits below ``2**E``, the result truncated to float32's 23."""
    return FusedAccumulator(terms=terms, align_bits=23 + extra, sum_bits=23, align_emin=align_emin,
                            operand_emin=operand_emin, name=name)


FUSED_PRESETS = {
    "h100_fp8_fast": FusedAccumulator(name="h100_fp8_fast"),
    "h100_fp8": FusedAccumulator(promote_every=128, name="h100_fp8"),
    "ada_fp8": FusedAccumulator(terms=16, name="ada_fp8"),
    # FP16/BF16/TF32 inputs, float32 accumulation (models/V100TC.m, A100TC.m, H100TC.m of
    # north-numerical-computing/MATLAB-tensor-core; Khattak & Mikaitis, ACM TACO, arXiv 2512.07004)
    "v100_fp16": _wide("v100_fp16", 4, 0, -1024, -14),
    "a100_fp16": _wide("a100_fp16", 8, 1, -132, -14),
    "a100_bf16": _wide("a100_bf16", 8, 1, -132, -126),
    "a100_tf32": _wide("a100_tf32", 4, 1, -132, -126),
    "h100_fp16": _wide("h100_fp16", 16, 2, -133, -14),
    "h100_bf16": _wide("h100_bf16", 16, 2, -133, -126),
    "h100_tf32": _wide("h100_tf32", 8, 2, -133, -126),
}


def accumulator_from_name(name: str, *, operand_emin: Optional[int] = None) -> FusedAccumulator:
    """A named tensor-core accumulator (``FUSED_PRESETS``); ``operand_emin`` -14 for E5M2 inputs."""
    if name not in FUSED_PRESETS:
        raise ValueError(f"accumulator {name!r} unknown; allowed: {', '.join(FUSED_PRESETS)}")
    acc = FUSED_PRESETS[name]
    if operand_emin is not None:
        acc = replace(acc, operand_emin=operand_emin)
    return acc
