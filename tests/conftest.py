"""Shared fixtures: a tiny, fast cifar.py job (digits, 4-channel ResNet10, a few images)."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Without a GPU the Triton kernels run under Triton's interpreter, on CPU tensors, bit for bit as on
# a GPU (bfp.kernels.triton_cuda); it must be set before triton first decorates a kernel.
if not os.environ.get("TRITON_INTERPRET"):
    try:
        import torch
    except ImportError:  # not installed: the test modules say so themselves (pip install -e ".[test]")
        torch = None
    if torch is not None and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker a core, at most 4. Each worker imports torch
    and runs tests that start processes of their own; more would only share the same cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # not on macOS
    return max(1, min(4, cores or 1))


@pytest.fixture
def tiny_args(tmp_path):
    """CLI flags of a job that trains in about a second an epoch on two CPU cores."""
    def make(*extra, train_images=64, test_images=32):
        return ["-d", "digits", "-m", "ResNet10", "--model-opt", "width=4",
                "--limit-train-images", str(train_images), "--limit-test-images", str(test_images),
                "--batch-size-train", "32", "--batch-size-test", "32", "--num-workers", "0",
                "--progress", "False", "--device", "cpu", "--threads", "1",
                "--run-dir", str(tmp_path / "runs"), *extra]
    return make
