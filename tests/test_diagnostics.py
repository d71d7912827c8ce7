"""bfp.diagnostics: per-point SQNR and friends, the --diagnose callback and --mode diagnose."""
import csv
import math

import pytest
import torch

from bfp import Float, LayerPrecision, quantize
from bfp.cli import cifar as main
from bfp.diagnostics import PointDiagnostics, measure_step, point_stats, table
from bfp.layers import QLinear

E4M3 = Float(4, 3)


def test_point_stats_equal_a_float64_computation():
    x = torch.tensor([1.0, 2.0, 3.0, 0.01, -500.0, float("nan"), 0.0])
    q = torch.tensor([1.0, 2.0, 2.0, 0.0, -448.0, float("nan"), 0.0])
    r = point_stats(x, q, Float(4, 3, encoding="fn"))  # max 448
    sig = float(torch.tensor([1.0, 2.0, 3.0, 0.01, -500.0]).double().pow(2).sum())  # 0.01 as float32
    err = float((torch.tensor([0.0, 0.0, 1.0, 0.01, -52.0]).double() ** 2).sum())
    assert r["sqnr_db"] == 10 * math.log10(sig / err)
    assert r["rel_l2"] == math.sqrt(err / sig)
    assert r["flushed"] == 1 / 6  # 0.01, of six nonzeros (NaN counts, as the kernels' zero-setting counts)
    assert r["saturated"] == 1 / 6        # |-500| > 448, of six finite elements
    assert r["range_use"] == 500 / 448
    assert r["numel"] == 7


def test_point_stats_edges():
    z = torch.zeros(4)
    assert math.isnan(point_stats(z, z)["sqnr_db"]) and point_stats(z, z)["rel_l2"] == 0.0
    x = torch.tensor([1.0, 2.0])
    assert point_stats(x, x)["sqnr_db"] == math.inf
    assert point_stats(x, x)["saturated"] is None  # no format: no fixed range


def test_layer_points_are_measured_on_the_tensors_they_round():
    torch.manual_seed(0)
    lin = QLinear.from_float(torch.nn.Linear(16, 8), LayerPrecision(fw=E4M3, fi=E4M3, bwo=E4M3))
    x = torch.randn(4, 16)
    diag = PointDiagnostics(lin)
    diag.arm()
    out = lin(x)
    out.pow(2).sum().backward()
    rows = {r["point"]: r for r in diag.disarm()}
    assert set(rows) == {"fw", "fi", "bwo"}
    assert rows["fw"]["sqnr_db"] == point_stats(lin.weight, quantize(lin.weight, E4M3))["sqnr_db"]
    assert rows["fi"]["sqnr_db"] == point_stats(x, quantize(x, E4M3))["sqnr_db"]
    assert rows["fw"]["format"] == "e4m3"
    assert lin.quantize_hook is None  # disarm gives the layer its hook back


def test_measure_step_leaves_no_gradients_and_orders_worst_first():
    from bfp.conversion import convert
    from bfp.models import create
    model = convert(create("ResNet10", width=4), "ResNet18_FB12")
    rows = measure_step(model, torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    assert rows and all(p.grad is None for p in model.parameters())
    lines = table(rows).splitlines()[2:]
    values = [float(line.split()[3]) for line in lines]
    assert values == sorted(values)


def test_diagnose_flag_writes_a_csv_every_n_steps(tiny_args, tmp_path):
    assert main(tiny_args("--training-epochs", "1", "--bfp", "ResNet18_FB12", "--diagnose", "1", "--log", "True",
                          "--do", "Simple/0.1/0.2/0/1", "--run-name", "d")) == 0
    rows = list(csv.DictReader(open(tmp_path / "runs" / "d" / "diagnostics.csv")))
    steps = sorted({int(r["step"]) for r in rows})
    assert steps == [1, 2]  # 64 images, batch 32: every step measured
    assert {r["point"] for r in rows} >= {"fw", "fi", "bwo", "bwi", "bio", "biw"}
    assert all(float(r["sqnr_db"]) > 0 for r in rows)


def test_mode_diagnose_on_a_saved_run_prints_a_table_and_draws_a_heat_map(tiny_args, tmp_path, capsys):
    assert main(tiny_args("--training-epochs", "1", "--bfp", "ResNet18_FB12", "--save", "True",
                          "--run-name", "r")) == 0
    run = tmp_path / "runs" / "r"
    capsys.readouterr()
    assert main(tiny_args("--mode", "diagnose", "--resume", str(run))) == 0
    out = capsys.readouterr().out
    assert "worst first" in out and "layer1.0.conv1" in out
    assert (run / "diagnose.png").stat().st_size > 1000
    # a second diagnose never replaces the plot without --overwrite True (issue 53, item 2)
    (run / "diagnose.png").write_bytes(b"kept")
    assert main(tiny_args("--mode", "diagnose", "--resume", str(run))) == 2
    assert "diagnose.png exists; pass --overwrite True" in capsys.readouterr().err
    assert (run / "diagnose.png").read_bytes() == b"kept"
    assert main(tiny_args("--mode", "diagnose", "--resume", str(run), "--overwrite", "True")) == 0
    assert (run / "diagnose.png").stat().st_size > 1000


def test_mode_diagnose_and_sweep_keep_an_existing_plot_in_the_working_folder(tiny_args, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    for mode, name in (("diagnose", "diagnose.png"), ("sweep", "sweep.png")):
        (tmp_path / name).write_bytes(b"kept")
        assert main(tiny_args("--mode", mode, "--bfp", "ResNet18_FB12")) == 2
        assert f"{name} exists; pass --overwrite True" in capsys.readouterr().err
        assert (tmp_path / name).read_bytes() == b"kept"


def test_mode_diagnose_without_a_config_says_what_it_needs(tiny_args, capsys):
    assert main(tiny_args("--mode", "diagnose")) == 2
    assert "--mode diagnose needs quantized layers" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1"])
def test_bad_diagnose_interval(tiny_args, capsys, value):
    assert main(tiny_args("--diagnose", value)) == 2
    assert "--diagnose must be >= 0" in capsys.readouterr().err


def test_draw_curve_plots_a_layers_sqnr_over_training(tiny_args, tmp_path, capsys):
    from bfp.cli.plot import main as plot
    assert main(tiny_args("--training-epochs", "2", "--bfp", "ResNet18_FB12", "--diagnose", "1", "--log", "True",
                          "--run-name", "s")) == 0
    run = tmp_path / "runs" / "s"
    assert plot([str(run), "--sqnr", "layer1.0.conv1", "-o", str(tmp_path / "png")]) == 0
    assert (tmp_path / "png" / "sqnr-layer1.0.conv1.png").stat().st_size > 1000
    assert plot([str(run), "--sqnr", "nope"]) == 2
    assert "measured layers: layer1.0.conv1" in capsys.readouterr().err


def test_sweep_formats_and_sqnr_grow_with_bits():
    from bfp.diagnostics import sweep, sweep_format
    assert repr(sweep_format("float", 8, 4)).startswith("Float(e4m3")
    assert repr(sweep_format("float", 16, 2)).startswith("Float(e5m10")
    assert sweep_format("bfp", 6, 4).group == (1, 16, 1, 1)
    assert sweep_format("mx", 8, 3).axis == 2
    with pytest.raises(ValueError, match="allowed: bfp, float, mx"):
        sweep_format("int", 8, 2)
    g = torch.Generator().manual_seed(0)
    rows = sweep({"fi": [torch.randn(4, 32, 3, 3, generator=g)]}, ("bfp",), range(2, 9))
    sq = [r["sqnr_db"] for r in rows]
    assert all(b > a + 4 for a, b in zip(sq, sq[1:]))  # about 6 dB per bit


def test_mode_sweep_prints_and_plots(tiny_args, tmp_path, capsys):
    png = tmp_path / "sweep.png"
    assert main(tiny_args("--mode", "sweep", "--bfp", "ResNet18_FB12", "--sweep-family", "bfp,float",
                          "--diagnose-out", str(png))) == 0
    out = capsys.readouterr().out
    assert "bfp    bits" in out and "float  bits" in out and png.stat().st_size > 1000
    assert main(tiny_args("--mode", "sweep", "--bfp", "ResNet18_FB12", "--sweep-family", "posit")) == 2
    assert "--sweep-family 'posit'" in capsys.readouterr().err


def _shadow_rows(precision):
    from bfp.diagnostics import Shadow
    torch.manual_seed(0)
    model = torch.nn.Sequential(QLinear.from_float(torch.nn.Linear(8, 16), precision), torch.nn.ReLU(),
                                QLinear.from_float(torch.nn.Linear(16, 4), precision))
    crit = torch.nn.functional.cross_entropy
    sh = Shadow()
    rec = sh.arm(model, crit)
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    rec(model(x), y).backward()
    return sh.compare(crit)


def test_shadow_of_an_exact_format_agrees_and_of_a_narrow_one_drifts():
    f32 = Float(8, 23, overflow="inf")  # rounds float32 to itself
    same = _shadow_rows(LayerPrecision(fw=f32, fi=f32, bwo=f32, bwi=f32, bio=f32, biw=f32))
    assert [r["layer"] for r in same] == ["0", "2"]
    for r in same:
        assert r["act_rel"] == r["grad_rel"] == r["wgrad_rel"] == 0.0
        assert abs(r["act_cos"] - 1) < 1e-12 and abs(r["wgrad_cos"] - 1) < 1e-12
    e2m1 = Float(2, 1, encoding="finite")
    narrow = _shadow_rows(LayerPrecision(fw=e2m1, fi=e2m1, bwo=e2m1, bio=e2m1))
    assert all(r["act_rel"] > 0.01 and r["act_cos"] < 1 for r in narrow)


def test_compare_is_cosine_and_relative_error():
    from bfp.diagnostics import compare
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])
    cos, rel = compare(a, b)
    assert cos == 1 / math.sqrt(2) and rel == 1 / math.sqrt(2)
    assert all(math.isnan(v) for v in compare(None, b))


def test_shadow_flag_writes_shadow_csv_and_needs_diagnose(tiny_args, tmp_path, capsys):
    assert main(tiny_args("--training-epochs", "1", "--bfp", "ResNet18_FB12", "--diagnose", "2", "--shadow", "True",
                          "--log", "True", "--run-name", "sh")) == 0
    rows = list(csv.DictReader(open(tmp_path / "runs" / "sh" / "shadow.csv")))
    assert rows and {r["step"] for r in rows} == {"2"} and 0 < float(rows[0]["act_cos"]) <= 1
    assert main(tiny_args("--shadow", "True")) == 2
    assert "--shadow compares" in capsys.readouterr().err


def test_a_tensor_rounded_at_two_points_is_measured_once_and_reported_at_both():
    torch.manual_seed(1)
    lin = QLinear.from_float(torch.nn.Linear(16, 8), LayerPrecision(fw=E4M3, biw=E4M3, fi=E4M3, bwi=E4M3))
    x = torch.randn(4, 16, requires_grad=True)  # so the input-gradient GEMM (biw) runs
    diag = PointDiagnostics(lin)
    diag.arm()
    lin(x).sum().backward()
    rows = {r["point"]: r for r in diag.disarm()}
    assert rows["fw"]["sqnr_db"] == rows["biw"]["sqnr_db"] == point_stats(lin.weight, quantize(lin.weight, E4M3))["sqnr_db"]
    assert rows["fi"]["sqnr_db"] == rows["bwi"]["sqnr_db"] == point_stats(x.detach(), quantize(x.detach(), E4M3))["sqnr_db"]
    assert len(diag._seen) == 0  # the cache lives for one armed step


def test_delayed_scaling_is_measured_by_diagnose_sweep_and_the_diagnose_flag(tiny_args, tmp_path, capsys):
    """Issue 53, item 8: delayed scaling's points reach the hooks (they round with the layer's own
    history, as the layer would), so every diagnostic sees them."""
    assert main(tiny_args("--mode", "diagnose", "--bfp", "any_fp8_delayed",
                          "--diagnose-out", str(tmp_path / "d.png"))) == 0
    out = capsys.readouterr().out
    assert "layer1.0.conv1" in out and "no quantization point" not in out and (tmp_path / "d.png").exists()
    assert main(tiny_args("--mode", "sweep", "--bfp", "any_fp8_delayed", "--diagnose-out", str(tmp_path / "s.png"))) == 0
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert main(tiny_args("--training-epochs", "1", "--bfp", "any_fp8_delayed", "--diagnose", "1", "--log", "True",
                          "--run-name", "dl")) == 0
    rows = list(csv.DictReader(open(tmp_path / "runs" / "dl" / "diagnostics.csv")))
    assert {r["point"] for r in rows} >= {"fw", "fi", "bwo", "bwi", "bio", "biw"}
    assert all(float(r["sqnr_db"]) > 10 for r in rows)


def test_a_measured_step_moves_delayed_histories_as_an_unmeasured_one():
    from bfp.conversion import convert
    torch.manual_seed(0)
    a = convert(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)),
                "any_fp8_delayed")
    b = convert(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)),
                "any_fp8_delayed")
    b.load_state_dict(a.state_dict())
    x, y = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 0, 1])
    rows = measure_step(a, x, y)
    assert {r["point"] for r in rows} == {"fw", "fi", "bwo", "bwi", "bio", "biw"}
    b.train()
    torch.nn.functional.cross_entropy(b(x), y).backward()
    for (n, t), (_, u) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(t, u), n  # histories included: the measured step rounded as the layer would
