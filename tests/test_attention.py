"""Attention with named products (bfp.attention), nn.MultiheadAttention conversion, and the ViT."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bfp import quantize
from bfp.attention import Attention, MultiheadAttention
from bfp.cli import cifar as main
from bfp.conversion import convert
from bfp.layers import QLinear, QMatmul
from bfp.models import create


def _close(a, b, tol=1e-5):
    assert torch.allclose(a, b, atol=tol, rtol=tol), (a - b).abs().max()


def _sdpa_reference(att: Attention, x, attn_mask=None, is_causal=False):
    n, t, d = x.shape
    q, k, v = (z.reshape(n, t, att.heads, d // att.heads).transpose(1, 2) for z in att.qkv(x).chunk(3, -1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return att.proj(out.transpose(1, 2).reshape(n, t, d))


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float", "padding"])
def test_unquantized_attention_equals_pytorch_sdpa_forward_and_backward(mask):
    torch.manual_seed(0)
    att = Attention(16, 4).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    kw, ref_kw = {}, {}
    if mask == "causal":
        att.causal, ref_kw = True, {"is_causal": True}
    elif mask == "bool":
        m = torch.rand(7, 7) > 0.3
        m |= torch.eye(7, dtype=torch.bool)  # no row without a key
        kw, ref_kw = {"attn_mask": m}, {"attn_mask": m}
    elif mask == "float":
        m = torch.randn(7, 7, dtype=torch.float64)
        kw, ref_kw = {"attn_mask": m}, {"attn_mask": m}
    elif mask == "padding":
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[1, 5:] = True
        kw, ref_kw = {"key_padding_mask": pad}, {"attn_mask": ~pad[:, None, None, :]}
    y = att(x, **kw)
    g, = torch.autograd.grad(y.square().sum(), x)
    y_ref = _sdpa_reference(att, x, **ref_kw)
    g_ref, = torch.autograd.grad(y_ref.square().sum(), x)
    _close(y, y_ref, 1e-12)
    _close(g, g_ref, 1e-12)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_attention_conversion_keeps_results_and_parameters(batch_first, cross):
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(16, 2, batch_first=batch_first)
    shape = (2, 5, 16) if batch_first else (5, 2, 16)
    q = torch.randn(*shape)
    k = torch.randn(*shape) if cross else q
    v = torch.randn(*shape) if cross else q
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 3:] = True
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)  # MHA: True = not allowed
    want, want_w = mha(q, k, v, key_padding_mask=pad, attn_mask=mask)
    new = MultiheadAttention.from_float(mha)
    assert new.qkv.weight is mha.in_proj_weight and new.proj.weight is mha.out_proj.weight
    got, got_w = new(q, k, v, key_padding_mask=pad, attn_mask=mask)
    _close(got, want)
    _close(got_w, want_w)
    per_head = new(q, k, v, average_attn_weights=False)[1]
    _close(per_head, mha(q, k, v, average_attn_weights=False)[1])
    assert new(q, k, v, need_weights=False)[1] is None


def test_convert_replaces_multihead_attention_and_loads_its_old_state_dict():
    model = nn.Sequential(nn.Linear(8, 16))
    model.add_module("attn", nn.MultiheadAttention(16, 2, batch_first=True))
    old_state = {k: v.clone() for k, v in model.state_dict().items()}
    model = convert(model, {"version": 1, "default": {"operands": "fp8_e4m3"}})
    assert isinstance(model.attn, MultiheadAttention)
    assert isinstance(model.attn.qk, QMatmul) and isinstance(model.attn.qkv, QLinear)
    model.load_state_dict(old_state)  # nn.MultiheadAttention's keys are accepted
    assert torch.equal(model.attn.qkv.weight, old_state["attn.in_proj_weight"])
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiheadAttention.from_float(nn.MultiheadAttention(16, 2, add_bias_kv=True))


def test_quantized_points_reach_the_attention_operands():
    """qk.fi quantizes q, qk.fw k^T, pv.fi the probabilities, pv.fw v: the module's output
    equals the same float32 steps written out with quantize at those four places."""
    torch.manual_seed(2)
    att = Attention(16, 2)
    model = convert(att, {"version": 1, "rules": [{"match": "qk", "precision": {"fi": "fp8_e4m3", "fw": "fp8_e4m3"}},
                                                  {"match": "pv", "precision": {"fi": "fp8_e4m3", "fw": "fp8_e4m3"}}]})
    fmt = model.qk.precision.fi
    assert (fmt.exp, fmt.man) == (4, 3) and model.qk.precision.fw == model.pv.precision.fi == model.pv.precision.fw == fmt
    x = torch.randn(2, 6, 16)
    n, t, d = x.shape
    q, k, v = (z.reshape(n, t, 2, 8).transpose(1, 2) for z in att.qkv(x).chunk(3, -1))
    s = (quantize(q, fmt) @ quantize(k.transpose(-2, -1), fmt)) * 8 ** -0.5
    probs = torch.softmax(s, -1)
    out = (quantize(probs, fmt) @ quantize(v, fmt)).transpose(1, 2).reshape(n, t, d)
    assert torch.equal(model(x), att.proj(out))
    assert not torch.equal(model(x), _sdpa_reference(att, x))


def test_attention_bad_values():
    with pytest.raises(ValueError, match="heads must be a positive integer dividing dim=16"):
        Attention(16, 3)
    with pytest.raises(ValueError, match="dropout must be in"):
        Attention(16, 2, dropout=1.5)


@pytest.mark.parametrize("preset", ["any_mxfp8", "any_fp8_e4m3", "any_FB16", "any_nvfp4_recipe"])
def test_presets_quantize_the_vit_attention_products(preset):
    model = convert(create("ViT", depth=1, dim=32, heads=2), preset)
    assert model.blocks[0].attn.qk.precision.enabled and model.blocks[0].attn.pv.precision.enabled
    y = model(torch.randn(2, 3, 32, 32))
    y.sum().backward()
    assert torch.isfinite(model.blocks[0].attn.qkv.weight.grad).all()


def test_cifar_py_trains_a_vit_with_mxfp8(tiny_args, tmp_path):
    args = tiny_args("--training-epochs", "1", "--bfp", "any_mxfp8", "--save", "True", "--run-name", "vit")
    args[args.index("-m") + 1] = "ViT"
    args[args.index("--model-opt") + 1:args.index("--model-opt") + 2] = ["dim=32", "--model-opt", "heads=2", "--model-opt", "depth=1"]
    assert main(args) == 0
    assert (tmp_path / "runs" / "vit" / "checkpoints" / "last.pt").exists()


def test_all_nine_points_of_both_products_round_exactly_where_they_say():
    """Every point of qk and pv on, each in its own format: the output and the gradients of
    q, k and v equal the GEMMs written out by hand with quantize at those places (softmax
    and the scale through autograd, as in the module)."""
    from bfp.formats import Float
    from bfp.precision import LayerPrecision
    fmts = dict(fi=Float(4, 3), fw=Float(5, 2), fo=Float(4, 2), bio=Float(4, 1), biw=Float(3, 2),
                big=Float(5, 3), bwo=Float(4, 4), bwi=Float(6, 2), bwg=Float(5, 1))
    pq, pp = LayerPrecision(**fmts), LayerPrecision(**{k: Float(f.exp, f.man + 1) for k, f in fmts.items()})
    att = convert(Attention(16, 2), {"version": 1, "rules": [{"match": "qk", "precision": pq.to_dict()},
                                                            {"match": "pv", "precision": pp.to_dict()}]})
    assert att.qk.precision == pq and att.pv.precision == pp
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 5, 16, generator=g).requires_grad_() for _ in range(3))
    d_out = torch.randn(2, 5, 16, generator=g)
    out, _ = att.attend(q, k, v)
    got = (out, *torch.autograd.grad(out, (q, k, v), d_out))

    def heads(t):
        return t.detach().reshape(2, 5, 2, 8).transpose(1, 2)

    Q, K, V, dO = heads(q), heads(k), heads(v), heads(d_out)
    kt = K.transpose(-2, -1)
    s = _q(pq.fo, _q(pq.fi, Q) @ _q(pq.fw, kt))
    s_leaf = s.clone().requires_grad_()
    scores = s_leaf * 8 ** -0.5
    p_leaf = torch.softmax(scores, -1).detach().requires_grad_()
    o = _q(pp.fo, _q(pp.fi, p_leaf.detach()) @ _q(pp.fw, V))
    dp = _q(pp.big, _q(pp.bio, dO) @ _q(pp.biw, V).transpose(-1, -2))
    dv = _q(pp.bwg, _q(pp.bwi, p_leaf.detach()).transpose(-1, -2) @ _q(pp.bwo, dO))
    ds, = torch.autograd.grad(torch.softmax(s_leaf * 8 ** -0.5, -1), s_leaf, dp)
    dq = _q(pq.big, _q(pq.bio, ds) @ _q(pq.biw, kt).transpose(-1, -2))
    dkt = _q(pq.bwg, _q(pq.bwi, Q).transpose(-1, -2) @ _q(pq.bwo, ds))

    def merge(t):
        return t.transpose(1, 2).reshape(2, 5, 16)

    want = (merge(o), merge(dq), merge(dkt.transpose(-2, -1)), merge(dv))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name


def _q(fmt, t):
    return t if fmt is None else quantize(t, fmt)
