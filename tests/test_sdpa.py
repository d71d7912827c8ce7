"""bfp.routes: models that call F.scaled_dot_product_attention or torch.matmul in their forward get named,
quantizable products, found by tracing one forward (bfp.trace), not by reading source."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bfp import Float, LayerPrecision, quantize
from bfp.routes import route
from bfp.trace import trace_gemms
from bfp.conversion import convert
from bfp.layers import Matmul, QMatmul


class HandWritten(nn.Module):
    """An attention block as users write it: projections, then the functional call."""

    def __init__(self, dim=16, heads=4, kv_heads=4, causal=False, scale=None):
        super().__init__()
        self.heads, self.kv_heads, self.causal, self.scale = heads, kv_heads, causal, scale
        d = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * d)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None):
        n, t, dim = x.shape
        q = self.q(x).view(n, t, self.heads, -1).transpose(1, 2)
        k, v = (z.view(n, t, self.kv_heads, -1).transpose(1, 2) for z in self.kv(x).chunk(2, -1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=self.causal, scale=self.scale,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(n, t, dim))


def route_sdpa(net, *example):
    return route(net, trace_gemms(net, example or (torch.randn(2, 5, 8, dtype=next(net.parameters()).dtype),)))


class Net(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.attn = HandWritten(**kw)

    def forward(self, x, attn_mask=None):
        return self.attn(self.embed(x), attn_mask)


@pytest.mark.parametrize("kw, mask", [({}, None), ({"causal": True}, None), ({"scale": 0.3}, None),
                                      ({"kv_heads": 2}, None), ({}, "bool"), ({}, "float")])
def test_routed_sdpa_equals_pytorchs_forward_and_backward(kw, mask):
    torch.manual_seed(0)
    net = Net(**kw).double()
    x = torch.randn(3, 6, 8, dtype=torch.float64, requires_grad=True)
    m = None
    if mask == "bool":
        m = (torch.rand(6, 6) > 0.4) | torch.eye(6, dtype=torch.bool)
    elif mask == "float":
        m = torch.randn(6, 6, dtype=torch.float64)
    y_ref = net(x, m)
    g_ref, = torch.autograd.grad(y_ref.square().sum(), x)
    routed = route_sdpa(copy.deepcopy(net), x, m)
    assert isinstance(routed.attn.qk, Matmul) and isinstance(routed.attn.pv, Matmul)
    assert torch.equal(routed(x, m), y_ref)  # nothing rounded: PyTorch's own SDPA, bit for bit
    routed.attn.qk = QMatmul(LayerPrecision(fi=Float(8, 23))).double()
    routed.attn.pv = QMatmul(LayerPrecision(fi=Float(8, 23))).double()
    ran = []
    for mm in (routed.attn.qk, routed.attn.pv):  # an identity hook: quantized layers that round nothing
        mm.quantize_hook = lambda layer, point, t, fmt: t
        mm.register_forward_hook(lambda mod, args, out: ran.append(mod))
    y = routed(x, m)
    assert ran == [routed.attn.qk, routed.attn.pv]  # the call went through the named products
    g, = torch.autograd.grad(y.square().sum(), x)
    assert torch.allclose(y, y_ref, atol=1e-12, rtol=0) and torch.allclose(g, g_ref, atol=1e-12, rtol=0)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)  # outside the module's forward the function is PyTorch's
    assert torch.allclose(F.scaled_dot_product_attention(q, q, q),
                          torch.softmax(q @ q.transpose(-2, -1) / 2, -1) @ q, atol=1e-12) and len(ran) == 2
    route_sdpa(routed, x, m)  # routing again changes nothing
    assert len(routed.attn._forward_pre_hooks) == 1 and list(routed.state_dict()) == list(net.state_dict())


def test_converted_sdpa_rounds_q_k_p_and_v_where_the_points_say():
    torch.manual_seed(1)
    net = Net()
    x = torch.randn(2, 5, 8)
    ref = copy.deepcopy(net)
    model = convert(net, {"version": 1, "rules": [
        {"match": "*.qk", "precision": {"fi": "fp8_e4m3", "fw": "fp8_e4m3"}},
        {"match": "*.pv", "precision": {"fi": "fp8_e4m3", "fw": "fp8_e4m3"}}]}, example_input=x)
    assert isinstance(model.attn.qk, QMatmul) and isinstance(model.attn.pv, QMatmul)
    fmt = model.attn.qk.precision.fi
    a, h = ref.attn, ref.embed(x)
    q = a.q(h).view(2, 5, 4, 4).transpose(1, 2)
    k, v = (z.view(2, 5, 4, 4).transpose(1, 2) for z in a.kv(h).chunk(2, -1))
    p = torch.softmax((quantize(q, fmt) @ quantize(k.transpose(-2, -1), fmt)) * 4 ** -0.5, -1)
    want = a.out((quantize(p, fmt) @ quantize(v, fmt)).transpose(1, 2).reshape(2, 5, 16))
    assert torch.equal(model(x), want)
    assert not torch.equal(model(x), ref(x))


def test_the_route_ends_with_the_forward_even_when_it_fails():
    net = route_sdpa(Net())
    with pytest.raises(RuntimeError):
        net(torch.randn(2, 5, 7))  # a bad input size: the forward raises inside the routed module
    q = torch.randn(1, 2, 3, 4)
    assert net.attn._bfp_routes == []
    assert torch.allclose(F.scaled_dot_product_attention(q, q, q),
                          torch.softmax(q @ q.transpose(-2, -1) / 2, -1) @ q, atol=1e-6)


def test_a_module_whose_product_names_are_taken_is_refused():
    class Clash(HandWritten):
        def __init__(self):
            super().__init__()
            self.qk = nn.Identity()
    with pytest.raises(ValueError, match="computes products in its forward but already has \\['qk'\\]"):
        route_sdpa(nn.Sequential(Clash()), torch.randn(2, 5, 16))


def test_a_rule_for_the_probabilities_says_where_they_are():
    from bfp.config import ConfigError
    with pytest.raises(ConfigError, match=r"'\*\.attn\.p': matches no convertible layer .*they are the fi point "
                                          r"of the pv product, e.g. \*\.attn\.pv, and their gradient its bio"):
        convert(Net(), {"version": 1, "rules": [{"match": "*.attn.p", "precision": {"fi": "fp8_e4m3"}}]},
                example_input=torch.randn(2, 5, 8))
