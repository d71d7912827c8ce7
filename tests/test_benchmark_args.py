"""The benchmark scripts refuse bad values before any work, naming the flag and what is allowed
(issue 53, item 16): argparse's exit 2 with a message, never a traceback or a printed ratio."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

CASES = [
    ("overhead", ["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    ("overhead", ["--width", "0"], "--width must be an integer >= 1, got 0"),
    ("overhead", ["--batch", "0"], "--batch must be an integer >= 1, got 0"),
    ("overhead", ["--model", "nope"], "--model 'nope' unknown; allowed: ResNet10"),
    ("overhead", ["--configs", "nope"], "--configs nope: nope: no such config file or preset"),
    ("overhead", ["--device", "tpu"], "--device 'tpu'"),
    ("overhead", ["--json", "{tmp}"], "is a folder; give the JSON file's path"),
    ("overhead", ["--diagnose", "2", "--modes", "compile"], "include eager in --modes"),
    ("host_path", ["--reps", "0"], "--reps must be an integer >= 1, got 0"),
    ("host_path", ["--reps", "-5"], "--reps must be an integer >= 1, got -5"),
    ("host_path", ["--json", "{tmp}"], "is a folder"),
    ("sass_count", ["--formats", "nope"], "--formats 'nope': not a format name"),
    ("sass_count", ["--json", "{tmp}"], "is a folder"),
    ("gpu_check", ["--small", "--json", "{tmp}"], "is a folder"),
]


@pytest.mark.parametrize("script, argv, message", CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in CASES])
def test_a_bad_value_is_refused_before_any_work(script, argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if script in ("sass_count", "host_path"):  # Triton compiled, refusing the interpreter this suite runs under
        import os
        import subprocess
        pytest.importorskip("triton")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *argv], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        return
    main = __import__(script).main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_overhead_diagnose_times_the_measured_step(tmp_path, capsys):
    """--diagnose N failed with KeyError ('... measured' was never timed)."""
    import json
    from overhead import main
    out = tmp_path / "o.json"
    assert main(["--model", "ResNet10", "--width", "4", "--configs", "ResNet18_FB12", "--diagnose", "4",
                 "--steps", "1", "--batch", "4", "--json", str(out)]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert {"fp32", "ResNet18_FB12", "ResNet18_FB12 measured", "ResNet18_FB12 --diagnose 4"} <= set(rows)
    row = rows["ResNet18_FB12 --diagnose 4"]  # a ratio of two timings: its size is not a unit test's to judge
    assert row["measured_step_ratio"] > 0 and row["ratio_to_config"] == 1 + (row["measured_step_ratio"] - 1) / 4


def test_draw_curve_refuses_a_file_as_its_output_folder(tmp_path, capsys):
    from bfp.cli.plot import main
    (tmp_path / "f").write_text("x")
    assert main([str(tmp_path), "-o", str(tmp_path / "f")]) == 2
    assert "is a file; -o names the folder" in capsys.readouterr().err
