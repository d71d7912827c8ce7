"""imagenet.py's distributed flags -> RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*/BFP_DIST_BACKEND, and worker spawning."""
import sys

import pytest

from bfp.cli.dist_launch import dist_env, node_args, spawn
from bfp.cli.flags import build_parser
from bfp.cli.tasks import IMAGENET


def test_one_process_per_flag_set():
    assert dist_env(world_size=4, rank=2, dist_url="tcp://10.1.2.3:23456", dist_backend="gloo") == {
        "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456",
        "BFP_DIST_BACKEND": "gloo"}


def test_multiprocessing_distributed_counts_nodes_and_workers():
    # node 1 of 2 nodes, 4 workers each: worker 3 is rank 7 of 8, as the PyTorch example computes it
    env = dist_env(world_size=2, rank=1, dist_url="tcp://[::1]:29400", local_rank=3, nprocs=4)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
        ("7", "8", "3", "::1", "29400")
    assert "BFP_DIST_BACKEND" not in env


def test_env_url_takes_the_environment_or_torchruns_defaults():
    assert dist_env(world_size=1, rank=0)["MASTER_ADDR"] == "127.0.0.1"
    assert dist_env(world_size=1, rank=0)["MASTER_PORT"] == "29500"
    env = dist_env(world_size=1, rank=0, environ={"MASTER_ADDR": "h", "MASTER_PORT": "7"})
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("h", "7")


@pytest.mark.parametrize("kw, message", [
    (dict(world_size=0, rank=0), "--world-size must be >= 1, got 0"),
    (dict(world_size=2, rank=-1), "--rank must be in 0..1 (--world-size 2), got -1"),
    (dict(world_size=1, rank=0, dist_url="tcp://host"), "expected tcp://HOST:PORT or env://"),
    (dict(world_size=1, rank=0, dist_url="file:///tmp/x"), "expected tcp://HOST:PORT or env://"),
    (dict(world_size=1, rank=0, dist_backend="mpi"), "--dist-backend 'mpi': allowed: nccl, gloo"),
    (dict(world_size=1, rank=0, environ={"MASTER_PORT": "x"}), "MASTER_PORT 'x': expected a port number"),
])
def test_bad_values_are_named(kw, message):
    with pytest.raises(ValueError) as e:
        dist_env(**kw)
    assert message in str(e.value)


def test_the_examples_flags_parse_into_the_translation():
    args = build_parser(IMAGENET).parse_args(["--world-size", "2", "--rank", "1", "--dist-url", "tcp://m:1",
                                              "--dist-backend", "nccl", "--multiprocessing-distributed"])
    assert args.multiprocessing_distributed is True
    assert dist_env(**node_args(args), local_rank=1, nprocs=2)["RANK"] == "3"


def test_spawn_starts_one_worker_per_process_with_its_environment(tmp_path):
    # each worker writes its own file: two processes printing to one stdout may interleave their bytes
    code = ("import os, sys; e = os.environ; open(os.path.join(sys.argv[1], e['LOCAL_RANK']), 'w')"
            ".write(' '.join(('rank', e['RANK'], e['LOCAL_RANK'], e['WORLD_SIZE'])))")
    assert spawn([sys.executable, "-c", code, str(tmp_path)], 2, dict(world_size=1, rank=0, dist_url="env://",
                                                                      dist_backend=None)) == 0
    assert [(tmp_path / r).read_text() for r in ("0", "1")] == ["rank 0 0 2", "rank 1 1 2"]
    assert spawn([sys.executable, "-c", "import sys; sys.exit(3)"], 2, dict(world_size=1, rank=0)) == 3
