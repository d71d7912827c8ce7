"""Which process this is, from the launcher's environment, and the process group.

Read in this order (the first complete set wins):

* ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT``:
  what ``torchrun`` sets, and what a user (or ``imagenet.py``'s
  ``--world-size/--rank/--dist-url`` translation) may set by hand;
* Slurm's ``srun``: ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``,
  with ``MASTER_ADDR`` (and ``MASTER_PORT``, default 29500) exported by the
  job script, as CPD read them.

``MASTER_PORT`` must be an integer in 1..65535 (an error names the variable
otherwise). A world size of 1 (or no such variables: a plain ``python cifar.py``) is a
single process and no process group is made.

Every process group has a timeout (``init(..., timeout_s=)``, ``--dist-timeout``,
default ``DEFAULT_TIMEOUT_S``): joining it and every collective (gloo) fail
after that long instead of hanging, and while a process waits to join it prints
every ``WAIT_NOTE_S`` seconds which address and how many processes it awaits. The backend is ``nccl`` on
CUDA and ``gloo`` on the CPU, unless ``BFP_DIST_BACKEND`` names another.
Each process uses ``cuda:LOCAL_RANK`` on GPUs (missing ``LOCAL_RANK``:
``RANK`` modulo the GPU count).
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

DEFAULT_PORT = "29500"
DEFAULT_TIMEOUT_S = 300.0
WAIT_NOTE_S = 10.0


class DistEnvError(ValueError):
    """The launcher's environment is incomplete or inconsistent; the message says what to set."""


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: Optional[str] = None
    master_port: str = DEFAULT_PORT
    source: str = "single process"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DistEnvError(f"{name}={env[name]!r} is not an integer") from None


def read_env(env: Optional[Mapping[str, str]] = None) -> DistEnv:
    """The ``DistEnv`` the variables describe (see the module docstring)."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env or "RANK" in env:
        if not ("WORLD_SIZE" in env and "RANK" in env):
            raise DistEnvError("set both RANK and WORLD_SIZE (torchrun sets them), or neither")
        rank, world, source = _int(env, "RANK"), _int(env, "WORLD_SIZE"), "RANK/WORLD_SIZE"
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else None
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world, source = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), "Slurm (srun)"
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else None
    else:
        return DistEnv()
    if world < 1 or not 0 <= rank < world:
        raise DistEnvError(f"{source}: rank {rank} and world size {world} need 0 <= rank < world size")
    if world == 1:
        return DistEnv(source=source)
    addr = env.get("MASTER_ADDR")
    if not addr:
        raise DistEnvError(f"{source} describe {world} processes but MASTER_ADDR is not set: export "
                           f"MASTER_ADDR (the host of rank 0) and MASTER_PORT (default {DEFAULT_PORT})")
    if local is None:
        n_gpu = torch.cuda.device_count()
        local = rank % n_gpu if n_gpu else 0
    return DistEnv(rank, world, local, addr, _port(env.get("MASTER_PORT", DEFAULT_PORT)), source)


def _port(text: str) -> str:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535 or str(text).strip() != str(port):
        raise DistEnvError(f"MASTER_PORT={text!r} is not a port number: allowed an integer in 1..65535 "
                           f"(the port rank 0 listens on; default {DEFAULT_PORT})")
    return str(port)


def backend_for(device: torch.device) -> str:
    """``BFP_DIST_BACKEND`` if set, else nccl for CUDA and gloo for the CPU."""
    return os.environ.get("BFP_DIST_BACKEND") or ("nccl" if device.type == "cuda" else "gloo")


def device_for(e: DistEnv, device: torch.device) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` when ``device`` is CUDA without an index."""
    if e.distributed and device.type == "cuda" and device.index is None:
        return torch.device("cuda", e.local_rank)
    return device


def init(e: DistEnv, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the process group of ``e`` (once per process; later calls do nothing). Joining and
    every collective fail after ``timeout_s`` seconds (``DistEnvError`` for the join)."""
    if not e.distributed or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", e.master_addr)
    os.environ.setdefault("MASTER_PORT", e.master_port)
    where = f"{e.master_addr}:{e.master_port}"
    waiting = threading.Event()
    note = threading.Thread(target=_wait_notes, args=(waiting, e, where), daemon=True)
    note.start()
    try:
        # A rank other than 0 first reaches rank 0's address itself, within the timeout: PyTorch's
        # store client retries past it (50 s for 20) and prints C++ frames on the way.
        left = timeout_s - (_reach(e, where, timeout_s) if e.rank else 0.0)
        dist.init_process_group(backend_for(device), rank=e.rank, world_size=e.world_size,
                                timeout=datetime.timedelta(seconds=max(left, 1.0)))
    except (RuntimeError, ValueError) as err:  # DistStoreError, DistNetworkError: RuntimeErrors
        why = str(err).splitlines()[0].rstrip(".") if str(err) else type(err).__name__
        raise DistEnvError(f"rank {e.rank}: could not join the {e.world_size}-process group at {where} within "
                           f"{timeout_s:g} s (`timeout_s`): {why}. "
                           f"Is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same for every process?"
                           ) from None
    finally:
        waiting.set()
    atexit.register(shutdown)


def _reach(e: DistEnv, where: str, timeout_s: float) -> float:
    """Seconds it took until something accepts a TCP connection at MASTER_ADDR:MASTER_PORT
    (rank 0's store); ``DistEnvError`` at once for a host that does not resolve, and after
    ``timeout_s`` when nothing answers."""
    t0 = time.monotonic()
    try:
        socket.getaddrinfo(e.master_addr, int(e.master_port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise DistEnvError(f"rank {e.rank}: MASTER_ADDR {e.master_addr!r} does not resolve "
                           f"({getattr(err, 'strerror', None) or err}); give rank 0's host name or address"
                           ) from None
    while True:
        left = timeout_s - (time.monotonic() - t0)
        if left <= 0:
            raise DistEnvError(f"rank {e.rank}: nothing answered at {where} within {timeout_s:g} s (`timeout_s`): "
                               f"is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same for every process?")
        try:
            socket.create_connection((e.master_addr, int(e.master_port)), timeout=min(left, 2.0)).close()
            return time.monotonic() - t0
        except OSError:
            time.sleep(min(0.25, max(left, 0.0)))


def _wait_notes(done: threading.Event, e: DistEnv, where: str) -> None:
    t = 0.0
    while not done.wait(WAIT_NOTE_S):
        t += WAIT_NOTE_S
        print(f"rank {e.rank}: waiting {t:.0f} s for the {e.world_size}-process group at {where} "
              f"({'listening for the other ranks' if e.rank == 0 else 'connecting to rank 0'})",
              file=sys.stderr, flush=True)


def shutdown(barrier: bool = False) -> None:
    """Leave the process group (nothing without one). ``barrier``: first wait until every rank is
    done, so none tears its connections down while a peer still uses them. A finished run calls it
    before it returns, while the interpreter is whole: a group left to exit-time teardown can race
    its own threads ('terminate called without an active exception', exit 134)."""
    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def group_size(group: Any = None) -> int:
    """Processes in ``group`` (None: the default group); 1 without a process group."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def broadcast_state(tensors, group: Any = None) -> None:
    """Copy the first rank of ``group``'s ``tensors`` to every rank (nothing in a single process):
    the parameters a run starts from, and the buffers (BatchNorm running statistics) before a
    step or an evaluation."""
    if group_size(group) > 1:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        for t in tensors:
            dist.broadcast(t.data, src=src, group=group)
