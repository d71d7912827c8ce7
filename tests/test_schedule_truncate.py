"""-tc schedules with switches beyond --training-epochs: dropped with a warning, so a
shipped 200-epoch schedule can be smoke-tested with --training-epochs 1."""
import json
from pathlib import Path

import pytest

from bfp.cli import cifar as main
from bfp.cli.flags import UsageError
from bfp.cli.tasks import CIFAR
from bfp.cli.train_config import parse_args

ROOT = Path(__file__).resolve().parents[1]


def test_a_shipped_schedule_keeps_the_epochs_the_run_reaches_and_warns_about_the_rest(capsys):
    args, plan, path = parse_args(CIFAR, ["-tc", "ResNet18_CIFAR100_Mixed", "--training-epochs", "21"])
    assert plan.precision == {0: "ResNet18_FB16", 20: "ResNet18_FB12LG16"} and plan.optimizer == {20: {}}
    assert capsys.readouterr().err.splitlines() == [
        f"cifar.py: warning: {path}: bfp-layer-conf-dict entries at epochs [180] ignored: the run trains "
        f"epochs 0..20 (--training-epochs 21)",
        f"cifar.py: warning: {path}: optimizer-dict entries at epochs [180] ignored: the run trains "
        f"epochs 0..20 (--training-epochs 21)"]
    args, plan, path = parse_args(CIFAR, ["-tc", "ResNet18_CIFAR100_Mixed"])  # its own 200 epochs
    assert sorted(plan.precision) == [0, 20, 180] and capsys.readouterr().err == ""


def test_a_dropped_entry_naming_a_missing_config_is_still_an_error(tmp_path):
    tc = tmp_path / "tc.json"
    tc.write_text(json.dumps({"bfp-layer-conf-dict": {"0": "ResNet18_FB16", "5": "ResNet18_FB77"}}))
    with pytest.raises(UsageError, match=r"bfp-layer-conf-dict\[5\]: .*ResNet18_FB77"):
        parse_args(CIFAR, ["-tc", str(tc), "-d", "digits", "--training-epochs", "1"])


def test_a_shipped_schedule_smoke_tests_in_one_epoch(tiny_args, tmp_path, capsys):
    assert main(tiny_args("-tc", "digits_ResNet18_Mixed", "--training-epochs", "1", "--log", "True",
                          "--run-name", "s", train_images=32)) == 0
    assert "bfp-layer-conf-dict entries at epochs [2] ignored" in capsys.readouterr().err
    cfg = json.loads((tmp_path / "runs" / "s" / "config.json").read_text())
    assert cfg["epoch_plan"] == {"bfp-layer-conf-dict": {"0": "ResNet18_FB16"}, "optimizer-dict": {}}
