"""Whole distributed runs beyond plain SGD: --do decisions, loss scaling, the optimizer and reduction
flags through emulated workers, and imagenet.py under 2 gloo processes.

The 2-process runs go through ``tests/_dist_worker.py``; its ``Recorder`` saves what every rank saw
(rank 0 alone writes logs and checkpoints), so the tests can check that the ranks agree.
"""
import json

import pytest
import torch

import bfp.distributed.emulated as emulated
from bfp.amp import MixedPrecision
from bfp.cli import cifar as main
from bfp.cli import run_task
from bfp.dynamic import read_log
from bfp.engine import checkpoint as ckpt
from bfp.formats import format_from_name
from bfp.kernels import quantize
from bfp.optim.lars import LARS
from image_tree import make_tree
from test_distributed import launch
from _dist_worker import BIG


def last(run_dir):
    return ckpt.load(run_dir / "checkpoints" / "last.pt")


def recorded(out):
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def assert_same_model(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), (what, k)


def test_do_decides_on_zse_summed_over_ranks_as_one_process_emulating_two_workers(tiny_args, tmp_path):
    # 3 steps, a decision after each but the last
    common = ["--training-epochs", "1", "--bfp", "ResNet18_FB16", "--do", "Simple/0.2/0.5/0/1/1", "--log", "True",
              "--save", "True"]
    rec = tmp_path / "rec"
    rec.mkdir()
    launch(["cifar", json.dumps([{"record": str(rec)},
                                 tiny_args(*common, "--run-name", "ddp", train_images=96)])], timeout=120)
    assert main(tiny_args(*common, "--emulate-node", "2", "--run-name", "emu", train_images=96)) == 0
    runs = tmp_path / "runs"
    r0, r1 = recorded(rec)
    assert len(r0["decisions"]) == 2
    assert r0["decisions"] == r1["decisions"]  # every rank decided alike, ZSE values included
    assert any(row["old_bits"] != row["new_bits"] for rows in r0["decisions"] for row in rows)
    # ... and as one process holding both micro-batches, whose counts are the sum of the two ranks'
    ddp_log, emu_log = read_log(runs / "ddp"), read_log(runs / "emu")
    assert len(ddp_log) == sum(len(rows) for rows in r0["decisions"])
    assert ddp_log == emu_log
    ddp, emu = last(runs / "ddp"), last(runs / "emu")
    assert ddp["precision_state"] == emu["precision_state"]
    assert ddp["callbacks"]["dynamic_precision"]["bits"] == emu["callbacks"]["dynamic_precision"]["bits"]
    assert_same_model(ddp["model"], emu["model"], "do")


def test_an_overflow_on_one_rank_skips_the_step_on_both(tiny_args, tmp_path, monkeypatch):
    # rank 1's loss is multiplied by BIG at step 1: its simulated e5m2 gradient points saturate (an
    # overflow in its micro-batch only; the gradients stay finite, so the reduction does not spread it)
    common = ["--training-epochs", "1", "--bfp", "any_fp8_hybrid", "--loss-scale", "dynamic",
              "--loss-scale-init", "1024", "--loss-scale-interval", "1", "--save", "True"]
    rec = tmp_path / "rec"
    rec.mkdir()
    launch(["cifar", json.dumps([{"record": str(rec), "overflow_at": [1, 1]}, tiny_args(*common, "--run-name", "ddp")])],
           timeout=120)
    r0, r1 = recorded(rec)
    local = [(s0["local_overflow"], s1["local_overflow"]) for s0, s1 in zip(r0["steps"], r1["steps"])]
    assert local == [(False, True), (False, False)]
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        assert s0["stepped"] == s1["stepped"] and s0["scale"] == s1["scale"]
        assert all(torch.equal(a, b) for a, b in zip(s0["params"], s1["params"]))
    assert [s["stepped"] for s in r0["steps"]] == [False, True]
    assert [s["scale"] for s in r0["steps"]] == [512.0, 1024.0]  # backed off, then grown
    # one process emulating both workers, rank 1's micro-batch (the second) multiplied by BIG at step 1:
    # its micro-batches share one overflow flag
    backward, count = MixedPrecision.backward, {"n": 0}

    def saturating_second(mp, loss):
        count["n"] += 1
        return backward(mp, loss * BIG if count["n"] == 2 else loss)
    monkeypatch.setattr(MixedPrecision, "backward", saturating_second)
    assert main(tiny_args(*common, "--emulate-node", "2", "--run-name", "emu")) == 0
    ddp, emu = last(tmp_path / "runs" / "ddp"), last(tmp_path / "runs" / "emu")
    assert ddp["scaler"] == emu["scaler"] and ddp["scaler"]["skipped_steps"] == 1
    assert_same_model(ddp["model"], emu["model"], "loss scale")


def _kahan_sequential(terms, q):
    s, c = terms[0], torch.zeros_like(terms[0])
    for t in terms[1:]:
        y = q(t - c)
        total = q(s + y)
        c = q(q(total - s) - y)
        s = total
    return s


# flags -> (workers, reference of the reduced gradient from the workers' gradients x, the optimizer)
REFERENCES = {
    "fb16": (["--grad-format", "fb16"], 2, "fb16", lambda x, q: q(q(x[0] / 2) + q(x[1] / 2)), "sgd"),
    "mxfp8": (["--grad-format", "mxfp8_e4m3"], 2, "mxfp8_e4m3", lambda x, q: q(q(x[0] / 2) + q(x[1] / 2)), "sgd"),
    "divide_after": (["--grad-format", "e4m3", "--grad-divide", "after"], 2, "e4m3",
                     lambda x, q: q(q(x[0]) + q(x[1])) / 2, "sgd"),
    # Kahan changes nothing with 2 addends (the first compensation is exact): 4 workers, sequential
    "kahan": (["--grad-format", "e4m3", "--use-kahan", "--emulate-node", "4", "--grad-order", "sequential"], 4,
              "e4m3", lambda x, q: _kahan_sequential([q(v / 4) for v in x], q), "sgd"),
    "lars": (["--use-lars", "--lars-trust", "0.02"], 2, None, lambda x, q: x[0] / 2 + x[1] / 2, "lars"),
}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_reduction_and_optimizer_flags_through_emulated_workers(tiny_args, monkeypatch, name):
    """One step of cifar.py: the parameters after it are the optimizer's step from the
    parameters before it with the reduced gradient computed here from the workers' gradients."""
    flags, n, fmt_name, reference, optimizer = REFERENCES[name]
    seen = {}
    reduce_flat, step_call = emulated.reduce_flat, emulated.EmulatedStep.__call__

    ring = emulated.ring_reduce_workers

    def recording_reduce(reduce, rows, shapes, out):
        seen.update(reduce=reduce, rows=rows.clone(), shapes=shapes)
        return reduce_flat(reduce, rows, shapes, out)

    def recording_ring(reduce, rows, shapes, group=None):  # the ring order's path (one process)
        seen.update(reduce=reduce, rows=rows.clone(), shapes=shapes)
        return ring(reduce, rows, shapes, group)

    def recording_step(step, model, x, y, *, criterion, optimizer, amp):
        seen.update(before=[p.detach().clone() for p in model.parameters()], lr=optimizer.param_groups[0]["lr"],
                    optimizer=type(optimizer).__name__)
        out = step_call(step, model, x, y, criterion=criterion, optimizer=optimizer, amp=amp)
        seen["after"] = [p.detach().clone() for p in model.parameters()]
        return out

    monkeypatch.setattr(emulated, "reduce_flat", recording_reduce)
    monkeypatch.setattr(emulated, "ring_reduce_workers", recording_ring)
    monkeypatch.setattr(emulated.EmulatedStep, "__call__", recording_step)
    emulate = [] if "--emulate-node" in flags else ["--emulate-node", "2"]
    assert main(tiny_args("--training-epochs", "1", *emulate, *flags, train_images=32)) == 0  # one step
    fmt = format_from_name(fmt_name) if fmt_name else None
    assert seen["reduce"].fmt == fmt and seen["rows"].shape[0] == n
    assert seen["optimizer"] == {"sgd": "SGD", "lars": "LARS"}[optimizer]

    def q(t):
        return t if fmt is None else quantize(t, fmt)

    grads, off = [], 0
    for shape in seen["shapes"]:
        k = shape.numel()
        grads.append(reference(seen["rows"][:, off:off + k].reshape(n, *shape).unbind(0), q))
        off += k
    params = [torch.nn.Parameter(w.clone()) for w in seen["before"]]
    for p, g in zip(params, grads):
        p.grad = g
    opts = {"sgd": lambda ps: torch.optim.SGD(ps, lr=seen["lr"], momentum=0.9, weight_decay=5e-4),
            "lars": lambda ps: LARS(ps, lr=seen["lr"], momentum=0.9, weight_decay=5e-4, trust_coefficient=0.02)}
    opts[optimizer](params).step()
    for i, (p, w) in enumerate(zip(params, seen["after"])):
        assert torch.equal(p.detach(), w), (name, i)
    if optimizer == "lars":  # other weights than SGD would give with the same gradient
        sgd = [torch.nn.Parameter(w.clone()) for w in seen["before"]]
        for p, g in zip(sgd, grads):
            p.grad = g
        opts["sgd"](sgd).step()
        assert any(not torch.equal(a.detach(), b) for a, b in zip(sgd, seen["after"]))
    if name == "kahan":  # the compensation changed the sum somewhere
        x = [q(v / 4) for v in seen["rows"][:, :off].unbind(0)]
        plain = q(q(q(x[0] + x[1]) + x[2]) + x[3])
        assert not torch.equal(plain, torch.cat([g.reshape(-1) for g in grads]))


def test_imagenet_under_two_gloo_processes_equals_one_process_emulating_two_workers(tmp_path):
    make_tree(tmp_path / "tree", bad=False)  # 12 train images, 2 classes

    def args(name, *extra):
        return [str(tmp_path / "tree"), "-a", "resnet18", "--image-size", "16", "-b", "4", "--batch-size-test", "4",
                "-j", "0", "--epochs", "1", "--limit-train-images", "8", "--limit-test-images", "4", "--device", "cpu",
                "--threads", "1", "--progress", "False", "--save", "True", "--run-dir", str(tmp_path / "runs"),
                "--run-name", name, "--grad-format", "e4m3", *extra]

    launch(["cifar", json.dumps([{"task": "imagenet", "argv": args("ddp")}])], timeout=120)
    assert run_task("imagenet", args("emu", "--emulate-node", "2")) == 0
    ddp, emu = last(tmp_path / "runs" / "ddp"), last(tmp_path / "runs" / "emu")
    assert "rank 0 of 2 (RANK/WORLD_SIZE), 2 worker(s)" in (tmp_path / "runs" / "ddp" / "log.txt").read_text()
    assert "one process, 2 worker(s)" in (tmp_path / "runs" / "emu" / "log.txt").read_text()
    assert ddp["global_step"] == emu["global_step"] == 2
    # weights, and BatchNorm running statistics: rank 0's / worker 0's micro-batch (docs/distributed.md)
    assert_same_model(ddp["model"], emu["model"], "imagenet")
    for k, s in ddp["optimizer"]["state"].items():
        assert torch.equal(s["momentum_buffer"], emu["optimizer"]["state"][k]["momentum_buffer"]), k
    assert [h["test_acc1"] for h in ddp["history"]] == [h["test_acc1"] for h in emu["history"]]
