"""Dynamic precision control (bfp.dynamic): spec grammar, the Simple rule on
scripted ZSE sequences, ZSE measured through the layers against an independent
float64 computation, checkpoint state, logs, plot, and a digits run."""
import csv
import io
import math
from itertools import product
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import bfp
from bfp.dynamic import (CSV_FIELDS, CSV_NAME, DynamicPrecision, SimpleController, SimpleSpec,
                         format_table, ladder_step, main, parse_spec, plot_precision, read_log)
from bfp.formats import BlockFloat, Float
from bfp.formats.mx import MX
from bfp.layers import QConv2d, QLinear
from bfp.precision import LayerPrecision

BACKWARD = ("bwo", "bwi", "bio", "biw")


# -- spec grammar ------------------------------------------------------------------

@pytest.mark.parametrize("text, expect", [
    ("Simple/0.6/0.8/0/1", SimpleSpec(0.6, 0.8, 0, 1)),
    ("simple/0.1/0.2/50/1/5", SimpleSpec(0.1, 0.2, 50, 1, every=5)),  # the original's 6th field
    ("Simple/0.1/0.2/2/1/4,8,12,16", SimpleSpec(0.1, 0.2, 2, 1, ladder=(4, 8, 12, 16))),
    ("Simple/0.1/0.2/2/1/4,8/500", SimpleSpec(0.1, 0.2, 2, 1, every=500, ladder=(4, 8))),
    ("Simple/0/1/0/0/epoch/ladder=8/combine=mean",
     SimpleSpec(0.0, 1.0, 0, 0, every="epoch", ladder=(8,), combine="mean")),
    ("Simple/.2/.2/0/0/every=3/sample=1", SimpleSpec(0.2, 0.2, 0, 0, every=3, sample=1)),
])
def test_spec_forms_parse_and_print_back(text, expect):
    spec = parse_spec(text)
    assert spec == expect
    assert parse_spec(str(spec)) == spec


@pytest.mark.parametrize("text, names", [
    ("Simple/0.1/0.2/1", "needs at least 4"),
    ("Greedy/0.1/0.2/1/1", "'Greedy'"),
    ("Simple/0.3/0.2/0/0", "LOWER <= UPPER"),
    ("Simple/x/0.2/0/0", "'x'"),
    ("Simple/0.1/1.5/0/0", "1.5"),
    ("Simple/0.1/0.2/-1/0", "'-1'"),
    ("Simple/0.1/0.2/1/0.5", "'0.5'"),
    ("Simple/0.1/0.2/1/1/soon", "'soon'"),
    ("Simple/0.1/0.2/1/1/0", "got 0"),
    ("Simple/0.1/0.2/1/1/16,8", "'16,8'"),
    ("Simple/0.1/0.2/1/1/4,8,32", "'4,8,32'"),
    ("Simple/0.1/0.2/1/1/5/6", "every twice"),
    ("Simple/0.1/0.2/1/1/hold=3", "'hold'"),
    ("Simple/0.1/0.2/1/1/combine=min", "'min'"),
    ("Simple/0.1/0.2/1/1/sample=0", "got 0"),
    ("", "Simple/LOWER/UPPER/INITIAL/HOLD"),
])
def test_malformed_specs_say_what_is_wrong_and_the_expected_form(text, names):
    with pytest.raises(ValueError) as e:
        parse_spec(text)
    assert names in str(e.value)
    assert "Simple/LOWER/UPPER/INITIAL/HOLD" in str(e.value)


def test_ladder_steps_stop_at_the_ends_and_snap_between_rungs():
    ladder = (4, 8, 16)
    assert [ladder_step(b, +1, ladder) for b in (4, 8, 16, 6, 2, 20)] == [8, 16, 16, 8, 4, 20]
    assert [ladder_step(b, -1, ladder) for b in (4, 8, 16, 6, 2, 20)] == [4, 4, 8, 4, 2, 16]
    assert ladder_step(8, 0, ladder) == 8


# -- the Simple rule on scripted ZSE ---------------------------------------------------

def _run(spec, zses, bits=8, key="L|fw+fi"):
    """Feed one key a ZSE per decision; return its bits after each decision."""
    ctl, out = SimpleController(spec), []
    for z in zses:
        bits = ctl.decide({key: (z, bits)})[key]
        out.append(bits)
    return out


def test_thresholds_are_strict_and_move_one_rung():
    spec = "Simple/0.1/0.3/0/0"
    assert _run(spec, [0.05]) == [4]
    assert _run(spec, [0.35]) == [16]
    assert _run(spec, [0.1]) == [8]      # equal to LOWER: keep
    assert _run(spec, [0.3]) == [8]      # equal to UPPER: keep
    assert _run(spec, [0.2]) == [8]
    assert _run(spec, [0.9], bits=4) == [8]  # one rung, not to the top


def test_no_change_during_the_initial_decisions():
    assert _run("Simple/0.1/0.3/3/0", [0.0, 0.0, 0.0, 0.0, 0.0]) == [8, 8, 8, 4, 4]
    assert _run("Simple/0.1/0.3/0/0", [0.0]) == [4]


def test_a_pair_holds_for_hold_decisions_after_a_change():
    # change, then 2 held decisions, then free again
    assert _run("Simple/0.1/0.3/0/2", [0.9, 0.0, 0.0, 0.0, 0.0, 0.0]) == [16, 16, 16, 8, 8, 8]
    assert _run("Simple/0.1/0.3/0/1", [0.9, 0.9, 0.0, 0.0, 0.9]) == [16, 16, 8, 8, 16]
    assert _run("Simple/0.1/0.3/0/0", [0.9, 0.0, 0.9, 0.0]) == [16, 8, 16, 8]


def test_ladder_ends_and_custom_ladders():
    assert _run("Simple/0.1/0.3/0/0", [0.0, 0.0], bits=4) == [4, 4]
    assert _run("Simple/0.1/0.3/0/0", [0.9, 0.9]) == [16, 16]
    assert _run("Simple/0.1/0.3/0/0/4,8,12,16", [0.9, 0.9, 0.9, 0.0]) == [12, 16, 16, 12]
    # a pair at the end does not start a hold: nothing changed
    assert _run("Simple/0.1/0.3/0/5", [0.0, 0.9], bits=4) == [4, 8]


def test_unmeasured_pairs_keep_their_bits_and_keys_are_independent():
    ctl = SimpleController("Simple/0.1/0.3/0/1")
    out = ctl.decide({"a": (None, 8), "b": (math.nan, 8), "c": (0.0, 8)})
    assert out == {"a": 8, "b": 8, "c": 4}
    out = ctl.decide({"a": (0.0, 8), "b": (0.9, 8), "c": (0.0, 4)})
    assert out == {"a": 4, "b": 16, "c": 4}  # c is held
    assert ctl.decision == 2


# -- ZSE against an independent float64 computation ------------------------------------

def np_bfp_truncate_counts(x: np.ndarray, bits: int, group) -> tuple[int, int]:
    """(nonzero, zeroed) of BlockFloat truncation, tile by tile in float64.

    Shared exponent = largest floor(log2|x|) of the tile (via frexp, exact),
    LSB = 2**(Emax - bits + 1), magnitudes truncated toward zero.
    """
    g = tuple(group[:x.ndim]) + (1,) * (x.ndim - len(group))
    nonzero = zeroed = 0
    for start in product(*(range(0, n, k) for n, k in zip(x.shape, g))):
        tile = np.abs(x[tuple(slice(s, s + k) for s, k in zip(start, g))].astype(np.float64))
        nz = tile != 0
        if not nz.any():
            continue
        emax = int(np.frexp(tile[nz])[1].max()) - 1
        q = np.trunc(tile / 2.0 ** (emax - bits + 1))
        nonzero += int(nz.sum())
        zeroed += int((nz & (q == 0)).sum())
    return nonzero, zeroed


def wide_tensor(shape, seed, zeros=0.2):
    """Values over ~30 binades, exact zeros and a few float32 subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-24, 6, shape, generator=g).float())
    x[torch.rand(shape, generator=g) < zeros] = 0.0
    x.view(-1)[:3] = torch.tensor([1e-40, -3e-42, 2e-39])
    return x


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("shape, group", [((5, 13, 3, 3), (1, 4, 3, 3)), ((7, 30), (1, 8)),
                                          ((3, 5, 4, 4), (2, 3, 2, 1))])
def test_zero_setting_error_matches_a_float64_reimplementation(bits, shape, group):
    x = wide_tensor(shape, seed=bits)
    nonzero, zeroed = np_bfp_truncate_counts(x.numpy(), bits, group)
    fmt = BlockFloat(bits, group)
    assert bfp.kernels.quantize_stats(x, fmt, stats=True)[1].tolist() == [nonzero, zeroed]
    assert bfp.zero_setting_error(x, fmt) == zeroed / nonzero
    assert zeroed > 0  # the case is not trivial


def _conv(bits=4, group=(1, 4, 3, 3), points=("fw", "fi", *BACKWARD), seed=0):
    torch.manual_seed(seed)
    fmt = BlockFloat(bits, group)
    return QConv2d.from_float(torch.nn.Conv2d(6, 8, 3, padding=1, bias=False),
                              LayerPrecision(**{p: fmt for p in points}))


def test_layer_measurement_counts_the_tensor_each_point_quantizes():
    """fw: the weight; fi/bwi: the input; bwo/bio: the OUTPUT gradient (the
    original measured the weight gradient there)."""
    model = torch.nn.Sequential(_conv())
    layer = model[0]
    dp = DynamicPrecision(model, "Simple/0.1/0.2/0/0")
    dp.install()
    x = wide_tensor((3, 6, 5, 5), seed=1).requires_grad_()
    grad_y = wide_tensor((3, 8, 5, 5), seed=2)
    model(x).backward(grad_y)
    expect = {"fw": layer.weight.detach(), "fi": x.detach(), "bwi": x.detach(),
              "bwo": grad_y, "bio": grad_y, "biw": layer.weight.detach()}
    counts = dp.counts()[0]
    for j, point in enumerate(bfp.POINTS):
        want = np_bfp_truncate_counts(expect[point].numpy(), 4, (1, 4, 3, 3)) if point in expect else (0, 0)
        assert counts[j].tolist() == list(want), point
    zse = dp.point_zse()["0"]
    assert zse["bwo"] == want_ratio(grad_y) and zse["fw"] == want_ratio(layer.weight.detach())
    # evaluation passes are not counted; a decision starts the next count from zero
    model.eval()
    model(x)
    assert torch.equal(dp.counts()[0], counts)
    dp.decide()
    assert dp.counts().sum() == 0
    dp.remove()
    assert layer.quantize_hook is None


def want_ratio(t):
    nz, z = np_bfp_truncate_counts(t.numpy(), 4, (1, 4, 3, 3))
    return z / nz


def test_measured_output_is_what_quantize_gives():
    model = torch.nn.Sequential(_conv(), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(200, 3))
    x = wide_tensor((2, 6, 5, 5), seed=3)
    plain = model(x)
    dp = DynamicPrecision(model, "Simple/0.1/0.2/0/0")
    dp.install()
    assert torch.equal(model(x), plain)


def test_counts_are_summed_over_processes_when_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist
    model = torch.nn.Sequential(_conv())
    dp = DynamicPrecision(model, "Simple/0.1/0.2/0/0")
    dp.install()
    model(wide_tensor((2, 6, 5, 5), seed=4)).sum().backward()
    local = dp.counts()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert torch.equal(dp.global_counts(), local)  # one rank: the sum is its own counts
        # a second rank with the same counts, as all_reduce would sum them
        monkeypatch.setattr(dist, "all_reduce", lambda t: t.mul_(2))
        assert torch.equal(dp.global_counts(), 2 * local)
        assert dp.point_zse() == dp.point_zse(local)  # ratios of summed counts
        assert torch.equal(dp.counts(), local)  # the local counts themselves are left alone
    finally:
        dist.destroy_process_group()


def test_one_step_in_sample_is_measured_starting_after_each_decision():
    model = torch.nn.Sequential(_conv())
    x = wide_tensor((2, 6, 5, 5), seed=5)
    trainer = FakeTrainer(model=model, writer=None, run_dir=None, global_step=0, epoch=0, messages=[])
    dp = DynamicPrecision(model, "Simple/0/1/0/0/5/sample=2")
    dp.on_train_start(trainer)
    seen = []
    for step in range(1, 11):
        model(x).sum().backward()
        seen.append(dp.counts()[0, 0, 0].item())  # fw nonzero count so far
        trainer.global_step = step
        dp.on_batch_end(trainer, step)
    per_step = seen[0]
    # steps 1, 3, 5 | 6, 8, 10 are measured (a decision after step 5 restarts the pattern)
    assert seen == [per_step, per_step, 2 * per_step, 2 * per_step, 3 * per_step,
                    per_step, per_step, 2 * per_step, 2 * per_step, 3 * per_step]


# -- decisions on real layers -------------------------------------------------------

def _mixed_model():
    torch.manual_seed(0)
    bf = BlockFloat(8, (1, 12, 3, 3), rounding="nearest")
    conv = QConv2d.from_float(torch.nn.Conv2d(4, 4, 3), LayerPrecision(
        fw=bf, fi=bf, bwo=bf, bwi=BlockFloat(16, (1, 6, 3, 3)), bio=Float(4, 3, encoding="fn"),
        biw=MX("float8_e4m3fn")))
    lin = QLinear.from_float(torch.nn.Linear(4, 2), LayerPrecision(fw=MX("float8_e4m3fn"), fi=Float(5, 2)))
    return torch.nn.ModuleDict({"conv": conv, "lin": lin})


def test_a_decision_replaces_only_blockfloat_bits_keeping_group_and_rounding():
    model = _mixed_model()
    dp = DynamicPrecision(model, "Simple/0.1/0.3/0/0")
    before = model["conv"].precision
    rows = dp.decide(step=10, epoch=0, zse={"conv": {"fw": 0.05, "fi": 0.0, "bwo": 0.5, "bwi": 0.0}})
    after = model["conv"].precision
    assert after.fw == BlockFloat(4, (1, 12, 3, 3), rounding="nearest") == after.fi
    assert after.bwo == BlockFloat(16, (1, 12, 3, 3), rounding="nearest")   # max(0.5, 0.0) > upper
    assert after.bwi == BlockFloat(16, (1, 6, 3, 3))                        # already at the top
    assert (after.bio, after.biw) == (before.bio, before.biw)               # Float / MX: left alone
    assert model["lin"].precision == LayerPrecision(fw=MX("float8_e4m3fn"), fi=Float(5, 2))
    assert [(r["layer"], r["pair"], r["zse"], r["old_bits"], r["new_bits"]) for r in rows] == [
        ("conv", "fw+fi", 0.05, 8, 4), ("conv", "bwo+bwi", 0.5, 8, 16)]  # no BlockFloat: no bio+biw row
    assert set(rows[0]) == set(CSV_FIELDS)


def test_combine_mean_averages_the_pair():
    model = _mixed_model()
    dp = DynamicPrecision(model, "Simple/0.1/0.3/0/0/combine=mean")
    dp.decide(zse={"conv": {"fw": 0.05, "fi": 0.5}})  # mean 0.275: keep; max would raise
    assert model["conv"].precision.fw.bits == 8


def test_every_comes_from_the_spec_or_the_argument_but_not_two_different_ones():
    model = _mixed_model()
    assert DynamicPrecision(model, "Simple/0.1/0.3/0/0").every == "epoch"
    assert DynamicPrecision(model, "Simple/0.1/0.3/0/0", every="25").every == 25
    assert DynamicPrecision(model, "Simple/0.1/0.3/0/0/5", every="epoch").every == 5
    with pytest.raises(ValueError, match="given twice"):
        DynamicPrecision(model, "Simple/0.1/0.3/0/0/5", every=7)
    with pytest.raises(ValueError, match="no converted layers"):
        DynamicPrecision(torch.nn.Linear(2, 2), "Simple/0.1/0.3/0/0")
    with pytest.raises(ValueError, match="`color` must be True or False"):
        DynamicPrecision.from_args(model, "Simple/0.1/0.3/0/0", color="maybe")


# -- checkpoint state -----------------------------------------------------------------

def _scripted(dp, k):
    """Deterministic pseudo-ZSE for decision k."""
    rng = np.random.default_rng(k)
    return {"conv": {p: float(rng.uniform(0, 0.5)) for p in ("fw", "fi", "bwo", "bwi")}}


def test_state_round_trips_through_a_weights_only_load_and_continues_the_same_decisions():
    spec = "Simple/0.15/0.35/1/2/4,8,12,16"
    a = DynamicPrecision(_mixed_model(), spec)
    for k in range(4):
        a.decide(zse=_scripted(a, k))
    a.install()
    model_a = a.model
    model_a["conv"].train()(torch.randn(2, 4, 5, 5)).sum().backward()  # pending counts travel too
    buf = io.BytesIO()
    torch.save({"callbacks": {a.name: a.state_dict()}}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["callbacks"][a.name]

    b = DynamicPrecision(_mixed_model(), spec)  # fresh model at the config's bits
    b.load_state_dict(state)
    assert b.bits() == a.bits()
    assert b.controller.state_dict() == a.controller.state_dict()
    assert torch.equal(b.counts(), a.counts())
    for k in range(4, 12):
        rows_a, rows_b = a.decide(zse=_scripted(a, k)), b.decide(zse=_scripted(b, k))
        assert rows_a == rows_b
    assert any(r["new_bits"] != r["old_bits"] for r in rows_a) or a.controller.hold


def test_state_of_another_model_is_refused():
    a = DynamicPrecision(_mixed_model(), "Simple/0.1/0.3/0/0")
    b = DynamicPrecision(torch.nn.Sequential(_conv()), "Simple/0.1/0.3/0/0")
    with pytest.raises(ValueError, match="other layers"):
        b.load_state_dict(a.state_dict())


# -- logs, table, plot --------------------------------------------------------------------

class FakeTrainer(SimpleNamespace):
    def log(self, msg):
        self.messages.append(msg)


def test_callback_writes_csv_tensorboard_and_a_plain_or_coloured_table(tmp_path, capsys):
    model = torch.nn.Sequential(_conv(bits=8))
    scalars = []
    writer = SimpleNamespace(add_scalar=lambda tag, v, step: scalars.append((tag, v, step)))
    trainer = FakeTrainer(model=model, writer=writer, run_dir=tmp_path, global_step=0, epoch=0, messages=[])
    dp = DynamicPrecision(model, "Simple/0.02/0.05/0/0", every=2)
    dp.on_train_start(trainer)
    for step in range(1, 5):
        model(torch.randn(2, 6, 5, 5)).square().sum().backward()
        trainer.global_step = step
        dp.on_batch_end(trainer, step)
    dp.on_epoch_end(trainer, 0, {})  # every=2 steps: the epoch end does not decide
    rows = read_log(tmp_path)
    assert list(rows[0]) == list(CSV_FIELDS)
    assert [r["decision"] for r in rows] == ["0"] * 3 + ["1"] * 3
    assert [r["step"] for r in rows] == ["2"] * 3 + ["4"] * 3
    assert {r["pair"] for r in rows} == {"fw+fi", "bio+biw", "bwo+bwi"}
    tags = {t for t, _, _ in scalars}
    assert {"dynamic_bits/0/fw", "dynamic_zse/0/bwo", "dynamic_zse/0/fi"} <= tags
    table = trainer.messages[-1]
    assert "decision 1" in table and "fw+fi" in table and "\033[" not in table

    dp.color = True
    dp._decide_and_log(trainer)
    assert "\033[" in capsys.readouterr().out
    dp.on_train_end(trainer)
    assert model[0].quantize_hook is None

    # a resumed run rewrites the log from the checkpoint's decision on
    resumed = DynamicPrecision(model, "Simple/0.02/0.05/0/0", every=2)
    resumed.load_state_dict({**dp.state_dict(), "controller": {"decision": 1, "hold": {}}})
    resumed.on_train_start(trainer)
    assert {r["decision"] for r in read_log(tmp_path)} == {"0"}


def test_table_marks_changes():
    rows = [{"decision": 3, "step": 30, "epoch": 2, "layer": "a", "pair": "fw+fi", "zse": 0.5,
             "old_bits": 8, "new_bits": 16},
            {"decision": 3, "step": 30, "epoch": 2, "layer": "a", "pair": "bio+biw", "zse": None,
             "old_bits": 8, "new_bits": 8}]
    plain = format_table(rows, parse_spec("Simple/0.1/0.2/0/0"))
    assert "8>16 (0.500)" in plain and "8 (  n/a)" in plain and "\033[" not in plain
    coloured = format_table(rows, parse_spec("Simple/0.1/0.2/0/0"), color=True)
    assert "\033[1;31m 8>16" in coloured and "\033[2m    8 (  n/a)" in coloured


def test_plot_from_a_csv_and_the_cli(tmp_path, capsys):
    with open(tmp_path / CSV_NAME, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for d, (a, b) in enumerate([(8, 4), (4, 4), (4, 8)]):
            w.writerow([d, 10 * (d + 1), d, "layer1", "fw+fi", 0.1, a, b])
            w.writerow([d, 10 * (d + 1), d, "layer2", "bio+biw", 0.3, 16, 16])
    out = plot_precision(tmp_path)
    assert out == tmp_path / "dynamic_precision.png" and out.read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").exists() and "p.png" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path / "missing")])
    assert "no dynamic precision log" in capsys.readouterr().err


# -- end to end ---------------------------------------------------------------------------

@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from threads, and lose a lot on a busy machine."""
    import numba
    old = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(old[0])
    numba.set_num_threads(old[1])


def test_digits_run_changes_precision_and_a_resumed_run_makes_the_same_decisions(tmp_path, tiny_args,
                                                                                   one_thread):
    from bfp.engine import checkpoint as ckpt
    from bfp.cli import cifar as cifar_main

    # 3 steps an epoch, a decision every 2 steps: the checkpoint after epoch 1
    # falls between decisions, with counts pending.
    common = tiny_args("--training-epochs", "3", "--bfp", "ResNet18_FB16", "--log", "True", "--save", "True",
                       "--save-interval", "1", "--do", "Simple/0.2/0.5/0/1/2", "--run-name", "do",
                       train_images=96)  # batches of 32
    assert cifar_main(common) == 0
    run = tmp_path / "runs" / "do"
    straight_log = (run / CSV_NAME).read_text()
    rows = read_log(run)
    assert sorted({(int(r["decision"]), int(r["step"])) for r in rows}) == [(0, 2), (1, 4), (2, 6), (3, 8)]
    assert any(r["old_bits"] != r["new_bits"] for r in rows)
    straight = ckpt.load(run / "checkpoints" / "last.pt")  # a weights_only load
    dyn = straight["callbacks"]["dynamic_precision"]
    assert dyn["controller"]["decision"] == 4
    lead = {"fw+fi": "fw", "bio+biw": "bio", "bwo+bwi": "bwo"}
    for r in (r for r in rows if r["decision"] == "3"):  # the model ends at the last decision's bits
        assert dyn["bits"][r["layer"]][lead[r["pair"]]] == int(r["new_bits"])
        assert straight["precision_state"][r["layer"]][lead[r["pair"]]]["bits"] == int(r["new_bits"])
    assert plot_precision(run).exists()

    # branch from epoch 1 the documented way: a copy of the run without its later last.pt
    # (the copy's CSV still holds the straight run's later decisions, which the resume drops)
    import shutil
    branch = tmp_path / "runs" / "branch"
    shutil.copytree(run, branch)
    (branch / "checkpoints" / "last.pt").unlink()
    cut = branch / "checkpoints" / "epoch_001.pt"
    assert ckpt.load(cut)["callbacks"]["dynamic_precision"]["batches"] == 1
    assert cifar_main([*common, "--resume", str(cut)]) == 0
    assert (branch / CSV_NAME).read_text() == straight_log
    resumed = ckpt.load(branch / "checkpoints" / "last.pt")["callbacks"]["dynamic_precision"]
    assert torch.equal(resumed.pop("counts"), dyn.pop("counts")) and resumed == dyn
