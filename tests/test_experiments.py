"""python -m bfp.experiments: the quick profile's machinery (rows run, results written, skipped when
done, a killed row resumed to the uninterrupted numbers, a row rerun to the same numbers), mean bits
of --do, the report's verdicts, the decoded-image cache. No accuracy is checked here."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bfp.data import decoded
from bfp.experiments import matrix, report, reruns, results

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _cifar_like(root: Path, train: int = 32, test: int = 12) -> Path:
    """A JPEG CIFAR-10 look-alike: ``root/cifar10_jpg/{train,test}/<class>/NNNN.jpg``, 32x32."""
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for c, name in enumerate(CLASSES):
            d = root / "cifar10_jpg" / split / name
            d.mkdir(parents=True)
            for i in range(n):
                x = np.full((32, 32, 3), 20 * c, np.uint8) + rng.integers(0, 60, (32, 32, 3), np.uint8)
                Image.fromarray(x).save(d / f"{i:04d}.jpg", quality=90)
    return root / "cifar10_jpg"


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    return _cifar_like(tmp_path_factory.mktemp("data"))


def _experiments(*args, cwd, env=None, **kw):
    env = {**os.environ, "BFP_CACHE_DIR": str(cwd / "cache"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bfp.experiments", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kw)


def test_quick_profile_runs_its_three_rows_writes_results_and_skips_them_when_done(cifar_dir, tmp_path):
    res, runs = tmp_path / "res", tmp_path / "runs"
    args = ("run", "cifar10-table", "--profile", "quick", "--data", str(cifar_dir), "--results", str(res),
            "--runs", str(runs))
    r = _experiments(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    prof = matrix.profile("quick")
    assert sorted(p.stem for p in res.glob("*.json")) == sorted(prof.rows)
    for name in prof.rows:
        doc = json.loads((res / f"{name}.json").read_text())
        row = next(x for x in matrix.ROWS if x.name == name)
        assert doc["command"] == matrix.command(row, prof, str(cifar_dir), str(runs))
        assert doc["command"][0] == "cifar.py" and list(row.flags) == doc["command"][
            doc["command"].index("--threads") + 2:doc["command"].index("--progress")]
        assert [e["epoch"] for e in doc["epochs"]] == [0]
        assert doc["final_top1"] == doc["epochs"][-1]["test_acc1"] == doc["best_top1"]
        assert doc["threads"] == 1 and doc["seed"] == 0 and doc["resumed"] is False
        assert doc["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
        assert doc["invocations"][0]["returncode"] == 0
        # the recorded epoch equals what the run directory's metrics say
        m = json.loads((runs / name / "metrics.jsonl").read_text().splitlines()[-1])
        assert m["train_loss"] == doc["epochs"][0]["train_loss"]
    before = {p.name: p.read_bytes() for p in res.glob("*.json")}
    again = _experiments(*args, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count(": done (") == 3, again.stdout
    assert "$ python cifar.py" not in again.stdout
    assert {p.name: p.read_bytes() for p in res.glob("*.json")} == before

    # the report of these results: a table row per matrix row, a verdict per claim, PNG curves
    rep = _experiments("report", "cifar10-table", "--profile", "quick", "--results", str(res),
                       "--doc", str(tmp_path / "doc" / "R.md"), "--img", str(tmp_path / "doc" / "img"),
                       cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "doc" / "R.md").read_text()
    assert text.count("| `") == len(matrix.ROWS) and text.count("not run yet |") == len(matrix.ROWS) - 3
    assert (tmp_path / "doc" / "img" / "cifar10-table-seed000.png").stat().st_size > 1000
    assert "![Seed 000" in text and "python cifar.py -m ResNet10" in text


def test_a_rerun_row_reproduces_its_recorded_numbers_exactly(cifar_dir, tmp_path):
    res, runs = tmp_path / "res", tmp_path / "runs"
    common = ("--profile", "quick", "--data", str(cifar_dir), "--results", str(res), "--runs", str(runs))
    assert _experiments("run", "cifar10-table", "--rows", "fb16-do", *common, cwd=tmp_path).returncode == 0
    r = _experiments("verify", "cifar10-table", "--row", "fb16-do", *common, cwd=tmp_path)
    assert r.returncode == 0 and "fb16-do: identical to" in r.stdout, r.stdout + r.stderr
    logged = reruns.load(res)
    assert [(t["row"], t["identical"], t["epochs"]) for t in logged] == [("fb16-do", True, 1)]
    assert logged[0]["recorded"]["sha256"] == reruns.fingerprint(results.read_result(res / "fb16-do.json"))
    # a recorded number that differs is reported, with exit status 1
    doc = json.loads((res / "fb16-do.json").read_text())
    doc["epochs"][0]["train_loss"] += 1e-9
    (res / "fb16-do.json").write_text(json.dumps(doc))
    r = _experiments("verify", "cifar10-table", "--row", "fb16-do", *common, cwd=tmp_path)
    assert r.returncode == 1 and "DIFFERS" in r.stdout and "epoch 1 train_loss" in r.stdout
    assert [t["identical"] for t in reruns.load(res)] == [True, False]  # appended, the first kept


def test_a_killed_row_resumes_from_its_checkpoint_to_the_uninterrupted_numbers(cifar_dir, tmp_path):
    common = ("run", "cifar10-table", "--rows", "fp32", "--profile", "quick", "--epochs", "4",
              "--data", str(cifar_dir))
    ref = _experiments(*common, "--results", str(tmp_path / "ref"), "--runs", str(tmp_path / "ref_runs"),
                       cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    res, runs = tmp_path / "res", tmp_path / "runs"
    env = {**os.environ, "BFP_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "bfp.experiments", *common, "--results", str(res),
                          "--runs", str(runs)], cwd=tmp_path, env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (runs / "fp32" / "checkpoints" / "last.pt").exists():
        assert p.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    assert not (res / "fp32.json").exists()
    r = _experiments(*common, "--results", str(res), "--runs", str(runs), cwd=tmp_path)
    assert r.returncode == 0 and "resuming" in r.stdout, r.stdout + r.stderr
    doc, want = (json.loads((d / "fp32.json").read_text()) for d in (res, tmp_path / "ref"))
    assert doc["resumed"] is True and len(doc["invocations"]) == 2
    keys = ("train_loss", "test_loss", "test_acc1", "global_step")
    assert [[e[k] for k in keys] for e in doc["epochs"]] == [[e[k] for k in keys] for e in want["epochs"]]


def test_bad_arguments_are_named_with_what_is_allowed(tmp_path):
    r = _experiments("run", "cifar10-table", "--data", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert r.returncode == 2 and "nowhere" in r.stderr and "does not exist" in r.stderr
    (tmp_path / "x.txt").write_text("hi")
    r = _experiments("run", "cifar10-table", "--data", str(tmp_path / "x.txt"), cwd=tmp_path)
    assert r.returncode == 2 and "not a .tar.gz" in r.stderr
    r = _experiments("list", "cifar10-table", "--rows", "fp32,fb7", "--data", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "fb7" in r.stderr and "allowed: fp32, fb24" in r.stderr
    r = _experiments("run", "cifar10-table", cwd=tmp_path)
    assert r.returncode == 2 and "--data is required" in r.stderr


def test_list_prints_every_rows_exact_command(cifar_dir, tmp_path):
    r = _experiments("list", "cifar10-table", "--data", str(cifar_dir), cwd=tmp_path)
    assert r.returncode == 0
    cmds = [line for line in r.stdout.splitlines() if line.startswith("python cifar.py")]
    assert len(cmds) == len(matrix.ROWS)
    assert "--emulate-node 8 --grad-exp 3 --grad-man 0 --use-aps" in r.stdout
    assert all(f"--run-name {row.name}" in c for row, c in zip(matrix.ROWS, cmds))


def test_an_archive_is_unpacked_once_into_the_extract_folder(cifar_dir, tmp_path):
    import tarfile
    tgz = tmp_path / "c.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(cifar_dir, arcname="cifar10_jpg")
    r = _experiments("list", "cifar10-table", "--rows", "fp32", "--data", str(tgz), "--extract-to",
                     str(tmp_path / "x"), cwd=tmp_path)
    assert r.returncode == 0 and "unpacking" in r.stdout and f"-dp {tmp_path / 'x' / 'cifar10_jpg'}" in r.stdout
    r = _experiments("list", "cifar10-table", "--rows", "fp32", "--data", str(tgz), "--extract-to",
                     str(tmp_path / "x"), cwd=tmp_path)
    assert r.returncode == 0 and "unpacking" not in r.stdout


def test_mean_bits_weights_each_pairs_bits_by_the_steps_they_were_in_force(tmp_path):
    (tmp_path / "dynamic_precision.csv").write_text(
        "decision,step,epoch,layer,pair,zse,old_bits,new_bits\n"
        "0,10,0,a,fw+fi,0.1,8,4\n0,10,0,b,fw+fi,0.9,8,16\n1,30,1,a,fw+fi,0.9,4,8\n")
    # a: 8 for 10 steps, 4 for 20, 8 for 10 -> 240/40 = 6; b: 8 for 10, 16 for 30 -> 560/40 = 14
    assert results.mean_bits(tmp_path, 40) == 10.0
    assert results.mean_bits(tmp_path / "none", 40) is None


def _doc(top1, **kw):
    return {"final_top1": top1, "best_top1": top1, "train_time_s": 10.0, "epochs": [], **kw}


def test_verdicts_follow_the_numbers_with_a_one_point_tolerance():
    res = {"fp32": _doc(80.0), "fb24": _doc(79.5), "fb16": _doc(80.9), "fb12": _doc(70.0),
           "fb12lg16": _doc(75.0), "fb16-do": _doc(76.0, mean_bits=6.5)}
    v, text = report.claims(res)["seed000"]
    assert v == "reproduced" and "FB12 70.00% (yes)" in text and "6.50 mean bits" in text
    res["fb16"] = _doc(78.9)
    assert report.claims(res)["seed000"][0] == "partly reproduced"
    res = {"w8-fp32": _doc(80.0), "w8-e4m3": _doc(80.0), "w8-e4m3-aps": _doc(80.0),
           "w8-e3m0": _doc(10.0), "w8-e3m0-aps": _doc(79.0)}
    v, text = report.claims(res)["seed001"]
    assert v == "partly reproduced" and "recovers with it: no)" in text and "with (yes)" in text
    assert report.claims({})["seed002"][0] == "not run yet"
    assert report.claims({"fp32": _doc(80.0), "bf16": _doc(80.0)})["seed002"][0] == "partly run"
    lines = report.table_lines({"fp32": _doc(80.0, citable=True), "fb16": _doc(78.5, train_time_s=25.0)},
                               matrix.ROWS)
    assert "| `fb16` † | BFP 8-bit, groups of 12 (FB16) | 78.50% | 1 seed | 78.50% | -1.50 (fp32) | 2.50x |  |" in lines
    assert "| `fp32` |" in " ".join(lines) and any(x.startswith("†: not citable") for x in lines)


def test_decoded_images_are_cached_once_and_equal_a_fresh_decode(cifar_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("BFP_CACHE_DIR", str(tmp_path / "c"))
    from bfp.data import cifar as data
    tr, _ = data._image_folder(str(cifar_dir))
    samples = [s for s in tr.samples[::7]]
    x1, y1 = decoded.decode(samples, cifar_dir)
    files = list((tmp_path / "c").glob("decoded-32px-*.pt"))
    assert len(files) == 1 and x1.dtype == torch.uint8 and x1.shape == (len(samples), 3, 32, 32)
    calls = []
    monkeypatch.setattr(decoded, "_decode", lambda *a: calls.append(1))
    x2, y2 = decoded.decode(samples, cifar_dir)   # from the cache: no decoding
    assert not calls and torch.equal(x1, x2) and torch.equal(y1, y2)
    monkeypatch.undo()
    monkeypatch.setenv("BFP_CACHE_DIR", str(tmp_path / "c"))
    files[0].write_bytes(b"damaged")               # a damaged cache is decoded anew and replaced
    x3, _ = decoded.decode(samples, cifar_dir)
    assert torch.equal(x1, x3) and files[0].stat().st_size > 1000
    decoded.decode(samples[:-1], cifar_dir)        # another subset: another key
    assert len(list((tmp_path / "c").glob("decoded-32px-*.pt"))) == 2
    monkeypatch.setenv("BFP_CACHE_DIR", "off")
    x4, _ = decoded.decode(samples, cifar_dir)
    assert torch.equal(x1, x4) and len(list((tmp_path / "c").glob("*.pt"))) == 2


def test_the_lm_table_runs_lm_py_on_its_embedded_corpus_reports_bits_and_verifies(tmp_path):
    """The transformer tables are tables of the same runner: lm-table's quick profile runs lm.py
    (no --data: its corpus is embedded), writes result files, renders bits per character, and
    verify reruns a row to the same numbers."""
    res, runs = tmp_path / "res", tmp_path / "runs"
    common = ("lm-table", "--profile", "quick", "--results", str(res), "--runs", str(runs))
    r = _experiments("run", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    prof = matrix.profile("quick", "lm-table")
    docs = {name: results.read_result(res / f"{name}.json") for name in prof.rows}
    assert all(d["command"][0] == "lm.py" and "-dp" not in d["command"] for d in docs.values())
    r = _experiments("report", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = (runs / "RESULTS.md").read_text()
    bpc = docs["fp32"]["epochs"][-1]["test_loss"] / np.log(2)
    assert f"`fp32` {bpc:.3f}" in page and "bits per character" in page and "Profile `quick`" in page
    r = _experiments("verify", *common, "--row", "fp32", cwd=tmp_path)
    assert r.returncode == 0 and "identical" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    r = _experiments("run", *common, "--data", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "use lm.py's embedded data; drop --data" in r.stderr
