"""bfp.quantize on tensors that require grad (straight-through gradient) and on meta
tensors (a shape-only result on every backend)."""
import pytest
import torch

import bfp
from bfp.kernels.dispatch import format_json

FP6 = bfp.Float(3, 2)  # e3m2: 1.3 -> 1.25, -0.3 -> -0.3125


def test_a_tensor_that_requires_grad_gets_the_same_bits_and_a_straight_through_gradient():
    x = torch.tensor([1.3, -0.3, 2.0], requires_grad=True)
    y = bfp.quantize(x, FP6)
    assert y.requires_grad and torch.equal(y.detach(), torch.tensor([1.25, -0.3125, 2.0]))
    assert torch.equal(y.detach(), bfp.quantize(x.detach(), FP6))
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 2.0, 3.0]))


def test_without_grad_mode_the_result_is_a_plain_tensor():
    x = torch.tensor([1.3], requires_grad=True)
    with torch.no_grad():
        y = bfp.quantize(x, FP6)
    assert not y.requires_grad and y.grad_fn is None


@pytest.mark.parametrize("backend", [None, "reference", "cpu", "cuda"])
def test_a_meta_tensor_gives_a_meta_result_of_its_shape_on_every_backend(backend):
    x = torch.empty(3, 64, dtype=torch.bfloat16, device="meta")
    y = bfp.quantize(x, bfp.MX("e2m1"), backend=backend)
    assert y.device.type == "meta" and y.shape == x.shape and y.dtype == x.dtype


def test_a_meta_tensor_is_still_checked_against_the_format_and_has_no_zero_setting_error():
    x = torch.empty(3, 64, device="meta")
    with pytest.raises(ValueError, match=r"MX axis 9 is out of range for a tensor of shape \(3, 64\)"):
        bfp.quantize(x, bfp.MX("e2m1", axis=9))
    with pytest.raises(ValueError, match=r"a meta tensor \(shape \(3, 64\)\) has only a shape"):
        bfp.zero_setting_error(x, FP6)


def test_the_straight_through_gradient_holds_for_parameters_subclasses_and_under_compile():
    """Issue 53, item 7: a Parameter (a tensor subclass) goes through the op, whose autograd formula is
    straight through; delayed scaling's op (it mutates its history) is called on a detached input."""
    from bfp.formats import Scaled, format_from_name
    fmt = format_from_name("e4m3")
    p = torch.nn.Parameter(torch.tensor([0.1, 1.3, -7.7, 300.0]))
    y = bfp.quantize(p, fmt)
    (y * 3).sum().backward()
    assert torch.equal(y.detach(), bfp.quantize(p.detach(), fmt)) and p.grad.tolist() == [3.0] * 4
    x = torch.linspace(-3, 3, 16, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda t: bfp.quantize(t, fmt) * 2, fullgraph=True)
    f(x).sum().backward()
    assert x.grad.tolist() == [2.0] * 16
    gx = torch.zeros_like(x, requires_grad=True)
    out, counts = torch.ops.bfp.quantize_format(gx, format_json(fmt), None, True, "reference")
    out.sum().backward()
    assert gx.grad.tolist() == [1.0] * 16
    delayed = Scaled(format_from_name("e4m3"), history=4)
    state = torch.tensor([4.0, 0.0, 0.0, 0.0])
    p.grad = None
    (bfp.quantize(p, delayed, state=state, update_state=True) * 5).sum().backward()
    assert p.grad.tolist() == [5.0] * 4 and state[0].item() == 300.0


def test_a_compiled_model_is_refused_by_convert_with_the_order_to_use():
    import torch.nn as nn
    from bfp.conversion import convert
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"convert first, then compile.*_orig_mod"):
        convert(torch.compile(model), "any_fp8_e4m3", example_input=torch.randn(2, 4))
