"""Delayed scaling's state (the amax histories) where it enters and when a model changes dtype: a
non-finite or negative history is refused at ``bfp.quantize(state=...)`` and at ``load_state_dict``
(which keeps the layer's own), a history stays float32 across ``model.to(dtype)``, and a meta history
rounds only meta tensors."""
import copy

import pytest
import torch
import torch.nn as nn

import bfp
from bfp.formats import Scaled, format_from_name

FMT = Scaled(format_from_name("e4m3"), history=16)


def _model():
    torch.manual_seed(0)
    m = bfp.convert(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 4)), "any_fp8_delayed",
                    example_input=torch.randn(2, 4))
    m(torch.randn(3, 4)).sum().backward()  # a training step moves the histories
    return m


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_a_history_with_inf_nan_or_a_negative_amax_is_refused_by_quantize(bad):
    hist = torch.tensor([2.0] + [0.0] * 15)
    hist[3] = bad
    with pytest.raises(ValueError, match=r"amax history must hold finite amaxes >= 0; got \[.*\] at positions \[3\]"):
        bfp.quantize(torch.randn(4), FMT, state=hist)
    hist[3] = 0.0  # negative control: the same history with a finite amax rounds
    assert torch.isfinite(bfp.quantize(torch.randn(4), FMT, state=hist)).all()


def test_load_state_dict_refuses_an_inf_history_naming_it_and_keeps_the_layers_own():
    m = _model()
    state = m.state_dict()
    before = {k: v.clone() for k, v in state.items()}
    edited = {k: v.clone() for k, v in state.items()}
    edited["1.amax_history_fw"][2] = float("inf")
    edited["1.weight"] += 1.0
    with pytest.raises(RuntimeError, match=r"1\.amax_history_fw: .*must hold finite amaxes >= 0; got \[inf\]"):
        m.load_state_dict(edited)
    assert torch.equal(m.state_dict()["1.amax_history_fw"], before["1.amax_history_fw"])
    with pytest.raises(RuntimeError, match=r"1\.amax_history_bwo: an amax history is float32, got torch.float16"):
        m.load_state_dict({**state, "1.amax_history_bwo": state["1.amax_history_bwo"].half()})
    m.load_state_dict(state)  # a saved history as it was loads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_histories_stay_float32_with_their_values_across_model_to_dtype(dtype):
    m = _model()
    hist = m[1].amax_history_fi.clone()
    assert hist.max() > 0
    low = copy.deepcopy(m).to(dtype)
    assert low[1].weight.dtype == dtype
    assert low[1].amax_history_fi.dtype == torch.float32 and torch.equal(low[1].amax_history_fi, hist)
    out = low(torch.randn(3, 4, dtype=dtype))  # forwards (it raised on the history's dtype before)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert not torch.equal(low[1].amax_history_fi, hist)  # and training moves the history on


def test_a_meta_history_rounds_meta_tensors_only():
    meta = torch.zeros(16, device="meta")
    out = bfp.quantize(torch.randn(4, device="meta"), FMT, state=meta)
    assert out.device.type == "meta" and out.shape == (4,)
    with pytest.raises(ValueError, match="its amax history is a meta tensor .* rounds only meta tensors; got a cpu"):
        bfp.quantize(torch.randn(4), FMT, state=meta)
