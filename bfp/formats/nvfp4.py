"""NVFP4: NVIDIA's 4-bit format with two-level scaling (E2M1 elements, E4M3 block scales,
an FP32 tensor scale), as a ``Format`` the quantization points take like any other.

The rule, every step a float32 operation rounded to nearest-even, in this order
(NVIDIA's definition as torchao's ``nvfp4_quantize`` spells it; names as there):

1. ``amax_t``: the largest finite magnitude of the whole tensor. A tensor with none
   (all zeros) is returned as it is (Inf as NaN).
2. ``pts = max(amax_t / (448 * 6), 2**-149)``: the per-tensor scale, chosen so the
   largest block scale lands at E4M3's maximum 448 (``tensor_scale=False``: 1).
3. Per block of ``block`` elements along ``axis`` (aligned at 0, the tail block
   smaller; a tuple ``block`` such as ``(16, 16)`` is a 2-D block whose last entry runs
   along ``axis``, the one before along ``axis - 1``: a weight and its transpose then see
   the same blocks, as the NVFP4 training recipe requires), ``amax_b`` its largest finite magnitude; ``sb = amax_b / 6``;
   ``sb8 = e4m3(clamp(sb / pts, 2**-6, 448))``: the block scale, rounded to nearest-even
   E4M3 (a block of zeros gets E4M3's smallest normal, 2**-6).
4. ``ts = pts * sb8``; each element ``v = clamp(x / ts, -6, 6)`` rounded to E2M1
   (nearest-even, or stochastic: one counter-based 32-bit draw per element, as
   ``Rounding.STOCHASTIC``, indexed by the element's position in the tensor with
   ``axis`` moved last, or as it is for 2-D blocks); the result is ``q * ts``.

Overflow: none can happen past step 2 (``|x / ts| <= 6`` up to the float32
roundings, then clamped: saturation). Underflow: elements below a quarter of a
block's E2M1 step round to zero (E2M1 has one subnormal, 0.5). NaN stays NaN and
Inf becomes NaN (E2M1 has neither); neither takes part in the maxima. The double
rounding of steps 4 (``x / ts`` to float32, then to E2M1) is the recipe's own and is
reproduced, not avoided. The Numba CPU kernels (``bfp.kernels.numba_cpu``), the Triton kernel
(``bfp.kernels.triton_cuda.nvfp4``, CUDA tensors, both conventions, 1-D and 2-D blocks) and the
PyTorch reference (any device) compute exactly these operations.

``convention="te"`` (presets ``nvfp4_te``, ``nvfp4_te_sr``) is TransformerEngine's order instead
(``bfp.kernels.nvfp4_te``: its encode scale ``S_enc = 2688 / amax`` capped at float32's max, block
scales ``e4m3(amax_b * (S_enc * fp32(1/6)))`` with no lower clamp, elements multiplied by a
reciprocal); it differs from this one in the block scales of a tensor with outliers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .base import Format, Rounding, Spec, block_shape, register_family

E2M1_MAX, E4M3_MAX, E4M3_TINY = 6.0, 448.0, 2.0 ** -6
CONVENTIONS = ("bfpsim", "te")


@dataclass(frozen=True)
class NVFP4(Format):
    """NVFP4 (see the module docstring): ``block`` elements along ``axis`` share an E4M3 scale,
    the tensor an FP32 one (``tensor_scale``); ``rounding`` of the E2M1 elements is
    ``nearest`` or ``stochastic`` (the NVFP4 training recipe rounds gradients stochastically)."""

    block: int = 16
    axis: int = -1
    rounding: Rounding = Rounding.NEAREST
    tensor_scale: bool = True
    convention: str = "bfpsim"  # "te": TransformerEngine's order of operations (bfp.kernels.nvfp4_te)

    def __post_init__(self):
        object.__setattr__(self, "block", block_shape(self.block, "NVFP4"))  # 2-D: 16x16 weights
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ValueError(f"NVFP4 axis must be an integer, got {self.axis!r}")
        try:
            r = Rounding(self.rounding)
        except ValueError:
            r = None
        if r not in (Rounding.NEAREST, Rounding.STOCHASTIC):
            raise ValueError(f"NVFP4 rounding {self.rounding!r}: allowed nearest, stochastic")
        object.__setattr__(self, "rounding", r)
        if not isinstance(self.tensor_scale, bool):
            raise ValueError(f"NVFP4 tensor_scale must be True or False, got {self.tensor_scale!r}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"NVFP4 convention {self.convention!r}: allowed {', '.join(CONVENTIONS)}")
        if self.convention == "te" and (not self.tensor_scale or (isinstance(self.block, tuple)
                                                                   and tuple(self.block) != (16, 16))):
            raise ValueError("NVFP4 convention 'te' is TransformerEngine's recipe with its tensor scale: blocks "
                             f"of 16 or 16 x 16 tiles (quant_tile_shape); tensor_scale=False and block "
                             f"{self.block!r} are not part of it")

    chunkable = False  # the tensor scale comes from the whole tensor

    def short_name(self, name_of=None) -> str:
        block = "x".join(map(str, self.block)) if isinstance(self.block, tuple) else self.block
        return f"nvfp4/{block}@{self.axis}" + ("" if self.rounding.value == "nearest" else "/sr") + \
            ("" if self.tensor_scale else "/1lvl") + ("" if self.convention == "bfpsim" else f"/{self.convention}")

    def tile_rows(self, shape: tuple[int, ...]) -> int:
        if not shape:
            return 1
        block = self.block if isinstance(self.block, tuple) else (self.block,)
        axis = self.axis % len(shape)
        return block[len(block) - 1 - axis] if axis < len(block) else 1

    def scale_axis(self) -> Optional[int]:
        return self.axis

    def contraction_axis(self) -> Optional[int]:
        return self.axis if isinstance(self.block, int) else None

    def with_rounding(self, rounding: Any) -> "NVFP4":
        return dataclasses.replace(self, rounding=rounding)

    def rht_fused_block(self) -> Optional[int]:
        """The 1-D block size the Hadamard transform's fused kernel rounds to (bfpsim's convention)."""
        return self.block if self.convention == "bfpsim" and isinstance(self.block, int) else None

    def __repr__(self) -> str:
        extra = "" if self.rounding is Rounding.NEAREST else f", rounding={self.rounding}"
        extra += "" if self.tensor_scale else ", tensor_scale=False"
        extra += "" if self.convention == "bfpsim" else f", convention={self.convention!r}"
        block = "x".join(map(str, self.block)) if isinstance(self.block, tuple) else self.block
        return f"NVFP4(block={block}, axis={self.axis}{extra})"

    def to_dict(self) -> dict[str, Any]:
        block = list(self.block) if isinstance(self.block, tuple) else self.block
        d = {"kind": "nvfp4", "block": block, "axis": self.axis, "rounding": self.rounding.value,
             "tensor_scale": self.tensor_scale}
        if self.convention != "bfpsim":
            d["convention"] = self.convention
        return d


register_family("nvfp4", NVFP4, {"nvfp4": NVFP4(), "nvfp4_sr": NVFP4(rounding=Rounding.STOCHASTIC),
                                 "nvfp4_te": NVFP4(convention="te"),
                                 "nvfp4_te_sr": NVFP4(rounding=Rounding.STOCHASTIC, convention="te")},
                spec=Spec("nvfp4", ("nvfp4", "axis", "rounding", "tensor_scale", "convention"),
                          lambda v, o: NVFP4(v, **o), '{"nvfp4": 16, "axis": -1}'))
