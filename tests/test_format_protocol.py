"""What layers above the formats ask a format instead of checking its class (issue 31's protocol,
begun with the distributed layer), and a ratchet on the class checks that remain elsewhere."""
import ast
from pathlib import Path

import pytest
import torch

import bfp
from bfp.formats import BlockFloat, Float
from bfp.kernels.plan import tile_for

PKG = Path(__file__).resolve().parents[1] / "bfp"
FAMILIES = {"Float", "BlockFloat", "MX", "NVFP4", "Scaled", "P3109"}
# The format package and the kernels that implement a family may branch on a format's class.
OWNERS = ("formats/", "kernels/")
REMAINING: dict[str, int] = {}  # class checks left elsewhere: none (issue 31)


def class_checks(source: str) -> int:
    """``isinstance``/``issubclass`` calls and ``type(x) is``/``==`` comparisons naming a format family."""
    n = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass"):
            names = {x.id for x in ast.walk(node.args[1]) if isinstance(x, ast.Name)} if len(node.args) > 1 else set()
            n += bool(names & FAMILIES)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and \
                getattr(node.left.func, "id", None) == "type":
            n += any(isinstance(c, ast.Name) and c.id in FAMILIES for c in node.comparators)
    return n


def _checks() -> dict[str, int]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(OWNERS):
            continue
        n = class_checks(path.read_text(encoding="utf-8"))
        if n:
            out[rel] = n
    return out


def test_the_class_check_counter_sees_every_spelling():
    src = ("isinstance(f, Float)\nisinstance(fmts.get(p), BlockFloat)\nisinstance(f, (MX, NVFP4))\n"
           "type(f) is Scaled\nisinstance(x, dict)\nissubclass(c, P3109)\n")
    assert class_checks(src) == 5


def test_no_module_adds_a_class_check_on_formats_and_the_distributed_layer_has_none():
    found = _checks()
    grown = {m: (n, REMAINING.get(m, 0)) for m, n in found.items() if n > REMAINING.get(m, 0)}
    assert not grown, f"class checks on formats (found, allowed): {grown}; ask the format instead"
    assert not any(m.startswith("distributed/") or m in ("cli/dist_run.py", "overflow.py", "conversion.py",
                                                         "functional.py", "layers.py") for m in found)


def test_formats_answer_the_protocol():
    e4m3, fp16, fp32 = Float(4, 3), Float(5, 10), Float(8, 23)
    assert [f.transport_bytes() for f in (e4m3, fp16, fp32)] == [1, 2, 4]
    fb16, mx = bfp.format_from_name("fb16"), bfp.format_from_name("mxfp8_e4m3")
    nv, sc = bfp.format_from_name("nvfp4"), bfp.format_from_name("fp8_e4m3_tensorwise")
    assert fb16.transport_bytes() is None and mx.transport_bytes() is None
    assert e4m3.aps_top() == e4m3.emax == 7 and fb16.aps_top() == 0 and mx.aps_top() == 0
    assert e4m3.elementwise and not fb16.elementwise and not mx.elementwise
    assert e4m3.chunkable and fb16.chunkable and mx.chunkable and not nv.chunkable and not sc.chunkable
    for shape in [(64, 32), (7, 5, 3, 3), (96,)]:
        assert fb16.tile_rows(shape) == tile_for(fb16, shape)[0]
        assert mx.tile_rows(shape) == tile_for(mx, shape)[0]
    assert e4m3.tile_rows((8, 8)) == 1 and isinstance(fb16, BlockFloat)
    two_d = bfp.MX(Float(4, 3), block=(32, 32), axis=-1)
    assert two_d.tile((64, 64)) == (32, 32) and two_d.tile_rows((64, 64)) == 32
    with pytest.raises(ValueError, match="MX axis 3 is out of range"):
        bfp.MX(Float(4, 3), axis=3).tile((4, 4))
    assert e4m3.overflow_limit() == 240.0 and mx.overflow_limit() == 448.0 * 2.0 ** 127
    assert fb16.overflow_limit() == nv.overflow_limit() == float(torch.finfo(torch.float32).max)
    assert (e4m3.short_name(), fb16.short_name(), mx.short_name()) == ("e4m3", "bfp8[1,12,3,3]", "mx:e4m3/32@-1")
    assert nv.short_name() == "nvfp4/16@-1" and sc.short_name(lambda f: "E4") == "E4*t"
    delayed = bfp.format_from_name("fp8_e4m3_delayed")
    assert delayed.history_length == 16 and sc.history_length == 0 and e4m3.history_length == 0
    assert e4m3.normal_emin() == -6 and Float(5, 2).normal_emin() == -14 and mx.normal_emin() is None


def test_the_autograd_layer_calls_one_quantize_entry_and_knows_no_kernel_internals():
    """functional.py and layers.py reach the kernels through ``bfp.kernels.quantize`` only (a
    format's state, delayed scaling's amax history, is passed to it); no format module either."""
    for name in ("functional.py", "layers.py"):
        tree = ast.parse((PKG / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "kernels" in node.module:
                assert node.module == "kernels" and [a.name for a in node.names] == ["quantize"], \
                    f"{name}:{node.lineno} imports {node.module}: {[a.name for a in node.names]}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("formats."):
                raise AssertionError(f"{name}:{node.lineno} imports the format module {node.module}")
    src = (PKG / "hadamard.py").read_text(encoding="utf-8")
    assert "dispatch" not in src and "nvfp4_keys" not in src  # the transform's keys are drawn in its kernel
