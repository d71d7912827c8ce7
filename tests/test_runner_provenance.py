"""The runner's provenance and seeds: run directories started by another command are never
collected nor resumed as the row; seeds 1 and 2 run for the references and the close rows;
verdicts use the seeds' spread; stale results are found against git; the report says at its top
when a table is incomplete, of a quick profile or not from one commit."""
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bfp.experiments import matrix, report, results, reruns, runner, spread, stale

ROWS = {r.name: r for r in matrix.ROWS}


def _fake_training(top1_of):
    """A stand-in for ``cifar.py``: writes the run directory (config.json with the command,
    metrics.jsonl with one record per epoch) whose top-1 is ``top1_of(run name, seed)``."""
    started = []

    def invoke(argv, log, say):
        flag = lambda f: argv[argv.index(f) + 1]   # noqa: E731
        run_dir = Path(flag("--run-dir")) / flag("--run-name")
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps({"command": ["/x/cifar.py", *argv[1:]]}))
        top1 = top1_of(flag("--run-name"), int(flag("--seed")))
        with open(run_dir / "metrics.jsonl", "w") as f:
            for e in range(int(flag("--training-epochs"))):
                f.write(json.dumps({"epoch": e, "global_step": e + 1, "train_loss": 1.0, "test_acc1": top1,
                                    "epoch_time_s": 1.0}) + "\n")
        runner._log(log, {"argv": argv, "git_commit": "c0ffee" * 6 + "c0ff"})
        started.append(flag("--run-name"))
        return 0
    return invoke, started


@pytest.fixture
def prof():
    return replace(matrix.profile("quick"), seeds=(0, 1, 2), rows=None)


def test_a_finished_run_of_other_epochs_or_data_is_set_aside_not_collected(tmp_path, monkeypatch, prof):
    invoke, started = _fake_training(lambda name, seed: 50.0)
    monkeypatch.setattr(runner, "_invoke", invoke)
    runs, res = tmp_path / "runs", tmp_path / "res"
    row = ROWS["fb12"]
    # a finished 6-epoch run in the row's directory, and then one trained on another -dp folder
    for other in (matrix.command(row, prof, "DATA", str(runs), epochs=6),
                  matrix.command(row, prof, "OTHER", str(runs), epochs=1)):
        invoke(other, runs / ".x", print)
        started.clear()
        assert runner.run_row("cifar10-table", row, prof, "DATA", res, runs, epochs=1, say=print)
        assert started == ["fb12"]  # trained afresh, not collected
        doc = results.read_result(res / "fb12.json")
        assert len(doc["epochs"]) == 1 and doc["command"] == matrix.command(row, prof, "DATA", str(runs), 1)
        (res / "fb12.json").unlink()
        import shutil
        shutil.rmtree(runs / "fb12")
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith("fb12.")) == [
        "fb12.other-command-1", "fb12.other-command-2"]  # nothing deleted


def test_a_run_of_the_same_command_is_collected_without_training(tmp_path, monkeypatch, prof):
    invoke, started = _fake_training(lambda name, seed: 50.0)
    monkeypatch.setattr(runner, "_invoke", invoke)
    runs, res = tmp_path / "runs", tmp_path / "res"
    invoke(matrix.command(ROWS["fb12"], prof, "DATA", str(runs), epochs=1), runs / ".fb12.invocations.jsonl", print)
    started.clear()
    assert runner.run_row("cifar10-table", ROWS["fb12"], prof, "DATA", res, runs, epochs=1, say=print)
    assert started == [] and results.read_result(res / "fb12.json")["final_top1"] == 50.0


def test_a_run_killed_before_its_first_checkpoint_restarts_and_is_not_called_resumed(tmp_path, monkeypatch, prof):
    invoke, started = _fake_training(lambda name, seed: 50.0)
    monkeypatch.setattr(runner, "_invoke", invoke)
    runs, res = tmp_path / "runs", tmp_path / "res"
    argv, log = matrix.command(ROWS["fb12"], prof, "DATA", str(runs), epochs=1), runs / ".fb12.invocations.jsonl"
    (runs / "fb12").mkdir(parents=True)  # killed twice in its first epoch: a config, no metrics, no checkpoint
    (runs / "fb12" / "config.json").write_text(json.dumps({"command": ["/x/cifar.py", *argv[1:]]}))
    for n in (1, 2):
        runner._log(log, {"argv": argv, "git_commit": f"killed{n}"})
    (runs / "fb12.failed-1").mkdir()  # an older failure keeps its name; the log goes with its directory
    assert runner.run_row("cifar10-table", ROWS["fb12"], prof, "DATA", res, runs, epochs=1, say=print)
    doc = results.read_result(res / "fb12.json")
    assert [i["git_commit"] for i in doc["invocations"]] == ["c0ffee" * 6 + "c0ff"] and doc["resumed"] is False
    assert report._notes(doc) == ""
    assert (runs / "fb12.failed-2" / "config.json").is_file()
    assert [json.loads(x)["git_commit"] for x in (runs / ".fb12.invocations.jsonl.failed-2").read_text().splitlines()] \
        == ["killed1", "killed2"]
    # a file written before this rule (resumed set by a second invocation) is read by its argv
    assert not results.resumed([{"argv": argv}, {"argv": argv}])
    assert report._notes({"resumed": True, "invocations": [{"argv": argv}, {"argv": argv}]}) == ""
    assert results.resumed([{"argv": argv}, {"argv": ["cifar.py", "--resume", "runs/fb12"]}])
    assert report._notes({"invocations": [{"argv": ["cifar.py", "--resume", "x"]}]}) == "resumed"


def test_seeds_run_for_references_and_close_rows_only(tmp_path, monkeypatch, prof):
    acc = {"fp32": 70.0, "fb24": 68.5, "fb12": 60.0}   # fb24 is 1.5 under: 0.5 from the threshold
    invoke, started = _fake_training(lambda name, seed: acc[name.split("-s")[0]] + seed / 10)
    monkeypatch.setattr(runner, "_invoke", invoke)
    monkeypatch.setattr(runner, "check_clean", lambda allow: None)
    rows = [ROWS[n] for n in ("fp32", "fb24", "fb12")]
    assert runner.run("cifar10-table", rows, prof, "DATA", tmp_path / "res", tmp_path / "runs", epochs=1,
                      say=print) == 0
    assert started == ["fp32", "fb24", "fb12", "fp32-s1", "fp32-s2", "fb24-s1", "fb24-s2"]
    got = results.load_results(tmp_path / "res")
    assert got["fb24-s2"]["seed"] == 2 and got["fb24-s2"]["base_row"] == "fb24"
    assert "--seed 2" in matrix.shell(got["fb24-s2"]["command"]) and "--seed 0" not in matrix.shell(got["fb24-s2"]["command"])
    assert spread.top1s(got, "fb24") == [68.5, 68.6, 68.7]
    started.clear()  # a rerun has nothing left to do
    assert runner.run("cifar10-table", rows, prof, "DATA", tmp_path / "res", tmp_path / "runs", epochs=1,
                      say=print) == 0 and started == []


def test_verdicts_use_the_seeds_spread():
    # within 1 point: |d| + half-ranges <= 1
    assert spread.near([70.0], [70.5]) is True
    assert spread.near([69.6, 69.7, 69.8], [70.0, 70.1, 70.2]) is True       # d -0.4, s 0.1 + 0.1
    assert spread.near([69.0, 69.4, 69.8], [70.0, 70.2, 70.4]) == spread.UNRESOLVED  # d -0.8, s 0.4 + 0.2
    assert spread.near([68.0, 69.0, 70.0], [70.0]) == spread.UNRESOLVED       # d -1.0, s 1.0
    assert spread.near([65.0], [70.0]) is False
    assert spread.below([60.0], [70.0]) is True and spread.below([69.5], [70.0]) is False
    assert spread.below([68.5, 69.5], [70.0, 70.0]) == spread.UNRESOLVED      # d -1.0, s 0.5
    assert spread.verdict([True, spread.UNRESOLVED]) == "not resolved at this scale"
    assert spread.verdict([True, None]) == "partly run" and spread.verdict([True, False]) == "partly reproduced"
    assert spread.both(False, spread.UNRESOLVED) is False and spread.both(True, spread.UNRESOLVED) == spread.UNRESOLVED
    res = {"fp32": {"final_top1": 70.0}, "fb24": {"final_top1": 69.0}, "fb12": {"final_top1": 59.0},
           "fb16": {"final_top1": 66.5}}
    refs = {"fp32", "w8-fp32"}
    assert spread.needs_seeds(res, "fp32", "fp32", refs) is True
    assert spread.needs_seeds(res, "fb24", "fp32", refs) is True     # d -1: on the threshold
    assert spread.needs_seeds(res, "fb16", "fp32", refs) is True     # d -3.5: 2.5 from it
    assert spread.needs_seeds(res, "fb12", "fp32", refs) is False    # d -11: 10 from it
    assert spread.needs_seeds(res, "mxfp4", "fp32", refs) is None    # not run yet


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def test_stale_results_are_found_against_git(tmp_path):
    repo = tmp_path / "repo"
    (repo / "bfp").mkdir(parents=True)
    (repo / "bfp" / "x.py").write_text("a = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    a = _git(repo, "commit", "-qm", "a")
    (repo / "bfp" / "x.py").write_text("a = 2\n")
    _git(repo, "add", ".")
    b = _git(repo, "commit", "-qm", "b")
    (repo / "README.md").write_text("words\n")
    _git(repo, "add", ".")
    head = _git(repo, "commit", "-qm", "c")
    assert stale.why_stale({"git_commit": a}, head, repo) == f"bfp/x.py changed since its commit {a[:12]}"
    assert stale.why_stale({"git_commit": b}, head, repo) is None            # only the README changed since
    assert stale.why_stale({"git_commit": b}, head, repo, every=True).startswith(f"it ran at {b[:12]}, not HEAD")
    assert "uncommitted changes" in stale.why_stale({"git_commit": head + "+dirty"}, head, repo)
    assert "not in this repository" in stale.why_stale({"git_commit": "0" * 40}, head, repo)
    assert stale.why_stale({}, head, repo) == "it records no commit"


def test_result_keys_map_back_to_their_rows():
    for row in matrix.ROWS:
        for seed in (0, 1, 2):
            assert matrix.base_name(matrix.key(row, seed)) == row.name  # "-sequential" is not a seed


def test_set_aside_moves_results_and_run_directories(tmp_path):
    res, runs = tmp_path / "res", tmp_path / "runs"
    (runs / "fb12").mkdir(parents=True)
    res.mkdir()
    (res / "fb12.json").write_text("{}")
    dest = stale.set_aside(["fb12"], res, runs)
    assert (dest / "fb12.json").is_file() and (dest / "fb12").is_dir() and not (res / "fb12.json").exists()
    assert stale.set_aside([], res, runs).name == "2"


def test_the_report_says_when_a_table_is_incomplete_quick_or_not_one_commit(tmp_path):
    rec = results.read_result(Path(__file__).resolve().parents[1] / "results" / "cifar10-table" / "fp32.json")
    one = dict(rec, git_commit="a" * 40, citable=True)
    page = report.render("cifar10-table", {"fp32": one}, matrix.ROWS, tmp_path / "R.md", tmp_path / "img",
                         profile="quick").read_text()
    assert "Profile `quick`: a machinery check, not results" in page
    assert f"Incomplete table**: 1 of {len(matrix.ROWS)} rows" in page
    assert f"Every result (1) comes from one clean commit, `{'a' * 40}`" in page
    two = {"fp32": one, "fb24": dict(rec, row="fb24", git_commit="b" * 40, citable=True)}
    page = report.render("cifar10-table", two, matrix.ROWS, tmp_path / "R.md", tmp_path / "img").read_text()
    assert "**Not one commit**: the results come from 2 source state(s)" in page


def test_the_report_says_when_rows_come_from_different_machines(tmp_path):
    """One commit on two hosts trains to other digits (float32 kernels sum in a CPU-dependent
    order): the page names both machines; one machine says nothing."""
    rec = results.read_result(Path(__file__).resolve().parents[1] / "results" / "cifar10-table" / "fp32.json")
    one = dict(rec, git_commit="a" * 40, citable=True)
    other = dict(one, row="fb24", machine=dict(rec["machine"], platform="Linux-other-host"))
    assert report.machines({"fp32": one, "fb24": dict(one, row="fb24")}) is None
    page = report.render("cifar10-table", {"fp32": one, "fb24": other}, matrix.ROWS, tmp_path / "R.md",
                         tmp_path / "img").read_text()
    assert "**Not one machine**: the results come from 2 machines" in page
    assert "Linux-other-host, torch" in page and f"{rec['machine']['platform']}, torch" in page


def _tie(doc: dict, rerun_host: str, identical: bool = True) -> dict:
    return {"row": doc["row"], "identical": identical, "epochs": len(doc["epochs"]),
            "recorded": {"sha256": reruns.fingerprint(doc), "host": reruns.host(doc), "commit": "a" * 40},
            "rerun": {"host": rerun_host, "commit": "a" * 40, "date": "2026-11-27", "train_time_s": 400.0}}


def test_verify_reruns_that_reproduce_a_row_on_another_host_join_the_hosts(tmp_path):
    """Two hosts (another VM build of the platform) are shown to agree only by an identical rerun
    of a row's current result file across them: a differing rerun, or a rerun of a file since
    replaced, leaves the warning; a damaged log line is refused, naming the file and line."""
    rec = results.read_result(Path(__file__).resolve().parents[1] / "results" / "cifar10-table" / "fp32.json")
    one = dict(rec, git_commit="a" * 40, citable=True)
    other = dict(one, row="fb24", machine=dict(rec["machine"], platform="Linux-other-host"))
    res = {"fp32": one, "fb24": other}
    there = reruns.host(other)
    assert there == f"{rec['machine']['cpu']}, Linux-other-host, torch {rec['versions']['torch']}"
    said = report.machines(res, [_tie(one, there)])
    assert said.startswith("**2 hosts, shown to agree**") and "`fp32` recorded on" in said
    assert "reproduced all 3 recorded epochs exactly" in said and "Linux-other-host" in said
    for bad in (_tie(one, there, identical=False), _tie(dict(one, epochs=one["epochs"][:2]), there),
                _tie(one, "AMD EPYC, Linux-third-host, torch 2.14.1")):
        said = report.machines(res, [bad])
        assert said.startswith("**Not one machine**: the results come from 2 machines"), said
    assert "Shown so far" not in report.machines(res, [_tie(one, there, identical=False)])
    (tmp_path / reruns.LOG).write_text(json.dumps(_tie(one, there)) + "\n" + '{"row": "fp32"}\n')
    with pytest.raises(results.ResultError, match=r"verified.jsonl line 2: not a verify record"):
        reruns.load(tmp_path)
    (tmp_path / reruns.LOG).write_text(json.dumps(_tie(one, there)) + "\n")
    assert reruns.load(tmp_path) == [_tie(one, there)] and reruns.load(tmp_path / "none") == []


def test_the_machine_record_names_the_cpu_generation_and_torchs_instruction_set():
    m = results.machine()
    import torch
    assert m["isa"] == torch.backends.cpu.get_cpu_capability() and m["cores"] >= 1
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    if "vendor_id" in cpuinfo:  # the first processor's vendor family/model/stepping, read independently
        first = {}
        for line in cpuinfo.split("\n\n")[0].splitlines():
            k, _, v = line.partition(":")
            first[k.strip()] = v.strip()
        assert m["cpu_id"] == (f"{first['vendor_id']} {first['cpu family']}/{first['model']}/"
                               f"{first['stepping']}")
        assert m["cpu"] == first["model name"]


def test_a_rows_time_is_over_fp32s_on_its_own_host():
    """A row from another host is timed against FP32's verify rerun there; without one, against
    FP32's own run, marked with a footnote."""
    rec = results.read_result(Path(__file__).resolve().parents[1] / "results" / "cifar10-table" / "fp32.json")
    one = dict(rec, git_commit="a" * 40, citable=True, train_time_s=200.0)
    other = dict(one, row="fb24", train_time_s=800.0, machine=dict(rec["machine"], platform="Linux-other-host"))
    res, there = {"fp32": one, "fb24": other}, reruns.host(other)
    fb24 = lambda lines: next(line for line in lines if line.startswith("| `fb24`"))  # noqa: E731
    timed = report.table_lines(res, matrix.ROWS, [_tie(one, there)])  # FP32 took 400 s there
    assert "| 2.00x |" in fb24(timed) and not any(line.startswith("‡") for line in timed)
    assert reruns.time_on(res, [_tie(one, there)], "fp32", there) == 400.0
    assert reruns.time_on(res, [_tie(dict(one, epochs=one["epochs"][:1]), there)], "fp32", there) is None
    untimed = report.table_lines(res, matrix.ROWS, [])
    assert "| 4.00x ‡ |" in fb24(untimed) and any(line.startswith("‡: over FP32's time on another host")
                                                   for line in untimed)


def test_the_lm_tables_hugging_face_gpt2_rows_compare_with_their_own_fp32():
    rows = {r.name: r for r in matrix.table("lm-table")}
    assert rows["hf-gpt2"].flags == ("-m", "HFGPT2") and rows["hf-gpt2"].reference == "fp32"
    assert rows["hf-gpt2-mxfp8"].reference == "hf-gpt2" and "--bfp" in rows["hf-gpt2-mxfp8"].flags
    rec = results.read_result(Path(__file__).resolve().parents[1] / "results" / "lm-table" / "fp32.json")
    epochs = lambda top1: [dict(rec["epochs"][-1], test_acc1=top1)]  # noqa: E731
    res = {"fp32": rec,
           "hf-gpt2": dict(rec, row="hf-gpt2", epochs=epochs(40.0), final_top1=40.0, best_top1=40.0),
           "hf-gpt2-mxfp8": dict(rec, row="hf-gpt2-mxfp8", epochs=epochs(39.5), final_top1=39.5, best_top1=39.5)}
    lines = report.table_lines(res, matrix.table("lm-table"))
    line = next(x for x in lines if x.startswith("| `hf-gpt2-mxfp8`"))
    assert "| -0.50 (hf-gpt2) |" in line


def _unfinished(runs: Path, argv: list[str], commit: str) -> Path:
    """A row's run killed after its first checkpoint, started by ``argv`` at ``commit``."""
    run_dir = Path(argv[argv.index("--run-dir") + 1]) / argv[argv.index("--run-name") + 1]
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"ckpt")
    (run_dir / "config.json").write_text(json.dumps({"command": ["/x/cifar.py", *argv[1:]]}))
    runner._log(runs / f".{run_dir.name}.invocations.jsonl", {"argv": argv, "git_commit": commit})
    return run_dir


def test_an_unfinished_run_goes_on_only_at_the_commit_it_started_at(tmp_path, monkeypatch, prof):
    invoke, started = _fake_training(lambda name, seed: 50.0)
    resumed = []
    monkeypatch.setattr(runner, "_invoke", lambda argv, log, say: resumed.append(argv[1:3]) or 1
                        if "--resume" in argv else invoke(argv, log, say))
    monkeypatch.setattr(runner, "source_commit", lambda repo=runner.REPO: "c0ffee" * 6 + "c0ff")
    runs, res = tmp_path / "runs", tmp_path / "res"
    argv = matrix.command(ROWS["fb12"], prof, "DATA", str(runs), epochs=2)
    run_dir = _unfinished(runs, argv, "c0ffee" * 6 + "c0ff")
    assert not runner.run_row("cifar10-table", ROWS["fb12"], prof, "DATA", res, runs, epochs=2, say=print)
    assert resumed == [["--resume", str(run_dir)]] and started == []   # same commit: resumed (it fails here)
    resumed.clear()
    import shutil
    shutil.rmtree(run_dir)
    (runs / ".fb12.invocations.jsonl").unlink()
    _unfinished(runs, argv, "0ld0e" * 8)
    assert runner.run_row("cifar10-table", ROWS["fb12"], prof, "DATA", res, runs, epochs=2, say=print)
    assert resumed == [] and started == ["fb12"]                       # another commit: trained afresh
    assert (runs / "fb12.other-commit-1" / "checkpoints" / "last.pt").is_file()
    assert results.read_result(res / "fb12.json")["citable"] is True


def test_rerun_stale_keeps_the_run_directory_of_its_own_unfinished_rerun(tmp_path, prof):
    res, runs = tmp_path / "res", tmp_path / "runs"
    res.mkdir()
    for name, commit in (("fb12", "h" * 40), ("fb16", "o" * 40), ("fb24", "h" * 40 + "+dirty")):
        (res / f"{name}.json").write_text("{}")                        # the stale result (another commit)
        _unfinished(runs, matrix.command(ROWS[name], prof, "DATA", str(runs), epochs=2), commit)
    dest = stale.set_aside(["fb12", "fb16", "fb24"], res, runs, head="h" * 40)
    assert sorted(p.name for p in dest.iterdir()) == [".fb16.invocations.jsonl", ".fb24.invocations.jsonl",
                                                      "fb12.json", "fb16", "fb16.json", "fb24", "fb24.json"]
    assert (runs / "fb12" / "checkpoints" / "last.pt").is_file() and (runs / ".fb12.invocations.jsonl").is_file()


def test_a_reference_whose_seeds_span_more_than_twice_the_tolerance_is_named_as_leaving_near_open():
    res = {"fp32": {"final_top1": 70.28}, "fp32-s1": {"final_top1": 68.31}, "fp32-s2": {"final_top1": 70.73},
           "w8-fp32": {"final_top1": 69.32}, "w8-fp32-s1": {"final_top1": 69.0}, "w8-fp32-s2": {"final_top1": 70.9}}
    said = spread.reference_too_noisy(res, ["fp32", "w8-fp32"])
    assert said == ["`fp32`'s own 3 seeds span 2.42 points (68.31 to 70.73): half of that is more than the 1-point "
                    "tolerance, so no \"within 1 point\" claim against `fp32` can be resolved at this scale, whatever "
                    "the other row's seeds; \"loses more than 1\" claims still can be."]   # w8-fp32 spans 1.90
    fp32 = spread.top1s(res, "fp32")
    assert all(spread.near([x, x, x], fp32) == spread.UNRESOLVED for x in (69.0, 69.77, 70.5))
    assert spread.below([60.0], fp32) is True
