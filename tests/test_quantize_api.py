"""bfp.quantize on tensors that require grad (straight-through gradient) and on meta
tensors (a shape-only result on every backend)."""
import pytest
import torch

import bfp

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
