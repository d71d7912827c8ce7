"""Network and training configs that used to pass validation and fail later, or crash the
JSON reader: an MX axis the layer's tensors do not have, a 100k-deep nesting."""
import json

import pytest
import torch.nn as nn

import bfp
from bfp.cli import cifar as main
from bfp.config import ConfigError, load_config


def _mx_config(tmp_path, axis):
    path = tmp_path / "mx.json"
    path.write_text(json.dumps({"version": 1, "default": {"operands": {"mx": "e2m1", "axis": axis}}}))
    return path


@pytest.mark.parametrize("layer, type_name, allowed", [
    (nn.Linear(4, 4), "Linear", "-2..1"), (nn.Conv2d(1, 2, 3), "Conv2d", "-4..3"),
    (nn.Conv1d(1, 2, 3), "Conv1d", "-3..2")])
def test_an_mx_axis_outside_the_layers_tensors_names_the_file_and_the_layer(tmp_path, layer, type_name, allowed):
    path = _mx_config(tmp_path, 9)
    model = nn.Sequential(layer)
    with pytest.raises(ConfigError, match=rf"mx\.json: layer '0' \({type_name}\), point fw: MX axis 9 is out "
                                          rf"of range; a {type_name}'s tensors have \d dimensions, "
                                          rf"allowed axes: {allowed}"):
        bfp.convert(model, str(path))


def test_an_mx_axis_in_range_converts_where_it_is_the_points_contraction_axis(tmp_path):
    path = tmp_path / "fw.json"
    path.write_text(json.dumps({"version": 1, "default": {"fw": {"mx": "e2m1", "axis": -3}}}))
    model = bfp.convert(nn.Sequential(nn.Conv2d(1, 2, 3)), str(path))
    assert model[0].precision.fw.axis == -3  # channels: the forward GEMM's contraction axis
    with pytest.raises(ConfigError, match=r"point fw: MX blocks lie along axis -4, but this point's GEMM "
                                          r"contracts along axis 1"):  # in range, but across output channels
        bfp.convert(nn.Sequential(nn.Conv2d(1, 2, 3)), str(_mx_config(tmp_path, -4)))


def test_an_mx_axis_of_9_is_a_usage_error_before_anything_is_written(tmp_path, tiny_args, capsys):
    path = _mx_config(tmp_path, 9)
    assert main(tiny_args("--bfp", str(path), "--log", "True", "--run-name", "mx")) == 2
    err = capsys.readouterr().err
    assert "mx.json" in err and "MX axis 9 is out of range" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "mx").exists()


def test_a_100k_deep_network_config_is_a_clear_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"deep\.json: JSON nested too deeply to read"):
        load_config(str(path))


def test_a_100k_deep_training_config_is_a_usage_error(tmp_path, tiny_args, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(tiny_args("-tc", str(path))) == 2
    err = capsys.readouterr().err
    assert "deep.json': JSON nested too deeply to read" in err and "Traceback" not in err


@pytest.mark.parametrize("spec", [{"nvfp4": [16, 16, 16]}, {"mx": "e2m1", "block": [8, 8, 8]}])
def test_a_block_of_three_dimensions_is_a_config_error(tmp_path, spec):
    from bfp.config.specs import parse_format
    with pytest.raises(ConfigError, match=r"block must be a positive integer or a list of one or two .* got "
                                          r"\[\d+, \d+, \d+\]"):
        parse_format(spec, source="c.json", where="fw")
