"""Format values: validation, derived constants, names, serialisation."""
import pytest

import bfp
from bfp import BlockFloat, Float, MX, format_from_dict, format_from_name


@pytest.mark.parametrize("name,maxval,emin", [
    ("float8_e4m3fn", 448.0, -6), ("float8_e5m2", 57344.0, -14), ("float6_e3m2fn", 28.0, -2),
    ("float6_e2m3fn", 7.5, 0), ("float4_e2m1fn", 6.0, 0), ("float16", 65504.0, -14),
    ("bfloat16", 3.3895313892515355e38, -126), ("tf32", 3.4011621342146535e38, -126),
])
def test_float_presets_constants(name, maxval, emin):
    f = format_from_name(name)
    assert f.max == maxval
    assert f.emin == emin


def test_presets_of_the_original_simulator():
    assert format_from_name("fb12") == BlockFloat(4, (1, 24, 3, 3))
    assert format_from_name("FB16") == BlockFloat(8, (1, 12, 3, 3))
    assert format_from_name("fb24") == BlockFloat(16, (1, 6, 3, 3))
    assert format_from_name("mxint8") == MX("int8", 32, -1)
    assert format_from_name("mxfp4_e2m1").element == format_from_name("float4_e2m1fn")


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as e:
        format_from_name("float8_e4m3")
    msg = str(e.value)
    assert "'float8_e4m3'" in msg and "float8_e4m3fn" in msg and "mxfp4_e2m1" in msg and "fb24" in msg


@pytest.mark.parametrize("make,needle", [
    (lambda: BlockFloat(0, (1, 8)), "bits must be an integer in 1..24, got 0"),
    (lambda: BlockFloat(25, (1, 8)), "got 25"),
    (lambda: BlockFloat(8, ()), "non-empty"),
    (lambda: BlockFloat(8, (1, 0, 3)), "positive"),
    (lambda: BlockFloat(8, (1, -2)), "positive"),
    (lambda: BlockFloat(8, (1, 8), rounding="floor"), "unknown rounding 'floor'; allowed: 'truncate', 'nearest', 'stochastic'"),
    (lambda: Float(9, 3), "exp (exponent bits) must be an integer in 1..8, got 9"),
    (lambda: Float(4, 24), "man (mantissa bits) must be an integer in 0..23, got 24"),
    (lambda: Float(4, 3, overflow="wrap"), "unknown overflow 'wrap'"),
    (lambda: Float(4, 3, encoding="fn", overflow="inf"), "needs encoding='ieee'"),
    (lambda: Float(1, 3), "no normal numbers"),
    (lambda: Float(8, 1, encoding="fn"), "Float(exp=8) with encoding='fn' reaches 2**128"),
    (lambda: Float(8, 0, encoding="finite"), "use encoding='ieee' (emax 127) or exp <= 7"),
    (lambda: MX("float99"), "unknown format name 'float99'"),
    (lambda: MX(Float(4, 3), block=0), "block must be an integer"),
    (lambda: MX(Float(5, 10, overflow="inf")), "saturate"),
])
def test_validation_names_the_bad_value(make, needle):
    with pytest.raises(ValueError) as e:
        make()
    assert needle in str(e.value)


def test_formats_are_immutable_hashable_values():
    f = BlockFloat(8, [1, 12, 3, 3], "nearest")
    assert f.group == (1, 12, 3, 3) and f == BlockFloat(8, (1, 12, 3, 3), "nearest")
    assert len({f, BlockFloat(8, (1, 12, 3, 3), "nearest")}) == 1
    with pytest.raises(AttributeError):
        f.bits = 4


def test_repr_is_readable():
    assert repr(BlockFloat(8, (1, 12, 3, 3), "nearest")) == "BlockFloat(bits=8, group=[1, 12, 3, 3], rounding=nearest)"
    assert repr(format_from_name("float8_e4m3fn")) == \
        "Float(e4m3, rounding=nearest, overflow=saturate, encoding=fn)"
    assert repr(format_from_name("mxfp8_e5m2")) == "MX(e5m2, block=32, axis=-1)"


def test_group_for_shorter_and_longer_ranks():
    f = BlockFloat(4, (1, 24, 3, 3))
    assert f.group_for(2) == (1, 24)
    assert f.group_for(1) == (1,)
    assert f.group_for(5) == (1, 24, 3, 3, 1)


@pytest.mark.parametrize("name", bfp.format_names())
def test_dict_round_trip(name):
    f = format_from_name(name)
    assert format_from_dict(f.to_dict()) == f


def test_format_from_dict_rejects_garbage():
    with pytest.raises(ValueError, match="'kind'"):
        format_from_dict({"bits": 3})
    with pytest.raises(ValueError, match="unknown format kind 'posit'"):
        format_from_dict({"kind": "posit"})
    with pytest.raises(ValueError, match="bad float format dict"):
        format_from_dict({"kind": "float", "exp": 4})


def test_mx_element_max_is_the_elements_largest_magnitude_before_the_scale():
    from bfp.formats import format_from_name
    from bfp.formats.mx import MX
    assert MX("int8").element_max == 127 / 64
    assert format_from_name("mxfp8_e4m3").element_max == 448.0
    assert format_from_name("mxfp4_e2m1").element_max == 6.0


def test_every_float_has_its_e_m_name():
    from bfp.formats import Encoding, Rounding
    assert format_from_name("e3m0") == Float(3, 0)
    assert format_from_name("e5m10") == Float(5, 10) and format_from_name("E8M7") == Float(8, 7)
    assert format_from_name("e1m2") == Float(1, 2, encoding=Encoding.FINITE)
    assert format_from_name("e8m7_sr") == Float(8, 7, rounding=Rounding.STOCHASTIC)
    assert format_from_name("e3m0_tr") == Float(3, 0, rounding=Rounding.TRUNCATE)
    assert format_from_name("e4m3") == Float(4, 3, encoding=Encoding.FN)  # the OCP alias keeps its encoding
    for bad in ("e9m1", "e4m24", "e0m3"):
        with pytest.raises(ValueError, match=f"unknown format name '{bad}'.*any e<E>m<M>"):
            format_from_name(bad)
