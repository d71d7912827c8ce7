#!/usr/bin/env python3
"""Train a CIFAR-sized image classifier with simulated low-precision arithmetic.

    python cifar.py --mode train --model ResNet18 --dataset CIFAR100 --log True --bfp ResNet18_FB24
    python cifar.py --dataset digits --bfp ResNet18_FB16 --compare True   # offline, a few minutes

The flags live in bfp/cli/flags.py, the run in bfp/cli/run.py; `--help` lists the flags.
`bfp cifar ARGS` does the same.
"""
import sys

from bfp.cli import run_task

if __name__ == "__main__":
    sys.exit(run_task("cifar"))
