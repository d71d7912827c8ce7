"""cifar.py: the original flags, clear errors, run directory contents, -tc, --compare, generate-config."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bfp.cli import cifar as main
from bfp.cli.flags import build_parser
from bfp.cli.tasks import CIFAR

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL_FLAGS = ["--mode", "-m", "--model", "-d", "--dataset", "-dp", "--dataset-path", "--bfp", "--do",
                  "--do-color", "-tc", "--train-config-file", "--training-epochs", "--batch-size-train",
                  "--batch-size-test", "--optim-lr", "--optim-momentum", "--optim-weight-decay", "--log",
                  "--save", "--save-interval", "--run-dir", "--slackbot", "--num-workers"]
NEW_FLAGS = ["--precision", "--seed", "--resume", "--device", "--do-every", "--gpu-data", "--compare"]


def test_help_documents_every_flag():
    out = subprocess.run([sys.executable, str(ROOT / "cifar.py"), "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    for flag in ORIGINAL_FLAGS + NEW_FLAGS:
        assert f"{flag} " in out or f"{flag}," in out or f"{flag}\n" in out, flag
    for a in build_parser(CIFAR)._actions:
        assert a.help, a.dest  # no flag without an explanation


def test_original_command_parses_with_true_false_booleans():
    a = build_parser(CIFAR).parse_args(["--mode", "train", "--model", "ResNet18", "--dataset", "CIFAR100",
                                   "--log", "True", "--bfp", "ResNet18_FB24", "--do-color", "False"])
    assert a.log is True and a.do_color is False and a.network_config == "ResNet18_FB24"
    assert build_parser(CIFAR).parse_args(["--log"]).log is True


@pytest.mark.parametrize("extra, message", [
    (["-m", "ResNet19"], "unknown model 'ResNet19'"),
    (["-d", "mnist"], "unknown dataset 'mnist'"),
    (["--bfp", "ResNet18_FB99"], "ResNet18_FB99"),
    (["--bfp", "ResNet18_FB16", "--do", "Simple/oops"], "--do Simple/oops"),
    (["--device", "cuda:7"] if not __import__("torch").cuda.is_available() else ["--device", "tpu"], "--device"),
    (["--training-epochs", "0"], "--training-epochs must be >= 1"),
    (["--label-smoothing", "2"], "--label-smoothing must be in [0, 1], got 2"),
    (["--limit-train-images", "1"], "digits: 1 training image(s) (--limit-train-images); training needs at least 2"),
    (["--seed", str(2 ** 64)], f"--seed must be in [-2**63, 2**64), got {2 ** 64}"),
    (["--log", "True", "--run-dir", __file__], f"--run-dir {__file__}"),  # a file, not a directory
    (["--precision", "fp16"] if not __import__("torch").cuda.is_available() else ["--in-channels", "2"],
     "--precision fp16" if not __import__("torch").cuda.is_available() else "--in-channels"),
])
def test_bad_values_exit_2_with_a_message_not_a_traceback(tiny_args, capsys, extra, message):
    assert main(tiny_args(*extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_cifar_names_the_path(tmp_path, capsys, monkeypatch):
    import torchvision

    def offline(*a, **k):
        raise OSError("network unreachable")
    monkeypatch.setattr(torchvision.datasets.CIFAR100, "download", offline)
    assert main(["-d", "CIFAR100", "-dp", str(tmp_path / "nodata"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nodata") in err and "cifar-100-python" in err


def test_bad_boolean_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--log", "maybe"])
    assert e.value.code == 2 and "expected True or False, got 'maybe'" in capsys.readouterr().err


def test_run_directory_holds_config_log_metrics_events_checkpoints(tiny_args, tmp_path):
    assert main(tiny_args("--training-epochs", "2", "--log", "True", "--save", "True", "--save-interval", "1",
                          "--bfp", "ResNet18_FB16", "--histograms", "True", "--run-name", "r")) == 0
    run = tmp_path / "runs" / "r"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["args"]["network_config"] == "ResNet18_FB16" and cfg["args"]["training_epochs"] == 2
    assert cfg["bfpsim_version"] and "git_commit" in cfg and cfg["network_config"]["config"] == "ResNet18_FB16"
    assert "layer1.0.conv1" in cfg["network_config"]["layers"]
    assert "epoch 2/2" in (run / "log.txt").read_text() and "QConv2d" in (run / "log.txt").read_text()
    assert [json.loads(l)["epoch"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert list(run.glob("events.out.tfevents.*"))
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"last.pt", "best.pt", "epoch_001.pt",
                                                                 "epoch_002.pt"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(run)).Reload()
    assert {"loss/train", "accuracy/test_top1", "lr", "throughput/images_per_s"} <= set(ea.Tags()["scalars"])
    assert "precision/text_summary" in ea.Tags()["tensors"]


def test_nothing_is_written_without_log_or_save(tiny_args, tmp_path):
    assert main(tiny_args("--training-epochs", "1")) == 0
    assert not (tmp_path / "runs").exists()


def test_train_config_file_presets_flags_and_rejects_unknown_keys(tiny_args, tmp_path, capsys):
    tc = tmp_path / "tc.json"
    tc.write_text(json.dumps({"training-epochs": 2, "optim-lr": 0.05, "log": True,
                              "bfp-layer-conf-dict": {"0": "ResNet18_FB16", "1": "ResNet18_FB12"}}))
    assert main(tiny_args("-tc", str(tc), "--run-name", "t", "--optim-lr", "0.02")) == 0
    run = tmp_path / "runs" / "t"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["args"]["training_epochs"] == 2 and cfg["args"]["optim_lr"] == 0.02  # flag beats file
    assert cfg["epoch_plan"]["bfp-layer-conf-dict"] == {"0": "ResNet18_FB16", "1": "ResNet18_FB12"}
    assert "epoch 2/2 (plan key 1): switching network config to 'ResNet18_FB12'" in (run / "log.txt").read_text()

    tc.write_text(json.dumps({"trainig-epochs": 2}))
    assert main(tiny_args("-tc", str(tc))) == 2
    err = capsys.readouterr().err
    assert str(tc) in err and "unknown key 'trainig-epochs'" in err
    for bad, why in (({"training-epochs": [5]}, "must be a single value, got [5]"),
                     ({"training-epochs": 2.5}, "invalid literal for int() with base 10: '2.5'"),
                     ({"training-epochs": True}, "invalid literal for int() with base 10: 'True'"),
                     ({"run-dir": None}, "cannot be null"),
                     ({"model-opt": ["width=4"]}, 'must be an object like {"width": 16}')):
        tc.write_text(json.dumps(bad))
        assert main(tiny_args("-tc", str(tc))) == 2
        err = capsys.readouterr().err
        assert str(tc) in err and why in err and "Traceback" not in err
    tc.write_text(json.dumps({"run-name": 7, "log": True}))  # a number is text, as on the command line
    assert main(tiny_args("-tc", str(tc), "--training-epochs", "1")) == 0 and (tmp_path / "runs" / "7").is_dir()
    tc.write_text(json.dumps({"bfp-layer-conf-dict": {"1": "ResNet18_FB77"}}))
    assert main(tiny_args("-tc", str(tc), "--training-epochs", "2")) == 2
    assert "bfp-layer-conf-dict[1]" in capsys.readouterr().err  # caught before training starts


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "conf_train").glob("*.json")))
def test_shipped_training_configs_parse(name, monkeypatch):
    from bfp.cli.train_config import parse_args
    monkeypatch.chdir(ROOT)
    args, plan, path = parse_args(CIFAR, ["-tc", name])
    plan.check_epochs(args.training_epochs, str(path))
    assert path.name == f"{name}.json"
    import bfp.models
    from bfp.cli.run import check_plan_configs
    small = {"width": 4} if "width" in bfp.models.options(args.model) else {}
    model = bfp.models.create(args.model, 10, **{**dict(args.model_opt), **small})
    check_plan_configs(model, plan, None, str(path))  # every scheduled network config converts the model


def test_unknown_training_config_lists_the_available_ones(capsys):
    assert main(["-tc", "NoSuchConfig"]) == 2
    assert "ResNet18_CIFAR100_Mixed" in capsys.readouterr().err


def test_compare_prints_fp32_and_bfp_side_by_side(tiny_args, capsys):
    assert main(tiny_args("--training-epochs", "1", "--bfp", "ResNet18_FB12", "--compare", "True")) == 0
    out = capsys.readouterr().out
    table = out[out.index("test top-1 (last)") - 60:]
    assert "FP32" in table and "ResNet18_FB12" in table and "total time" in table and "ratio" in table


def test_generate_config_lists_every_layer_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "gen.json"
    assert main(["--mode", "generate-config", "-m", "ResNet18", "--config-out", str(out)]) == 0
    cfg = json.loads(out.read_text())
    assert "default" in cfg and "net.layer2.0.shortcut.0" in cfg and "net.linear" in cfg and len(cfg) == 22
    out.write_text("{}")
    assert main(["--mode", "generate-config", "-m", "ResNet18", "--config-out", str(out)]) == 2
    assert out.read_text() == "{}" and "--overwrite" in capsys.readouterr().err
    for where, why in ((tmp_path, "is a directory"), (out / "x.json", "cannot write")):
        assert main(["--mode", "generate-config", "-m", "ResNet18", "--config-out", str(where),
                     "--overwrite", "True"]) == 2
        err = capsys.readouterr().err
        assert why in err and str(where) in err and "Traceback" not in err
    assert out.read_text() == "{}"


def test_dynamic_precision_plugs_in_as_a_callback(tiny_args, tmp_path):
    assert main(tiny_args("--training-epochs", "2", "--bfp", "ResNet18_FB16", "--do", "Simple/0.1/0.2/0/1",
                          "--save", "True", "--run-name", "d")) == 0
    from bfp.engine.checkpoint import load
    st = load(tmp_path / "runs" / "d" / "checkpoints" / "last.pt")
    assert "dynamic_precision" in st["callbacks"]


def test_draw_curve_writes_pngs(tiny_args, tmp_path):
    assert main(tiny_args("--training-epochs", "2", "--log", "True", "--run-name", "p")) == 0
    r = subprocess.run([sys.executable, str(ROOT / "draw_curve.py"), str(tmp_path / "runs" / "p"),
                        "-o", str(tmp_path / "png")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for name in ("loss.png", "accuracy.png"):
        assert (tmp_path / "png" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = subprocess.run([sys.executable, str(ROOT / "draw_curve.py"), str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2 and "metrics.jsonl" in r.stderr
    (tmp_path / "runs" / "p" / "metrics.jsonl").write_text('{"epoch": 0, "test_loss": 1}\n[1, 2]\n')
    r = subprocess.run([sys.executable, str(ROOT / "draw_curve.py"), str(tmp_path / "runs" / "p"),
                        "-o", str(tmp_path / "png2")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "metrics.jsonl:2: not a JSON record" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "runs" / "p" / "metrics.jsonl").write_text('{"epoch": 0, "test_loss": 1}\n')
    r = subprocess.run([sys.executable, str(ROOT / "draw_curve.py"), str(tmp_path / "runs" / "p"),
                        "-o", str(tmp_path / "png2")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "records without test_acc1, train_acc1, train_loss" in r.stderr


def test_a_model_built_for_another_image_size_is_a_usage_error(tiny_args, capsys):
    args = tiny_args()
    i = args.index("--model-opt")
    del args[i:i + 2]  # the tiny ResNet's width=4
    assert main(args + ["-m", "MLPMixer", "--model-opt", "image_size=64"]) == 2
    err = capsys.readouterr().err
    assert "--model MLPMixer --model-opt image_size=64 does not take 32x32 images" in err
