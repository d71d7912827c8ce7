"""``torch.ops.bfp.quantize_rule`` is an operator PyTorch understands: ``torch.library.opcheck``
passes on it (schema, fake implementation, autograd registration, AOT dispatch) for every backend,
element-wise and tiled, each rounding, with and without counts; and it traces with fake tensors."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bfp import format_from_name
from bfp.kernels.ops import quantize_rule
from bfp.kernels.plan import rule_for, tile_for

CASES = [("float8_e4m3fn", (6, 40)), ("fb16", (4, 12, 3, 3)), ("mxfp8_e4m3", (5, 64)), ("fb12", (3, 5, 7, 2, 3))]


def _args(name, shape, backend, stats, stochastic=False):
    fmt = format_from_name(name)
    rule = list(rule_for(fmt))
    if stochastic:
        rule[1] = 2
    x = torch.randn(shape) * 3
    keys = torch.tensor([7, 4000000000], dtype=torch.int64) if stochastic else None
    return (x, rule, list(tile_for(fmt, shape) or ()), keys, stats, backend)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("name, shape", CASES)
@pytest.mark.parametrize("stats, stochastic", [(False, False), (True, True)])
def test_opcheck_passes(name, shape, backend, stats, stochastic):
    torch.library.opcheck(torch.ops.bfp.quantize_rule.default, _args(name, shape, backend, stats, stochastic))


def test_the_op_and_the_public_quantize_agree_and_counts_are_only_made_when_asked():
    x, rule, tile, keys, _, _ = _args("fb16", (4, 12, 3, 3), "cpu", False)
    out, counts = quantize_rule(x, rule, tile, keys, False, "cpu")
    assert counts.numel() == 0
    ref, rcounts = quantize_rule(x, rule, tile, keys, True, "reference")
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32)) and rcounts.shape == (2,)


def test_fake_tensors_trace_without_running_a_kernel():
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 12, 3, 3))
        fmt = format_from_name("fb16")
        out, counts = torch.ops.bfp.quantize_rule(x, list(rule_for(fmt)), list(tile_for(fmt, (4, 12, 3, 3))), None,
                                                  True, "cpu")
    assert out.shape == (4, 12, 3, 3) and counts.shape == (2,) and counts.dtype == torch.int64
