"""The diagnostics' Python API on a model nobody here wrote: a Hugging Face GPT-2, its output
object, its own loss, a loss function of one's own, and the table and heat map of the rows."""
import pytest
import torch

import bfp
from bfp.diagnostics import PointDiagnostics, heatmap, measure_step, table

transformers = pytest.importorskip("transformers")


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    model, ids = transformers.GPT2LMHeadModel(cfg), torch.randint(0, 64, (2, 8))
    return bfp.convert(model, "any_fp8_e4m3", example_input=ids), ids


def test_measure_step_reads_a_hugging_face_output(tmp_path):
    model, ids = _gpt2()
    rows = measure_step(model, ids, ids)  # logits (N, T, V) against ids (N, T)
    assert rows and {r["point"] for r in rows} >= {"fi", "fw", "bwo"}
    assert all(r["format"] == "float8_e4m3fn" for r in rows)
    own = measure_step(model, {"input_ids": ids, "labels": ids})  # the model's own (shifted) loss
    assert [(r["layer"], r["point"]) for r in own] == [(r["layer"], r["point"]) for r in rows]
    assert [r["sqnr_db"] for r in own if r["point"] == "fi"] == [r["sqnr_db"] for r in rows if r["point"] == "fi"]
    assert [r["sqnr_db"] for r in own if r["point"] == "bwo"] != [r["sqnr_db"] for r in rows if r["point"] == "bwo"]
    mine = measure_step(model, ids, loss_fn=lambda out, y: out.logits.square().mean())
    assert len(mine) == len(rows)
    assert all(p.grad is None for p in model.parameters())  # no step, gradients cleared
    text = table(rows, limit=3)
    assert text.splitlines()[0].startswith("layer") and len(text.splitlines()) == 5
    assert heatmap(rows, tmp_path / "map.png").stat().st_size > 1000


def test_arm_and_disarm_around_ones_own_step():
    model, ids = _gpt2()
    diag = PointDiagnostics(model)
    diag.arm()
    model(ids).logits.float().pow(2).mean().backward()
    rows = diag.disarm()
    assert rows and diag.disarm() == []  # disarmed: nothing more is recorded


def test_an_output_without_a_loss_or_targets_says_what_to_pass():
    model, ids = _gpt2()
    with pytest.raises(TypeError, match=r"cannot take a loss from a CausalLMOutputWithCrossAttentions output "
                                        r"without targets y; pass loss_fn="):
        measure_step(model, ids)
    with pytest.raises(TypeError, match=r"the loss must be a one-element tensor, got a tensor of shape \(2, 8, 64\)"):
        measure_step(model, ids, loss_fn=lambda out, y: out.logits)
