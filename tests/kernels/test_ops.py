"""The quantize entry points are operators PyTorch understands: ``torch.library.opcheck`` passes on
``bfp::quantize_format`` (schema, fake implementation, autograd registration, AOT dispatch) for every
family and backend, element-wise and tiled, each rounding, with and without counts, and on
``bfp::hadamard_quantize``, ``bfp::fused_bmm`` and ``bfp::quantize_delayed``; fake tensors trace through them."""
import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bfp import MX, format_from_name
from bfp.kernels import quantize_stats
from bfp.kernels.dispatch import _draw, format_json, needs_keys, quantize_format

# the element-rule families, element-wise and tiled (a 4-D tile, one that folds into more than four
# axes, a 0-dim tensor's one-element tile), each also with stochastic rounding
CASES = [("float8_e4m3fn", (6, 40)), ("fb16", (4, 12, 3, 3)), ("mxfp8_e4m3", (5, 64)), ("fb12", (3, 5, 7, 2, 3)),
         ("fb12", ())]


def _stochastic(fmt):
    if isinstance(fmt, MX):
        return dataclasses.replace(fmt, element=dataclasses.replace(fmt.element, rounding="stochastic"))
    return dataclasses.replace(fmt, rounding="stochastic")


def _args(name, shape, backend, stats, stochastic=False):
    fmt = format_from_name(name)
    fmt = _stochastic(fmt) if stochastic else fmt
    keys = torch.tensor([7, 4000000000], dtype=torch.int64) if stochastic else None
    assert needs_keys(fmt) == stochastic
    return (torch.randn(shape) * 3, format_json(fmt), keys, stats, backend)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("name, shape", CASES)
@pytest.mark.parametrize("stats, stochastic", [(False, False), (True, True)])
def test_opcheck_passes(name, shape, backend, stats, stochastic):
    torch.library.opcheck(torch.ops.bfp.quantize_format.default, _args(name, shape, backend, stats, stochastic))


def test_the_op_and_the_reference_agree_and_counts_are_only_made_when_asked():
    x, fmt, keys, _, _ = _args("fb16", (4, 12, 3, 3), "cpu", False)
    out, counts = quantize_format(x, fmt, keys, False, "cpu")
    assert counts.numel() == 0
    ref, rcounts = quantize_format(x, fmt, keys, True, "reference")
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32)) and rcounts.shape == (2,)


def test_fake_tensors_trace_through_the_op_without_running_a_kernel():
    """A FakeTensor (what torch.compile traces with) reaches the kernels only through the op, whose
    fake implementation gives the shapes."""
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 12, 3, 3))
        out, counts = quantize_stats(x, format_from_name("fb16"), backend="cpu")
    assert out.shape == (4, 12, 3, 3) and counts.shape == (2,) and counts.dtype == torch.int64


FORMAT_CASES = ["nvfp4", "nvfp4_sr", "nvfp4_te", "fp8_e4m3_tensorwise", "fp8_e5m2_rowwise_pow2", "mxfp8_e4m3", "fb16",
                "p3109_k8p3se"]


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("name", FORMAT_CASES)
def test_opcheck_passes_on_the_format_op_for_every_family(name, backend):
    fmt = format_from_name(name)
    keys = torch.tensor([11, 3000000000], dtype=torch.int64) if needs_keys(fmt) else None
    for stats in (False, True):
        torch.library.opcheck(torch.ops.bfp.quantize_format.default,
                              (torch.randn(6, 32) * 5, format_json(fmt), keys, stats, backend))


def test_the_format_op_takes_the_same_single_draw_as_the_eager_path():
    """Through the op (a tensor subclass, as under FakeTensor or torch.compile, routes there) a
    stochastic format gives the eager path's bits for the same generator seed."""
    x = torch.randn(5, 64)
    for name in ("nvfp4_sr", "fb16", "fp8_e4m3_tensorwise"):
        fmt = format_from_name(name)
        fmt = fmt if name != "fb16" else type(fmt)(fmt.bits, fmt.group, "stochastic")
        eager = quantize_stats(x, fmt, generator=torch.Generator().manual_seed(5), backend="cpu")
        keys = _draw(torch.Generator().manual_seed(5))
        op = quantize_format(x, format_json(fmt), keys, True, "cpu")
        assert torch.equal(eager[0].view(torch.int32), op[0].view(torch.int32)) and torch.equal(eager[1], op[1])


def test_opcheck_passes_on_the_hadamard_and_tensor_core_ops():
    import json
    import bfp.hadamard  # noqa: F401 (registers bfp::hadamard_quantize)
    from bfp.tensorcore import FUSED_PRESETS
    for name, keys in (("nvfp4", None), ("nvfp4_sr", torch.tensor([3, 4], dtype=torch.int64))):
        for t in (torch.randn(32, 8), torch.randn(40, 6)):  # rows padded to whole blocks in the second
            torch.library.opcheck(torch.ops.bfp.hadamard_quantize.default, (t, 16, 0, format_json(format_from_name(name)),
                                                                            keys))
    fp8 = lambda *s: torch.randn(*s).to(torch.float8_e4m3fn).float()  # noqa: E731 (values the products take exactly)
    for name in ("h100_fp8_fast", "h100_fp8"):
        acc = json.dumps(FUSED_PRESETS[name].to_dict(), sort_keys=True)
        for backend in ("kernel", "reference"):
            torch.library.opcheck(torch.ops.bfp.fused_bmm.default, (fp8(2, 3, 40), fp8(2, 40, 5), acc, backend))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_opcheck_passes_on_the_delayed_scaling_op_and_it_moves_the_history_as_eager(backend):
    """``bfp::quantize_delayed`` mutates the point's amax history (declared: ``mutates_args``)."""
    from bfp.kernels.dispatch import delayed
    fmt = format_from_name("fp8_e4m3_delayed")
    x = torch.randn(6, 32) * 7
    history = [0.0, 5.0, 3.0] + [0.0] * (fmt.history_length - 3)  # the format's length (16), as a layer keeps it
    for update in (False, True):
        torch.library.opcheck(torch.ops.bfp.quantize_delayed.default,
                              (x, format_json(fmt), torch.tensor(history), None, update, backend))
    h_op, h_eager = torch.tensor(history), torch.tensor(history)
    op = torch.ops.bfp.quantize_delayed(x, format_json(fmt), h_op, None, True, backend)
    eager = delayed(x, fmt, h_eager, None, True, backend=backend)
    assert torch.equal(op.view(torch.int32), eager.view(torch.int32)) and torch.equal(h_op, h_eager)
    assert h_op[0] == x.abs().max()
