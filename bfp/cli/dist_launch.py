"""The PyTorch ImageNet example's distributed flags, as the environment ``torch.distributed`` reads.

``imagenet.py --world-size N --rank R --dist-url tcp://HOST:PORT --dist-backend B``
and ``--multiprocessing-distributed`` keep their meaning from the example the
original simulator ran; the engine's distributed setup
(``bfp.distributed``) initialises from the standard variables ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``BFP_DIST_BACKEND``. ``dist_env`` translates one into the other (a pure
function); ``spawn`` starts one worker per GPU (or ``--nprocs``) with its
variables, as ``torch.multiprocessing.spawn`` did in the example:

* without ``--multiprocessing-distributed``: one process, ``RANK = --rank``,
  ``WORLD_SIZE = --world-size``, ``LOCAL_RANK = 0``;
* with it: ``--world-size`` counts nodes and ``--rank`` is the node's index;
  worker ``i`` of ``n`` gets ``RANK = rank * n + i``,
  ``WORLD_SIZE = world_size * n``, ``LOCAL_RANK = i``.

``--dist-url env://`` takes ``MASTER_ADDR``/``MASTER_PORT`` from the
environment (default ``127.0.0.1:29500``, torchrun's).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence
from urllib.parse import urlsplit

BACKENDS = ("nccl", "gloo")
DEFAULT_ADDR, DEFAULT_PORT = "127.0.0.1", 29500
SPAWNED = "BFP_DIST_SPAWNED"  # set in the workers spawn starts: they must not spawn again


def _master(dist_url: str, environ: Mapping[str, str]) -> tuple[str, int]:
    if dist_url == "env://":
        addr = environ.get("MASTER_ADDR", DEFAULT_ADDR)
        port = environ.get("MASTER_PORT", str(DEFAULT_PORT))
    else:
        u = urlsplit(dist_url)
        if u.scheme != "tcp" or not u.hostname or u.port is None or u.path not in ("", "/"):
            raise ValueError(f"--dist-url {dist_url!r}: expected tcp://HOST:PORT or env://")
        addr, port = u.hostname, str(u.port)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT {port!r}: expected a port number 1..65535")
    return addr, int(port)


def dist_env(*, world_size: int, rank: int, dist_url: str = "env://", dist_backend: Optional[str] = None,
             local_rank: int = 0, nprocs: int = 1, environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The environment of worker ``local_rank`` of ``nprocs`` on node ``rank`` of ``world_size``
    (``nprocs`` 1: the process is the node). ``ValueError`` naming the bad flag."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"--rank must be in 0..{world_size - 1} (--world-size {world_size}), got {rank!r}")
    if nprocs < 1 or not 0 <= local_rank < nprocs:
        raise ValueError(f"worker {local_rank} of {nprocs}: expected 0 <= worker < nprocs")
    if dist_backend is not None and dist_backend not in BACKENDS:
        raise ValueError(f"--dist-backend {dist_backend!r}: allowed: {', '.join(BACKENDS)}")
    addr, port = _master(dist_url, environ or {})
    env = {"RANK": str(rank * nprocs + local_rank), "WORLD_SIZE": str(world_size * nprocs),
           "LOCAL_RANK": str(local_rank), "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    if dist_backend is not None:
        env["BFP_DIST_BACKEND"] = dist_backend
    return env


def is_distributed(args) -> bool:
    """The example's rule: distributed when ``--world-size`` > 1 or ``--multiprocessing-distributed``."""
    return bool(args.multiprocessing_distributed) or (args.world_size or 1) > 1


def node_args(args) -> dict:
    """``dist_env`` keywords from parsed flags (``--world-size``/``--rank`` default to one node, rank 0)."""
    return dict(world_size=args.world_size or 1, rank=args.rank or 0, dist_url=args.dist_url,
                dist_backend=args.dist_backend)


def spawn(command: Sequence[str], nprocs: int, node: dict, environ: Optional[Mapping[str, str]] = None,
          stream=None) -> int:
    """Run ``command`` ``nprocs`` times, worker ``i`` with ``dist_env(local_rank=i, ...)``;
    waits for all and returns the first non-zero exit status (0 if all succeed). When one
    worker fails the others are stopped, since they would wait for it forever."""
    base = dict(os.environ if environ is None else environ)
    envs = [{**base, **dist_env(**node, local_rank=i, nprocs=nprocs, environ=base), SPAWNED: "1"}
            for i in range(nprocs)]  # every worker's flags checked before any starts
    print(f"starting {nprocs} workers (ranks {envs[0]['RANK']}..{envs[-1]['RANK']} of "
          f"{envs[0]['WORLD_SIZE']})", file=stream or sys.stderr)
    procs = [subprocess.Popen(list(command), env=env) for env in envs]
    status = 0
    try:
        pending = list(procs)
        while pending:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc and not status:
                    status = rc
                    for q in pending:
                        q.terminate()
            if pending:
                try:
                    pending[0].wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return status
