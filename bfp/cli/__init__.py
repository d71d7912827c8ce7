"""The command line: the scripts' flags, run assembly and the ``bfp`` command.

    tasks         per-script settings (dataset, image size, classes, default model)
    flags         argparse groups shared by every script
    train_config  -tc files and --resume merging
    run           flags -> data, model, Trainer; one training run
    compare       --compare (FP32 against the network config)
    generate      --mode generate-config
    plot          draw_curve.py / bfp plot
    main          run_task (behind cifar.py) and main (the ``bfp`` console script)

The top of the layering: it imports the engine, dynamic precision and
everything below; nothing imports it.
"""
from typing import Optional, Sequence

from .flags import UsageError
from .main import main, run_task


def cifar(argv: Optional[Sequence[str]] = None) -> int:
    """``python cifar.py ARGS`` from Python: ``bfp.cli.cifar(["--dataset", "digits"])``."""
    return run_task("cifar", argv)


__all__ = ["UsageError", "cifar", "main", "run_task"]
