"""The torch.ops.bfp ops called directly with odd arguments (issue 53, items 12 and 15): each a clear
TypeError/ValueError naming the value and what is allowed, from the op and from its fake (so a
compiled graph refuses at trace time); fused_bmm takes float16/bfloat16 operands exactly."""
import pytest
import torch

import bfp
import bfp.tensorcore as tc
from bfp.formats import Scaled, format_from_name
from bfp.kernels.dispatch import format_json

E4M3 = format_json(format_from_name("e4m3"))
NVFP4 = format_json(format_from_name("nvfp4"))
DELAYED = Scaled(format_from_name("e4m3"), history=4)
ACC = tc._accumulator_json(tc.accumulator_from_name(next(iter(tc.FUSED_PRESETS))))
q = torch.ops.bfp.quantize_format

CASES = {
    "int tensor": (lambda: q(torch.ones(4, dtype=torch.int32), E4M3, None, False, "reference"),
                   TypeError, "a int32 tensor; allowed: float32, float16, bfloat16, float64"),
    "bool tensor": (lambda: q(torch.ones(4, dtype=torch.bool), E4M3, None, False, "cpu"), TypeError, "a bool tensor"),
    "complex tensor": (lambda: q(torch.ones(4, dtype=torch.complex64), E4M3, None, False, "cpu"), TypeError,
                       "a complex64 tensor"),
    "sparse tensor": (lambda: q(torch.ones(4).to_sparse(), E4M3, None, False, "cpu"), TypeError,
                      "a sparse_coo tensor; only dense"),
    "empty format": (lambda: q(torch.ones(4), "", None, False, "cpu"), ValueError, "fmt must be the JSON"),
    "not JSON": (lambda: q(torch.ones(4), "{e4m3", None, False, "cpu"), ValueError, "is not JSON"),
    "backend": (lambda: q(torch.ones(4), E4M3, None, False, "nope"), ValueError,
                "backend 'nope' unknown; allowed: 'reference', 'cpu', 'triton'"),
    "one key": (lambda: q(torch.ones(4), E4M3, torch.ones(1, dtype=torch.int64), False, "cpu"), ValueError,
                r"int64 tensor of shape \(2,\).*got a int64 tensor of shape \(1,\)"),
    "delayed op, plain format": (lambda: torch.ops.bfp.quantize_delayed(torch.ones(4), E4M3, torch.zeros(4), None,
                                                                        True, "cpu"),
                                 ValueError, "quantize_delayed needs a delayed-scaling format"),
    "delayed state int64": (lambda: bfp.quantize(torch.full((4,), 4.45), DELAYED,
                                                 state=torch.zeros(4, dtype=torch.int64), update_state=True),
                            ValueError, r"must be a float32 tensor of shape \(4,\).*got a int64"),
    "delayed state float16": (lambda: bfp.quantize(torch.full((4,), 4.45), DELAYED,
                                                   state=torch.zeros(4, dtype=torch.float16), update_state=True),
                              ValueError, "got a float16"),
    "delayed state (1, 4)": (lambda: torch.ops.bfp.quantize_delayed(torch.ones(4), format_json(DELAYED),
                                                                    torch.zeros(1, 4), None, True, "cpu"),
                             ValueError, r"got a float32 tensor of shape \(1, 4\)"),
    "hadamard 0-d": (lambda: torch.ops.bfp.hadamard_quantize(torch.tensor(1.0), 16, 0, NVFP4, None), ValueError,
                     r"at least 2 dimensions, got shape \(\)"),
    "hadamard 1-d": (lambda: torch.ops.bfp.hadamard_quantize(torch.ones(16), 16, 0, NVFP4, None), ValueError,
                     r"got shape \(16,\)"),
    "generator 5": (lambda: bfp.quantize(torch.ones(4), format_from_name("e4m3"), generator=5), TypeError,
                    "generator must be None or a torch.Generator, got int 5"),
    "bmm sparse": (lambda: torch.ops.bfp.fused_bmm(torch.ones(1, 2, 2).to_sparse(), torch.ones(1, 2, 2), ACC,
                                                   "kernel"), TypeError, "fused_bmm's a: a sparse_coo tensor"),
    "bmm int": (lambda: torch.ops.bfp.fused_bmm(torch.ones(1, 2, 2, dtype=torch.int64), torch.ones(1, 2, 2), ACC,
                                                "kernel"), TypeError, "a int64 tensor; allowed: float32, float16"),
    "bmm accumulator": (lambda: torch.ops.bfp.fused_bmm(torch.ones(1, 2, 2), torch.ones(1, 2, 2), "", "kernel"),
                        ValueError, r"acc must be the JSON of its to_dict\(\) \(json.dumps"),
    "bmm backend": (lambda: torch.ops.bfp.fused_bmm(torch.ones(1, 2, 2), torch.ones(1, 2, 2), ACC, "nope"),
                    ValueError, "backend 'nope' unknown; allowed: 'kernel'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_odd_argument_is_a_clear_error(case):
    call, error, message = CASES[case]
    with pytest.raises(error, match=message):
        call()


def test_the_fake_refuses_too_so_a_compiled_graph_fails_at_trace_time():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.ones(4, dtype=torch.int32))
        with pytest.raises(TypeError, match="a int32 tensor"):
            q(x, E4M3, None, False, "cpu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_bmm_takes_half_operands_exactly(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(2, 3, 40, generator=g).to(dtype), torch.randn(2, 40, 5, generator=g).to(dtype))
    acc = tc.accumulator_from_name(next(iter(tc.FUSED_PRESETS)))
    assert torch.equal(tc.fused_bmm(a, b, acc), tc.fused_bmm(a.float(), b.float(), acc))
    assert torch.equal(torch.ops.bfp.fused_bmm(a, b, ACC, "reference"), tc.fused_bmm(a.float(), b.float(), acc,
                                                                                       "reference"))


def test_the_hadamard_op_is_there_after_import_bfp():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import torch, bfp; print(torch.ops.bfp.hadamard_quantize.default)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "hadamard_quantize" in out.stdout, out.stderr[-2000:]
