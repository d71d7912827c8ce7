"""A run whose weights or loss go NaN/Inf stops with exit status 3 and keeps its last finite
checkpoint as last.pt, from which --resume restarts."""
import json

import torch

from bfp.cli import cifar as main
from bfp.engine import checkpoint as ckpt


def _diverging_from_epoch_2(tmp_path) -> str:
    """A -tc file whose learning rate jumps to 1e30 at epoch 2: its first step blows the weights up."""
    (tmp_path / "tc.json").write_text(json.dumps({"optimizer-dict": {"1": {"lr": 1e30}}}))
    return str(tmp_path / "tc.json")


def _finite(state):
    return all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_a_diverging_run_stops_and_keeps_the_last_finite_checkpoint(tiny_args, tmp_path, capsys):
    args = tiny_args("-tc", _diverging_from_epoch_2(tmp_path), "--training-epochs", "4", "--save", "True",
                     "--log", "True", "--run-name", "nan")
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "epoch 2: " in err and "holds NaN or Inf" in err and "Stopped after 1 non-finite epoch(s)" in err
    assert "checkpoints/last.pt keeps epoch 1" in err and "Traceback" not in err
    last = ckpt.load(tmp_path / "runs" / "nan" / "checkpoints" / "last.pt")
    assert last["epoch"] == 1 and _finite(last)
    assert "epoch 2/4: train loss nan" in (tmp_path / "runs" / "nan" / "log.txt").read_text()
    # --resume starts again from those finite weights (and, same flags, diverges the same way)
    assert main(["--resume", str(tmp_path / "runs" / "nan")]) == 3
    assert "resumed" in (tmp_path / "runs" / "nan" / "log.txt").read_text()


def test_with_stop_nonfinite_0_the_run_goes_on_but_never_saves_a_non_finite_epoch(tiny_args, tmp_path, capsys):
    args = tiny_args("-tc", _diverging_from_epoch_2(tmp_path), "--training-epochs", "3", "--save", "True",
                     "--run-name", "n0", "--stop-nonfinite", "0")
    assert main(args) == 0
    out = capsys.readouterr()
    assert "warning: epoch 3: " in out.out + out.err
    last = ckpt.load(tmp_path / "runs" / "n0" / "checkpoints" / "last.pt")
    assert last["epoch"] == 1 and _finite(last)


def test_a_negative_stop_nonfinite_is_refused(tiny_args, capsys):
    assert main(tiny_args("--stop-nonfinite", "-1")) == 2
    assert "--stop-nonfinite must be an integer >= 0 (0: never stop), got -1" in capsys.readouterr().err


def test_a_nan_test_loss_with_finite_weights_stops_like_a_nan_training_loss(tiny_args, tmp_path, capsys,
                                                                               monkeypatch):
    from bfp.engine.trainer import Trainer
    real = Trainer.evaluate

    def evaluate(self, loader=None):  # a forward that overflows in evaluation only
        m = real(self, loader)
        return {**m, "test_loss": float("nan")} if self.epoch >= 1 else m
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    assert main(tiny_args("--training-epochs", "3", "--save", "True", "--run-name", "tl")) == 3
    err = capsys.readouterr().err
    assert "epoch 2: the test loss is nan (the weights are finite" in err and "Traceback" not in err
    assert ckpt.load(tmp_path / "runs" / "tl" / "checkpoints" / "last.pt")["epoch"] == 1


def test_silent_cases_are_refused_before_any_work(tiny_args, tmp_path, capsys):
    assert main(tiny_args("--diagnose", "2", "--training-epochs", "1")) == 2
    assert "add --log True" in capsys.readouterr().err
    for out in ("heat.txt", "sweep.csv", "heat"):
        assert main(tiny_args("--mode", "diagnose", "--diagnose-out", str(tmp_path / out))) == 2
        assert "must end in .png, .pdf or .svg" in capsys.readouterr().err
    assert not any(tmp_path.glob("heat*")) and not any(tmp_path.glob("sweep*"))
    cfg = tmp_path / "rht.json"
    cfg.write_text(json.dumps({"version": 1, "rules": [{"match": "*", "types": ["Linear"],
                                                        "precision": {"fw": "nvfp4", "rht": 16}}]}))
    assert main(tiny_args("--bfp", str(cfg), "--training-epochs", "1")) == 2
    assert "rht transforms the weight-gradient GEMM's inputs, the bwo and bwi points" in capsys.readouterr().err
