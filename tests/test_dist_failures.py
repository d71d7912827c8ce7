"""A distributed run never hangs without a word: an unreachable rank 0, a peer killed or frozen
mid-training each end every remaining rank within --dist-timeout with a message naming the
address or the failed collective, and a non-zero exit."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["-d", "digits", "-m", "ResNet10", "--model-opt", "width=4", "--batch-size-train", "32",
        "--progress", "False", "--threads", "1", "--num-workers", "0", "--device", "cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, *flags) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    return subprocess.Popen([sys.executable, str(ROOT / "cifar.py"), *TINY, *flags], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_an_unreachable_rank_0_ends_with_the_address_after_the_timeout():
    port = _free_port()
    p = _rank(1, port, "--training-epochs", "1", "--dist-timeout", "8")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2, out
    assert f"rank 1: nothing answered at 127.0.0.1:{port} within 8 s (--dist-timeout)" in out
    # no store retries past the timeout: the group's own wait note (every 10 s) never printed; no
    # wall-clock bound here (starting Python and torch on a loaded machine took 12 s once)
    assert "Traceback" not in out and "frame #" not in out and "waiting 10 s" not in out


def test_an_unresolvable_rank_0_host_is_named_at_once():
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid",
           "MASTER_PORT": str(_free_port())}
    p = subprocess.run([sys.executable, str(ROOT / "cifar.py"), *TINY, "--training-epochs", "1",
                        "--dist-timeout", "20"], env=env, text=True, capture_output=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "MASTER_ADDR 'no-such-host.invalid' does not resolve" in p.stderr
    assert "Traceback" not in p.stderr and "frame #" not in p.stderr and "waiting" not in p.stderr


def _peer_fails(sig, *flags) -> tuple[int, str, float]:
    port = _free_port()
    ps = [_rank(r, port, "--training-epochs", "40", "--dist-timeout", "10", *flags) for r in (0, 1)]
    try:
        lines = []
        for line in ps[0].stdout:  # rank 0 prints; wait until training runs
            lines.append(line)
            if line.startswith("epoch 1/40"):
                break
        assert any(x.startswith("epoch 1/40") for x in lines), "".join(lines)
        t = time.monotonic()
        os.kill(ps[1].pid, sig)
        rest, _ = ps[0].communicate(timeout=180)
        return ps[0].returncode, rest, time.monotonic() - t
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_a_killed_peer_ends_the_other_rank_with_a_clear_message(tmp_path):
    rc, out, _ = _peer_fails(signal.SIGKILL, "--save", "True", "--run-dir", str(tmp_path))  # checkpoints: --resume advice
    assert rc == 4, out
    assert "cifar.py: error: rank 0 of 2: a collective failed" in out and "--resume" in out
    assert "Traceback" not in out


def test_a_killed_or_frozen_peer_ends_an_fsdp_run_too_without_resume_advice():
    """FSDP's collectives (all-gather, the rounded reduce-scatter) fail as DDP's do; a run that saves no
    checkpoints (--save False) is not pointed at --resume."""
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        rc, out, waited = _peer_fails(sig, "--fsdp", "--grad-format", "float8_e4m3fn", "--save", "False")
        assert rc == 4, out
        assert "cifar.py: error: rank 0 of 2: a collective failed" in out, out
        assert "This run saves no checkpoints (--save False)" in out and "--resume" not in out.split("a collective")[-1]
        assert "Traceback" not in out and waited < 120


def test_a_frozen_peer_ends_the_other_rank_after_the_timeout():
    rc, out, waited = _peer_fails(signal.SIGSTOP)
    assert rc == 4, out
    detail = re.search(r"cifar\.py: error: rank 0 of 2: a collective failed \((.*?)\)\. ", out)
    # gloo words it "Timed out waiting ... for recv" or "Application timeout caused pair closure"
    assert detail and re.search(r"timed out|timeout", detail[1], re.I), out
    assert "Traceback" not in out and waited < 120


def test_torchrun_passes_flags_after_double_dash_to_the_script(tmp_path):
    """`torchrun ... cifar.py --log True` is torchrun's ambiguous option; `cifar.py -- --log True` works."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
            "--master-port", str(_free_port()), str(ROOT / "cifar.py")]
    flags = [*TINY, "--limit-train-images", "64", "--limit-test-images", "32", "--training-epochs", "1",
             "--run-dir", str(tmp_path / "runs"), "--run-name", "t", "--log", "True"]
    bad = subprocess.run([*base, *flags], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "ambiguous option: --log" in bad.stderr
    good = subprocess.run([*base, "--", *flags], env=env, capture_output=True, text=True, timeout=180)
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "runs" / "t" / "log.txt").is_file()


def _both_ranks(flags0, flags1, timeout=120):
    port = _free_port()
    ps = [_rank(0, port, "--training-epochs", "1", *flags0), _rank(1, port, "--training-epochs", "1", *flags1)]
    try:
        return [(p.communicate(timeout=timeout)[0], p.returncode) for p in ps]
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()


def test_ranks_started_with_different_runs_all_refuse_naming_the_flags():
    outs = _both_ranks(["--seed", "0", "--grad-exp", "4", "--grad-man", "3", "--model-opt", "width=4",
                        "--bfp", "any_FB12"],
                       ["--seed", "1", "--grad-exp", "5", "--grad-man", "2", "--model-opt", "width=8",
                        "--bfp", "any_FB16"])
    for out, rc in outs:
        assert rc == 2, out
        assert "the ranks were started with different runs" in out and "Traceback" not in out
        for part in ("rank 1 has --seed 1 where rank 0 has 0", "--grad-exp 5 where rank 0 has 4",
                     "--grad-man 2 where rank 0 has 3", "--model-opt", "--bfp 'any_FB16' where rank 0 has 'any_FB12'"):
            assert part in out, out
        assert "--network-config" not in out and "--explicit" not in out  # issue 53, item 12: flags users type
    ok = _both_ranks(["--num-workers", "0"], ["--num-workers", "0", "--progress", "False"])  # local flags only
    assert [rc for _, rc in ok] == [0, 0], ok[0][0]


def test_nodes_outside_the_tree_order_are_refused(capsys):
    from bfp.cli import cifar
    for order in ([], ["--grad-order", "gloo", "--grad-format", "e4m3"]):
        assert cifar([*TINY, "--training-epochs", "1", "--emulate-node", "8", "--nodes", "3", *order]) == 2
        err = capsys.readouterr().err
        assert "--nodes 3 places the workers on nodes for --grad-order nccl-tree only" in err
        assert "Traceback" not in err


def test_a_peer_dying_during_resume_is_a_failed_collective_not_a_checkpoint_that_does_not_fit(monkeypatch,
                                                                                               tmp_path):
    """The ranks load their shards with collectives: when a peer dies then, the error is the
    collective's (exit 4's message), never the advice that the checkpoint does not fit."""
    import pytest
    import torch.distributed as dist
    from bfp.cli import resume
    from bfp.cli.flags import UsageError
    from bfp.cli.peers import peer_failure

    class Trainer:
        epochs = 2

        def __init__(self, error):
            self.error = error

        def load_state_dict(self, state):
            raise self.error

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    STATE = {"epoch": 1, "global_step": 4}
    died = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40113")
    with pytest.raises(RuntimeError) as got:
        resume.load_state(Trainer(died), STATE, tmp_path / "last.pt")
    assert got.value is died and not isinstance(got.value, UsageError)
    assert peer_failure(died).startswith("rank 1 of 2: a collective failed ([gloo/transport/tcp/pair.cc:534] "
                                         "Connection closed by peer")
    # the negative control: a state that does not fit is still named as one
    with pytest.raises(UsageError, match="does not fit the model built from its flags .*size mismatch"):
        resume.load_state(Trainer(RuntimeError("Error(s) in loading state_dict: size mismatch for fc.weight")), STATE,
                          tmp_path / "last.pt")
