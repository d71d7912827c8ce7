"""Entry points: ``run_task`` behind each script (``cifar.py``) and the ``bfp`` command.

    bfp cifar ARGS              same as python cifar.py ARGS
    bfp imagenet ARGS           same as python imagenet.py ARGS
    bfp generate-config ARGS    same as python cifar.py --mode generate-config ARGS
    bfp plot RUN_DIR ...        same as python draw_curve.py RUN_DIR ...
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Optional, Sequence

from ..distributed import env as dist_env
from ..engine.checkpoint import CheckpointError
from ..engine.trainer import NonFiniteTraining
from . import plot
from .compare import compare
from .diagnose import diagnose, sweep_mode
from .evaluate import evaluate
from .flags import UsageError, build_parser
from .param_flags import as_flags
from .peers import peer_failure
from .generate import generate_config
from .run import train
from .spec import build_spec
from .tasks import TASKS, get_task


# A write refused by the disk or the file system (full, read-only, quota, permissions).
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EIO}


def in_flags(task, e: BaseException) -> str:
    """The message of a library error with its parameters named as the task's flags
    (``bfp.cli.param_flags``)."""
    dests = {a.dest for a in build_parser(task)._actions if a.option_strings}
    return as_flags(str(e), dests, task.hooks.flag_spellings)


def run_task(task_name: str, argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None,
             leave_group: Optional[bool] = None) -> int:
    """Parse ``argv`` as the task's script does and run it; returns the exit status.
    ``leave_group`` (default: when ``argv`` is None, the process's own command line, as the
    scripts call it): after a finished run, wait for every rank and leave the process group
    before returning, not at interpreter exit. A caller running several tasks in one process
    keeps its group."""
    leave_group = argv is None if leave_group is None else leave_group
    task = get_task(task_name)
    prog = prog or task.prog
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = None
    try:
        spec = build_spec(task, argv)  # flags, -tc and --resume merged, checked and frozen
        try:  # e.g. imagenet.py's distributed flags: set the environment or spawn workers
            status = task.hooks.before_run(spec)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if status is not None:
            return status
        mode = spec.args.mode
        refused = one_process_only(spec.args, prog)
        if refused is not None:
            return refused
        run = (generate_config if mode == "generate-config" else diagnose if mode == "diagnose" else
               sweep_mode if mode == "sweep" else evaluate if task.hooks.evaluate_only(spec.args) else
               compare if spec.args.compare else train)
        run(spec)
        if leave_group:
            dist_env.shutdown(barrier=True)  # every rank done, then the group torn down before exit
        return 0
    except (UsageError, CheckpointError) as e:
        if not said_by_rank_0(e):
            print(f"{prog}: error: {in_flags(task, e)}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in WRITE_ERRNOS or not e.filename:
            raise
        print(f"{prog}: error: cannot write {e.filename}: {e.strerror}. What the run saved before is kept "
              f"(each checkpoint is written whole or not at all); free space or fix the permissions, then "
              f"continue with --resume <run directory>", file=sys.stderr)
        return 2
    except NonFiniteTraining as e:  # the run diverged; its last finite checkpoint is kept
        print(f"{prog}: error: {in_flags(task, e)}", file=sys.stderr)
        return 3
    except RuntimeError as e:
        failed = peer_failure(e, resumable=bool(getattr(getattr(spec, "args", None), "save", True)))
        if failed is None:
            raise
        print(f"{prog}: error: {failed}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(4)  # no process-group teardown: it would wait on the dead or frozen peer
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def said_by_rank_0(e: BaseException) -> bool:
    """Whether another process prints ``e`` for this one: a ``UsageError`` every rank meets alike,
    on a rank other than 0 of a launch whose processes all run on this machine (torchrun's
    ``LOCAL_WORLD_SIZE`` equal to ``WORLD_SIZE``: the same files, the same error)."""
    if not getattr(e, "every_rank", False):
        return False
    env = os.environ
    return env.get("RANK", "0") != "0" and env.get("LOCAL_WORLD_SIZE") is not None \
        and env.get("LOCAL_WORLD_SIZE") == env.get("WORLD_SIZE")


def one_process_only(args, prog: str) -> Optional[int]:
    """Exit status 2 for a mode that runs in one process (``--mode generate-config``, ``--mode
    diagnose``, ``--compare``) started by a launcher (torchrun, srun): every rank would write the
    same file and print its own table. Rank 0 alone says so; None when the run may go on."""
    what = (f"--mode {args.mode}" if args.mode in ("generate-config", "diagnose") else
            "--compare" if getattr(args, "compare", None) else None)
    if what is None:
        return None
    try:
        launched = dist_env.read_env()
    except dist_env.DistEnvError:
        launched = None
    if launched is None or not launched.distributed:
        return None
    if launched.rank == 0:
        print(f"{prog}: error: {what} runs in one process; this one is rank {launched.rank} of "
              f"{launched.world_size} ({launched.source}), and every rank would write the same outputs. "
              f"Run it as one process, without the launcher", file=sys.stderr, flush=True)
    return 2


USAGE = f"""usage: bfp COMMAND [ARGS]

commands:
{chr(10).join(f"  {name:<16} {t.summary} ({t.prog} ARGS)" for name, t in TASKS.items())}
  generate-config  a network config listing every convertible layer of a model
                   (cifar.py --mode generate-config ARGS; --task NAME for another task)
  plot             loss and accuracy curves of runs (draw_curve.py ARGS)

'bfp COMMAND --help' lists a command's flags."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in TASKS:
        return run_task(command, rest, prog=f"bfp {command}", leave_group=True)
    if command == "generate-config":
        task = "cifar"
        if "--task" in rest:
            i = rest.index("--task")
            if i + 1 >= len(rest) or rest[i + 1] not in TASKS:
                print(f"bfp generate-config: error: --task needs one of {', '.join(TASKS)}", file=sys.stderr)
                return 2
            task, rest = rest[i + 1], rest[:i] + rest[i + 2:]
        return run_task(task, ["--mode", "generate-config", *rest], prog="bfp generate-config", leave_group=True)
    if command == "plot":
        return plot.main(rest, prog="bfp plot")
    print(f"bfp: error: unknown command {command!r}; allowed: {', '.join([*TASKS, 'generate-config', 'plot'])}\n"
          f"{USAGE}", file=sys.stderr)
    return 2
