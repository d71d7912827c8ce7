"""draw_curve.py / bfp plot: readable figures for runs of any length, written where the user expects."""
import json

import pytest
from matplotlib.figure import Figure

from bfp.cli.plot import main as plot_main
from bfp.engine.plots import MARKERS_UP_TO, draw_curves


def write_run(path, losses):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for e, loss in enumerate(losses):
            f.write(json.dumps(dict(epoch=e, train_loss=loss, test_loss=2 * loss, train_acc1=50.0 + e,
                                    test_acc1=40.0 + e)) + "\n")
    return path


@pytest.fixture
def saved(monkeypatch):
    """The axes of every figure as it is saved: {file name: Axes}."""
    axes, real = {}, Figure.savefig

    def spy(fig, path, *a, **k):
        axes[str(path).rsplit("/", 1)[-1]] = fig.axes[0]
        return real(fig, path, *a, **k)
    monkeypatch.setattr(Figure, "savefig", spy)
    return axes


def test_a_one_epoch_run_gets_markers_a_title_an_integer_tick_and_lands_in_its_run_dir(tmp_path, saved):
    run = write_run(tmp_path / "one", [25.8])
    written = draw_curves([run])
    assert written == [run / "loss.png", run / "accuracy.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    for name in ("loss.png", "accuracy.png"):
        ax = saved[name]
        assert [line.get_marker() for line in ax.get_lines()] == ["x", "o"]
        assert ax.get_title() == f"{name[:-4]} per epoch: one"
        assert list(ax.get_xticks()) == [1]
    assert saved["loss.png"].get_yscale() == "linear"


def test_long_runs_have_plain_lines_integer_ticks_and_an_optional_log_loss(tmp_path, saved):
    long = write_run(tmp_path / "long", [1 / (e + 1) for e in range(MARKERS_UP_TO + 1)])
    short = write_run(tmp_path / "short", [3.0, 1.0, 0.5])
    draw_curves([long, short], tmp_path / "out", labels=["L", "S"], log_loss=True)
    ax = saved["loss.png"]
    assert [line.get_marker() for line in ax.get_lines()] == ["None", "None", "x", "o"]
    assert ax.get_yscale() == "log" and ax.get_title() == "loss per epoch: L, S"
    assert all(t == int(t) for t in ax.get_xticks())
    assert saved["accuracy.png"].get_yscale() == "linear"
    assert (tmp_path / "out" / "loss.png").is_file()


def test_log_loss_names_a_loss_it_cannot_draw(tmp_path):
    run = write_run(tmp_path / "r", [1.0, 0.0])
    with pytest.raises(ValueError, match=r"epoch 2 train_loss is 0.0; a log scale \(--log-loss\)"):
        draw_curves([run], log_loss=True)


def test_cli_writes_several_runs_to_curves_in_the_working_directory(tmp_path, monkeypatch, capsys):
    a, b = write_run(tmp_path / "a", [1.0]), write_run(tmp_path / "b", [2.0])
    monkeypatch.chdir(tmp_path)
    assert plot_main([str(a), str(b), "--log-loss"]) == 0
    assert "wrote curves/loss.png" in capsys.readouterr().out
    assert plot_main([str(a), "-o", str(tmp_path / "x")]) == 0 and (tmp_path / "x" / "accuracy.png").is_file()
