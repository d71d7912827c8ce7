"""Loss scaling in whole runs: flags, per-step log, gradient histograms, checkpoint and resume."""
import json

import pytest
import torch

import bfp
import bfp.models
from bfp.amp import MixedPrecision
from bfp.cli import cifar as main
from bfp.engine import checkpoint as ckpt
from bfp.data import cifar as D
from bfp.engine.grad_histogram import HI, LO, exponent_counts
from bfp.engine.trainer import Trainer, TrainConfig


def test_exponent_bins_are_exact_with_zero_and_non_finite_bins():
    t = torch.tensor([0.0, -0.0, 1.0, 1.5, -2.0, 0.75, 2.0 ** -60, 2.0 ** 40, float("inf"), float("nan"),
                      torch.finfo(torch.float32).tiny / 4])  # a float32 subnormal: 2^-128
    c = exponent_counts(t)
    assert c.shape == (HI - LO + 1 + 2,)
    assert c[0 - LO] == 2 and c[1 - LO] == 1 and c[-1 - LO] == 1   # [1, 2): 1, 1.5; [2, 4): -2; 0.75
    assert c[0] == 2 and c[HI - LO] == 1                           # 2^-60, 2^-128 -> first bin; 2^40 -> last
    assert c[-2] == 2 and c[-1] == 2                               # two zeros; Inf and NaN
    assert int(c.sum()) == t.numel()


def test_cli_logs_the_scale_per_step_and_draws_histograms(tiny_args, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert main([*tiny_args("--training-epochs", "1", "--bfp", "any_fp8_hybrid", "--loss-scale", "dynamic",
                            "--loss-scale-init", "1099511627776", "--grad-histogram", "1", "--log", "True",
                            "--save", "True", "--run-name", "r")]) == 0
    run = tmp_path / "runs" / "r"
    steps = [json.loads(line) for line in (run / "loss_scale.jsonl").read_text().splitlines()]
    # 2^40 saturates the e5m2 points: each of the two steps is skipped and halves the scale
    assert steps == [{"step": 1, "epoch": 0, "scale": 2.0 ** 39, "skipped": True},
                     {"step": 2, "epoch": 0, "scale": 2.0 ** 38, "skipped": True}]
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["loss_scale"] == 2.0 ** 38 and m["skipped_steps"] == 2
    assert (run / "grad_histograms" / "epoch_001.png").stat().st_size > 10_000
    ev = EventAccumulator(str(run), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    assert [s.value for s in ev.Scalars("amp/loss_scale")] == [2.0 ** 39, 2.0 ** 38]
    assert "grad_log2/layer1.0.conv1" in ev.Tags()["histograms"]
    assert ckpt.load(run / "checkpoints" / "last.pt")["scaler"]["skipped_steps"] == 2


@pytest.mark.parametrize("flag, value", [("--loss-scale", "auto"), ("--loss-scale-backoff", "2"),
                                         ("--loss-scale-interval", "0"), ("--grad-histogram", "-1")])
def test_bad_loss_scale_flags_exit_2_naming_the_value(tiny_args, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        main([*tiny_args(flag, value)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and repr(value) in err and "allowed" in err


def test_scaler_state_resumes_exactly(tmp_path):
    """Two epochs straight against one epoch, a checkpoint, and a fresh Trainer for the second:
    the scale (backed off by saturating e5m2 points, then grown) and the weights agree bit for bit."""
    def trainer(save_dir=None):
        torch.manual_seed(0)
        model = bfp.convert(bfp.models.create("ResNet10", 10, width=4), "any_fp8_hybrid")
        data = D.load("digits", batch_size_train=32, batch_size_test=32, limit_train=64, limit_test=32)
        amp = MixedPrecision("fp32", loss_scale="dynamic", init_scale=2.0 ** 21, growth_interval=1)
        return Trainer(model, data, TrainConfig(epochs=2, progress=False, save_interval=1), amp=amp,
                       checkpoint_dir=save_dir, network_config="any_fp8_hybrid")
    straight = trainer(tmp_path / "ck")
    straight.fit()
    resumed = trainer()
    resumed.load_state_dict(ckpt.load(tmp_path / "ck" / "epoch_001.pt"))
    resumed.fit()
    assert straight.amp.state_dict() == resumed.amp.state_dict()
    assert straight.amp.scaler.skipped_steps >= 1  # the test exercises a back-off
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
