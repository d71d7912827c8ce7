"""What the kernels are given: a negative view's values, not its memory, on every backend; and a
Triton launch on its tensor's CUDA device, not the current one (two devices faked, no GPU needed)."""
import pytest
import torch

import bfp
from bfp.formats import format_from_name
from bfp.hadamard import transform_quantize
from bfp.kernels.triton_cuda import launcher
from bfp.precision import Hadamard


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("name", ["e4m3", "fb16", "mxfp8_e4m3", "nvfp4", "fp8_e4m3_tensorwise"])
def test_a_negative_view_is_rounded_as_its_values(backend, name):
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    fmt = format_from_name(name)
    view = torch._neg_view(x)
    assert view.is_neg() and torch.equal(view, -x)
    want = bfp.quantize(-x, fmt, backend=backend)
    assert torch.equal(bfp.quantize(view, fmt, backend=backend), want)
    assert not torch.equal(bfp.quantize(x, fmt, backend=backend), want)  # the control: the memory's sign differs


def test_a_negative_view_is_transformed_as_its_values():
    x = torch.randn(32, 16)
    rht, fmt = Hadamard(16, 3), format_from_name("nvfp4")
    assert torch.equal(transform_quantize(torch._neg_view(x), rht, fmt), transform_quantize(-x, rht, fmt))


class _OnDevice:
    """A stand-in for a tensor on ``cuda:index`` (what a launch reads of it here: device, data_ptr)."""

    def __init__(self, index):
        self.device = torch.device("cuda", index)

    def data_ptr(self):
        return 0

    def get_device(self):
        return self.device.index


def _fake_devices(monkeypatch):
    current = {"device": 0}
    seen = []

    class Device:  # torch.cuda.device: makes its device current inside the block
        def __init__(self, d):
            self.index = torch.device(d).index

        def __enter__(self):
            self.prev, current["device"] = current["device"], self.index

        def __exit__(self, *exc):
            current["device"] = self.prev

    class Kernel:  # a JITFunction: launches on the current device
        arg_names = ()

        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(current["device"])
    monkeypatch.setattr(torch.cuda, "device", Device)
    return Kernel(), seen, current


def test_a_launch_runs_on_its_tensors_device_not_the_current_one(monkeypatch):
    kernel, seen, current = _fake_devices(monkeypatch)
    launcher.run(kernel, (1,), (_OnDevice(1), _OnDevice(1)), (4,), {}, plan_key=("test", 1))
    launcher.launch(kernel, (1,), _OnDevice(1), 4)
    launcher.run(kernel, (1,), (_OnDevice(0),), (4,), {}, plan_key=("test", 0))
    assert seen == [1, 1, 0] and current["device"] == 0  # and the caller's current device is restored


def test_a_cpu_tensor_under_the_interpreter_switches_no_device(monkeypatch):
    kernel, seen, current = _fake_devices(monkeypatch)
    current["device"] = 5
    launcher.launch(kernel, (1,), torch.zeros(4), 4)
    assert seen == [5]
