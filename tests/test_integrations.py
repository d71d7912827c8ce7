"""The rounded all-reduce inside other people's training loops, on 2 gloo ranks under torchrun:
PyTorch Lightning's DDPStrategy and Hugging Face's Trainer. The callbacks install the hook on the
DDP module the framework built and it reduces every step's gradients; Lightning's own
``ddp_comm_hook`` on the CPU never runs (the reason for the callback), and the refusals name why."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(framework, how, out):
    out.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(_port()), str(ROOT / "tests" / "_frameworks_worker.py"), framework, how, str(out)],
                       env=env, capture_output=True, text=True, timeout=400, cwd=out)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return [torch.load(out / f"rank{r}.pt") for r in (0, 1)]


def _needs(framework):
    """Skip unless the framework is installed (Lightning as "lightning" or "pytorch-lightning")."""
    if framework == "hf":
        pytest.importorskip("accelerate")
        return
    try:
        import bfp.integrations.lightning  # noqa: F401
    except ImportError:
        pytest.skip("neither lightning nor pytorch-lightning is installed")


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_the_callback_rounds_every_steps_all_reduce(framework, tmp_path):
    _needs(framework)
    ranks = _torchrun(framework, "callback", tmp_path / "callback")
    assert all(r["calls"] >= 2 for r in ranks)  # at least a bucket a step, two steps
    assert _same(ranks[0]["weights"], ranks[1]["weights"])  # every rank applied the same reduced gradient
    plain = _torchrun(framework, "none", tmp_path / "none")
    assert _same(plain[0]["weights"], plain[1]["weights"])
    assert not _same(ranks[0]["weights"], plain[0]["weights"])  # e4m3 sums changed the step


def test_lightnings_own_comm_hook_never_runs_on_the_cpu(tmp_path):
    _needs("lightning")
    ranks = _torchrun("lightning", "strategy_hook", tmp_path / "hook")
    assert [r["calls"] for r in ranks] == [0, 0]  # FP32 ran: what the callback exists to prevent


def test_the_callbacks_refuse_a_model_without_ddp_and_a_hook_that_never_ran():
    from bfp.distributed.hook import RoundedHookState, check_hook_ran, install_rounded_hook
    from bfp.integrations import as_reduce
    with pytest.raises(ValueError, match="the rounded all-reduce replaces DistributedDataParallel's, but the model is "
                                         "a Linear: run with 2 or more processes"):
        install_rounded_hook(torch.nn.Linear(2, 2), as_reduce("e4m3"))
    with pytest.raises(RuntimeError, match="the rounded all-reduce hook reduced no gradient bucket in the first step"):
        check_hook_ran(RoundedHookState(as_reduce("e4m3")), "RoundedAllReduce")
    with pytest.raises(ValueError, match="unknown format name 'e4m9x'"):
        as_reduce("e4m9x")
