"""bfp.cli.spec: one frozen run specification after flags, -tc and --resume; a fourth script adds no CLI branch."""
import json

import pytest
import torch
import torch.nn as nn

from bfp.cli import main as cli_main
from bfp.cli import run as run_mod
from bfp.cli import run_task
from bfp.cli.flags import UsageError
from bfp.cli.spec import build_spec
from bfp.cli.task_base import TaskHooks
from bfp.cli.tasks import CIFAR, IMAGENET, LM, TASKS, Task
from bfp.data.bundle import DataBundle
from bfp.data.cifar import TensorDataset, TensorLoader


def test_the_spec_refuses_changes_and_makes_variants(tiny_args):
    spec = build_spec(CIFAR, tiny_args("--bfp", "ResNet18_FB12LG24"))
    with pytest.raises(AttributeError, match="the run specification is frozen: optim_lr cannot change"):
        spec.args.optim_lr = 1.0
    with pytest.raises(AttributeError, match="frozen"):
        del spec.args.seed
    with pytest.raises(TypeError):
        spec.plan.precision[0] = "any_FB16"
    fp32 = spec.replace(network_config=None, do=None)
    assert (fp32.args.network_config, spec.args.network_config) == (None, "ResNet18_FB12LG24")
    assert fp32.initial_config is None and spec.initial_config == "ResNet18_FB12LG24"
    with pytest.raises(KeyError, match="not flags of this run: no_such_flag"):
        spec.replace(no_such_flag=1)


def test_flags_beat_the_training_config_and_bfp_replaces_its_epoch_0_entry(tiny_args, tmp_path):
    tc = tmp_path / "tc.json"
    tc.write_text(json.dumps({"optim-lr": 0.5, "seed": 7, "training-epochs": 3,
                              "bfp-layer-conf-dict": {"0": "any_FB16", "2": "any_FB12"},
                              "optimizer-dict": {"2": {"lr": 0.01}}}))
    spec = build_spec(CIFAR, tiny_args("-tc", str(tc), "--seed", "9", "--bfp", "any_FB8"))
    assert (spec.args.optim_lr, spec.args.seed, spec.args.training_epochs) == (0.5, 9, 3)
    assert dict(spec.plan.precision) == {0: "any_FB8", 2: "any_FB12"}
    assert spec.initial_config == "any_FB8" and spec.plan.optimizer[2]["lr"] == 0.01
    no_bfp = build_spec(CIFAR, tiny_args("-tc", str(tc)))
    assert no_bfp.initial_config == "any_FB16" and dict(no_bfp.plan.precision) == {0: "any_FB16", 2: "any_FB12"}


def test_derived_values_are_set_before_freezing():
    # canonical names, the dataset's epoch count, the task's own derived values
    spec = build_spec(CIFAR, ["-m", "resnet18", "-d", "digits"])
    assert (spec.args.model, spec.args.training_epochs) == ("ResNet18", 4)
    assert build_spec(LM, ["--data", __file__]).args.dataset == "text"
    assert build_spec(LM, []).args.dataset == "pysrc"
    assert build_spec(IMAGENET, ["--do", "Simple/0.1/0.2/50/1", "--bfp", "any_FB16"]).args.do_every == 500


def test_a_resumed_spec_carries_the_checkpoint_and_the_saved_flags(tiny_args, tmp_path):
    assert run_task("cifar", tiny_args("--training-epochs", "2", "--bfp", "any_FB16", "--save", "True",
                                                "--run-name", "r", "--optim-lr", "0.05")) == 0
    spec = build_spec(CIFAR, ["--resume", str(tmp_path / "runs" / "r"), "--progress", "False"])
    assert spec.resumed is not None and spec.resumed.path.name == "last.pt"
    assert (spec.args.optim_lr, spec.args.network_config, spec.args.training_epochs) == (0.05, "any_FB16", 2)
    assert spec.initial_config == spec.resumed.state["network_config"] == "any_FB16"
    with pytest.raises(UsageError, match="these flags differ from it: --optim-lr"):
        build_spec(CIFAR, ["--resume", str(tmp_path / "runs" / "r"), "--optim-lr", "0.1"])


def test_nothing_downstream_changes_the_spec(tiny_args, monkeypatch):
    seen = []
    real = run_mod._train

    def spy(spec, **kw):
        before = dict(vars(spec.args)), spec.plan.to_json()
        out = real(spec, **kw)
        seen.append(before == (dict(vars(spec.args)), spec.plan.to_json()))
        return out
    monkeypatch.setattr(run_mod, "_train", spy)
    # --compare trains twice: its FP32 twin is a variant, not an edit
    assert run_task("cifar", tiny_args("--training-epochs", "1", "--bfp", "any_FB16", "--compare", "True")) == 0
    assert seen == [True, True]


class _ToyHooks(TaskHooks):
    """A fourth script: a two-layer classifier on 4x4 random patterns, defined outside bfp.cli."""

    def canonical_model(self, name):
        if name != "mlp":
            raise ValueError(f"--model {name!r}: allowed: mlp")
        return name

    def canonical_dataset(self, name):
        return "patterns"

    def make_model(self, args, num_classes, in_channels):
        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 16, 8), nn.ReLU(),
                             nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, num_classes))

    def example_input(self, args, in_channels):
        return torch.zeros(2, in_channels, 4, 4), "4x4 patterns"

    def load_data(self, args, device, shard):
        g = torch.Generator().manual_seed(args.seed)
        y = torch.arange(64) % 2
        x = (torch.rand(64, 1, 4, 4, generator=g) * 100 + 100 * y[:, None, None, None]).to(torch.uint8)
        ds = TensorDataset(x, y)
        return DataBundle("patterns", TensorLoader(ds, args.batch_size_train, (0.5,), (0.25,), shuffle=True,
                                                   generator=g),
                          TensorLoader(ds, args.batch_size_test, (0.5,), (0.25,)), 2, 1, ["a", "b"], g)


def test_a_fourth_task_runs_through_the_unchanged_cli(monkeypatch, tmp_path, capsys):
    toy = Task(name="toy", prog="toy.py", summary="toy", description="toy", default_dataset="patterns",
               default_model="mlp", default_epochs=2, default_classes=2, hooks=_ToyHooks())
    monkeypatch.setitem(TASKS, "toy", toy)
    args = ["--in-channels", "1", "--batch-size-train", "16", "--batch-size-test", "32", "--optim-lr", "0.1",
            "--progress", "False", "--device", "cpu", "--run-dir", str(tmp_path), "--run-name", "t", "--log", "True"]
    assert cli_main(["toy", *args, "--bfp", "any_FB16"]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [0, 1] and metrics[-1]["test_acc1"] == 100.0
    assert "1 of 3 convertible layers quantized" in capsys.readouterr().out  # the middle one: FB16
    assert cli_main(["toy", "--model", "conv"]) == 2
    assert "toy: error: --model 'conv': allowed: mlp" in capsys.readouterr().err
