"""Result files come from other people's commits: every field is checked before it reaches git, a
report or a verdict, and the runner's lock covers the result folder (issue 47, items 1, 4-6, 9)."""
import json
import math
import re
import shutil

import pytest

from bfp.experiments import matrix, results, reruns, runner, stale
from bfp.experiments.__main__ import main as experiments

from test_results_integrity import ROOT, _edit, table  # noqa: F401 (the recorded fp32 row in a scratch folder)


def _report(table, capsys, *extra):
    rc = experiments(["report", "cifar10-table", "--results", str(table), "--doc", str(table / "R.md"),
                      "--img", str(table / "img"), *extra])
    return rc, capsys.readouterr().err


def test_a_commit_that_is_an_option_never_reaches_git(table, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    _edit(table / "fp32.json", lambda d: (d.update(git_commit=f"--output={victim}"),
                                          d["invocations"][0].update(git_commit=f"--output={victim}")))
    rc = experiments(["rerun-stale", "cifar10-table", "--dry-run", "--results", str(table)])
    err = capsys.readouterr().err
    assert rc == 2 and "git_commit is '--output=" in err and "not 40 hex digits" in err and "Traceback" not in err
    assert victim.read_text() == "precious\n"
    with pytest.raises(ValueError, match="not a commit"):  # the git call itself refuses it too
        stale.changed_since(f"--output={victim}", runner.REPO)
    assert victim.read_text() == "precious\n"
    assert stale.why_stale({"git_commit": "HEAD"}, "a" * 40, runner.REPO) == "its commit 'HEAD' is not 40 hex digits"


def _both_commits(value):
    return lambda d: (d.update(git_commit=value), d["invocations"][0].update(git_commit=value))


@pytest.mark.parametrize("change, why", [
    (lambda d: (d["epochs"][-1].update(test_acc1=math.inf), d.update(final_top1=math.inf, best_top1=math.inf)),
     "epoch 3's test_acc1 is inf; an accuracy is a finite number from 0 to 100"),
    (lambda d: (d["epochs"][-1].update(test_acc1=1e9), d.update(final_top1=1e9, best_top1=1e9)),
     "epoch 3's test_acc1 is 1000000000.0"),
    (lambda d: (d["epochs"][-1].update(test_acc1=-5), d.update(final_top1=-5)), "epoch 3's test_acc1 is -5"),
    (lambda d: (d["epochs"][-1].update(test_acc1=math.nan), d.update(final_top1=math.nan)),
     "epoch 3's test_acc1 is nan; an accuracy is a finite number from 0 to 100"),
    (lambda d: d.update(profile="quick"), "a result of profile 'quick', not of 'full'"),
    (lambda d: d.update(table="vit-table"), "a result of table 'vit-table', not of 'cifar10-table'"),
    (lambda d: d["invocations"].append(dict(d["invocations"][0], git_commit="b" * 40 + "+dirty")),
     "citable is True, but its invocations say False"),
    (_both_commits("HEAD"), "invocation 1's git_commit is 'HEAD', not 40 hex digits"),
    (_both_commits(12345), "git_commit is 12345"),
    (lambda d: d.update(git_commit="b" * 40), "but its first invocation ran at 'e7797b4"),
    (lambda d: d.update(machine="AMD"), "machine is str, not an object"),
    (lambda d: d.update(train_time_s="206"), "train_time_s is '206', not a finite number of seconds"),
    (lambda d: d.update(invocations="once"), "invocations is str, not a list of objects"),
    (lambda d: d.update(mean_bits="8"), "mean_bits is '8', not null or a number in"),
    (lambda d: d["epochs"][0].update(train_loss="abc"), "epoch 1's train_loss is 'abc', not a number"),
    (lambda d: d.update(skipped_steps=-1), "skipped_steps is -1, not an integer >= 0"),
    (lambda d: d["epochs"].extend(dict(d["epochs"][-1], epoch=i) for i in range(3, 60000)),
     "it records 60000 epochs, but its command asks for --training-epochs 3"),
    (lambda d: [a.__setitem__(a.index("--training-epochs") + 1, "60000") for a in
                (d["command"], d["invocations"][0]["argv"])],
     "it records 3 epochs, but its command asks for --training-epochs 60000"),
    (lambda d: d["command"].append("--lr"), "its command is not the argv its first invocation ran"),
    (lambda d: d["epochs"][1].update(epoch=7), "its epochs are numbered [0, 7, 2], not 0 to 2"),
    (lambda d: d.update(steps=10**6), "steps is 1000000, but its last epoch ended at step"),
    (lambda d: [a.__setitem__(a.index("--seed") + 1, "5") for a in (d["command"], d["invocations"][0]["argv"])],
     "seed is 0, but its command has --seed 5"),
    (lambda d: d.update(claim="beats fp32"), "its claim is 'beats fp32', but cifar10-table's row says"),
    (lambda d: d.update(setup="one epoch on a laptop"), "its setup is 'one epoch on a laptop', but "
                                                        "cifar10-table's profile says"),
])
def test_each_field_is_checked_and_named(table, capsys, change, why):
    _edit(table / "fp32.json", change)
    with pytest.raises(results.ResultError, match="fp32.json: .*" + re.escape(why)):
        results.load_results(table, "cifar10-table", "full")
    rc, err = _report(table, capsys)
    assert rc == 2 and "fp32.json" in err and "Traceback" not in err and not (table / "R.md").exists()


def test_a_renamed_copy_of_one_seed_is_not_a_second_seed(table, capsys):
    shutil.copy(table / "fp32.json", table / "fp32-s1.json")
    _edit(table / "fp32-s1.json", lambda d: d.update(row="fp32-s1"))  # seed and base_row still say seed 0
    with pytest.raises(results.ResultError, match=r"fp32-s1.json: its base_row 'fp32' with seed 0 is row 'fp32', "
                                                  r"not 'fp32-s1'"):
        results.load_results(table)


def test_the_files_as_recorded_pass_every_check():
    for name in matrix.TABLES:
        res = results.load_results(ROOT / "results" / name, name, "full")
        assert res and all(d["table"] == name for d in res.values())


def test_report_refuses_a_missing_folder_a_file_and_a_doc_that_is_a_folder(table, tmp_path, capsys):
    for bad in (tmp_path / "nowhere", table / "fp32.json"):
        rc = experiments(["report", "cifar10-table", "--results", str(bad), "--doc", str(tmp_path / "R.md"),
                          "--img", str(tmp_path / "img")])
        err = capsys.readouterr().err
        assert rc == 2 and "result folder" in err and str(bad) in err and not (tmp_path / "R.md").exists()
    rc, err = _report(table, capsys)
    assert rc == 0
    rc = experiments(["report", "cifar10-table", "--results", str(table), "--doc", str(tmp_path),
                      "--img", str(tmp_path / "img")])
    assert rc == 2 and "is a folder; give the Markdown file" in capsys.readouterr().err


def test_two_runners_on_one_result_folder_are_refused(tmp_path):
    res = tmp_path / "res"
    with runner.table_lock(tmp_path / "runs-a", res):
        with pytest.raises(ValueError, match=r"another runner is working on .*res \(--results; pid"):
            with runner.table_lock(tmp_path / "runs-b", res):
                pass
    with runner.table_lock(tmp_path / "runs-b", res):  # released with the first
        pass


def test_verify_says_and_records_when_the_rerun_read_other_data(table, tmp_path, monkeypatch, capsys):
    recorded = json.loads((table / "fp32.json").read_text())
    prof = matrix.profile("full", "cifar10-table")

    def rerun(tbl, row, prof, data, res_dir, runs_dir, epochs):  # the same numbers, from the other folder
        command = matrix.command(row, prof, data, str(runs_dir), epochs)
        invocations = [dict(recorded["invocations"][0], argv=command)]
        results.write_json(dict(recorded, command=command, invocations=invocations), res_dir / f"{row.name}.json")
        return True
    monkeypatch.setattr(runner, "run_row", rerun)
    row = next(r for r in matrix.table("cifar10-table") if r.name == "fp32")
    assert reruns.verify("cifar10-table", row, prof, "/elsewhere/cifar", table, tmp_path / "runs") == 0
    out = capsys.readouterr().out
    was = reruns.data_of(recorded["command"], prof.data_flag)
    assert f"was recorded reading {prof.data_flag} {was}; this rerun reads /elsewhere/cifar" in out
    line = reruns.load(table)[-1]
    assert line["data"] == {"recorded": was, "rerun": "/elsewhere/cifar", "same": False}
