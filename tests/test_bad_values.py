"""Values that used to give a traceback, be accepted silently, or write outside --run-dir: each is
now refused with exit status 2 naming the value and what is allowed, before anything is written."""
import json

import pytest

from bfp.cli import cifar


def main(argv):
    """cifar.py's exit status: argparse's own refusals exit through SystemExit."""
    try:
        return cifar(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("flags, said", [
    (["--run-name", "../../x"], ["--run-name '../../x'", "one plain directory name"]),
    (["--run-name", "a/b"], ["--run-name 'a/b'", "one plain directory name"]),
    (["--run-name", ".."], ["--run-name '..'"]),
    (["--use-lars", "--lars-trust", "nan"], ["--lars-trust must be a finite number >= 0, got nan"]),
    (["--use-lars", "--lars-trust", "inf"], ["--lars-trust must be a finite number >= 0, got inf"]),
    (["--loss-scale", "1e-50"], ["--loss-scale '1e-50'", "[1.2e-38, 3.4e38]"]),
    (["--loss-scale", "1e39"], ["--loss-scale '1e39'", "[1.2e-38, 3.4e38]"]),
    (["--loss-scale", "dynamic", "--loss-scale-init", "1e-50"], ["'1e-50'", "a normal float32"]),
    (["--optim-lr", "1e308"], ["--optim-lr must be a number in [0, 3.4e38]", "1e+308"]),
    (["--optim-momentum", "5"], ["--optim-momentum must be a number in [0, 1], got 5.0"]),
    (["--optim-weight-decay", "-1"], ["--optim-weight-decay must be", "got -1.0"]),
    (["--threads", "100000"], ["--threads must be in [0, ", "got 100000"]),
])
def test_a_bad_value_is_refused_naming_it_before_anything_is_written(tiny_args, tmp_path, capsys, flags, said):
    assert main(tiny_args("--log", "True", "--save", "True", *flags)) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said), err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "x").exists()


@pytest.mark.parametrize("content, said", [
    (b'{"optim-lr": 0.1, "note": "\xff"}', ["is not UTF-8 text (byte 27: b'\\xff')"]),
    (json.dumps({"optimizer-dict": {"1": {"momentum": 5}}}).encode(),
     ["optimizer-dict['1']['momentum'] must be a number in [0, 1], got 5"]),
    (json.dumps({"bfp-layer-conf-dict": {"0": "NoSuchPreset"}}).encode(),
     ["-tc ", "tc.json: bfp-layer-conf-dict[0] NoSuchPreset: NoSuchPreset: no such config file or preset"]),
    (json.dumps({"bfp-layer-conf-dict": {"0": "any_FB16", "1": "Nope"}}).encode(),
     ["tc.json: bfp-layer-conf-dict[1] Nope"]),
])
def test_a_bad_training_config_file_is_named_with_its_key(tiny_args, tmp_path, capsys, content, said):
    (tmp_path / "tc.json").write_bytes(content)
    assert main(tiny_args("--log", "True", "-tc", str(tmp_path / "tc.json"), "--training-epochs", "2")) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said), err
    assert "--bfp" not in err and "Traceback" not in err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mode", ["diagnose", "sweep", "generate-config"])
def test_training_engine_flags_are_refused_where_no_step_is_trained(tiny_args, capsys, mode):
    """Issue 53, item 12: --cuda-graph and --compile were accepted and ignored outside training."""
    from bfp.cli import cifar as main
    for flags, named in ((["--cuda-graph", "True"], "--cuda-graph sets"), (["--compile", "default"], "--compile sets")):
        assert main(tiny_args("--mode", mode, "--bfp", "any_FB16", *flags)) == 2
        assert f"{named} how training steps run; --mode {mode} trains no step" in capsys.readouterr().err


def test_fewer_images_than_one_global_batch_over_several_workers_is_a_clear_error(tiny_args, capsys):
    """Issue 53, item 13: with more than one worker the incomplete last global batch is dropped, so 64
    images and a global batch of 128 made no step (total_steps 0 traceback); one worker keeps it."""
    from bfp.cli import cifar as main
    from bfp.data.bundle import DataError, check_train_size
    argv = tiny_args("--batch-size-train", "128", "--training-epochs", "1")
    assert main([*argv, "--emulate-node", "2"]) == 2
    err = capsys.readouterr().err
    assert "64 training images are fewer than one global batch of 128 (--batch-size-train); with 2 workers" in err
    assert "use a global batch of at most 64" in err and "Traceback" not in err
    assert main(argv) == 0  # one worker: the incomplete batch is trained
    check_train_size("x", 7, 8, 1)
    with pytest.raises(DataError, match="at most 6 .a multiple of 2."):
        check_train_size("x", 7, 8, 2)
