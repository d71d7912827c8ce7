"""imagenet.py: torchvision models on the shared engine, the seed's presets on them, ImageNet folders."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfp.cli import run_task
from bfp.engine import checkpoint as ckpt
from image_tree import make_tree

ROOT = Path(__file__).resolve().parents[1]
FP32_LAYERS = ["conv1", "layer2.0.downsample.0", "layer3.0.downsample.0", "layer4.0.downsample.0", "fc"]


def quick(tree, runs, *extra):
    return [str(tree), "-a", "resnet18", "--image-size", "16", "-b", "4", "--batch-size-test", "8", "-j", "0",
            "--device", "cpu", "--threads", "1", "--progress", "False", "--run-dir", str(runs), *extra]


def report_rows(text):
    return {line.split()[0]: line.split()[1] for line in text.splitlines()
            if len(line.split()) > 2 and line.split()[1] in ("Conv2d", "QConv2d", "Linear", "QLinear")
            and not line.startswith(" ")}  # the coverage lines below the table are indented


def test_resnet18_preset_keeps_the_cifar_presets_fp32_layers(tmp_path, capsys):
    out = tmp_path / "r18.json"
    assert run_task("imagenet", ["-a", "resnet18", "--bfp", "ResNet18_FB12LG24", "--mode", "generate-config",
                                 "--config-out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = report_rows(text)
    assert sorted(n for n, t in rows.items() if not t.startswith("Q")) == sorted(FP32_LAYERS)
    assert len(rows) == 21 and "16 of 21 convertible layers quantized" in text
    cfg = json.loads(out.read_text())
    assert cfg["net.layer2.0.downsample.0"] == {"type": "default"} and cfg["net.fc"] == {"type": "default"}
    assert cfg["net.layer1.0.conv1"]["fw_bit"] == 4 and cfg["net.layer1.0.conv1"]["fw_dim"] == [1, 24, 3, 3]


def test_generate_config_for_any_torchvision_arch_and_a_preset_for_another_model_is_refused(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert run_task("imagenet", ["-a", "MobileNet_V3_Small", "--mode", "generate-config", "--config-out",
                                 str(out)]) == 0
    names = [k for k in json.loads(out.read_text()) if k != "default"]
    assert names[0] == "net.features.0.0" and names[-1] == "net.classifier.3"
    capsys.readouterr()
    assert run_task("imagenet", ["-a", "vgg11", "--bfp", "ResNet18_FB12LG24", "--mode", "generate-config",
                                 "--config-out", str(tmp_path / "v.json")]) == 2
    err = capsys.readouterr().err
    assert "'net.layer2.0.shortcut.0': matches no convertible layer" in err
    assert "convertible layers: features.0, features.3" in err and not (tmp_path / "v.json").exists()
    assert run_task("imagenet", ["-a", "resnet19"]) == 2
    assert "not a torchvision model (did you mean resnet18" in capsys.readouterr().err


def test_bfp_imagenet_is_imagenet_py(tmp_path):
    args = ["-a", "resnet18", "--mode", "generate-config", "--config-out"]
    code = "import sys; from bfp.cli import main; sys.exit(main())"
    a = subprocess.run([sys.executable, str(ROOT / "imagenet.py"), *args, str(tmp_path / "a.json")],
                       capture_output=True, text=True, timeout=120)
    b = subprocess.run([sys.executable, "-c", code, "imagenet", *args, str(tmp_path / "b.json")],
                       capture_output=True, text=True, timeout=120)
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()


def test_trees_without_val_or_with_other_classes_are_refused_before_training(tmp_path, capsys):
    make_tree(tmp_path / "t", bad=False)
    shutil.rmtree(tmp_path / "t" / "val")
    assert run_task("imagenet", quick(tmp_path / "t", tmp_path / "runs")) == 2
    assert "has no train/ and val/ class folders (found: train)" in capsys.readouterr().err
    make_tree(tmp_path / "u", bad=False)
    (tmp_path / "u" / "val" / "dog").rename(tmp_path / "u" / "val" / "cow")
    assert run_task("imagenet", quick(tmp_path / "u", tmp_path / "runs")) == 2
    assert "class folders differ: only in train: ['dog']; only in val: ['cow']" in capsys.readouterr().err
    assert run_task("imagenet", quick(tmp_path / "missing", tmp_path / "runs")) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_pretrained_weights_only_from_disk(tmp_path, capsys, monkeypatch):
    make_tree(tmp_path / "t", bad=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    assert run_task("imagenet", quick(tmp_path / "t", tmp_path / "runs", "--pretrained", "-e")) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'hub'}/hub/checkpoints/resnet18-" in err and "never downloaded" in err
    import torchvision
    weights = torchvision.models.resnet18(num_classes=1000).state_dict()  # an ImageNet-shaped classifier
    torch.save(weights, tmp_path / "w.pth")
    assert run_task("imagenet", quick(tmp_path / "t", tmp_path / "runs", "--pretrained", str(tmp_path / "w.pth"),
                                      "-e")) == 0
    out = capsys.readouterr().out
    assert f"pretrained: {len(weights) - 2} tensors from {tmp_path / 'w.pth'}; kept initialised (shape differs " \
           "or absent): fc.bias, fc.weight" in out and "top-1 " in out
    assert "; CRC-32 of every member checked" in out


def test_pretrained_files_that_are_damaged_malicious_or_a_directory_are_refused_clearly(tmp_path, capsys):
    make_tree(tmp_path / "t", bad=False)
    import os
    import torchvision
    weights = torchvision.models.resnet18(num_classes=1000).state_dict()
    torch.save(weights, tmp_path / "w.pth")
    raw = bytearray((tmp_path / "w.pth").read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):   # bits flipped inside a tensor's bytes
        raw[i] ^= 0xFF
    (tmp_path / "flipped.pth").write_bytes(bytes(raw))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))
    torch.save({"x": Evil()}, tmp_path / "evil.pth")
    (tmp_path / "adir").mkdir()
    for name, said in (("flipped.pth", "does not match its CRC-32"), ("evil.pth", "holds Python objects"),
                       ("adir", "is a directory; give the weights file")):
        assert run_task("imagenet", quick(tmp_path / "t", tmp_path / "runs", "--pretrained",
                                          str(tmp_path / name), "-e")) == 2
        err = capsys.readouterr().err
        assert said in err and name in err and "Traceback" not in err, err
        assert "weights_only=False will likely succeed" not in err and "not on disk" not in err
    # a file written without CRC-32s loads, and says it could not be checked
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(weights, tmp_path / "nocrc.pth")
    finally:
        torch.serialization.set_crc32_options(True)
    assert run_task("imagenet", quick(tmp_path / "t", tmp_path / "runs", "--pretrained",
                                      str(tmp_path / "nocrc.pth"), "-e")) == 0
    assert "not integrity-checked: the file was written with its CRC-32s turned off" in capsys.readouterr().out


def test_train_with_bfp_and_do_skipping_bad_images_then_resume_and_evaluate(tmp_path, capsys):
    bad = make_tree(tmp_path / "t")
    runs = tmp_path / "runs"
    args = quick(tmp_path / "t", runs, "--epochs", "2", "--bfp", "ResNet18_FB12LG24", "--do",
                 "Simple/0.6/0.8/0/1", "--do-every", "2", "--save", "True", "--save-interval", "1",
                 "--log", "True", "--run-name", "r", "-b", "5", "-p", "2")  # 15 files: 3 steps an epoch
    assert run_task("imagenet", args) == 0
    out, err = capsys.readouterr()
    run = runs / "r"
    straight = ckpt.load(run / "checkpoints" / "last.pt")
    assert all(err.count(f"skipping unreadable image {p}:") == 1 for p in bad.values())  # once in 2 epochs
    log = (run / "log.txt").read_text()
    assert log.count("skipped 3 unreadable train image(s)") == 2
    assert "dynamic precision decision 1 (step 4" in out
    assert "step 2 (epoch 1/2): lr 0.100000" in out and "step 4 (epoch 2/2): lr 0.010000, " in out  # -p 2
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # epoch 0 trains at 0.1, epoch 1 (past the first third) at 0.1 * 0.1; "lr" is the next step's
    assert [m["lr"] for m in metrics] == [0.1 * 0.1, 0.1 * 0.1]
    assert all(m["test_acc5"] == 100.0 for m in metrics)  # two classes: top-5 holds every label
    assert straight["precision_state"]["layer1.0.conv1"]["fw"]["bits"] in (4, 8, 16)
    assert "layer2.0.downsample.0" not in straight["precision_state"]

    branch = runs / "branch"
    shutil.copytree(run, branch)
    (branch / "checkpoints" / "last.pt").unlink()
    assert run_task("imagenet", [*args, "--resume", str(branch / "checkpoints" / "epoch_001.pt")]) == 0
    resumed = ckpt.load(branch / "checkpoints" / "last.pt")
    for k, v in straight["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    assert resumed["precision_state"] == straight["precision_state"]

    capsys.readouterr()
    assert run_task("imagenet", quick(tmp_path / "t", runs, "-b", "5", "-e", "--resume", str(run))) == 0
    out = capsys.readouterr().out
    assert "layer2.0.downsample.0" in out and "evaluate resnet18 on imagenet: 15 train / 12 test" in out
    assert "top-1 " in out and "top-5 100.00%" in out


@pytest.mark.parametrize("flags, message", [
    (["--image-size", "4"], "--image-size must be >= 8, got 4"),
    (["--gpu-data", "True"], "--gpu-data keeps a whole dataset"),
    (["-e"], "-e/--evaluate needs weights"),
    (["--dataset", "CIFAR10"], "imagenet.py reads an image-folder tree"),
    (["--world-size", "2", "--rank", "2"], "--rank must be in 0..1 (--world-size 2), got 2"),
    (["--world-size", "2", "--rank", "0", "--dist-url", "udp://x:1"], "expected tcp://HOST:PORT or env://"),
])
def test_bad_flags_exit_2_naming_the_value(tmp_path, capsys, flags, message):
    assert run_task("imagenet", quick(tmp_path / "none", tmp_path / "runs", *flags)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, every", [(["--do", "Simple/0.1/0.2/50/1"], 500),
                                          (["--do", "Simple/0.1/0.2/50/1/5"], "epoch"),  # the seed's: spec says 5
                                          (["--do", "Simple/0.1/0.2/50/1", "--do-every", "7"], 7)])
def test_do_decides_every_500_steps_unless_told_otherwise(extra, every):
    from bfp.cli.spec import build_spec
    from bfp.cli.tasks import IMAGENET
    args = build_spec(IMAGENET, ["--arch", "resnet18", "--bfp", "ResNet18_FB12LG24", *extra]).args
    assert args.do_every == every and args.lr_schedule == "thirds" and args.training_epochs == 90
    assert (args.batch_size_train, args.num_workers, args.optim_weight_decay) == (256, 4, 1e-4)


def test_the_examples_spellings_set_the_shared_flags():
    from bfp.cli.flags import build_parser
    from bfp.cli.tasks import IMAGENET
    p = build_parser(IMAGENET)
    a = p.parse_args(["DIR", "-a", "vgg16", "-j", "3", "-b", "64", "--epochs", "9", "--lr", "0.2", "--momentum",
                      "0.8", "--wd", "0.002", "--gpu", "1", "--seed", "5"])
    assert (a.dataset_path, a.model, a.num_workers, a.batch_size_train, a.training_epochs, a.optim_lr) == \
        ("DIR", "vgg16", 3, 64, 9, 0.2)
    assert (a.optim_momentum, a.optim_weight_decay, a.device, a.seed) == (0.8, 0.002, "cuda:1", 5)
    assert p.parse_args(["--data", "D"]).dataset_path == "D" and p.parse_args([]).dataset_path is None


def test_imagenet_batches_are_the_same_for_any_worker_count_and_carry_a_fingerprint(tmp_path):
    from bfp.data.imagenet import load_imagenet
    make_tree(tmp_path / "t", bad=False)
    bundles = [load_imagenet(str(tmp_path / "t"), 16, batch_size_train=4, num_workers=w, seed=3) for w in (0, 2)]
    epochs = [[[(x.clone(), y.clone()) for x, y in b.train] for _ in range(2)] for b in bundles]
    for ep0, ep2 in zip(*epochs):
        assert len(ep0) == len(ep2) == 3
        for (x0, y0), (x2, y2) in zip(ep0, ep2):
            assert torch.equal(x0, x2) and torch.equal(y0, y2)
    assert not torch.equal(epochs[0][0][0][0], epochs[0][1][0][0])  # epochs draw other crops
    fp = bundles[0].fingerprint
    assert fp["dataset"] == "imagenet" and fp["classes"] == ["cat", "dog"] and fp["train_images"] == 12
