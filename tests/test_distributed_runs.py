"""Whole distributed runs beyond plain SGD: --do decisions, loss scaling, the optimizer and reduction
flags through emulated workers, and imagenet.py under 2 gloo processes.

The 2-process runs go through ``tests/_dist_worker.py``; its ``Recorder`` saves what every rank saw
(rank 0 alone writes logs and checkpoints), so the tests can check that the ranks agree.
"""
import json

import torch

from bfp.cli import cifar as main
from bfp.cli import run_task
from bfp.dynamic import read_log
from bfp.engine import checkpoint as ckpt
from image_tree import make_tree
from test_distributed import launch


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


def test_an_overflow_on_one_rank_skips_the_step_on_both(tiny_args, tmp_path):
    # e5m2 gradient points saturate at 57344: at this initial scale the first step overflows in
    # rank 1's micro-batch only (the recorded local flags check that), the second in neither
    common = ["--training-epochs", "1", "--bfp", "any_fp8_hybrid", "--loss-scale", "dynamic",
              "--loss-scale-init", "3500000", "--loss-scale-interval", "1", "--save", "True"]
    rec = tmp_path / "rec"
    rec.mkdir()
    launch(["cifar", json.dumps([{"record": str(rec)}, tiny_args(*common, "--run-name", "ddp")])], timeout=120)
    r0, r1 = recorded(rec)
    assert [s["local_overflow"] for s in r0["steps"]] == [False, False]
    assert [s["local_overflow"] for s in r1["steps"]] == [True, False]
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        assert s0["stepped"] == s1["stepped"] and s0["scale"] == s1["scale"]
        assert all(torch.equal(a, b) for a, b in zip(s0["params"], s1["params"]))
    assert [s["stepped"] for s in r0["steps"]] == [False, True]
    assert [s["scale"] for s in r0["steps"]] == [1750000.0, 3500000.0]  # backed off, then grown
    # one process emulating both workers shares one overflow flag between its micro-batches
    assert main(tiny_args(*common, "--emulate-node", "2", "--run-name", "emu")) == 0
    ddp, emu = last(tmp_path / "runs" / "ddp"), last(tmp_path / "runs" / "emu")
    assert ddp["scaler"] == emu["scaler"] and ddp["scaler"]["skipped_steps"] == 1
    assert_same_model(ddp["model"], emu["model"], "loss scale")
