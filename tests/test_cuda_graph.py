"""``--cuda-graph`` (bfp.engine.graphed) and ``--deterministic``: what CI checks on the CPU (the
refusals, the device learning rate the schedule fills in place, what makes a capture stale), and
``gpu`` tests for a GPU: a replayed step is bit for bit the eager one, and training steps of every
preset run with no host synchronisation (``torch.cuda.set_sync_debug_mode("error")``)."""
import copy

import pytest
import torch
import torch.nn as nn

import bfp
from bfp.cli import cifar as main
from bfp.engine.graphed import GraphedStep, _hyperparameters, device_lr, refusal
from bfp.engine.schedule import CosineSchedule
from bfp.engine.step import PlainStep

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _why(**changes):
    kw = dict(device=torch.device("cuda"), loss_scaling=False, distributed=False, emulated=False, compile_mode="none")
    return refusal(**{**kw, **changes})


def test_what_cannot_be_captured_is_refused_with_the_reason():
    assert _why() is None
    assert "needs a CUDA device" in _why(device=torch.device("cpu"))
    assert "loss scaling" in _why(loss_scaling=True) and "`compute_dtype` bf16" in _why(loss_scaling=True)
    assert "single-process" in _why(distributed=True) and "`emulate_node`" in _why(emulated=True)
    assert "reduce-overhead" in _why(compile_mode="default")


def test_the_cli_refuses_cuda_graph_on_the_cpu_naming_its_flags(tiny_args, capsys):
    assert main(tiny_args("--cuda-graph")) == 2
    assert "error: --cuda-graph needs a CUDA device" in capsys.readouterr().err


def test_the_schedule_fills_a_device_lr_in_place_and_settings_changes_are_seen():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sched = CosineSchedule(opt, total_steps=10)
    device_lr(opt, torch.device("cpu"))
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float32
    before = _hyperparameters(opt)
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.1 * 0.5 * (1 + torch.cos(
        torch.tensor(torch.pi / 10)).item()))
    assert _hyperparameters(opt) == before  # the tensor is the same: a captured step reads the new rate
    assert sched.get_last_lr() == [pytest.approx(float(lr))] and isinstance(sched.get_last_lr()[0], float)
    opt.param_groups[0]["momentum"] = 0.5  # a plan's change: a constant of the graph
    assert _hyperparameters(opt) != before
    p.grad = torch.ones(3)
    opt.step()  # SGD takes the tensor lr
    assert torch.all(p < 1)


def test_adam_is_made_capturable_with_its_step_count_on_the_device():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.01)
    p.grad = torch.ones(3)
    opt.step()
    device_lr(opt, torch.device("cpu"))
    assert opt.param_groups[0]["capturable"] is True


def _model(preset):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))
    return bfp.convert(m, preset, torch.randn(2, 3, 8, 8)).cuda()


def _train(model, step, batches):
    from bfp.amp import MixedPrecision
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    device_lr(opt, torch.device("cuda"))  # both runs take the same (tensor) learning rate
    sched = CosineSchedule(opt, total_steps=len(batches))
    amp, crit = MixedPrecision("fp32", "cuda"), nn.CrossEntropyLoss()
    losses = []
    for x, y in batches:
        loss, _ = step(model, x, y, criterion=crit, optimizer=opt, amp=amp)
        sched.step()
        losses.append(loss)
    return torch.stack(losses)


ROWWISE = {"version": 1, "default": {"operands": "fp8_e4m3_rowwise"}}
PRESETS = ["any_FB16", "any_fp8_e4m3", "any_fp8_tensorwise", "any_fp8_delayed", "any_mxfp8", "any_nvfp4",
           "any_nvfp4_te", "any_fp16_grads"]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_a_replayed_step_is_bit_for_bit_the_eager_step(preset):
    from bfp.engine.compiled import deterministic
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 3, 8, 8, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda())
               for _ in range(8)] + [(torch.randn(5, 3, 8, 8).cuda(), torch.randint(0, 10, (5,)).cuda())]
    with deterministic():
        eager_model = _model(preset)
        graphed_model = copy.deepcopy(eager_model)
        torch.cuda.manual_seed(3)
        want = _train(eager_model, PlainStep(), batches)
        torch.cuda.manual_seed(3)
        step = GraphedStep()
        got = _train(graphed_model, step, batches)
    assert step.captures == 1
    assert torch.equal(want, got)
    for a, b in zip(eager_model.state_dict().values(), graphed_model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("preset", PRESETS + ["any_nvfp4_recipe", "any_nvfp4_te_recipe", "any_mxfp4", "any_p3109_p3",
                                    "any_fp8_hybrid", "any_FB12LG16", "any_fp8_h100", ROWWISE])
def test_training_steps_do_not_synchronise_with_the_host(preset):
    """Every preset family, tensor-core accumulators (any_fp8_h100) included."""
    model = _model(preset)
    batches = [(torch.randn(16, 3, 8, 8).cuda(), torch.randint(0, 10, (16,)).cuda()) for _ in range(3)]
    _train(model, PlainStep(), batches[:1])  # first use: kernels compile, lazy state is made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _train(model, PlainStep(), batches)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@gpu
def test_a_new_precision_and_optimizer_capture_anew():
    model = _model("any_FB16")
    step = GraphedStep(warmup=1)
    batches = [(torch.randn(16, 3, 8, 8).cuda(), torch.randint(0, 10, (16,)).cuda()) for _ in range(4)]
    _train(model, step, batches)
    assert step.captures == 1
    bfp.convert(model, "any_FB12")
    _train(model, step, batches)
    assert step.captures == 2
