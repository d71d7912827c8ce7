"""The FSDP rows' runner: one rule for a citable tree (the results matrices'), a port of its own for
each row, and a failing row's own error on the screen."""
import subprocess
import sys

import pytest

from bfp.experiments import fsdp_rows

TORCHRUN_TAIL = """[rank0]: lm.py: error: --grad-format nonsense: unknown format name 'nonsense'
[rank1]: lm.py: error: --grad-format nonsense: unknown format name 'nonsense'
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1129, in run
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : 2 (pid: 3739)
"""


def _repo(path):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "lm.py").write_text("print('hi')\n")
    subprocess.run(["git", "-C", str(path), "add", "lm.py"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    return path


def _failing_row(monkeypatch, seen):
    def command(name, flags, runs, port):
        seen.append(port)
        return [sys.executable, "-c", "import sys; print('lm.py: error: --grad-format x: unknown format name', "
                                      "file=sys.stderr); sys.exit(2)"]
    monkeypatch.setattr(fsdp_rows, "command", command)


def test_a_failing_row_prints_its_ranks_errors_once_each():
    assert fsdp_rows.rank_errors(TORCHRUN_TAIL) == TORCHRUN_TAIL.splitlines()[0] + "\n" + \
        TORCHRUN_TAIL.splitlines()[1]
    assert fsdp_rows.rank_errors("loading\nValueError: boom\nTraceback (most recent call last):\n x") == \
        "loading\nValueError: boom"


def test_a_copy_outside_git_is_refused_unless_dirty_ok(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fsdp_rows, "ROOT", tmp_path)
    with pytest.raises(SystemExit) as e:
        fsdp_rows.main(["--runs", str(tmp_path / "runs")])
    assert e.value.code == 2 and "is not a git checkout: a published number must come from a commit" in \
        capsys.readouterr().err
    seen = []
    _failing_row(monkeypatch, seen)
    assert fsdp_rows.main(["--runs", str(tmp_path / "runs"), "--dirty-ok"]) == 1  # past the check, to the row


def test_an_untracked_file_is_not_a_change_a_tracked_one_is(tmp_path, monkeypatch, capsys):
    repo = _repo(tmp_path / "repo")
    monkeypatch.setattr(fsdp_rows, "ROOT", repo)
    (repo / "notes.txt").write_text("mine\n")  # untracked: the matrices' runner ignores it too
    seen = []
    _failing_row(monkeypatch, seen)
    assert fsdp_rows.main(["--runs", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "row fp32 failed (torchrun exit 2); its ranks said:\nlm.py: error: --grad-format x: unknown format " \
           "name" in err and "exitcode" not in err
    assert len(seen) == 1 and 1024 <= seen[0] <= 65535  # a free port of the system's choice
    (repo / "lm.py").write_text("print('changed')\n")
    with pytest.raises(SystemExit) as e:
        fsdp_rows.main(["--runs", str(tmp_path / "runs2")])
    assert e.value.code == 2 and "the tree has uncommitted changes (lm.py)" in capsys.readouterr().err


def test_port_takes_the_given_port_and_refuses_one_out_of_range(tmp_path, monkeypatch, capsys):
    repo = _repo(tmp_path / "repo")
    monkeypatch.setattr(fsdp_rows, "ROOT", repo)
    seen = []
    _failing_row(monkeypatch, seen)
    assert fsdp_rows.main(["--runs", str(tmp_path / "runs"), "--port", "31000"]) == 1 and seen == [31000]
    with pytest.raises(SystemExit) as e:
        fsdp_rows.main(["--runs", str(tmp_path / "runs3"), "--port", "70000"])
    assert e.value.code == 2 and "--port 70000: give a port from 1024 to 65530" in capsys.readouterr().err
