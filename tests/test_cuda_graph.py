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
    kw = dict(device=torch.device("cuda"), distributed=False, emulated=False, compile_mode="none")
    return refusal(**{**kw, **changes})


def test_what_cannot_be_captured_is_refused_with_the_reason():
    assert _why() is None
    assert "needs a CUDA device" in _why(device=torch.device("cpu"))
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


def _model(preset, device="cuda"):
    """Conv, BN, conv, linear: the middle conv is quantized by every preset (@first/@last stay FP32)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                      nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))
    return bfp.convert(m, preset, torch.randn(2, 3, 8, 8)).to(device)


def _setup(model, batches, compute="fp32"):
    """Optimizer (a device lr, as ``--cuda-graph`` makes it), schedule, amp: made before any step."""
    from bfp.amp import MixedPrecision
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    device_lr(opt, torch.device("cuda"))  # both runs take the same (tensor) learning rate
    amp = MixedPrecision(compute, "cuda")
    if amp.scaler.is_enabled():
        amp.scaler.on_device(torch.device("cuda"))  # both decide on the device
    return opt, CosineSchedule(opt, total_steps=len(batches)), amp


def _steps(model, step, batches, opt, sched, amp):
    losses = []
    for x, y in batches:
        loss, _ = step(model, x, y, criterion=nn.CrossEntropyLoss(), optimizer=opt, amp=amp)
        sched.step()
        losses.append(loss)
    return torch.stack(losses)


def _train(model, step, batches, compute="fp32"):
    return _steps(model, step, batches, *_setup(model, batches, compute))


ROWWISE = {"version": 1, "default": {"operands": "fp8_e4m3_rowwise"}}
PRESETS = ["any_FB16", "any_fp8_e4m3", "any_fp8_tensorwise", "any_fp8_delayed", "any_mxfp8", "any_nvfp4",
           "any_nvfp4_te", "any_fp16_grads"]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("preset, compute", [(p, "fp32") for p in PRESETS] + [("any_FB16", "fp16"),
                                                                             ("any_fp8_e4m3", "bf16")])
def test_a_replayed_step_is_bit_for_bit_the_eager_step(preset, compute):
    from bfp.engine.compiled import deterministic
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 3, 8, 8, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda())
               for _ in range(8)] + [(torch.randn(5, 3, 8, 8).cuda(), torch.randint(0, 10, (5,)).cuda())]
    with deterministic():
        eager_model = _model(preset)
        graphed_model = copy.deepcopy(eager_model)
        torch.cuda.manual_seed(3)
        want = _train(eager_model, PlainStep(), batches, compute)
        torch.cuda.manual_seed(3)
        step = GraphedStep()
        got = _train(graphed_model, step, batches, compute)
    assert step.captures == 1
    assert torch.equal(want, got)
    for a, b in zip(eager_model.state_dict().values(), graphed_model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("preset", PRESETS + ["any_nvfp4_recipe", "any_nvfp4_te_recipe", "any_mxfp4", "any_p3109_p3",
                                    "any_fp8_hybrid", "any_FB12LG16", "any_fp8_h100", ROWWISE])
def test_training_steps_do_not_synchronise_with_the_host(preset):
    """Every preset family, tensor-core accumulators (any_fp8_h100) included, and fp16 with dynamic
    loss scaling decided on the device."""
    model = _model(preset)
    batches = [(torch.randn(16, 3, 8, 8).cuda(), torch.randint(0, 10, (16,)).cuda()) for _ in range(3)]
    compute = "fp16" if preset == "any_FB16" else "fp32"
    setup = _setup(model, batches, compute)
    _steps(model, PlainStep(), batches[:1], *setup)  # first use: kernels compile, lazy state is made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(model, PlainStep(), batches, *setup)
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


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("mode", ["dynamic", 1024.0])
def test_loss_scaling_decided_on_the_device_gives_the_host_decided_weights_and_counts(optimizer, mode):
    """``LossScaler.on_device`` (what ``--cuda-graph`` uses): overflowing steps, the first included,
    are undone on the device; weights, optimizer state, scale and counters equal the host path's."""
    from bfp.amp import MixedPrecision

    def run(on_device):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4) if optimizer == "sgd"
               else torch.optim.AdamW(m.parameters(), lr=0.01))
        amp = MixedPrecision("fp32", "cpu", loss_scale=mode, growth_interval=3)
        if on_device:
            amp.scaler.on_device(torch.device("cpu"))
        g = torch.Generator().manual_seed(1)
        for i in range(12):
            x, y = torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g)
            if i in (0, 4, 5):
                x[0, 0] = float("inf")  # the loss overflows: the step is skipped
            amp.train_step(m, x, y, criterion=nn.CrossEntropyLoss(), optimizer=opt)
        return m, opt, amp.scaler
    (m0, o0, s0), (m1, o1, s1) = run(False), run(True)
    for a, b in zip(m0.state_dict().values(), m1.state_dict().values()):
        assert torch.equal(a, b)
    for p0, p1 in zip(m0.parameters(), m1.parameters()):
        for k, v in o0.state[p0].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(o1.state[p1][k])), k
    assert s0.state_dict() == s1.state_dict() and s1.skipped_steps == 3
    assert isinstance(s1.snapshot()[0], torch.Tensor) and not isinstance(s0.snapshot()[0], torch.Tensor)


class _FakeGraph:
    """A stand-in for a captured graph on the CPU: ``replay`` runs the captured step again on the
    static inputs and writes its results into the capture's output tensors (what a real replay's
    kernels do), so ``GraphedStep``'s own logic runs without a GPU."""

    def __init__(self, work, out):
        self.work, self.out, self.replays = work, out, 0

    def replay(self):
        loss, out = self.work()
        self.out[0].copy_(loss)
        self.out[1].copy_(out)
        self.replays += 1


@pytest.mark.parametrize("compute, scale", [("fp32", None), ("bf16", "dynamic")])
def test_graphed_step_logic_on_the_cpu_gives_the_eager_weights(monkeypatch, compute, scale):
    """The capture replaced by ``_FakeGraph`` (no GPU): warm-up, one capture, replays with the
    batch copied into the static inputs, the last smaller batch eager, a new capture after a
    precision change and after a momentum change, the schedule's lr read at every replay, loss
    scaling decided on the device: the weights equal the plain eager step's, bit for bit."""
    import bfp.engine.graphed as G
    from bfp.amp import MixedPrecision
    graphs, state = [], []

    def fake_capture(work, device):
        # a capture records the step without running it: run it for its outputs, then put back
        # everything it changed (weights, buffers, optimizer and scaler state); replay() runs it
        before = [t.detach().clone() for t in state[0]()]
        out = work()
        for t, b in zip(state[0](), before):
            t.detach().copy_(b)
        graphs.append(_FakeGraph(work, out))
        return graphs[-1], out
    monkeypatch.setattr(G, "capture", fake_capture)
    monkeypatch.setattr(G, "on_side_stream", lambda work, device: work())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(7)]
    batches.append((torch.randn(3, 3, 8, 8, generator=g), torch.randint(0, 10, (3,), generator=g)))  # smaller

    def train(step):
        m = _model("any_FB16", "cpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        device_lr(opt, torch.device("cpu"))
        sched = CosineSchedule(opt, total_steps=3 * len(batches))
        amp = MixedPrecision(compute, "cpu", loss_scale=scale)
        if amp.scaler.is_enabled():
            amp.scaler.on_device(torch.device("cpu"))
        state[:] = [lambda: [*m.parameters(), *m.buffers(), *(v for st in opt.state.values() for v in st.values()
                                                               if isinstance(v, torch.Tensor)),
                             *((amp.scaler._dev or {}).values())]]
        for epoch in range(3):
            if epoch == 1:
                bfp.convert(m, "any_FB12")  # a precision change (--do, a -tc schedule)
            if epoch == 2:
                opt.param_groups[0]["momentum"] = 0.8  # a plan's optimizer change
            for x, y in batches:
                step(m, x, y, criterion=nn.CrossEntropyLoss(), optimizer=opt, amp=amp)
                sched.step()
        return m, amp.scaler
    want, s0 = train(PlainStep())
    step = GraphedStep(warmup=2)
    got, s1 = train(step)
    for a, b in zip(want.state_dict().values(), got.state_dict().values()):
        assert torch.equal(a, b)
    assert step.captures == 3 == len(graphs)  # one per precision / momentum
    assert [gr.replays for gr in graphs] == [5, 5, 5]  # 8 batches: 2 warm-up, capture + 5 replays, 1 eager
    assert s0.state_dict() == s1.state_dict()


def test_the_overhead_benchmark_refuses_graph_mode_without_a_gpu(monkeypatch, capsys):
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import overhead
    args = ["--model", "ResNet10", "--width", "4", "--batch", "2", "--steps", "1", "--configs", "any_FB16"]
    with pytest.raises(SystemExit) as e:
        overhead.main([*args, "--modes", "eager,graph", "--device", "cpu"])
    assert e.value.code == 2 and "graph not possible here" in capsys.readouterr().err
