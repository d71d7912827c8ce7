"""Result files are checked on load, not trusted: edited, truncated, binary, stray and foreign
files are refused naming the file; a torn invocation log does not fail its row; output folders
that cannot be written are refused before any work."""
import copy
import json
import math
import os
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from bfp.experiments import matrix, results, runner, spread
from bfp.experiments.__main__ import main as experiments

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "results" / "cifar10-table" / "fp32.json"


@pytest.fixture
def table(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(RECORDED, folder / "fp32.json")
    return folder


def _edit(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change, why", [
    (lambda d: d.update(final_top1=99.5), "final_top1 is 99.5, but its own epochs say"),
    (lambda d: d.update(final_top1="68.0"), "final_top1 is '68.0'"),
    (lambda d: d.update(final_top1=None), "final_top1 is None"),
    (lambda d: d.pop("row"), "its row is None, not 'fp32'"),
    (lambda d: d.update(epochs=[]), "'epochs' must be a non-empty list"),
    (lambda d: d.update(best_top1=0.0), "best_top1 is 0.0"),
])
def test_an_edited_result_is_refused_naming_the_file(table, change, why, capsys):
    _edit(table / "fp32.json", change)
    with pytest.raises(results.ResultError, match=why):
        results.load_results(table)
    assert experiments(["report", "cifar10-table", "--results", str(table), "--doc", str(table / "R.md"),
                        "--img", str(table / "img")]) == 2
    err = capsys.readouterr().err
    assert "fp32.json" in err and "Traceback" not in err and not (table / "R.md").exists()


@pytest.mark.parametrize("content", [b'{"row": "fp32", "epo', b"\x89PNG\r\n\x1a\n\x00\xff", b"[1, 2]"])
def test_truncated_binary_or_list_files_are_refused_naming_the_file(table, content):
    (table / "fp32.json").write_bytes(content)
    with pytest.raises(results.ResultError, match="fp32.json"):
        results.load_results(table)


def test_a_stray_file_does_not_replace_a_row(table):
    stray = json.loads((table / "fp32.json").read_text())
    (table / "zz-notes.json").write_text(json.dumps(stray))  # "row": "fp32" in another file
    with pytest.raises(results.ResultError, match="zz-notes.json: its row is 'fp32', not 'zz-notes'"):
        results.load_results(table)


def test_a_bad_result_is_not_taken_as_a_done_row(table, tmp_path):
    (table / "fp32.json").write_text('{"row": "fp32"')
    with pytest.raises(results.ResultError, match="fp32.json: not JSON"):
        runner.run("cifar10-table", [r for r in matrix.table("cifar10-table") if r.name == "fp32"], None, "DATA",
                   table, tmp_path / "runs", allow_dirty=True)


def test_a_torn_invocation_log_keeps_the_entries_before_it(tmp_path):
    log = tmp_path / ".fp32.invocations.jsonl"
    log.write_text(json.dumps({"argv": ["cifar.py"], "git_commit": "abc"}) + "\n"
                   + json.dumps({"wall_s": 3.0, "returncode": 0}) + "\n" + '{"argv": ["cifar.py", "--res')
    inv = runner.invocations(log)
    assert inv == [{"argv": ["cifar.py"], "git_commit": "abc", "wall_s": 3.0, "returncode": 0}]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_outputs_are_refused_before_any_work(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert experiments(["run", "cifar10-table", "--data", str(tmp_path), "--results", str(ro / "r")]) == 2
        assert "--results" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


def test_outputs_that_are_files_are_refused_before_any_work(tmp_path, capsys, table):
    f = tmp_path / "file"
    f.write_text("")
    assert experiments(["report", "cifar10-table", "--results", str(table), "--img", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"--img {str(f)!r} is a file" in err and "Traceback" not in err
    assert experiments(["report", "cifar10-table", "--results", str(table), "--doc", str(f / "x.md")]) == 2


@pytest.mark.parametrize("flag", ["--results", "--runs", "--doc"])
def test_read_only_outputs_are_named_before_any_work(tmp_path, capsys, monkeypatch, flag, table):
    """A read-only folder (simulated: the tests may run as root, who writes anywhere)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == ro else real(p, mode, **k))
    if flag == "--doc":
        argv = ["report", "cifar10-table", "--results", str(table), "--doc", str(ro / "R.md"),
                "--img", str(tmp_path / "img")]
    else:
        other = "--runs" if flag == "--results" else "--results"
        argv = ["run", "cifar10-table", "--data", str(tmp_path), flag, str(ro), other, str(tmp_path / "o")]
    assert experiments(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {str(ro)!r} is not writable" in err and "Traceback" not in err


def test_a_full_table_is_refused_from_a_dirty_tree_and_a_second_runner_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "dirty_paths", lambda repo=None: ["bfp/formats.py"])
    full = matrix.profile("full")
    rows = [r for r in matrix.table("cifar10-table") if r.name == "fp32"]
    with pytest.raises(ValueError, match=r"uncommitted changes \(bfp/formats.py\): results must come from a clean commit"):
        runner.run("cifar10-table", rows, full, "DATA", tmp_path / "res", tmp_path / "runs")
    assert not (tmp_path / "runs").exists()  # refused before anything
    monkeypatch.setattr(runner, "dirty_paths", lambda repo=None: [])
    with runner.table_lock(tmp_path / "runs"):
        with pytest.raises(ValueError, match=f"another runner is working on .*runs \\(--runs; pid {os.getpid()}\\)"):
            with runner.table_lock(tmp_path / "runs"):
                pass
    with runner.table_lock(tmp_path / "runs"):  # released: the next runner gets it
        pass


def test_citable_only_when_every_invocation_ran_from_one_clean_commit():
    from types import SimpleNamespace
    row, prof = SimpleNamespace(name="r", claim="c", words="w"), SimpleNamespace(name="full", about="a", threads=2)

    def doc(commits):
        return results.collect(Path("/nonexistent"), table="t", row=row, profile=prof, command=["cifar.py"],
                               invocations=[{"git_commit": c} for c in commits])
    a, b = "a" * 40, "b" * 40
    assert doc([a])["citable"] and not doc([a + "+dirty"])["citable"]
    assert not doc([a, b])["citable"] and not doc([])["citable"]
    assert not doc(["HEAD"])["citable"] and not doc([None])["citable"]  # not a commit, or outside git


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_runners_child_dies_with_it(tmp_path):
    """The runner starts cifar.py with ``_die_with_parent``: a SIGKILL of the runner ends its child
    too, so no orphan keeps writing the run directory a rerun will resume."""
    import signal
    import subprocess
    import time
    code = ("import subprocess, sys, time; from bfp.experiments import runner; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "preexec_fn=runner._die_with_parent); print(p.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # reaped later by init: dead already
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its killed runner")


def test_a_hand_written_page_gets_only_its_marked_block_rendered_from_the_result_files(tmp_path):
    from bfp.experiments import matrix, report
    page = tmp_path / "transformers.md"
    page.write_text("intro by hand\n<!-- table:vit-table -->\nstale numbers\n<!-- /table:vit-table -->\noutro\n")
    rows = matrix.table("vit-table")
    res = {"fp32": {"final_top1": 52.5, "best_top1": 53.0, "train_time_s": 100.0, "citable": True,
                    "git_commit": "a" * 40, "epochs": [{"test_loss": 1.3}]}}
    assert report.splice(page, "vit-table", res, rows, "docs/results-vit-table.md")
    text = page.read_text()
    assert text.startswith("intro by hand\n<!-- table:vit-table -->\n") and text.endswith("<!-- /table:vit-table -->\noutro\n")
    assert "stale numbers" not in text and "| `fp32` | FP32 (reference) | 52.50% |" in text
    assert "Not run yet: mxfp8, fp8, fp8-ls, nvfp4" in text and f"`{'a' * 40}`" in text
    other = tmp_path / "plain.md"
    other.write_text("no block here\n")
    assert not report.splice(other, "vit-table", res, rows, "x.md") and other.read_text() == "no block here\n"


def test_the_lm_block_gives_bits_per_character_and_each_rows_difference_to_its_reference(tmp_path):
    import math
    from bfp.experiments import matrix, report
    page = tmp_path / "transformers.md"
    page.write_text("<!-- table:lm-table -->\n<!-- /table:lm-table -->\nprose\n")
    rows = matrix.table("lm-table")
    doc = lambda top1, bits: {"final_top1": top1, "best_top1": top1, "train_time_s": 10.0, "citable": True,  # noqa: E731
                              "git_commit": "b" * 40, "epochs": [{"test_loss": bits * math.log(2)}]}
    res = {"fp32": doc(40.0, 3.0), "mxfp8": doc(39.0, 3.25), "hf-gpt2": doc(41.0, 3.5), "hf-gpt2-mxfp8": doc(40.5, 3.375)}
    assert report.splice(page, "lm-table", res, rows, "docs/results-lm-table.md")
    assert ("\n\nFinal test loss in bits per character (nats / ln 2; lower is better): `fp32` 3.000, "
            "`mxfp8` 3.250 (+0.250 to fp32), `hf-gpt2` 3.500 (+0.500 to fp32), "
            "`hf-gpt2-mxfp8` 3.375 (-0.125 to hf-gpt2).\n<!-- /table:lm-table -->\nprose\n") in page.read_text()
    assert report.loss_lines("vit-table", {"fp32": doc(50.0, 1.0)}, matrix.table("vit-table")) == [
        f"Final test loss (nats): `fp32` {math.log(2):.3f}."]
    assert report.loss_lines("lm-table", {"fp32": {**doc(1.0, 1.0), "epochs": []}}, rows) == []


def _recorded_numbers() -> str:
    """The generated pages' text and every recorded epoch's top-1 (two decimals): what prose may quote."""
    pages = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p.name == "RESULTS.md"
             or p.name.startswith("results-")]
    epochs = [f"{e['test_acc1']:.2f}" for f in sorted((ROOT / "results").glob("*/*.json"))
              if f.name != "verified.jsonl" for e in json.loads(f.read_text()).get("epochs", [])]
    return "\n".join(pages + epochs)


@pytest.mark.parametrize("doc, start, end", [
    ("README.md", "What it found (ResNet10", "Rerunning a row's printed command"),
    ("docs/transformers.md", "## Runs", None),
])
def test_hand_written_summaries_quote_only_recorded_numbers(doc, start, end):
    """README's "What it found" and the prose of docs/transformers.md may round, but every
    two-decimal number they quote (a top-1, a seed range, a loss) must be one the generated pages or
    the result files' epochs hold, so prose cannot keep the numbers of runs the tables no longer
    hold."""
    import re
    text = (ROOT / doc).read_text()
    prose = text[text.index(start):text.index(end) if end else None]
    prose = re.sub(r"<!-- table:(\S+) -->.*?<!-- /table:\1 -->", "", prose, flags=re.S)  # generated blocks
    quoted = re.findall(r"(?<![\d.])\d+\.\d\d\d?(?![\d.])", prose)
    assert len(quoted) >= 10
    recorded = _recorded_numbers()
    assert [q for q in quoted if q not in recorded] == []


@pytest.fixture(scope="module")
def recorded_tables() -> dict[str, dict[str, dict]]:
    """The committed result files of every table, loaded (and so checked) once; not to be changed."""
    return {t: results.load_results(ROOT / "results" / t) for t in ("cifar10-table", "vit-table", "lm-table")}


def _worded_claims(tables: dict[str, dict[str, dict]]) -> dict[str, dict[str, bool]]:
    """Per document, each worded verdict and whether the result files bear it out."""
    cnn, vit, lm = tables["cifar10-table"], tables["vit-table"], tables["lm-table"]
    seeds = lambda b: spread.top1s(cnn, b)  # noqa: E731
    mean = lambda b, res=cnn: statistics.mean(spread.top1s(res, b))  # noqa: E731
    span = lambda b: max(seeds(b)) - min(seeds(b))  # noqa: E731
    nats = lambda b: lm[b]["epochs"][-1]["test_loss"]  # noqa: E731
    bits = lambda b: (nats(b) - nats("fp32")) / math.log(2)  # noqa: E731
    fp32 = mean("fp32")
    orders = [mean(f"w8-e4m3{o}") for o in ("", "-nccl-ring", "-nccl-tree", "-sequential", "-param-ring")]
    h100 = max(abs(mean("fp8") - mean(f"fp8-h100-{a}")) for a in ("fast", "promoted"))
    commit = cnn["fp32"]["git_commit"]
    return {
        "README.md": {
            f"all {len(cnn)} runs from one clean commit, {commit[:7]}":
                all(r["git_commit"] == commit and r["citable"] is True for r in cnn.values()),
            f"FP32's three seeds span {span('fp32'):.1f} points": True,
            f"lose {fp32 - mean('fb12lg16'):.0f} and {fp32 - mean('fb12'):.0f} points": True,
            f"{mean('fb16-do') - mean('fb12'):.0f} points above FB12": True,
            f"e4m3 gradients lose {mean('w8-fp32') - mean('w8-e4m3'):.1f} points without APS": True,
            "The order of the additions moves e4m3 less than the seeds do":
                max(orders) - min(orders) < span("w8-e4m3"),
            f"Unscaled FP8 e4m3/e5m2 loses {fp32 - mean('fp8'):.0f} points": True,
            f"MXFP4 loses {fp32 - mean('mxfp4'):.0f} points": True,
            "within 2 points of FP32's mean": 0 < fp32 - mean("nvfp4") < 2,
            "end less than a point under FP32's mean": 0 < fp32 - mean("fp16grad") < 1,
            "sit with unscaled FP8": h100 < 1.4,
        },
        "docs/transformers.md": {
            "puts the tensor-core model's cost there under 1.4 points": h100 < 1.4,
            "MXFP8 and NVFP4 end within a few hundredths of a bit of FP32": max(bits("mxfp8"), bits("nvfp4")) < 0.05,
            "unscaled FP8 stalls after two epochs, half a bit behind": f"{bits('fp8'):.1f}" == "0.5",
            "recovers all but six hundredths of a bit": round(100 * bits("fp8-ls")) == 6,
            "Promotion moves them by a few tenths of a point":
                0.1 <= abs(mean("fp8-h100-fast", lm) - mean("fp8-h100-promoted", lm)) < 1,
            f"loses {mean('fp32', vit) - mean('fp8', vit):.0f} points": True,
            f"unscaled FP8 loses about {fp32 - mean('fp8'):.0f} points there, MXFP8 nothing":
                min(seeds("fp32")) <= mean("mxfp8") <= max(seeds("fp32")),
        },
    }


def test_worded_claims_follow_the_result_files(recorded_tables):
    """The words around the quoted numbers ("loses 4 points", "within 2 points", "half a bit") are
    computed here from the result files' seed means, so a rerun that changes a verdict fails until
    the prose is changed with it."""
    for doc, said in _worded_claims(recorded_tables).items():
        text = " ".join((ROOT / doc).read_text().split())
        assert {claim: claim in text and holds for claim, holds in said.items()} == dict.fromkeys(said, True)


def _top1(delta):
    return lambda r: r.update(final_top1=r["final_top1"] + delta)


def _loss(delta):
    return lambda r: r["epochs"][-1].update(test_loss=r["epochs"][-1]["test_loss"] + delta)


# README and docs/transformers.md word the CNN table's H100 verdict twice, on one condition.
H100 = ("sit with unscaled FP8", "puts the tensor-core model's cost there under 1.4 points")
ONE_COMMIT = "all 79 runs from one clean commit, e7797b4"


@pytest.mark.parametrize("name, row, move, claim", [
    ("cifar10-table", "nvfp4", _top1(-2.0), "within 2 points of FP32's mean"),
    ("cifar10-table", "fp16grad", _top1(-3.0), "end less than a point under FP32's mean"),
    ("cifar10-table", "w8-e4m3-sequential", _top1(-6.0),
     "The order of the additions moves e4m3 less than the seeds do"),
    ("cifar10-table", "fp8-h100-fast", _top1(-4.5), H100),
    ("cifar10-table", "fp8-h100-promoted", _top1(4.5), H100),
    ("cifar10-table", "mxfp8", _top1(-6.0), "unscaled FP8 loses about 10 points there, MXFP8 nothing"),
    ("cifar10-table", "mxfp8", _top1(9.0), "unscaled FP8 loses about 10 points there, MXFP8 nothing"),
    ("cifar10-table", "fp8", lambda r: r.update(git_commit="b7836af001f32568fed44746692996b568a151e9"), ONE_COMMIT),
    ("cifar10-table", "mxfp4", lambda r: r.update(citable=False), ONE_COMMIT),
    ("lm-table", "fp8-h100-fast", _top1(-1.0), "Promotion moves them by a few tenths of a point"),
    ("lm-table", "fp8-h100-promoted", _top1(-0.31), "Promotion moves them by a few tenths of a point"),
    ("lm-table", "nvfp4", _loss(0.05), "MXFP8 and NVFP4 end within a few hundredths of a bit of FP32"),
    ("lm-table", "fp8", _loss(0.1), "unscaled FP8 stalls after two epochs, half a bit behind"),
    ("lm-table", "fp8-ls", _loss(0.01), "recovers all but six hundredths of a bit"),
])
def test_a_worded_claim_fails_when_its_row_moves(recorded_tables, name, row, move, claim):
    """The boolean verdicts are not vacuous: moving one recorded row (its seed-0 top-1, its last test
    loss in nats, or its provenance) turns exactly the named claim (or both wordings of one verdict)
    false and leaves the rest as they were."""
    claims = {claim} if isinstance(claim, str) else set(claim)
    moved = copy.deepcopy(recorded_tables[name][row])
    move(moved)
    tables = {**recorded_tables, name: {**recorded_tables[name], row: moved}}
    before, after = ({c: h for said in _worded_claims(t).values() for c, h in said.items()}
                     for t in (recorded_tables, tables))
    assert all(before[c] for c in claims) and {c for c in before if before[c] != after[c]} == claims
