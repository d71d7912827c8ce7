"""``--mode sweep``: one batch's tensors at every active point, rounded to 2..16-bit members of
BlockFloat, Float and MX; SQNR against bits, the picture architects pick formats with."""
from __future__ import annotations

import torch

from ..formats import BlockFloat, Encoding, Float
from ..formats.mx import MX
from ..kernels import quantize
from ..precision import POINTS
from .points import PointDiagnostics, _Sums, measure_step

SWEEP_FAMILIES = ("bfp", "float", "mx")


def _float_exp(bits: int) -> int:
    return {2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3, 8: 4}.get(bits, 5)


def sweep_format(family: str, bits: int, ndim: int):
    """The ``bits``-bit member of ``family`` for a tensor of ``ndim`` axes: ``bfp``:
    BlockFloat(bits) in groups of 16 along the channel axis (1 for 4-D, the last otherwise);
    ``float``: Float with 1/2/3/4 exponent bits up to 3/5/7/8 bits, 5 above (e4m3 at 8, e5m10
    at 16); ``mx``: that Float as an MX element, blocks of 32 along the same axis."""
    axis = 1 if ndim == 4 else max(ndim - 1, 0)
    if family == "bfp":
        group = [1] * max(ndim, 1)
        group[axis] = 16
        return BlockFloat(bits, group, rounding="nearest")
    e = _float_exp(bits)
    elem = Float(e, bits - 1 - e, encoding=Encoding.FINITE if e == 1 else Encoding.IEEE)
    if family == "float":
        return elem
    if family == "mx":
        return MX(elem, block=32, axis=axis)
    raise ValueError(f"unknown sweep family {family!r}; allowed: {', '.join(SWEEP_FAMILIES)}")


def capture_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """The unrounded tensors at every active point of one forward and backward pass, by point
    (copies; the pass itself rounds as the model's config says; gradients are zeroed after)."""
    diag = PointDiagnostics(model, keep=True)
    measure_step(model, x, y, diag)
    return diag.kept


def sweep(tensors: dict[str, list[torch.Tensor]], families=SWEEP_FAMILIES, bits=range(2, 17)) -> list[dict]:
    """SQNR of every point's tensors (summed over its layers) rounded to each family's member
    of each width: rows ``{family, bits, point, sqnr_db}``."""
    rows = []
    for fam in families:
        for b in bits:
            for point in [p for p in POINTS if p in tensors]:
                s = _Sums(None)
                for t in tensors[point]:
                    s.add(t, quantize(t, sweep_format(fam, b, t.dim())), None)
                rows.append({"family": fam, "bits": b, "point": point, "sqnr_db": s.row()["sqnr_db"]})
    return rows


