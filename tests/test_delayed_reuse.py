"""Delayed scaling: ``bwi``/``biw`` take the forward copies of ``fi``/``fw`` (``bfp.quantizer._StateReuse``)
and training is bit for bit what rounding them again gives: weights, gradients and every amax
history, step after step, also when the histories part (a training-mode forward without a
backward) and when a layer runs twice before one backward."""
import copy

import pytest
import torch
from torch import nn

import bfp
from bfp.quantizer import round_at
import bfp.quantizer


class Net(nn.Module):
    """Four convertible layers (the first and last stay FP32 in the preset); ``mid`` may run twice."""

    def __init__(self, twice: bool):
        super().__init__()
        self.twice = twice
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.mid(torch.relu(self.stem(x))))
        if self.twice:
            x = torch.relu(self.mid(x))
        return self.head(torch.relu(self.body(x)).flatten(1))


def _pass_through(layer, point, t, fmt):  # a hook: turns the reuse off, the roundings stay the same
    return round_at(layer, point, t, fmt, stats=False)[0]


def _q_layers(m):
    return [mod for mod in m.modules() if hasattr(mod, "quantize_hook")]


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
def test_forward_copies_serve_the_backward_points_bit_for_bit(monkeypatch, twice):
    torch.manual_seed(0)
    base = bfp.convert(Net(twice), "any_fp8_delayed")
    plain, hooked = base, copy.deepcopy(base)
    for layer in _q_layers(hooked):
        layer.quantize_hook = _pass_through
    calls = {"n": 0}

    def counting(real):
        def call(*a, **k):
            calls["n"] += 1
            return real(*a, **k)
        return call

    for name in ("quantize", "quantize_held"):  # a rounding without state, and one with a layer's history
        monkeypatch.setattr(bfp.quantizer, name, counting(getattr(bfp.quantizer, name)))
    g = torch.Generator().manual_seed(1)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, hooked)}
    counts = {}
    for step in range(6):
        x, y = torch.randn(4, 3, 8, 8, generator=g) * 3, torch.randint(0, 10, (4,), generator=g)
        for name, m in (("plain", plain), ("hooked", hooked)):
            if step == 3:  # a training-mode forward with no backward: fi's history moves, bwi's not
                with torch.no_grad():
                    m(x)
            calls["n"] = 0
            opts[id(m)].zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opts[id(m)].step()
            counts.setdefault(name, []).append(calls["n"])
        a, b = _state(plain), _state(hooked)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k} differs"
        assert any(k.startswith("mid.amax_history_bwi") for k in a)
    # Two quantized layers, six roundings each a call (two forward points, two gradient points, bwi
    # and biw); where the reuse holds bwi and biw take the forward copies. mid called twice: its
    # second call finds fi's history moved, and its first call's backward finds bwi's moved by the
    # second's, so both round again. From the no_grad forward on the histories differ: every point
    # rounds.
    assert counts["hooked"] == [counts["hooked"][0]] * 6
    assert counts["plain"][0] == (16 if twice else 8) and counts["hooked"][0] == (18 if twice else 12)
    assert counts["plain"][3:] == counts["hooked"][3:]
