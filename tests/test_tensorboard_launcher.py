"""tensorboard/run.sh: local by default, serves a real run's scalars over TensorBoard's HTTP API."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from bfp.cli import cifar as cifar_main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tensorboard" / "run.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_arguments_exit_2():
    for arg in ("abc", "0", "70000"):
        r = subprocess.run(["bash", str(SCRIPT), arg], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "run.sh:" in r.stderr, arg


def test_serves_a_runs_scalar_on_localhost_and_stops(tmp_path, tiny_args):
    assert cifar_main(tiny_args("--training-epochs", "1", "--log", "True", "--run-name", "tb")) == 0
    want = json.loads((tmp_path / "runs" / "tb" / "metrics.jsonl").read_text().splitlines()[0])["train_loss"]
    port = free_port()
    env = {**os.environ, "BFP_TB_LOCAL": "1", "BFP_RUNS": str(tmp_path / "runs")}
    env.pop("BFP_TB_BIND_ALL", None)
    proc = subprocess.Popen(["bash", str(SCRIPT), str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        assert f"at http://127.0.0.1:{port}/ (this machine only" in first
        query = urllib.parse.urlencode({"run": "tb", "tag": "loss/train"})
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?{query}"
        deadline, points = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    points = json.loads(r.read())
                if points:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(1)
        assert points, f"no scalar from {url}; TensorBoard exited with {proc.poll()}"
        (wall, step, value), = points
        assert step == 1 and value == pytest.approx(want, rel=1e-6)  # stored as float32
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _stub_bin(tmp_path, python_ok: bool):
    """A PATH with a fake docker (a daemon, no image; every call logged) and a python3 that has
    TensorBoard or not; no tensorboard command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\necho "$@" >> "$DOCKER_LOG"\n'
                                    'case "$1" in info) exit 0;; *) exit 1;; esac\n')
    (bin_dir / "python3").write_text("#!/bin/sh\n" + ('echo "served $@"; exit 0\n' if python_ok else "exit 1\n"))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("python_ok", [True, False])
def test_without_the_image_nothing_is_pulled_and_it_falls_back_or_fails_clearly(tmp_path, python_ok):
    bin_dir = _stub_bin(tmp_path, python_ok)
    log = tmp_path / "docker.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DOCKER_LOG": str(log), "BFP_RUNS": str(tmp_path / "runs"),
           "BFP_TB_IMAGE": "nobody/bfpsim:none", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", str(SCRIPT), "6123"], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    assert calls[:2] == ["info", "image inspect nobody/bfpsim:none"] and not any("pull" in c or c.startswith("run")
                                                                                for c in calls)
    assert "no docker image nobody/bfpsim:none here (it is never pulled" in r.stderr
    if python_ok:
        assert r.returncode == 0 and "served -m tensorboard.main --logdir" in r.stdout
    else:
        assert r.returncode == 1 and "nothing can serve TensorBoard" in r.stderr


def test_the_repositorys_own_tensorboard_folder_is_not_taken_for_tensorboard(tmp_path):
    """Run from the repository root with a Python that lacks TensorBoard (site-packages off): the
    folder tensorboard/ there imports as a namespace package, which must not pass the check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    root = SCRIPT.parents[1]
    assert subprocess.run([str(bin_dir / "python3"), "-c", "import tensorboard"], cwd=root).returncode == 0
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "BFP_RUNS": str(tmp_path / "runs"), "BFP_TB_LOCAL": "1",
           "HOME": str(tmp_path)}
    r = subprocess.run(["bash", "tensorboard/run.sh", "6124"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "nothing can serve TensorBoard" in r.stderr, r.stdout + r.stderr
    assert "No module named" not in r.stderr
