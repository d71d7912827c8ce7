"""tensorboard/run.sh: local by default, serves a real run's scalars over TensorBoard's HTTP API."""
import json
import os
import signal
import socket
import subprocess
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
