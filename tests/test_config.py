"""Network configs: both JSON forms, inheritance, shorthands, rules and every error path."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bfp.config import (ConfigError, NetConfig, Rule, config_from_dict, legacy_dict, legacy_entry,
                        legacy_group, load_config, preset_names)
from bfp.formats import BlockFloat, Float, format_from_name
from bfp.formats.mx import MX
from bfp.precision import POINTS, LayerPrecision

FB12, FB16, FB24 = BlockFloat(4, (1, 24, 3, 3)), BlockFloat(8, (1, 12, 3, 3)), BlockFloat(16, (1, 6, 3, 3))
RESNET18 = {"conv1": "Conv2d", "layer1.0.conv1": "Conv2d", "layer1.0.conv2": "Conv2d",
            "layer2.0.shortcut.0": "Conv2d", "linear": "Linear"}


def raises(match, fn, *args, **kw):
    with pytest.raises(ConfigError, match=match) as e:
        fn(*args, **kw)
    return str(e.value)


# -- the original form: defaults and inheritance --------------------------------------

def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


def test_legacy_empty_entry_has_the_originals_defaults():
    p = legacy_entry({})
    fw, fi = BlockFloat(8, (16, 1, 3, 3)), BlockFloat(8, (4, 1, 3, 3))
    assert (p.fw, p.fi, p.biw) == (fw, fi, fw)
    assert p.bio == p.bwo == p.bwi == fi
    assert p.fo is p.bwg is p.big is None
    assert all(getattr(p, q).rounding.value == "truncate" for q in POINTS if getattr(p, q) is not None)


def test_legacy_inheritance_fi_to_bio_bwo_bwi_and_fw_to_biw():
    p = legacy_entry({"fw_bit": 5, "fw_dim": [1, 8, 1, 1], "fi_bit": 6, "fi_dim": [1, 16, 1, 1]})
    assert p.fw == p.biw == BlockFloat(5, (1, 8, 1, 1), "truncate")
    assert p.fi == p.bio == p.bwo == p.bwi == BlockFloat(6, (1, 16, 1, 1))
    # fi_bit itself inherits fw_bit; its group has its own default
    q = legacy_entry({"fw_bit": 5})
    assert q.fi == q.bio == BlockFloat(5, (4, 1, 3, 3))


def test_legacy_switches_and_off_points_still_pass_settings_on():
    p = legacy_entry({"fi": False, "fi_bit": 6, "bwg": True, "fo": True, "fo_bit": 10, "big": True})
    assert p.fi is None and p.bio == BlockFloat(6, (4, 1, 3, 3))
    assert p.bwg == BlockFloat(8, (4, 1, 3, 3))      # fw's bits, its own group
    assert p.fo == BlockFloat(10, (1, 1, 1, 1))
    assert p.big == BlockFloat(6, (1, 1, 1, 1))      # fi's bits


def test_legacy_layer_entry_replaces_the_default_entirely():
    cfg = config_from_dict({"default": {"fw_bit": 4, "fi_bit": 4}, "net.layer1.0.conv1": {"fi_bit": 6}})
    p = cfg.resolve("layer1.0.conv1")
    assert p.fw.bits == 8 and p.fi.bits == 6
    assert cfg.resolve("layer1.0.conv2").fw.bits == 4


def test_legacy_type_default_is_full_precision_and_net_prefix_optional():
    cfg = config_from_dict({"default": {}, "net.conv1": {"type": "default"}, "linear": {"type": "default"},
                            "net.layer1.0.conv1": {"type": "torch.nn.Conv2d"}})
    assert cfg.resolve("conv1") is None and cfg.resolve("linear") is None
    assert cfg.resolve("layer1.0.conv1") is None
    assert cfg.resolve("layer1.0.conv2") is not None
    # a real module called net.conv1 (a wrapper) also matches the entry
    assert cfg.resolve("net.conv1") is None


def test_legacy_without_default_leaves_unlisted_layers_alone():
    cfg = config_from_dict({"net.layer1.0.conv1": {}})
    assert cfg.resolve("layer1.0.conv2") is None and cfg.resolve("layer1.0.conv1") is not None


@pytest.mark.parametrize("value,linear,group", [
    ("wi,36", False, (4, 1, 3, 3)), ("wo,216", False, (1, 24, 3, 3)), ("fc,108", False, (1, 12, 3, 3)),
    ("fx,12", False, (1, 1, 4, 3)), ("fy, 12", False, (1, 1, 3, 4)), ("FC,9", False, (1, 1, 3, 3)),
    ("fc,16", True, (16, 1)), ("wi,36", True, (36, 1)), (1, False, (1, 1, 1, 1)), (1, True, (1, 1)),
    ([1, 8, 1, 1], False, (1, 8, 1, 1)), ([1, 53], True, (1, 53)),
])
def test_legacy_group_shorthands(value, linear, group):
    assert legacy_group(value, linear) == group


def test_legacy_linear_type_reads_shorthands_for_2d():
    p = legacy_entry({"type": "Linear", "fw_dim": "fc,16"})
    assert p.fw.group == (16, 1) and p.fi.group == (4, 1)


@pytest.mark.parametrize("value", ["fc,16", "fx,10", "zz,9", "fc", "fc,0", "fc,abc", [1, 0, 3, 3], [],
                                   [1, 2, 3, 4, 5], [1.5, 2], True, 2, {"a": 1}])
def test_legacy_bad_groups_are_named(value):
    msg = raises("fw_dim", config_from_dict, {"default": {"fw_dim": value}})
    assert "<dict>: default.fw_dim" in msg and ("allowed" in msg or "multiple of" in msg)


@pytest.mark.parametrize("bits", [0, 25, -1, 4.5, "8", True])
def test_legacy_impossible_bits(bits):
    msg = raises("impossible", config_from_dict, {"net.conv1": {"bio_bit": bits}})
    assert "net.conv1.bio_bit" in msg and "1..24" in msg


def test_legacy_unknown_key_suggests_and_lists_allowed():
    msg = raises("unknown key", config_from_dict, {"default": {"fw_bitt": 4}})
    assert "'fw_bitt' (did you mean 'fw_bit'?)" in msg and "allowed: type, fw, fw_bit, fw_dim" in msg


def test_legacy_other_errors():
    raises(r"net\.conv1\.type.*allowed: 'default'", config_from_dict, {"net.conv1": {"type": "fp32"}})
    raises("takes no other keys", config_from_dict, {"net.conv1": {"type": "default", "fw_bit": 4}})
    raises(r"net\.conv1\.fw.*allowed: true, false", config_from_dict, {"net.conv1": {"fw": 1}})
    raises("must be an object", config_from_dict, {"net.conv1": "default"})
    raises("same layer as 'net.conv1'", config_from_dict, {"net.conv1": {}, "conv1": {}})
    raises("must be a JSON object", config_from_dict, [1, 2])


def test_legacy_dict_round_trips_and_refuses_what_it_cannot_say():
    for entry in ({}, {"fi": False, "bwg": True, "fw_dim": "wi,36"}, {"type": "Linear", "bio_bit": 3}):
        p = legacy_entry(entry)
        d = legacy_dict(p, linear=entry.get("type") == "Linear")
        assert legacy_entry(d) == p and len(d) == 28
    off = {q: False for q in POINTS}
    assert legacy_dict(legacy_entry(off)) == {"type": "default"}
    assert legacy_dict(None) == {"type": "default"}
    raises("precision_state", legacy_dict, LayerPrecision(fw=format_from_name("float8_e4m3fn")))
    raises("truncating", legacy_dict, LayerPrecision(fw=BlockFloat(4, (1, 16), "nearest")))


_LEGACY_VALUE = {"": st.booleans(), "_bit": st.integers(1, 24),
                 "_dim": st.one_of(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.just(1),
                                   st.sampled_from(["wi,36", "wo,216", "fc,108", "fx,12", "fy,6"]))}


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from([p + s for p in POINTS for s in _LEGACY_VALUE]), st.none(), max_size=12)
       .flatmap(lambda keys: st.fixed_dictionaries({k: _LEGACY_VALUE[k[k.find("_"):] if "_" in k else ""]
                                                    for k in keys})),
       st.booleans())
def test_legacy_entry_round_trips_through_legacy_dict(entry, linear):
    if linear:
        entry = {"type": "Linear", **entry}
    p = legacy_entry(entry)
    assert (legacy_entry(legacy_dict(p, linear)) or LayerPrecision()) == p  # all off = full precision
    for q in POINTS:  # a point is on exactly when its switch (or the original's default) says so
        assert (getattr(p, q) is not None) == entry.get(q, q in ("fw", "fi", "bwo", "bwi", "bio", "biw")), q


# -- the rule form --------------------------------------------------------------------

def test_rule_form_format_name_sets_the_six_operands():
    p = config_from_dict({"version": 1, "default": "fb16"}).resolve("anything")
    assert all(getattr(p, q) == FB16 for q in ("fw", "fi", "bwo", "bwi", "bio", "biw"))
    assert p.fo is p.bwg is p.big is None


def test_rule_form_point_overrides_rounding_and_specs():
    cfg = config_from_dict({"version": 1, "rounding": "nearest", "backward_source": "quantized",
                            "default": {"operands": "fb16", "bio": "fb24", "fw": None,
                                        "bwg": {"bfp": 4, "group": [1, 16, 1, 1], "rounding": "stochastic"},
                                        "fo": {"float": [4, 3]}, "big": {"float": "float8_e5m2", "subnormals": False}}})
    p = cfg.resolve("x")
    assert p.fw is None and p.fi == BlockFloat(8, (1, 12, 3, 3), "nearest")
    assert p.bio == BlockFloat(16, (1, 6, 3, 3), "nearest")
    assert p.bwg == BlockFloat(4, (1, 16, 1, 1), "stochastic")
    assert p.fo == Float(4, 3, rounding="nearest")
    assert p.big == Float(5, 2, subnormals=False)
    assert p.backward_source == "quantized"


def test_rule_form_mx_named_and_saved_specs():
    p = config_from_dict({"version": 1, "default": {
        "fw": {"mx": "float8_e4m3fn", "block": 32, "axis": 1},
        "fi": {"mx": [2, 1], "block": 16, "rounding": "stochastic"},
        "bio": {"name": "mxfp4_e2m1", "rounding": "truncate"},
        "biw": {"mx": "int8"},
        "bwo": format_from_name("mxfp6_e3m2").to_dict()}}).resolve("x")
    assert p.fw == MX(format_from_name("float8_e4m3fn"), 32, 1)
    assert p.fi == MX(Float(2, 1, rounding="stochastic"), 16)
    assert p.bio.rounding.value == "truncate" and p.bio.element.man == 1
    assert p.biw == MX("int8") and p.bwo == format_from_name("mxfp6_e3m2")


def test_rule_form_accumulator():
    from bfp.accumulate import Accumulator
    cfg = config_from_dict({"version": 1, "accumulator": {"fmt": "bfloat16", "chunk": 16},
                            "default": "fb16",
                            "rules": [{"match": "conv1", "precision": {"operands": "fb16", "accumulator": None}}]})
    assert cfg.resolve("x").accumulator == Accumulator(Float(8, 7), 16)
    assert cfg.resolve("conv1").accumulator is None


def test_rules_first_match_wins_glob_regex_types_and_ends():
    cfg = config_from_dict({"version": 1, "default": "fb16", "rules": [
        {"match": "@first", "precision": "full"},
        {"match": "layer1.0.conv1", "precision": "fb24"},
        {"match": "layer1.*", "precision": "fb12"},
        {"match": r"re:layer\d\.0\.shortcut\.0", "precision": None},
        {"match": "*", "types": ["Linear"], "precision": "float8_e4m3fn"},
        {"match": "@last", "precision": "fb24", "required": False},
    ]})
    got = cfg.assign(RESNET18)
    assert got["conv1"] is None
    assert got["layer1.0.conv1"].fw == FB24 and got["layer1.0.conv2"].fw == FB12
    assert got["layer2.0.shortcut.0"] is None
    assert got["linear"].fw == format_from_name("float8_e4m3fn")   # the Linear rule comes before @last
    assert cfg.resolve("net.layer1.0.conv2").fw == FB16            # prefix only stripped from patterns


def test_rule_patterns_accept_the_net_prefix():
    cfg = config_from_dict({"version": 1, "rules": [{"match": "net.layer1.*", "precision": "fb12"}]})
    assert cfg.resolve("layer1.0.conv1").fw == FB12 and cfg.resolve("layer2.0.conv1") is None


def test_assign_names_rules_that_match_nothing_with_closest_names():
    cfg = config_from_dict({"net.layer1.0.conv3": {}, "net.layer1.0.bn1": {}, "default": {}}, "cfg.json")
    msg = raises("matches no convertible layer", cfg.assign, RESNET18,
                 {**{n: "Conv2d" for n in RESNET18}, "layer1.0.bn1": "BatchNorm2d"})
    assert msg.startswith("cfg.json: ")
    assert "'net.layer1.0.conv3': matches no convertible layer of the model (closest: layer1.0.conv" in msg
    assert "module 'layer1.0.bn1' is a BatchNorm2d, which cannot be converted" in msg


def test_assign_optional_and_shadowed_rules():
    base = {"version": 1, "default": "fb16"}
    cfg = config_from_dict({**base, "rules": [{"match": "*shortcut*", "precision": "full", "required": False}]})
    assert cfg.assign({"conv1": "Conv2d"}) == {"conv1": cfg.default}
    cfg = config_from_dict({**base, "rules": [{"match": "conv*", "precision": "full"},
                                              {"match": "conv1", "precision": "fb12"}]})
    raises("taken by an earlier rule", cfg.assign, {"conv1": "Conv2d"})
    cfg = config_from_dict({**base, "rules": [{"match": "conv1", "types": "Linear", "precision": "full"}]})
    raises("of type Linear", cfg.assign, {"conv1": "Conv2d"})


@pytest.mark.parametrize("d,match", [
    ({"version": 1, "defualt": "fb16"}, r"'defualt' \(did you mean 'default'\?\)"),
    ({"version": 2}, "version.*allowed: 1"),
    ({"version": 1, "default": "fb17"}, r"default\.operands: unknown format name 'fb17' \(did you mean fb16"),
    ({"version": 1, "default": 8}, "default: precision 8 invalid; allowed"),
    ({"version": 1, "default": {"fw": "fb16", "fq": "fb16"}}, "'fq'.*allowed: fw, fi"),
    ({"version": 1, "rounding": "up", "default": "fb16"}, "default.rounding: 'up' unknown; allowed: 'truncate'"),
    ({"version": 1, "backward_source": "half", "default": "fb16"}, "backward_source: 'half' unknown"),
    ({"version": 1, "default": {"fw": {"bfp": 30, "group": [1, 8]}}}, "default.fw: BlockFloat bits must be"),
    ({"version": 1, "default": {"fw": {"bfp": 8, "group": [1, -8]}}}, "default.fw: group must be"),
    ({"version": 1, "default": {"fw": {"bfp": 8}}}, "needs \"group\""),
    ({"version": 1, "default": {"fw": {"bfp": 8, "group": [8], "axis": 1}}}, "'axis'.*allowed: bfp, group, rounding"),
    ({"version": 1, "default": {"fw": {"float": [9, 3]}}}, "Float exp"),
    ({"version": 1, "default": {"fw": {"mx": "fb16"}}}, "not a Float format"),
    ({"version": 1, "default": {"fw": {"bfp": 8, "float": [4, 3]}}}, "exactly one of"),
    ({"version": 1, "default": {"fw": 3}}, "default.fw: 3 is not a format; allowed: a format name"),
    ({"version": 1, "default": {"biw": {"mx": "int8", "rounding": "stochastic"}}}, "int8 elements round to nearest"),
    ({"version": 1, "accumulator": {"fmt": "fb16"}, "default": "fb16"}, "Accumulator fmt must be a Float"),
    ({"version": 1, "accumulator": {"fmt": "bfloat16", "chunks": 2}, "default": "fb16"}, "unknown accumulator keys"),
    ({"version": 1, "accumulator": "bfloat16", "default": "fb16"}, "default.accumulator: 'bfloat16' invalid"),
    ({"version": 1, "rules": {"match": "x"}}, "rules: must be a list"),
    ({"version": 1, "rules": ["x"]}, r"rules\[0\]: must be an object"),
    ({"version": 1, "rules": [{"match": "x"}]}, r"rules\[0\]: missing 'precision'"),
    ({"version": 1, "rules": [{"match": "x", "precision": "full", "when": 1}]}, "'when'"),
    ({"version": 1, "rules": [{"match": "re:(", "precision": "full"}]}, "bad regular expression"),
    ({"version": 1, "rules": [{"match": "x", "precision": "full", "types": ["BatchNorm2d"]}]},
     "types.*allowed: Conv1d, Conv2d, Linear, Matmul"),
    ({"version": 1, "rules": [{"match": "x", "precision": "full", "types": 5}]},
     r"rules\[0\]: rule types must be a list.*allowed: Conv1d"),
    ({"version": 1, "rules": [{"match": "x", "precision": "full", "required": "no"}]}, "required: 'no' invalid"),
    ({"version": 1, "rules": [{"match": "", "precision": "full"}]}, "non-empty string"),
    ({"version": 1, "description": 3}, "description: must be a string"),
])
def test_rule_form_errors(d, match):
    msg = raises(match, config_from_dict, d)
    assert msg.startswith("<dict>: ")


def test_to_dict_round_trips_through_json():
    from bfp.config import find_preset
    for name in preset_names():
        cfg = load_config(name)
        back = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
        key = lambda c: [(r.match, r.kind, r.precision, r.types, r.required) for r in c.rules]  # noqa: E731
        assert key(back) == key(cfg) and back.default == cfg.default, name
        assert find_preset(name).name == f"{name}.json"


# -- loading ---------------------------------------------------------------------------

def test_load_config_sources(tmp_path, monkeypatch):
    cfg = load_config("ResNet18_FB12")
    assert cfg.source.endswith("conf_net/ResNet18_FB12.json")
    assert load_config("ResNet18_FB12.json").rules == cfg.rules
    assert load_config(cfg) is cfg
    assert load_config({"default": {}}).source == "<dict>"
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"version": 1, "default": "fb12"}))
    assert load_config(p).source == str(p) and load_config(str(p)).default.fw == FB12
    # ./conf_net of the working directory comes first
    (tmp_path / "conf_net").mkdir()
    (tmp_path / "conf_net" / "ResNet18_FB12.json").write_text('{"version": 1, "default": "fb24"}')
    monkeypatch.chdir(tmp_path)
    assert load_config("ResNet18_FB12").default.fw == FB24
    assert "mine" not in preset_names() and "ResNet18_FB16" in preset_names()


def test_load_config_errors_name_the_file(tmp_path):
    msg = raises("no such config file or preset", load_config, "ResNet18_FB13")
    assert "(closest: ResNet18_FB" in msg and "ResNet18_FB16LG24" in msg
    bad = tmp_path / "bad.json"
    bad.write_text('{"default": {"fw_bit": 4,}}')
    raises(f"{bad}: invalid JSON at line 1 column", load_config, bad)
    bad.write_text('{"default": {"fw_bit": 44}}')
    raises(rf"{bad}: default\.fw_bit: bits 44 impossible", load_config, bad)
    raises("must be a preset name, a path, a dict or a NetConfig", load_config, 3)


def test_rule_and_netconfig_validate_directly():
    with pytest.raises(ValueError, match="LayerPrecision or None"):
        Rule("x", "fb16")
    with pytest.raises(ValueError, match="kind 'fuzzy' unknown"):
        Rule("x", None, kind="fuzzy")
    with pytest.raises(ValueError, match="must be Rule objects"):
        NetConfig(("x",))
